"""What a user would pick instead, on the same data: Flink (SQL text and CSV copies), DuckDB, and the checks that
every peer returns exactly the engine's result set (count and a fingerprint over all output columns).

The window semantics of a spec (docs/algorithms.md, "Notation"): ``(t_1..t_n)`` is a result iff every predicate holds and
``max(ts) - ts_i < W_i`` for every i. Since ``max(ts) - ts_i = max_j (ts_j - ts_i)``, that is the conjunction
over every ordered pair ``(i, j)`` of ``ts_j - ts_i < W_i``: pairwise interval conditions, which a SQL engine
can evaluate exactly on the event times as integers (microseconds). :func:`flink_sql` writes them so.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

#: spec column types -> Flink SQL types (timestamps travel as BIGINT microseconds)
FLINK_TYPES = {"long": "BIGINT", "int": "INT", "short": "SMALLINT", "double": "DOUBLE", "float": "FLOAT",
               "string": "STRING", "boolean": "BOOLEAN", "timestamp": "BIGINT"}
ARROW_TYPES = {"long": pa.int64(), "int": pa.int32(), "short": pa.int16(), "double": pa.float64(),
               "float": pa.float32(), "string": pa.string(), "boolean": pa.bool_(), "timestamp": pa.int64()}


NULL_LITERAL = "\\N"


class PeerError(ValueError):
    """A query a peer cannot run as written here (the reason says what is missing)."""


def _needed_columns(query, stream) -> list[str]:
    et = stream.event_time
    if et.expr is not None or et.format is not None or stream.columns[et.column] != "timestamp":
        raise PeerError(f"{stream.name}: the peers take event time as a timestamp column (not {et.to_spec()})")
    cols = [et.column] + list(stream.keys) + [o.column for o in query.output if o.stream == stream.name]
    return list(dict.fromkeys(cols))


def csv_copies(query, lake, out: Path) -> dict:
    """One headerless CSV file per stream under ``out/<stream>/`` with the columns the join needs (timestamps as
    epoch microseconds), rows in arrival order: the Flink wheel has no Parquet format (notes/flink-peer.md).
    Returns ``{stream: {"path", "rows", "columns"}}``; this conversion is outside every timed part."""
    if getattr(query, "bands", ()):
        raise PeerError("band predicates are not written for the peers")
    copies = {}
    for s in query.streams:
        cols = _needed_columns(query, s)
        parts = []
        for f in lake.stream_files(s.source):
            t = pq.read_table(f, columns=cols)
            arrays = []
            for c in cols:
                a = t.column(c)
                if s.columns[c] == "timestamp":
                    a = pc.cast(pc.cast(a, pa.timestamp("us")), pa.int64())
                else:
                    a = pc.cast(a, ARROW_TYPES[s.columns[c]])
                arrays.append(a)
            parts.append(pa.table(arrays, names=cols))
        table = pa.concat_tables(parts) if parts else pa.table({c: pa.array([], ARROW_TYPES[s.columns[c]]) for c in cols})
        folder = out / s.name
        folder.mkdir(parents=True, exist_ok=True)
        # NULL as the literal \\N (the tables declare 'csv.null-literal'): Flink's CSV reader fails on empty numbers
        text = pa.table([pc.fill_null(pc.cast(table.column(c), pa.string()), NULL_LITERAL) for c in cols], names=cols)
        pacsv.write_csv(text, folder / "part-0.csv", pacsv.WriteOptions(include_header=False, quoting_style="none"))
        copies[s.name] = {"path": str(folder), "rows": table.num_rows, "columns": cols}
    return copies


def _micros(seconds: float) -> int:
    return int(round(float(seconds) * 1_000_000))


def _interval_literal(seconds: float) -> str:
    """A Flink DAY TO SECOND(3) interval literal of whole milliseconds."""
    ms = int(round(float(seconds) * 1000))
    d, rest = divmod(ms, 86_400_000)
    h, rest = divmod(rest, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"INTERVAL '{d} {h:02d}:{m:02d}:{s:02d}.{ms:03d}' DAY TO SECOND(3)"


def join_sequence(query) -> list[str]:
    """The streams in spec order, each after one it shares a predicate with (a connected left-deep chain)."""
    names = query.stream_names
    seq = [names[0]]
    while len(seq) < len(names):
        nxt = next((n for n in names if n not in seq and any(
            {p.left, p.right} == {n, m} for p in query.predicates for m in seq)), None)
        if nxt is None:
            raise PeerError("the join graph is not connected")
        seq.append(nxt)
    return seq


def flink_sql(query, variant: str, quote: str = "`") -> str:
    """The SELECT a Flink peer runs: the spec's equi-predicates and, for every pair of streams, the exact window
    conditions ``ts_j - ts_i < W_i`` and ``ts_i - ts_j < W_j`` on BIGINT microseconds. ``interval`` adds, for the
    pair a predicate links at each join, rowtime bounds ``rt_i <= rt_j + W_j`` and ``rt_j <= rt_i + W_i`` on the
    millisecond rowtimes: implied by the exact conditions (flooring to milliseconds moves a difference by less
    than 1 ms and W is whole milliseconds), so they only let Flink plan an interval join and purge its state.
    ``quote``: the identifier quote (Flink's backtick; ``"`` runs the same text in DuckDB)."""
    if variant not in ("multijoin", "binary", "interval"):
        raise PeerError(f"unknown Flink variant {variant!r}")
    q = quote
    st = {s.name: s for s in query.streams}
    seq = join_sequence(query)
    sel = ", ".join(f"{q}{o.stream}{q}.{q}{o.column}{q} AS {q}{o.name}{q}" for o in query.output)
    parts = [f"SELECT {sel} FROM {q}{seq[0]}{q}"]
    for k, j in enumerate(seq[1:], start=1):
        conds = []
        for p in query.predicates:
            if {p.left, p.right} <= set(seq[: k + 1]) and j in (p.left, p.right):
                conds.append(f"{q}{p.left}{q}.{q}{p.left_column}{q} = {q}{p.right}{q}.{q}{p.right_column}{q}")
        for i in seq[:k]:
            ti, tj = f"{q}{i}{q}.{q}{st[i].event_time.column}{q}", f"{q}{j}{q}.{q}{st[j].event_time.column}{q}"
            conds.append(f"{tj} - {ti} < {_micros(st[i].window)}")
            conds.append(f"{ti} - {tj} < {_micros(st[j].window)}")
        if variant == "interval":
            link = next(m for m in reversed(seq[:k]) if any({p.left, p.right} == {m, j} for p in query.predicates))
            conds.append(f"{q}{link}{q}.rt <= {q}{j}{q}.rt + {_interval_literal(st[j].window)}")
            conds.append(f"{q}{j}{q}.rt <= {q}{link}{q}.rt + {_interval_literal(st[link].window)}")
        parts.append(f"JOIN {q}{j}{q} ON " + " AND ".join(conds))
    return "\n".join(parts)


def flink_job(query, copies: dict, variant: str, *, verify_to: str | None = None, repeats: int = 1,
              parallelism: int = 2) -> dict:
    """The job description ``flink_job.py`` reads."""
    tables = []
    for s in query.streams:
        cols = copies[s.name]["columns"]
        tables.append({"name": s.name, "path": copies[s.name]["path"], "ts": s.event_time.column,
                       "columns": [[c, FLINK_TYPES[s.columns[c]]] for c in cols]})
    st = {s.name: s for s in query.streams}
    output = [[o.name, FLINK_TYPES[st[o.stream].columns[o.column]]] for o in query.output]
    return {"variant": variant, "tables": tables, "sql": flink_sql(query, variant), "output": output,
            "verify_to": verify_to, "repeats": repeats, "parallelism": parallelism}


def result_schema(query) -> pa.Schema:
    """The engine's result columns and types (timestamps as the engine writes them are not in the shipped specs)."""
    st = {s.name: s for s in query.streams}
    return pa.schema([(o.name, ARROW_TYPES[st[o.stream].columns[o.column]]) for o in query.output])


def read_csv_results(folder: str, schema: pa.Schema) -> pa.Table:
    """The rows a Flink file sink wrote (every committed part file; in-progress files start with a dot)."""
    tables = []
    for root, _, files in os.walk(folder):
        for f in sorted(files):
            if f.startswith(".") or f.startswith("_"):
                continue
            tables.append(pacsv.read_csv(os.path.join(root, f), read_options=pacsv.ReadOptions(column_names=schema.names),
                                         convert_options=pacsv.ConvertOptions(column_types=schema)))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def fingerprint_table(table: pa.Table, schema: pa.Schema, folder: Path) -> dict:
    """``mjoin.engine.results.result_fingerprint`` of a peer's rows: written as one committed batch in the
    engine's results layout with the engine's column types, then fingerprinted by the very same function."""
    from mjoin.engine.results import result_fingerprint

    table = table.select(schema.names).cast(schema)
    batch = folder / "batch=1"
    batch.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, batch / "part-0.parquet")
    (batch / "_SUCCESS").write_text(json.dumps({"batch_id": 1, "rows": table.num_rows, "columns": schema.names}))
    return result_fingerprint(str(folder))


def duckdb_reference(query, lake, threads: int = 2) -> tuple[pa.Table, float]:
    """DuckDB's one-shot batch query over the landed Parquet files (tests/engine_helpers.reference_sql: the
    spec's predicates and windows as plain SQL, no engine code); returns the rows and the seconds it took."""
    import duckdb
    from engine_helpers import reference_sql

    sql = reference_sql(query, lake)
    con = duckdb.connect(config={"threads": threads, "autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    try:
        t = time.perf_counter()
        table = con.execute(sql).to_arrow_table()
        return table, time.perf_counter() - t
    finally:
        con.close()


class PeakRss:
    """Peak resident memory of this process and its children (Spark's JVM, Python workers), sampled."""

    def __init__(self, interval: float = 0.05):
        import psutil

        self._proc = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        total = 0
        for p in [self._proc] + self._proc.children(recursive=True):
            try:
                total += p.memory_info().rss
            except Exception:
                continue
        return total

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sample())
            self._stop.wait(self.interval)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
