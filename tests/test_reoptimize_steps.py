"""The re-optimization steps outside Airflow: params and gate thresholds, dry run and no change,
outcomes, and the continuous-mode deploy -> await_switch against a real streaming join job
(the shared local SparkSession, a real lake, the real registry and job control files)."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import threading
import time

import pytest

from mjoin.runtime import fsutil
from mjoin.gates.config import GateConfig, GateConfigError
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.lake.registry import PlanRegistry
from mjoin.loop.config import LoopConfig, NoChange, StepFailed
from mjoin.loop.deploy import await_switch, deploy
from mjoin.loop.replan import check_plan, optimize
from mjoin.loop.outcome import record

QUERY = "tpcds_returns_by_address"
T_END = "2026-01-01T00:05:00Z"


def ctx_for(tmp, name: str, cfg: LoopConfig) -> dict:
    folder = os.path.join(str(tmp), "runs", name)
    os.makedirs(folder, exist_ok=True)
    return {"query": QUERY, "start": "2026-01-01T00:04:00Z", "end": T_END, "run_dir": folder,
            "namespace": cfg.namespace, "lake": cfg.lake, "mode": cfg.mode}


def write_candidate(query, ctx: dict, perm) -> None:
    make_plan(query, orders_from_permutation(query, perm), "fixed").save(os.path.join(ctx["run_dir"], "candidate_plan.json"))


# ---- params: gates, thresholds, backfill ---------------------------------------------------------

def test_one_improvement_threshold_gates_wins_and_default_comes_from_gate_config(tmp_path):
    base = {"query": QUERY, "lake": str(tmp_path)}
    assert LoopConfig.from_params(base).improvement_threshold == GateConfig().improvement_threshold
    assert LoopConfig.from_params({**base, "improvement_threshold": 0.2}).gate_config().improvement_threshold == 0.2
    both = LoopConfig.from_params({**base, "improvement_threshold": 0.2, "gates": {"improvement_threshold": 0.4}})
    assert both.improvement_threshold == 0.4 and both.gate_config().improvement_threshold == 0.4
    other = LoopConfig.from_params({**base, "gates": {"min_history": 3, "null_key_fraction_max": "0.3"}})
    assert other.gate_config().min_history == 3 and other.gate_config().null_key_fraction_max == 0.3


def test_unknown_or_bad_gate_settings_are_rejected_with_a_clear_message(tmp_path):
    base = {"query": QUERY, "lake": str(tmp_path)}
    with pytest.raises(GateConfigError, match="unknown gate setting.*null_fraction.*known: null_key_fraction_max"):
        LoopConfig.from_params({**base, "gates": {"null_fraction": 0.2}})
    with pytest.raises(GateConfigError, match="min_history"):
        LoopConfig.from_params({**base, "gates": {"min_history": "many"}})
    with pytest.raises(GateConfigError, match="improvement_threshold"):
        LoopConfig.from_params({**base, "improvement_threshold": 1.5})
    with pytest.raises(ValueError, match="gates must be an object"):
        LoopConfig.from_params({**base, "gates": [1, 2]})


def test_dag_param_lists_match_the_library():
    from mjoin.evaluation import evaluate
    from mjoin.loop.params import EVAL_STRATEGY_NAMES, REOPTIMIZE_PARAMS, STRATEGY_NAMES
    from mjoin.optimizer.strategies import STRATEGIES

    assert list(STRATEGY_NAMES) == list(STRATEGIES)
    assert list(EVAL_STRATEGY_NAMES) == list(evaluate.STRATEGIES)
    default, *_ = REOPTIMIZE_PARAMS["improvement_threshold"]
    assert default is None  # the value lives in GateConfig only


def test_backfill_forces_cycle_mode_in_the_evaluation_namespace(tmp_path):
    cfg = LoopConfig.from_params({"query": QUERY, "lake": str(tmp_path), "mode": "continuous"}, run_type="backfill")
    assert (cfg.mode, cfg.namespace) == ("cycle", "eval/backfill")
    live = LoopConfig.from_params({"query": QUERY, "lake": str(tmp_path), "mode": "continuous"}, run_type="scheduled")
    assert (live.mode, live.namespace) == ("continuous", "")


def test_spark_env_puts_spark_submit_first_on_path(monkeypatch):
    from mjoin.loop.params import spark_env

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = spark_env()
    first = env["PATH"].split(os.pathsep)[0]
    assert os.access(os.path.join(first, "spark-submit"), os.X_OK), env
    assert env["PATH"].endswith("/usr/bin:/bin")


# ---- optimize -> plan gate -> deploy: no change, dry run, thresholds ----------------------------------

@pytest.fixture
def optimized(tmp_path, seed_query):
    """A run folder with a forecast and the exact optimizer's candidate (no Spark)."""
    from mjoin.optimizer.synthetic import random_statistics

    def make(name: str, **params):
        cfg = LoopConfig.from_params({"query": QUERY, "lake": str(tmp_path / "lake"), **params}, run_id=f"manual__{name}")
        ctx = ctx_for(tmp_path, name, cfg)
        random_statistics(seed_query, random.Random(11)).save(os.path.join(ctx["run_dir"], "forecast.json"))
        optimize(cfg, ctx)
        return cfg, ctx

    return make


