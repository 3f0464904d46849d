"""Benchmark: what only writing the results costs at sf 10 (the goal: sf 10 in at most 0.5x DuckDB's time).

    MJOIN_CACHE=... flock /tmp/mjoin-bench.lock nice -n 5 .venv/bin/python bench/scale/write_floor.py \
        --sf 10 --density dense --work /tmp/scale-work

At sf 10 the dense replay's seed query has ~86 M result rows, and both mjoin (26-30 s) and DuckDB's one-shot
query (18-23 s) spend most of their time making and writing them (docs/engine.md). This measures the floor
that writing alone sets, in one process on the same landed data as ``bench_scale.py``:

- ``duckdb_query``: the one-shot reference query (``bench_scale.duckdb_copy``: ``COPY (<query>) TO parquet``,
  2 threads, zstd), once more, its file kept; the rows are then read into memory (not timed) with the engine's
  result column types;
- ``engine_write``: the engine's writer on those rows with nothing else to do: the rows cut into files of
  ``results.FLUSH_ROWS`` rows (what a task's ``RowFiles`` writes), ``results.write_parquet`` (zstd) on 2
  threads (the 2 operator tasks of ``local[2]``); without the engine's ``_batch`` column, so a lower bound;
- ``duckdb_write``: DuckDB writing the same in-memory rows (``COPY (SELECT * FROM rows) TO parquet``, zstd,
  2 threads): the reference's own cost of writing them.

Rounds alternate the two writes. The goal "engine wall at most 0.5x the DuckDB one-shot query at sf 10" can
only be met if ``engine_write`` is well below half of ``duckdb_query``. Writes
``results/write-floor-sf<sf>-<density>.json`` (machine, load, versions, git commit, parameters).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_scale as B  # noqa: E402  (puts include/ and tests/ on sys.path)


def duckdb_query(landed: Path, span, out: Path, spill: Path) -> tuple[float, Path]:
    """The reference query into ``out/results.parquet`` (kept): its wall time and the file."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    target = out / "results.parquet"
    return B.duckdb_copy(landed, span, target, spill), target


def engine_write(rows, out: Path, threads: int = 2) -> float:
    """The engine's writer alone: ``rows`` cut into files of FLUSH_ROWS rows, written by ``threads`` threads."""
    from mjoin.engine.results import FLUSH_ROWS, write_parquet

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    n = rows.num_rows
    cuts = [(i, min(FLUSH_ROWS, n - i)) for i in range(0, n, FLUSH_ROWS)]

    def task(k: int) -> None:  # thread k writes every threads-th file, as two tasks each write their own
        for j in range(k, len(cuts), threads):
            off, length = cuts[j]
            write_parquet(str(out / f"part-{k}-{j:05d}.parquet"), rows.slice(off, length))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(task, range(threads)))
    return time.perf_counter() - t0


def duckdb_write(rows, out: Path, spill: Path) -> float:
    """DuckDB writing the in-memory ``rows`` as Parquet (zstd, 2 threads)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    con = B.duckdb_connect(spill)
    con.register("rows", rows)
    t0 = time.perf_counter()
    con.execute(f"COPY (SELECT * FROM rows) TO '{out / 'results.parquet'}' (FORMAT parquet, COMPRESSION zstd)")
    wall = time.perf_counter() - t0
    con.close()
    return wall


def spread(xs: list) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs), "all": xs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=10.0)
    ap.add_argument("--density", default="dense", choices=list(B.DENSITIES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", required=True, help="scratch folder (bench_scale's: its landed data is reused)")
    args = ap.parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mjoin.engine.compiled import EngineQuery
    from mjoin.engine.frame import arrow_result_schema
    from mjoin.engine.metrics import git_commit, machine
    from mjoin.model.query import load_query

    work = Path(args.work)
    load_before = os.getloadavg()
    landed, man = B.workload(args.sf, args.density, work)
    span = (man.start_epoch, man.end_epoch + 60)
    q_wall, target = duckdb_query(landed, span, work / "out-floor-duckdb", work / "spill")
    schema = arrow_result_schema(EngineQuery.from_query(load_query(B.QUERY)))
    rows = pq.read_table(target).cast(schema).combine_chunks()
    target.unlink()
    print(f"duckdb query {q_wall:.2f} s, {rows.num_rows:,} rows, {rows.nbytes / 2**30:.2f} GiB in memory", flush=True)
    eng, ddb, sizes = [], [], {}
    for r in range(args.rounds):
        for kind in (("engine", "duckdb") if r % 2 == 0 else ("duckdb", "engine")):
            out = work / f"out-floor-{kind}"
            if kind == "engine":
                eng.append(engine_write(rows, out))
            else:
                ddb.append(duckdb_write(rows, out, work / "spill"))
            sizes[kind] = B.du(out)
            shutil.rmtree(out, ignore_errors=True)
            print(f"round {r} {kind}: {(eng if kind == 'engine' else ddb)[-1]:.2f} s", flush=True)
    doc = {"benchmark": "write-floor", "sf": args.sf, "density": args.density, "machine": machine(),
           "versions": B.versions(), "git_commit": git_commit(B.PROJECT), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "load_before": list(load_before), "load_after": list(os.getloadavg()),
           "parameters": {"rounds": args.rounds, "threads": 2, "compression": "zstd", "query": B.QUERY},
           "result_rows": rows.num_rows, "columns": rows.column_names, "arrow_bytes": rows.nbytes,
           "parquet_bytes": sizes, "duckdb_query_seconds": q_wall,
           "engine_write_seconds": spread(eng), "duckdb_write_seconds": spread(ddb)}
    doc["engine_write_over_half_duckdb_query"] = doc["engine_write_seconds"]["median"] / (0.5 * q_wall)
    path = HERE / "results" / f"write-floor-sf{args.sf:g}-{args.density}.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {path}: engine write {doc['engine_write_seconds']['median']:.2f} s, DuckDB write "
          f"{doc['duckdb_write_seconds']['median']:.2f} s, DuckDB query {q_wall:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
