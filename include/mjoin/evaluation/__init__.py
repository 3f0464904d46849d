"""What each strategy would have cost on the same data: the historical evaluation, the cycle-by-cycle replay, the report."""