def test_dry_run_optimizes_and_gates_but_does_not_deploy(optimized):
    cfg, ctx = optimized("dry", dry_run=True)
    gate = check_plan(cfg, ctx)
    assert gate["status"] == "passed" and gate["active_version"] is None  # first plan: would deploy
    with pytest.raises(NoChange, match="dry run"):
        deploy(cfg, ctx, gate)
    reg = PlanRegistry(cfg.lake_, QUERY)
    assert reg.versions() == [] and reg.active_version() is None
    out = record(cfg, ctx, {"check_plan": "success", "deploy": "skipped", "await_switch": "skipped"})
    assert (out["status"], out["version"], out["deployed"], out["gates"]["plan"]) == ("dry_run", None, False, "passed")


def test_no_change_uses_and_prints_the_threshold_of_the_gates_param(optimized):
    cfg, ctx = optimized("first")
    deploy(cfg, ctx, check_plan(cfg, ctx))  # v1 active
    # the same forecast again: the candidate equals v1 (improvement 0) -> below any positive threshold
    cfg2, ctx2 = optimized("again", improvement_threshold=0.01, gates={"improvement_threshold": 0.37})
    gate = check_plan(cfg2, ctx2)
    assert gate["status"] == "no_change" and gate["threshold"] == 0.37 and gate["active_version"] == 1
    with pytest.raises(NoChange, match=r"threshold 37\.0% \(estimated improvement 0\.0%\)"):
        deploy(cfg2, ctx2, gate)
    out = record(cfg2, ctx2, {"check_plan": "success", "deploy": "skipped", "await_switch": "skipped"})
    assert (out["status"], out["version"], out["active_version"], out["threshold"]) == ("no_change", None, 1, 0.37)


def test_failing_plan_gate_stops_before_deploy_and_keeps_the_active_plan(optimized, two_class_query):
    cfg, ctx = optimized("good")
    deploy(cfg, ctx, check_plan(cfg, ctx))  # v1 active
    cfg2, ctx2 = optimized("other_query")
    write_candidate(two_class_query, ctx2, ["sr", "cu", "wr", "cr"])  # a plan of another query
    with pytest.raises(StepFailed, match="plan gate failed: plan.for_this_query"):
        check_plan(cfg2, ctx2)
    gate = json.loads(open(os.path.join(ctx2["run_dir"], "gate_plan.json")).read())
    assert gate["status"] == "failed" and [f["expectation"] for f in gate["failures"]] == ["plan.for_this_query"]
    out = record(cfg2, ctx2, {"check_plan": "failed", "deploy": "upstream_failed", "await_switch": "upstream_failed"})
    assert (out["status"], out["version"], out["active_version"]) == ("failed", None, 1)
    assert PlanRegistry(cfg2.lake_, QUERY).versions() == [1]


# ---- outcomes: one file per run, concurrent recorders ------------------------------------------

def _record_many(lake_root: str, k: int, n: int) -> None:
    cfg = LoopConfig(query=QUERY, lake=lake_root, run_id=f"r{k}")
    for i in range(n):
        end = f"2026-01-01T{k:02d}:{i:02d}:00Z"
        folder = fsutil.join(cfg.lake_.reports(QUERY), "runs", f"2026010{1}T{k:02d}{i:02d}00Z")
        fsutil.makedirs(folder)
        record(cfg, {"start": end, "end": end, "run_dir": folder}, {"deploy": "skipped"})


def test_two_runs_recording_at_once_lose_no_outcome(tmp_path):
    from mjoin.loop.ui import read_outcomes

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_record_many, args=(str(tmp_path), k, 12)) for k in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs)
    rows = read_outcomes(Lake(str(tmp_path)), QUERY)
    assert len(rows) == 24 and {r["run_id"] for r in rows} == {"r1", "r2"}
    assert [r["interval_end"] for r in rows] == sorted(r["interval_end"] for r in rows)
    assert [r["interval_end"] for r in read_outcomes(Lake(str(tmp_path)), QUERY, limit=3)] == \
        [r["interval_end"] for r in rows[-3:]]


