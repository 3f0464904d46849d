"""python -m mjoin check {input,stats,forecast,plan}: exit codes, printed failures, --json, --set."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from mjoin.cli import main
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.lake.registry import PlanRegistry
from test_gates_support import EPOCH0, cycle_iso, good_lake, history, snapshot, write_history, write_stream_file

INCLUDE = Path(__file__).resolve().parent.parent / "include"
Q = "tpcds_returns_by_address"


def test_input_pass_and_fail(seed_query, lake, capsys, tmp_path):
    good_lake(lake, seed_query)
    args = ["check", "input", "--query", Q, "--lake", lake.root, "--from", cycle_iso(0), "--to", cycle_iso(2),
            "--cycle", "60s"]
    assert main(args) == 0
    assert "gate input (tpcds_returns_by_address): passed" in capsys.readouterr().out
    write_stream_file(lake, seed_query, "sr", EPOCH0, 20, part=1, null_keys=20)
    out_json = tmp_path / "input.json"
    assert main(args + ["--json", str(out_json)]) == 1
    out = capsys.readouterr().out
    assert (f"input.null_key_fraction_below_max failed on 1 row: sr@{cycle_iso(0)}: 20 of 70 rows have a NULL join key"
            in out)
    doc = json.loads(out_json.read_text())
    assert doc["status"] == "failed" and doc["failed_expectations"] == ["input.null_key_fraction_below_max"]
    assert set(doc["gx_result"]) == {f"mjoin.input.files.{Q}", f"mjoin.input.cycles.{Q}"}
    assert main(args + ["--set", "null_key_fraction_max=0.3"]) == 0  # 20 of 70 rows in cycle 0: 29 %


def test_stats_and_forecast(seed_query, tmp_path, capsys):
    frame = history(seed_query, 12)
    root = write_history(frame, tmp_path / "stats")
    base = ["check", "stats", "--query", Q, "--history", str(root), "--from", cycle_iso(10), "--to", cycle_iso(12)]
    assert main(base + ["--cycle", "1m"]) == 0
    assert main(base + ["--from", cycle_iso(10), "--to", cycle_iso(13)]) == 1  # cycle 12 is not there
    assert "stats.every_cycle_present failed on 1 row: cycle 2026-01-01T00:12:00Z missing" in capsys.readouterr().out
    cfg = tmp_path / "gates.yaml"
    cfg.write_text("min_history: 30\n")
    assert main(base + ["--config", str(cfg)]) == 0  # a warning: shown, the gate passes
    out = capsys.readouterr().out
    assert "passed, 22 expectations checked, 1 warning" in out
    assert "warning: stats.history_long_enough failed on 1 row: 12 cycles of history, need >= 30" in out
    # stored in a GX context of one's own: the failing validation's Data Docs page is printed
    gx_dir = tmp_path / "gx"
    assert main(base + ["--from", cycle_iso(10), "--to", cycle_iso(13), "--set", f"results_store={gx_dir}"]) == 1
    page = re.search(r"data docs: (\S+\.html)", capsys.readouterr().out).group(1)
    assert page.startswith(str(gx_dir)) and "stats.every_cycle_present" in Path(page).read_text()

    fc = snapshot(seed_query, cycle_iso(12), kind="forecast", seed=3)
    ok = fc.save(tmp_path / "fc.json")
    assert main(["check", "forecast", "--query", Q, "--forecast", str(ok), "--history", str(root)]) == 0
    fc.groups[0].edges[("cu", "sr")].gamma = float("nan")
    bad = fc.save(tmp_path / "fc_bad.json")
    capsys.readouterr()
    assert main(["check", "forecast", "--query", Q, "--forecast", str(bad), "--history", str(root), "--quiet"]) == 1
    out = capsys.readouterr().out.strip()
    assert re.fullmatch(r"gate forecast \(tpcds_returns_by_address\): FAILED, \d+ expectations checked", out)
    assert main(["check", "forecast", "--query", Q, "--forecast", str(bad), "--history", str(root)]) == 1
    assert "forecast.gamma_finite failed on 1 row: gamma[cu][sr]@2026-01-01T00:12:00Z = NaN" in capsys.readouterr().out


def test_partitioning_option(seed_query, tmp_path, capsys):
    """--partitioning: the key groups every cycle must hold (a number, 'none', a JSON rule or a plan file)."""
    root = write_history(history(seed_query, 12), tmp_path / "stats")  # group 0 only
    base = ["check", "stats", "--query", Q, "--history", str(root), "--from", cycle_iso(10), "--to", cycle_iso(12)]
    assert main(base + ["--partitioning", "none"]) == 0
    capsys.readouterr()
    rule = {"method": "hash", "attr_class": "c0", "groups": 2}
    plan = make_plan(seed_query, {0: orders_from_permutation(seed_query, ["cu", "sr", "wr", "cr"]),
                                  1: orders_from_permutation(seed_query, ["cr", "wr", "sr", "cu"])}, "pmjoin",
                     partitioning=rule)
    for value in ("2", json.dumps(rule), str(plan.save(tmp_path / "plan.json"))):
        assert main(base + ["--partitioning", value]) == 1, value
        assert f"stats.every_stream_present failed on 8 rows: [cu]@{cycle_iso(10)} g1 missing" in capsys.readouterr().out
    fc = snapshot(seed_query, cycle_iso(12), kind="forecast", seed=3).save(tmp_path / "fc.json")
    assert main(["check", "forecast", "--query", Q, "--forecast", str(fc), "--history", str(root),
                 "--partitioning", "2"]) == 1
    assert "forecast.every_edge_present failed on 12 rows" in capsys.readouterr().out
    assert main(base + ["--partitioning", "{oops"]) == 2
    assert "--partitioning '{oops'" in capsys.readouterr().err
    assert main(base + ["--partitioning", '{"method": "zigzag"}']) == 2
    assert "defines no key groups" in capsys.readouterr().err


def test_plan_no_change_and_registry(seed_query, lake, tmp_path, capsys):
    a = make_plan(seed_query, orders_from_permutation(seed_query, ["cu", "sr", "wr", "cr"]), "x", estimated_cost=10.0)
    b = make_plan(seed_query, orders_from_permutation(seed_query, ["wr", "sr", "cu", "cr"]), "y", estimated_cost=9.8)
    pa_, pb = a.save(tmp_path / "a.json"), b.save(tmp_path / "b.json")
    assert main(["check", "plan", "--query", Q, "--plan", str(pb)]) == 0  # first deploy
    capsys.readouterr()
    assert main(["check", "plan", "--query", Q, "--plan", str(pb), "--active", str(pa_)]) == 0
    out = capsys.readouterr().out
    assert "no change" in out and "plan.improves_on_active" in out and "improvement 2.00%" in out
    assert main(["check", "plan", "--query", Q, "--plan", str(pb), "--active", str(pa_),
                 "--set", "improvement_threshold=0.01"]) == 0
    assert "passed" in capsys.readouterr().out
    reg = PlanRegistry(lake, Q)
    reg.activate(reg.publish(a))
    out_json = tmp_path / "plan.json"
    assert main(["check", "plan", "--query", Q, "--plan", str(pb), "--lake", lake.root, "--json", str(out_json)]) == 0
    doc = json.loads(out_json.read_text())
    assert doc["status"] == "no_change" and doc["details"]["active_version"] == 1
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**b.to_json(), "query": "another"}))
    assert main(["check", "plan", "--query", Q, "--plan", str(other)]) == 1
    assert "plan.for_this_query failed" in capsys.readouterr().out


def test_user_errors_exit_2(seed_query, tmp_path, capsys):
    assert main(["check", "plan", "--query", Q, "--plan", str(tmp_path / "nope.json")]) == 2
    assert main(["check", "stats", "--query", Q, "--history", str(tmp_path), "--from", cycle_iso(0), "--to",
                 cycle_iso(1), "--set", "min_histroy=3"]) == 2
    assert "unknown gate setting(s) min_histroy" in capsys.readouterr().err
    assert main(["check", "stats", "--query", "no_such_query", "--history", str(tmp_path), "--from", "0", "--to", "1"]) == 2
    capsys.readouterr()
    assert main(["check", "stats", "--query", Q, "--history", str(tmp_path), "--from", "noon", "--to", "1"]) == 2
    assert "--from: 'noon' is not a time" in capsys.readouterr().err
    assert main(["check", "input", "--query", Q, "--lake", str(tmp_path), "--from", "0", "--to", "60",
                 "--cycle", "0s"]) == 2
    capsys.readouterr()
    assert main(["check", "input", "--query", Q, "--lake", str(tmp_path / "typo"), "--from", "0", "--to", "60"]) == 2
    assert "no landed streams there" in capsys.readouterr().err


def test_subprocess_exit_code(seed_query, tmp_path):
    """The real entry point, as the docs show it."""
    a = make_plan(seed_query, orders_from_permutation(seed_query, ["cu", "sr", "wr", "cr"]), "x", estimated_cost=1.0)
    doc = a.to_json()
    doc["groups"][0]["orders"]["cr"] = doc["groups"][0]["orders"]["cr"][:1]
    p = tmp_path / "p.json"
    p.write_text(json.dumps(doc))
    env = {**os.environ, "PYTHONPATH": str(INCLUDE)}
    proc = subprocess.run([sys.executable, "-m", "mjoin", "check", "plan", "--query", Q, "--plan", str(p)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "plan.every_stream_has_complete_order failed on 1 row: order[cr] g0 = [cr,cu]" in proc.stdout
