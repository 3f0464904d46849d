"""python -m mjoin calibrate: fit the cost model to engine metrics."""
from __future__ import annotations

NAME = "calibrate"
HELP = "fit the cost model (alpha_q, alpha_m, c / m_slots) to measured engine metrics"
DESCRIPTION = """Fit the cost model's coefficients by non-negative least squares to the
engine's per-step metrics (chains[].steps[]: lookups, matches, kappa, seconds) and
write the model JSON that `python -m mjoin optimize --cost-model` reads.

  python -m mjoin calibrate --metrics <lake>/metrics/<query>/metrics.jsonl --out cost_model.json"""


def add_arguments(p):
    p.add_argument("--metrics", nargs="+", required=True, metavar="PATH",
                   help="metrics JSON-lines files or folders holding them")
    p.add_argument("--out", required=True, metavar="COST_MODEL.json")
    p.add_argument("--state", default="auto", choices=("auto", "sorted", "hash"),
                   help="state backend to fit f(kappa) for (auto: the metrics' state_backend)")
    p.add_argument("--no-intercept", action="store_true", help="no fixed per-step overhead term")
    p.add_argument("--min-observations", type=int, help="refuse with fewer usable steps (default max(8, 2 x terms))")


def run(args) -> int:
    from ..calibrate import CalibrationError, calibrate, read_observations
    from ..cli import UserError

    try:
        obs, counts = read_observations(args.metrics)
        model, report = calibrate(obs, args.state, intercept=not args.no_intercept,
                                  min_observations=args.min_observations, source=",".join(args.metrics))
    except CalibrationError as exc:
        raise UserError(str(exc)) from None
    model.save(args.out)
    print(f"read {counts.get('files', 0)} file(s), {counts.get('records', 0)} record(s), "
          f"{counts.get('observations', 0)} step observation(s)"
          + (f"; {counts['bad_lines']} unreadable line(s)" if counts.get("bad_lines") else ""))
    print(f"used {report['used']} of {report['observations']}"
          + (f"; rejected {report['rejected']}" if report["rejected"] else ""))
    print(f"fit ({report['state']} state): " + ", ".join(f"{k}={v:.4g}" for k, v in report["coefficients"].items()))
    print(f"R^2 = {report['r2']:.4f}, rmse = {report['rmse_seconds']:.3g} s, "
          f"median relative residual = {report['residuals']['p50_relative']:.1%}")
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"cost model: {model.describe()}")
    print(f"wrote {args.out}")
    return 0