# ---- continuous mode: deploy -> await_switch ---------------------------------------------------------

def continuous_cfg(lake_root, name: str, timeout: float) -> LoopConfig:
    return LoopConfig(query=QUERY, lake=str(lake_root), mode="continuous", deploy_timeout=timeout, run_id=f"test__{name}")


def test_await_switch_fails_fast_when_no_job_runs(tmp_path, seed_query):
    cfg = continuous_cfg(tmp_path / "lake", "never", timeout=120)
    ctx = ctx_for(tmp_path, "never", cfg)
    write_candidate(seed_query, ctx, ["cu", "sr", "wr", "cr"])
    deployed = deploy(cfg, ctx, {"status": "passed", "active_version": None})
    t0 = time.monotonic()
    with pytest.raises(StepFailed, match=r"not running \(never started\).*v1 stays active"):
        await_switch(cfg, ctx, deployed, poll=0.2)
    assert time.monotonic() - t0 < 10  # not the whole timeout
    assert PlanRegistry(cfg.lake_, QUERY).active_version() == 1
    assert json.loads(open(os.path.join(ctx["run_dir"], "switch.json")).read())["outcome"] == "not_running"


class RunningJob:
    """The streaming join job in a thread of this process, and a stage of arrival cycles to land."""

    def __init__(self, spark, query, root):
        from engine_helpers import TPCDS_TABLES, replay_tpcds

        self.spark, self.query = spark, query
        self.stage = Lake(str(root / "stage"))
        replay_tpcds(self.stage, 0.01)
        self.tables = TPCDS_TABLES
        self.arrivals = sorted({a for t in TPCDS_TABLES for a in self.stage.arrivals(t)})
        self.lake = Lake(str(root / "lake"))
        self.next = 0
        self.errors: list = []
        self.thread = None

    def land(self, n: int = 1) -> None:
        for a in self.arrivals[self.next:self.next + n]:
            for t in self.tables:
                for f in self.stage.stream_files(t, a, a + 1):
                    dst = self.lake.stream_file(t, a)
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    shutil.copy2(f, dst + ".tmp")
                    os.replace(dst + ".tmp", dst)  # the file source never sees a half-written file
        self.next += n

    def start(self) -> None:
        from mjoin.engine.runs import run_stream

        def run():
            try:
                run_stream(self.spark, self.query, self.lake, trigger="processingTime", interval=1.0)
            except Exception as exc:  # reported by the fixture
                self.errors.append(exc)

        self.thread = threading.Thread(target=run, name="join-job", daemon=True)
        self.thread.start()

    def stop(self) -> dict:
        from mjoin.engine.control import JobControl

        control = JobControl(self.lake, self.query.name)
        control.request_stop(by="test", reason="end of test")
        st = control.wait_stopped(timeout=120)
        self.thread.join(timeout=120)
        return st


@pytest.fixture(scope="module")
def job(spark, seed_query, tmp_path_factory):
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.control import JobControl

    j = RunningJob(spark, seed_query, tmp_path_factory.mktemp("continuous"))
    j.land(2)
    j.start()
    try:
        assert JobControl(j.lake, seed_query.name).wait_running(timeout=120)["running"], j.errors
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not fsutil.listdir(j.lake.metrics(seed_query.name)):
            time.sleep(0.5)
        assert read_metrics(j.lake, seed_query.name), "the job ran no batch"
        yield j
    finally:
        if j.thread.is_alive():
            j.stop()
        for q in spark.streams.active:  # never leak a query into other tests
            q.stop()
    assert not j.errors, j.errors


def settle(job, quiet: float = 4.0, timeout: float = 120.0) -> None:
    """Wait until the job has processed everything landed (no new batch for ``quiet`` seconds)."""
    from mjoin.engine.control import JobControl

    control = JobControl(job.lake, QUERY)
    last, since, deadline = None, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = control.status().get("last_batch_id")
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(0.5)
    raise AssertionError("the job kept running batches")


def land_while_waiting(job, n: int, delay: float = 1.0):
    t = threading.Timer(delay, job.land, args=(n,))
    t.start()
    return t


def test_await_switch_returns_once_a_batch_runs_the_new_version(job, tmp_path, seed_query):
    cfg = continuous_cfg(job.lake.root, "switch", timeout=120)
    ctx = ctx_for(tmp_path, "switch", cfg)
    write_candidate(seed_query, ctx, ["cr", "wr", "sr", "cu"])
    deployed = deploy(cfg, ctx, {"status": "passed", "active_version": None})
    assert deployed["version"] == 1 and deployed["job"]["running"] and deployed["job"]["last_batch_id"] is not None
    timer = land_while_waiting(job, 1)
    out = await_switch(cfg, ctx, deployed, poll=0.5)
    timer.join()
    assert out["outcome"] == "switched" and out["version"] == 1 and out["batch_id"] > deployed["job"]["last_batch_id"]
    from mjoin.engine.metrics import read_metrics

    rec = next(m for m in read_metrics(job.lake, QUERY) if m["batch_id"] == out["batch_id"])
    assert rec["plan_version"] == 1 and rec["plan_switch"]["to"] == 1
    outcome = record(cfg, ctx, {"deploy": "success", "await_switch": "success"})
    assert (outcome["status"], outcome["version"], outcome["active_version"]) == ("deployed", 1, 1)


