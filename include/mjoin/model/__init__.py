"""The formats every part shares: the query spec, the plan, the statistics schema, key groups, punctuations, event time."""
