"""python -m mjoin forecast: one-step-ahead Holt forecast of the statistics history."""
from __future__ import annotations

from mjoin.commands import UserError
from mjoin.forecast.holt import MODELS, ForecastConfig, forecast
from mjoin.model.timeutil import iso, parse_time
from mjoin.stats.history import read_history

NAME = "forecast"
HELP = "forecast the next cycle's statistics from the history (Holt, statsmodels)"
DESCRIPTION = """Read the statistics history (the cycles that start before --as-of, the last
--length of them), forecast every series one cycle ahead (Holt's linear trend; damped
trend for gamma; recorded fallbacks for short, constant, NaN and failed series) and write
the result as a statistics document (kind "forecast", Statistics.load reads it) with a
per-series report. Example:

  python -m mjoin forecast --stats-history .lake/stats/tpcds_returns_by_address \\
      --as-of 2026-01-01T00:10:00Z --length 60 --out forecast.json

--stats-history is the query's history folder, or the history root with --query."""


def add_arguments(p):
    p.add_argument("--stats-history", required=True, metavar="DIR",
                   help="<lake>/stats/<query> (or <lake>/stats with --query)")
    p.add_argument("--query", help="query name when DIR holds the histories of several queries")
    p.add_argument("--as-of", required=True, metavar="T", help="use only cycles starting before T (ISO-8601 or epoch s)")
    p.add_argument("--length", type=int, default=60, metavar="L", help="cycles to fit (default 60)")
    p.add_argument("--out", required=True, metavar="FORECAST.json", help="where to write the forecast")
    p.add_argument("--model", choices=MODELS, default="holt", help="holt (default), or a baseline: last_value, mean")
    p.add_argument("--min-points", type=int, default=10, help="fewer points: fallback instead of a fit (default 10)")
    p.add_argument("--fallback", choices=("last_value", "mean"), default="last_value",
                   help="value for short series and failed fits (default last_value)")
    p.add_argument("--level", type=float, default=0.9, help="prediction-interval coverage (default 0.9)")
    p.add_argument("--no-bound", dest="bound", action="store_false",
                   help="keep Holt values outside the forecast gate's range (default: the series' last value "
                        "replaces them; the range is the gate's defaults, docs/statistics.md)")


def run(args) -> int:
    try:
        as_of = parse_time(args.as_of)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    config = ForecastConfig(model=args.model, min_points=args.min_points, fallback=args.fallback, level=args.level,
                            **({} if args.bound else {"bound": None}))
    history = read_history(args.stats_history, args.query, end=as_of, meta=True)
    if history.empty:
        raise UserError(f"{args.stats_history} holds no statistics cycle before {iso(as_of)}")
    result = forecast(history, as_of, length=args.length, config=config)
    result.save(args.out)
    st = result.statistics
    methods = ", ".join(f"{m} {n}" for m, n in sorted(st.meta["methods"].items()))
    print(f"forecast {st.query}: {len(result.series)} series from {st.meta['cycles_used']} cycles "
          f"[{st.meta['first_cycle']} .. {st.meta['last_cycle']}] -> cycle {st.cycle_start} "
          f"({st.meta['horizon']} step(s) ahead) in {result.elapsed_seconds:.2f}s")
    print(f"  methods: {methods}")
    if st.meta["out_of_range"]:
        print(f"  {len(st.meta['out_of_range'])} Holt value(s) outside the forecast gate's range replaced by the last "
              f"value: {', '.join(st.meta['out_of_range'])}")
    for note in st.meta["notes"]:
        print(f"  note: {note}")
    print(f"  wrote {args.out}")
    return 0