def test_await_switch_times_out_rolls_back_and_record_says_rolled_back(job, tmp_path, seed_query):
    """No data lands, so no batch runs the new version: roll back after the timeout, fail loudly."""
    settle(job)
    cfg = continuous_cfg(job.lake.root, "timeout", timeout=4)
    ctx = ctx_for(tmp_path, "timeout", cfg)
    write_candidate(seed_query, ctx, ["sr", "cu", "wr", "cr"])
    deployed = deploy(cfg, ctx, {"status": "passed", "active_version": 1})
    assert deployed["version"] == 2
    t0 = time.monotonic()
    with pytest.raises(StepFailed, match=r"did not switch to v2 within 4 s.*rolled back to v1"):
        await_switch(cfg, ctx, deployed, poll=0.5)
    assert 4 <= time.monotonic() - t0 < 30
    reg = PlanRegistry(job.lake, QUERY)
    assert reg.active_version() == 1 and reg.activations()[-1]["action"] == "rollback"
    outcome = record(cfg, ctx, {"deploy": "success", "await_switch": "failed"})
    assert (outcome["status"], outcome["version"], outcome["previous"], outcome["active_version"]) == \
        ("rolled_back", 2, 1, 1)
    assert outcome["deployed"] is False and outcome["switch"]["rolled_back_to"] == 1
    assert outcome["changes"] == reg.get(2).diff(reg.get(1)) and outcome["changes"]


def test_await_switch_rolls_back_when_the_job_cannot_load_the_new_plan(job, tmp_path, seed_query):
    cfg = continuous_cfg(job.lake.root, "plan_error", timeout=120)
    ctx = ctx_for(tmp_path, "plan_error", cfg)
    write_candidate(seed_query, ctx, ["wr", "cr", "cu", "sr"])
    deployed = deploy(cfg, ctx, {"status": "passed", "active_version": 1})
    v = deployed["version"]
    reg = PlanRegistry(job.lake, QUERY)
    with open(os.path.join(reg.root, f"v{v:06d}.json"), "w") as f:
        f.write('{"query": "broken')  # the version file is damaged after publishing
    timer = land_while_waiting(job, 1)
    t0 = time.monotonic()
    with pytest.raises(StepFailed, match=rf"cannot run v{v} .*rolled back to v1"):
        await_switch(cfg, ctx, deployed, poll=0.5)
    timer.join()
    assert time.monotonic() - t0 < 90 and reg.active_version() == 1
    assert json.loads(open(os.path.join(ctx["run_dir"], "switch.json")).read())["reason"] == "plan_error"


def test_await_switch_never_undoes_a_manual_activation_made_meanwhile(job, tmp_path, seed_query):
    settle(job)
    cfg = continuous_cfg(job.lake.root, "manual", timeout=5)
    ctx = ctx_for(tmp_path, "manual", cfg)
    write_candidate(seed_query, ctx, ["cu", "wr", "sr", "cr"])
    deployed = deploy(cfg, ctx, {"status": "passed", "active_version": 1})
    reg = PlanRegistry(job.lake, QUERY)
    operator = threading.Timer(1.0, reg.activate, args=(2,), kwargs={"by": "operator", "reason": "manual"})
    operator.start()
    with pytest.raises(StepFailed, match=rf"did not switch to v{deployed['version']}.*not rolled back: the active "
                                         r"version is v2"):
        await_switch(cfg, ctx, deployed, poll=0.5)
    operator.join()
    assert reg.active_version() == 2 and reg.activations()[-1]["by"] == "operator"


def test_await_switch_fails_fast_when_the_job_has_stopped(job, tmp_path, seed_query):
    st = job.stop()
    assert not st["running"] and st["state"] == "stopped"
    cfg = continuous_cfg(job.lake.root, "stopped", timeout=120)
    ctx = ctx_for(tmp_path, "stopped", cfg)
    write_candidate(seed_query, ctx, ["cr", "sr", "wr", "cu"])
    deployed = deploy(cfg, ctx, {"status": "passed", "active_version": 2})
    t0 = time.monotonic()
    with pytest.raises(StepFailed, match=r"not running \(stopped"):
        await_switch(cfg, ctx, deployed, poll=0.5)
    assert time.monotonic() - t0 < 10
    assert PlanRegistry(job.lake, QUERY).active_version() == deployed["version"]


