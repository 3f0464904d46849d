"""Benchmark: the Spark path's two input readers side by side in one process (the engine-throughput goals): the seed run at sf 1 with
``normalize.scan_streams`` (default) and with Spark's file source (``MJOIN_SPARK_SCAN=0``), alternating, 3 each after
a warm-up of each; per run the wall, ``prepare_seconds``, the driver's contract checks and the input stage's Spark
metrics (tasks, wall, task seconds, JVM CPU: the Python workers' CPU is not in it, shuffle bytes written).

    flock /tmp/mjoin-bench.lock nice -n 5 .venv/bin/python bench/scale/ab_scan.py  # job: /tmp/h30/job.json

Prints JSON lines and a SUMMARY; writes /tmp/h30/prof.json (results/scan-vs-sql-h30-sf1.json adds machine,
versions, commit)."""
import json, os, shutil, statistics, time
from mjoin.engine.config import EngineConfig
from mjoin.engine.runs import run_interval
from mjoin.model.plan import load_plan
from mjoin.model.query import load_query
from mjoin.runtime.resources import Resources
from mjoin.runtime.spark import get_spark
job = json.load(open("/tmp/h30/job.json"))
q = load_query(job["query"]); plan = load_plan(job["plan"], q)
spark = get_spark("h30-prof", Resources(spark_master="local[2]", shuffle_partitions=4), conf={"spark.driver.memory": "6g"})
cfg = EngineConfig(buckets=4, driver_rows=0, interval_driver_rows=0)
out = "/tmp/h30/prof-out"
rows = []
def one(mode, timed):
    os.environ["MJOIN_SPARK_SCAN"] = "1" if mode == "scan" else "0"
    shutil.rmtree(out, ignore_errors=True)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    s = run_interval(spark, q, plan, job["lake"], job["start"], job["end"], 10, out, config=cfg)
    wall = time.perf_counter() - t0
    st = [x for x in s.extra["phases"]["spark_stages"] if x["kind"] == "input"][0]
    r = {"mode": mode, "wall": wall, "prepare": s.prepare_seconds, "contract_checks_driver": s.extra["phases"]["contract_checks_driver"],
         "input_stage": st, "load": load, "rows": s.result_rows}
    if timed:
        rows.append(r)
    print(json.dumps(r), flush=True)
for m in ("scan", "sql"):
    one(m, False)
for i in range(3):
    for m in (("scan", "sql") if i % 2 == 0 else ("sql", "scan")):
        one(m, True)
summ = {}
for m in ("scan", "sql"):
    rs = [r for r in rows if r["mode"] == m]
    med = lambda f: statistics.median(f(r) for r in rs)
    summ[m] = {"wall": med(lambda r: r["wall"]), "prepare": med(lambda r: r["prepare"]),
               "input_stage_wall": med(lambda r: r["input_stage"]["wall_seconds"]),
               "input_task_seconds": med(lambda r: r["input_stage"]["task_seconds"]),
               "input_task_cpu_seconds": med(lambda r: r["input_stage"]["task_cpu_seconds"]),
               "input_tasks": med(lambda r: r["input_stage"]["tasks"]),
               "shuffle_write_bytes": med(lambda r: r["input_stage"]["shuffle_write_bytes"])}
print("SUMMARY", json.dumps(summ))
json.dump({"runs": rows, "summary": summ, "load_after": os.getloadavg()}, open("/tmp/h30/prof.json", "w"), indent=1)
spark.stop()
