"""python -m mjoin calibrate: fit the cost model to engine metrics."""
from __future__ import annotations

from mjoin.commands import UserError
from mjoin.optimizer.calibrate import CalibrationError, calibrate, calibrate_from_lake, read_observations

NAME = "calibrate"
HELP = "fit the cost model (alpha_q, alpha_m, c / m_slots) to measured engine metrics"
DESCRIPTION = """Fit the cost model's coefficients by non-negative least squares to the
engine's per-step metrics (chains[].steps[]: lookups, matches, kappa, seconds) and
write the model JSON that `python -m mjoin optimize --cost-model` reads.

  python -m mjoin calibrate --metrics <lake>/metrics/<query>/metrics.jsonl --out cost_model.json
  python -m mjoin calibrate --lake <lake> --query <query>     # -> <lake>/plans/<query>/cost_model.json

The time fitted is the steps' CPU time when the metrics have it (cpu_seconds; stable on a
shared machine), else their wall time (--time-field to choose)."""


def add_arguments(p):
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--metrics", nargs="+", metavar="PATH", help="metrics JSON-lines files or folders holding them")
    src.add_argument("--lake", help="read <lake>/metrics/<query>/ (with --query); default --out "
                                    "<lake>/plans/<query>/cost_model.json, which the re-optimization loop reads")
    p.add_argument("--query", help="query name (with --lake)")
    p.add_argument("--last", type=int, help="with --lake: only the newest N batches")
    p.add_argument("--out", metavar="COST_MODEL.json")
    p.add_argument("--time-field", default="auto", choices=("auto", "seconds", "cpu_seconds"),
                   help="measured time to fit (auto: cpu_seconds when every step has it)")
    p.add_argument("--state", default="auto", choices=("auto", "sorted", "hash"),
                   help="state backend to fit f(kappa) for (auto: the metrics' state_backend)")
    p.add_argument("--no-intercept", action="store_true", help="no fixed per-step overhead term")
    p.add_argument("--min-observations", type=int, help="refuse with fewer usable steps (default max(8, 2 x terms))")


def run(args) -> int:
    if args.lake:
        if not args.query:
            raise UserError("--lake needs --query")

        try:
            model, report, path = calibrate_from_lake(args.lake, args.query, out=args.out, time_field=args.time_field,
                                                      last=args.last, min_observations=args.min_observations)
        except CalibrationError as exc:
            raise UserError(str(exc)) from None
        args.out = path
        counts = {"files": report["records"], "records": report["records"], "observations": report["observations"]}
    else:
        if not args.out:
            raise UserError("--metrics needs --out")
        try:
            obs, counts = read_observations(args.metrics)
            model, report = calibrate(obs, args.state, intercept=not args.no_intercept,
                                      min_observations=args.min_observations, source=",".join(args.metrics),
                                      time_field=args.time_field)
        except CalibrationError as exc:
            raise UserError(str(exc)) from None
        model.save(args.out)
    print(f"read {counts.get('files', 0)} file(s), {counts.get('records', 0)} record(s), "
          f"{counts.get('observations', 0)} step observation(s)"
          + (f"; {counts['bad_lines']} unreadable line(s)" if counts.get("bad_lines") else ""))
    print(f"used {report['used']} of {report['observations']}"
          + (f"; rejected {report['rejected']}" if report["rejected"] else ""))
    print(f"fit ({report['state']} state): " + ", ".join(f"{k}={v:.4g}" for k, v in report["coefficients"].items()))
    print(f"time fitted: {report['time_field']}; overhead per "
          + (f"call {report['overhead_seconds_per_call']:.3g} s" if report["overhead_term"] == "calls"
             else f"step {report['overhead_seconds_per_step']:.3g} s"))
    print(f"R^2 = {report['r2']:.4f}, rmse = {report['rmse_seconds']:.3g} s, "
          f"median relative residual = {report['residuals']['p50_relative']:.1%}")
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"cost model: {model.describe()}")
    print(f"wrote {args.out}")
    return 0