# ---- calibration before optimizing (last: it writes the live cost model into the job's lake) -------

def test_calibrate_step_fits_the_live_jobs_metrics_or_keeps_the_previous_model(job, tmp_path, seed_query):
    from mjoin.optimizer.cost import CostModel
    from mjoin.loop.replan import calibrate, cost_model_path

    def cfg_for(**params):
        return LoopConfig.from_params({"query": QUERY, "lake": job.lake.root, **params})

    # skipped: explicit model, evaluation namespace, switched off; nothing written to the live lake
    for params, why in (({"cost_model": str(tmp_path / "given.json")}, "explicit cost_model"),
                        ({"namespace": "eval/x"}, "evaluation namespace"), ({"calibrate": False}, "off")):
        doc = calibrate(cfg_for(**params), seed_query, str(tmp_path))
        assert doc["status"] == "skipped" and why in doc["reason"]
    live_model = fsutil.join(job.lake.plans(QUERY), "cost_model.json")
    assert not fsutil.exists(live_model)

    # a fit that cannot reach the required R^2 keeps the previous model (here: the defaults) and says why
    doc = calibrate(cfg_for(calibration_min_r2=1.01), seed_query, str(tmp_path))
    assert doc["status"] == "kept" and "R^2" in doc["reason"] and doc["cost_model"] == "defaults (uncalibrated)"
    assert not fsutil.exists(live_model)

    # the real job's batches: fitted, written where the optimizer and the plan gate read it, recorded in the run
    doc = calibrate(cfg_for(calibration_min_r2=0.0), seed_query, str(tmp_path))
    assert doc["status"] == "fitted" and doc["records"] > 0 and doc["path"] == live_model
    assert cost_model_path(cfg_for()) == live_model == doc["cost_model"]
    model = CostModel.load(live_model)
    assert model.calibrated and model.alpha_q >= 0 and model.alpha_m >= 0
    assert json.loads(open(tmp_path / "calibration.json").read())["status"] == "fitted"


# ---- runs aligned to cycles, judged on complete data ------------------------------------------------

@pytest.mark.parametrize("logical,start,end", [
    ("2026-01-01T00:05:31.905813Z", "2026-01-01T00:00:30Z", "2026-01-01T00:05:30Z"),  # a scheduled run's date
    ("2026-01-01T00:05:00Z", "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"),  # aligned (demo, backfills)
    ("2026-01-01T00:05:09.999999Z", "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"),
])
def test_interval_is_whole_cycles_ending_at_the_last_boundary(logical, start, end):
    from mjoin.loop.config import interval_for
    from mjoin.model.timeutil import iso, to_epoch

    assert tuple(map(iso, interval_for(logical, 300, 10))) == (start, end)
    assert tuple(map(iso, interval_for(logical, 300))) == (iso(to_epoch(logical) - 300), iso(logical))  # no cycle


def _land_cycles(lake: Lake, query, epochs, skip=()):
    """One 20-row file per stream and cycle (good data), except the (source, epoch) pairs in ``skip``."""
    from test_gates_support import write_stream_file

    for e in epochs:
        for s in query.streams:
            if (s.source, e) not in skip:
                write_stream_file(lake, query, s.name, int(e), 20, seed=int(e) % 1000, cycle=10)


LIVE0 = 1767225600  # 2026-01-01T00:00:00Z


def test_prepare_on_a_live_lake_starts_at_the_first_landed_cycle_and_covers_the_forecast_history(tmp_path, seed_query):
    from mjoin.loop.collect import prepare
    from mjoin.model.timeutil import iso

    lake = Lake(str(tmp_path / "lake"))
    cfg = LoopConfig.from_params({"query": QUERY, "lake": lake.root, "period": 60, "cycle": 10}, run_id="scheduled__a")
    with pytest.raises(StepFailed, match="nothing has landed for tpcds_returns_by_address"):
        prepare(cfg, "2026-01-01T00:01:31.5Z")
    _land_cycles(lake, seed_query, range(LIVE0 + 30, LIVE0 + 200, 10))
    # the feed began at 00:00:30: a run over [00:00:20, 00:01:20) judges [00:00:30, 00:01:20)
    ctx = prepare(cfg, "2026-01-01T00:01:27.123456Z")
    assert (ctx["start"], ctx["end"], ctx["clipped_from"]) == ("2026-01-01T00:00:30Z", "2026-01-01T00:01:20Z",
                                                                "2026-01-01T00:00:20Z")
    assert ctx["skip"] is None and ctx["run_dir"].endswith("runs/20260101T000120Z")
    # no statistics history yet: the stats job covers the landed cycles up to L before the end, from the first
    assert ctx["stats_from"] == "2026-01-01T00:00:30Z"
    assert ctx["stats_args"][ctx["stats_args"].index("--from") + 1] == "2026-01-01T00:00:30Z"
    later = prepare(cfg, iso(LIVE0 + 215.5))
    assert (later["start"], later["end"], later["stats_from"]) == ("2026-01-01T00:02:30Z", "2026-01-01T00:03:30Z",
                                                                   "2026-01-01T00:00:30Z")
    # an interval wholly before the first landed cycle: nothing to judge, a skip with the reason (not a failure)
    early = prepare(cfg, "2026-01-01T00:00:25Z")
    assert "ends before the first landed cycle 2026-01-01T00:00:30Z" in early["skip"]
    from mjoin.loop.collect import check_input

    with pytest.raises(NoChange, match="ends before the first landed cycle"):
        check_input(cfg, early)


def test_check_input_waits_for_the_last_cycle_then_judges_it(tmp_path, seed_query):
    """A scheduled run at ...:31.9 judges [.., :30); the feed lands the cycle [:20, :30) a moment later: the gate
    waits for it (not judging a half-landed cycle), then passes. A sparse source with no folder for the last
    cycle makes it wait for the landing allowance, after which the cycle counts as empty."""
    from mjoin.loop.collect import check_input, prepare

    lake = Lake(str(tmp_path / "lake"))
    cfg = LoopConfig.from_params({"query": QUERY, "lake": lake.root, "period": 60, "cycle": 10, "landing_allowance": 30},
                                 run_id="scheduled__b")
    _land_cycles(lake, seed_query, range(LIVE0, LIVE0 + 80, 10))  # up to the cycle [00:01:10, 00:01:20)
    ctx = prepare(cfg, "2026-01-01T00:01:31.905813Z")  # [00:00:30, 00:01:30)
    now = [LIVE0 + 91.9]
    landed = []

    def sleep(s):  # the wall clock moves; the lander lands the last cycle 1 s after its end
        now[0] += s
        if now[0] >= LIVE0 + 91 and not landed:
            _land_cycles(lake, seed_query, [LIVE0 + 80])
            landed.append(now[0])

    out = check_input(cfg, ctx, clock=lambda: now[0], sleep=sleep)
    assert out["status"] == "passed" and out["completeness"]["complete_by"] == "landed"
    # the next run: web_returns lands nothing in its last cycle (sparse): complete only after the allowance
    _land_cycles(lake, seed_query, range(LIVE0 + 90, LIVE0 + 150, 10), skip={("web_returns", LIVE0 + 140)})
    ctx2 = prepare(cfg, "2026-01-01T00:02:31Z")
    now[0] = LIVE0 + 151.0
    with pytest.raises(StepFailed, match="input.stream_flows_when_expected"):
        check_input(cfg, ctx2, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert now[0] >= LIVE0 + 150 + 30  # waited for the allowance
    gate = json.loads(open(os.path.join(ctx2["run_dir"], "gate_input.json")).read())
    assert [v["where"] for v in gate["failures"][0]["values"]] == ["wr@2026-01-01T00:02:20Z"]  # dense wr: a real gap
    # an interval far in the future is refused at once
    ctx3 = prepare(cfg, "2026-01-01T00:10:00Z")
    with pytest.raises(StepFailed, match="in the future"):
        check_input(cfg, ctx3, clock=lambda: LIVE0 + 200.0, sleep=lambda s: None)


# ---- outcomes of every run, also a failed prepare -----------------------------------------------------

def test_a_run_that_failed_in_prepare_gets_an_outcome_with_the_reason(tmp_path):
    from mjoin.loop.config import fallback_context, lenient_config
    from mjoin.loop.outcome import note_failure
    from mjoin.loop.ui import read_outcomes

    params = {"query": QUERY, "lake": str(tmp_path), "gates": {"null_frac": 0.5}, "period": 60, "cycle": 10}
    cfg, problem = lenient_config(params, run_id="manual__x", run_type="manual")
    assert problem.startswith("invalid params: unknown gate setting(s) null_frac")
    ctx = fallback_context(cfg, "2026-01-01T00:05:31.2Z")
    assert (ctx["start"], ctx["end"]) == ("2026-01-01T00:04:30Z", "2026-01-01T00:05:30Z")
    note_failure(ctx["run_dir"], "prepare", problem)
    out = record(cfg, ctx, {"prepare": "failed", "land": "upstream_failed", "deploy": "upstream_failed"})
    assert out["status"] == "failed" and out["failed_tasks"] == ["prepare", "land", "deploy"]
    assert out["reason"] == problem and out["reasons"] == {"prepare": problem}
    assert [r["reason"] for r in read_outcomes(Lake(str(tmp_path)), QUERY)] == [problem]
    # the run cleared and re-run with good params: the earlier attempt's note is not a reason any more
    again = record(cfg, ctx, {"prepare": "success", "deploy": "skipped"})
    assert (again["status"], again["reason"], again["reasons"]) == ("skipped", None, {})
    # a query that does not load still gets a folder (named after the reference) and an outcome
    bad, why = lenient_config({**params, "query": "no/such_spec.yaml", "cycle": "often"}, run_id="manual__y")
    assert "/reports/such_spec/runs/" in fallback_context(bad, "2026-01-01T00:05:00Z")["run_dir"] and why


def test_a_second_run_over_the_same_interval_keeps_its_own_folder(tmp_path):
    from mjoin.loop.config import run_dir

    a = LoopConfig(query=QUERY, lake=str(tmp_path), run_id="scheduled__1")
    b = LoopConfig(query=QUERY, lake=str(tmp_path), run_id="manual__2026-01-01T00:05:33+00:00")
    first = run_dir(a, QUERY, T_END)
    fsutil.makedirs(first)
    fsutil.atomic_write_text(fsutil.join(first, "context.json"), json.dumps({"config": {"run_id": a.run_id}}))
    assert run_dir(a, QUERY, T_END) == first  # a retry keeps its folder
    second = run_dir(b, QUERY, T_END)
    assert second != first and second.startswith(first + ".manual__2026-01-01T00_05_33_00_00")


# ---- trigger-time checks ----------------------------------------------------------------------------

def test_unknown_params_are_named_and_the_query_param_is_a_choice():
    from mjoin.loop.params import REOPTIMIZE_PARAMS, query_choices
    from mjoin.model.query import list_queries
    from mjoin.loop.trigger_checks import trigger_target, unknown_params

    assert set(list_queries()) <= set(query_choices())
    assert REOPTIMIZE_PARAMS["query"][2]["enum"] == query_choices()
    body = json.dumps({"logical_date": None, "conf": {"qurey": "x", "dry_run": True}}).encode()
    dag_id, conf = trigger_target("/api/v2/dags/mjoin_reoptimize/dagRuns", body)
    msg = unknown_params(dag_id, conf, REOPTIMIZE_PARAMS)
    assert msg.startswith("unknown param(s) qurey for mjoin_reoptimize; its params are:") and "dry_run" in msg
    assert unknown_params(dag_id, {"dry_run": True}, REOPTIMIZE_PARAMS) is None
    assert trigger_target("/api/v2/backfills", json.dumps({"dag_id": "d", "dag_run_conf": {"a": 1}}).encode()) == \
        ("d", {"a": 1})
    assert trigger_target("/api/v2/dags/d/clearTaskInstances", body) is None
    assert trigger_target("/api/v2/dags/d/dagRuns", b"not json") is None


def test_evaluate_over_a_range_without_data_is_a_clear_error(tmp_path, seed_query, capsys):
    from mjoin.cli import main
    from mjoin.evaluation.evaluate import EvalConfig, EvaluationError, check_has_data

    lake = Lake(str(tmp_path / "lake"))
    _land_cycles(lake, seed_query, [LIVE0, LIVE0 + 10])
    cfg = EvalConfig(query=QUERY, lake=lake.root, start="2026-02-01T00:00:00Z", end="2026-02-01T00:30:00Z")
    with pytest.raises(EvaluationError, match=r"no data to evaluate in \[2026-02-01T00:00:00Z, 2026-02-01T00:30:00Z\).*"
                                              r"arrival cycles from 2026-01-01T00:00:00Z to 2026-01-01T00:00:10Z"):
        check_has_data(cfg)
    assert check_has_data(EvalConfig(query=QUERY, lake=lake.root, start="2026-01-01T00:00:00Z",
                                     end="2026-01-01T00:01:00Z"))["store_returns"] == 2
    rc = main(["evaluate", "--query", QUERY, "--lake", lake.root, "--from", "2026-02-01T00:00:00Z",
               "--to", "2026-02-01T00:30:00Z"])
    assert rc == 2 and "error: no data to evaluate" in capsys.readouterr().err


def test_continuous_check_input_reports_what_the_job_quarantined_since_the_last_run(tmp_path, seed_query):
    """In continuous mode the running job enforces the landing contract; check_input says what it quarantined
    (rows by reason, files by rule) in the batches since the previous run reported, from its metrics."""
    from mjoin.engine.metrics import write_record
    from mjoin.loop.collect import check_input, prepare

    lake = Lake(str(tmp_path / "lake"))
    cfg = LoopConfig.from_params({"query": QUERY, "lake": lake.root, "period": 60, "cycle": 10, "mode": "continuous"},
                                 run_id="scheduled__q")
    _land_cycles(lake, seed_query, range(LIVE0, LIVE0 + 90, 10))
    zero = {s: {} for s in seed_query.stream_names}

    def batch(b, **quarantined):
        write_record(lake.metrics(seed_query.name), {"batch_id": b, "quarantined": dict(zero, **quarantined),
                                                     "quarantined_files": [{"path": "x.parquet", "rule": "input.files_readable",
                                                                            "reason": "unreadable"}] if b == 1 else []})

    batch(0, sr={"null_key": 3})
    batch(1, sr={"null_key": 2, "unreadable": 0}, wr={"late": 4})
    ctx = prepare(cfg, "2026-01-01T00:01:31Z")
    out = check_input(cfg, ctx, clock=lambda: LIVE0 + 200.0, sleep=lambda s: None)
    assert out["job_quarantine"] == {"batches": [0, 1], "rows": 9, "by_stream": {"sr": {"null_key": 5}, "wr": {"late": 4}},
                                     "files": 1}
    assert json.loads(open(os.path.join(ctx["run_dir"], "job_quarantine.json")).read())["files"][0]["rule"] == \
        "input.files_readable"
    batch(2, cr={"bad_time": 1})
    ctx2 = prepare(cfg, "2026-01-01T00:01:32Z")
    out2 = check_input(cfg, ctx2, clock=lambda: LIVE0 + 200.0, sleep=lambda s: None)
    assert out2["job_quarantine"]["batches"] == [2, 2] and out2["job_quarantine"]["by_stream"] == {"cr": {"bad_time": 1}}


# ---- the forecast step: Holt kept within the forecast gate's range -------------------------------

@pytest.mark.parametrize("bound", [True, False])
def test_forecast_step_records_the_series_replaced_by_the_last_value(tmp_path, seed_query, bound, holt_global_fit):
    """A history whose cu and sr rates step up in the last cycles (tests/test_forecast.py): the DAG's forecast step
    replaces their overshooting Holt values by the last value, says how many in its result and the forecast's
    report, and the forecast gate step passes; with ``forecast_bound`` off the gate fails as before."""
    import pandas as pd

    from mjoin.loop.replan import check_forecast, forecast
    from mjoin.loop.config import stats_root
    from mjoin.stats.history import write_cycle
    from test_forecast import T0, TAU, step_history

    cfg = LoopConfig.from_params({"query": QUERY, "lake": str(tmp_path), "length": 40, "forecast_bound": bound})
    assert cfg.forecast_bound is bound
    hist = step_history(seed_query)
    for cyc, rows in hist.groupby("cycle_start"):
        write_cycle(stats_root(cfg), QUERY, cyc, rows.assign(cycle_start=cyc.strftime("%Y-%m-%dT%H:%M:%SZ")),
                    meta={"partitioning": None})
    end = T0 + pd.Timedelta(seconds=TAU * 40)
    ctx = {**ctx_for(tmp_path, f"bound-{bound}", cfg), "start": (end - pd.Timedelta(minutes=1)).isoformat(),
           "end": end.strftime("%Y-%m-%dT%H:%M:%SZ")}
    out = forecast(cfg, ctx)
    assert out["forecast_bound"] is bound and out["history"]["as_stored"] == 40
    report = json.loads(open(os.path.join(ctx["run_dir"], "forecast_report.json")).read())["report"]
    replaced = sorted(f"{r['stream']}/{r['statistic']}" for r in report if r["out_of_range"])
    if bound:
        assert out["out_of_range"] == 2 and out["out_of_range_series"] == ["0/cu/lambda", "0/sr/lambda"]
        assert replaced == ["cu/lambda", "sr/lambda"] and out["methods"]["last_value"] >= 2
        assert check_forecast(cfg, ctx)["status"] == "passed"
    else:
        assert out["out_of_range"] == 0 and replaced == []
        with pytest.raises(StepFailed, match="near_recent_history"):
            check_forecast(cfg, ctx)


def test_forecast_bound_is_a_dag_param_of_the_loop_config():
    from dataclasses import fields

    from mjoin.loop.params import REOPTIMIZE_PARAMS

    default, typ, _, doc = REOPTIMIZE_PARAMS["forecast_bound"]
    assert default is True and typ == "boolean" and "last value" in doc
    assert {f.name: f.default for f in fields(LoopConfig)}["forecast_bound"] is True
