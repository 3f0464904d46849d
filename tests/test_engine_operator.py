"""The per-bucket operator without Spark, against brute force over all tuple combinations."""
from __future__ import annotations

from itertools import permutations, product

import numpy as np
import pyarrow as pa
import pytest

from mjoin.engine.compiled import CompiledPlan, EngineQuery
from mjoin.engine.frame import arrow_frame_schema, arrow_result_schema, delta_columns, payload_slots
from mjoin.engine.operator import KIND_DELTA, BucketContext, KeyedRows, expand, process_bucket
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.model.query import parse_query

W = {"a": 10, "b": 4, "c": 7, "d": 5}  # seconds, asymmetric on purpose


def _query(two_classes: bool):
    cols = {"t": "long", "k": "long", "id": "long"}
    streams = [{"name": s, "event_time": "t", "window": f"{W[s]}s", "columns": dict(cols), "keys": ["k"]}
               for s in "abc"]
    preds = ["a.k = b.k", "b.k = c.k"]
    if two_classes:  # b also has a second key j: a.k = b.k (c0), b.j = c.j = d.j (c1)
        streams[1]["columns"]["j"] = "long"
        streams[1]["keys"] = ["k", "j"]
        streams[2]["columns"] = {"t": "long", "j": "long", "id": "long"}
        streams[2]["keys"] = ["j"]
        streams.append({"name": "d", "event_time": "t", "window": f"{W['d']}s",
                        "columns": {"t": "long", "j": "long", "id": "long"}, "keys": ["j"]})
        preds = ["a.k = b.k", "b.j = c.j", "c.j = d.j"]
    out = [f"{s['name']}.id AS id_{s['name']}" for s in streams]
    return parse_query({"name": "optest", "streams": streams, "predicates": preds, "output": out})


def _data(q, rng, n_old=12, n_new=6):
    """Per stream: (old rows, new rows) as dicts of numpy arrays with t (micros), keys, id."""
    out, ident = {}, 0
    for s in q.streams:
        parts = []
        for n, lo, hi in ((n_old, 0, 20), (n_new, 15, 25)):
            rows = {"t": rng.integers(lo, hi, n) * 1_000_000 + rng.choice([0, 500_000], n),
                    "id": np.arange(ident, ident + n)}
            ident += n
            for k in s.keys:
                rows[k] = rng.integers(0, 4, n)
            parts.append(rows)
        out[s.name] = parts
    return out


def _brute_force(q, data):
    """Every combination with at least one new tuple satisfying keys and max(ts) - ts_i < W_i."""
    names = q.stream_names
    rows = {s: [dict(zip(d, vals), new=new) for new, part in ((False, data[s][0]), (True, data[s][1]))
                for vals in zip(*part.values())] for s, d in ((s, data[s][0]) for s in names)}
    found = []
    for combo in product(*(rows[s] for s in names)):
        m = dict(zip(names, combo))
        if not any(r["new"] for r in combo):
            continue
        if any(m[p.left][p.left_column] != m[p.right][p.right_column] for p in q.predicates):
            continue
        newest = max(r["t"] for r in combo)
        if all(newest - m[s]["t"] < W[s] * 1_000_000 for s in names):
            found.append(tuple(m[s]["id"] for s in names))
    return sorted(found)


def _frame_rows(eq, schema, stream, part):
    n = len(part["id"])
    slot = dict(payload_slots(eq)[1][stream])[f"{stream}__id"]  # a delta's payload is in its stream's slots
    cols = {"_kind": pa.array(np.full(n, KIND_DELTA, np.int8)), "_s": pa.array(np.full(n, eq.index(stream), np.int32)),
            "_ts": pa.array(part["t"].astype(np.int64)), slot: pa.array(part["id"])}
    for c in eq.stream_classes[stream]:
        cols[f"_k_{c}"] = pa.array(part[eq.key_columns[(stream, c)]].astype(np.int64))
    return pa.table([cols.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema)


def _run(q, data, plan, buckets=1):
    """Stage after stage for every (class, bucket), routing partial results like the Spark driver."""
    eq = EngineQuery.from_query(q)
    schema = arrow_frame_schema(eq)
    compiled = CompiledPlan.from_plan(q, plan)
    old = {}
    for s in eq.streams:
        t = _frame_rows(eq, schema, s, data[s][0])
        for c in eq.stream_classes[s]:
            keys = t.column(f"_k_{c}").to_numpy()
            for b in range(buckets):
                sel = np.flatnonzero(np.mod(keys, buckets) == b)
                state = t.take(sel).select(delta_columns(eq, s)).rename_columns(eq.state_columns(s))
                old[(c, s, b)] = KeyedRows(state, f"_k_{c}")
    deltas = pa.concat_tables([_frame_rows(eq, schema, s, data[s][1]) for s in eq.streams])
    results, docs, partials, stage = [], [], None, 1
    while True:
        produced = []
        for c in eq.classes:
            for b in range(buckets):
                k = deltas.column(f"_k_{c}")
                mask = (np.asarray(k.is_valid().to_numpy(zero_copy_only=False))
                        & (np.mod(k.fill_null(0).to_numpy(), buckets) == b))
                rows = deltas.filter(pa.array(mask))
                if partials is not None:
                    pm = ((partials.column("_c").to_numpy() == eq.class_index(c))
                          & (partials.column("_b").to_numpy() == b))
                    rows = pa.concat_tables([rows, partials.filter(pa.array(pm))])
                ctx = BucketContext(eq=eq, plan=compiled, frame_schema=schema, result_schema=arrow_result_schema(eq),
                                    batch_id=1, stage=stage, buckets=buckets)
                out = process_bucket(ctx, c, b, rows, lambda cls, s, bb: old.get((cls, s, bb)))
                results += out.results
                docs.append(out.doc)
                produced += out.partials
        if not produced:
            break
        partials, stage = pa.concat_tables(produced), stage + 1
    res = pa.concat_tables(results).to_pydict() if results else {f"id_{s}": [] for s in eq.streams}
    return sorted(zip(*(res[f"id_{s}"] for s in eq.streams))), docs


@pytest.mark.parametrize("seed", range(6))
def test_single_class_every_order_equals_brute_force(seed):
    q = _query(two_classes=False)
    data = _data(q, np.random.default_rng(seed))
    expected = _brute_force(q, data)
    for perm in permutations(q.stream_names):
        plan = make_plan(q, orders_from_permutation(q, perm), "fixedOrder")
        got, docs = _run(q, data, plan, buckets=2 if seed % 2 else 1)
        assert got == expected, (seed, perm)


@pytest.mark.parametrize("seed", range(4))
def test_two_classes_with_partials_equal_brute_force(seed):
    q = _query(two_classes=True)
    data = _data(q, np.random.default_rng(100 + seed), n_old=8, n_new=4)
    expected = _brute_force(q, data)
    for perm in (["a", "b", "c", "d"], ["d", "c", "b", "a"], ["c", "a", "d", "b"]):
        plan = make_plan(q, orders_from_permutation(q, perm), "fixedOrder")
        got, _ = _run(q, data, plan, buckets=2)
        assert got == expected, (seed, perm)


def test_prefilter_drops_only_tuples_that_cannot_join():
    q = _query(two_classes=False)
    data = _data(q, np.random.default_rng(7))
    expected = _brute_force(q, data)
    plan = make_plan(q, orders_from_permutation(q, "abc"), "fixedOrder", options={"prefilter": True})
    got, docs = _run(q, data, plan)
    assert got == expected
    assert docs[0]["prefilter"]["checked"] == sum(len(data[s][1]["id"]) for s in "abc")


def test_keyed_rows_index_and_expand():
    t = pa.table({"_ts": pa.array([5, 1, 3, 2], pa.int64()), "_k_c0": pa.array([2, 1, 2, 9], pa.int64())})
    rows = KeyedRows(t, "_k_c0")
    # sorted by key, stable: arrival order within a key (the operator never needs ts order)
    assert rows.key.tolist() == [1, 2, 2, 9] and rows.ts.tolist() == [1, 5, 3, 2]
    more = KeyedRows(pa.table({"_ts": pa.array([7, 0], pa.int64()), "_k_c0": pa.array([2, 0], pa.int64())}), "_k_c0")
    merged = rows.concat(more)
    assert merged.key.tolist() == [0, 1, 2, 2, 2, 9] and merged.ts.tolist() == [0, 1, 5, 3, 7, 2]
    assert merged.table.column("_ts").to_pylist() == merged.ts.tolist() and merged.offsets.tolist() == [0, 1, 2, 5, 6]
    assert rows.ukeys.tolist() == [1, 2, 9] and rows.offsets.tolist() == [0, 1, 3, 4]
    start, count = rows.ranges(np.array([2, 3, 9, -1, 100]))
    assert count.tolist() == [2, 0, 1, 0, 0] and start[[0, 2]].tolist() == [1, 3]
    assert expand(np.array([1, 3]), np.array([2, 1])).tolist() == [1, 2, 3]
    assert len(rows.purge(2)) == 2 and rows.purge(0) is rows


def _persist(root: str, version: int, prev, update):
    """One state update made durable as a task does it: a StateWriter of one piece, flushed."""
    from mjoin.engine import state as st

    writer = st.StateWriter(root, version, "test", 1 << 30)
    entry = writer.persist(prev, update)
    writer.flush()
    return entry


def test_state_log_appends_deltas_compacts_and_reads_back(tmp_path):
    """Durable state: each version appends the new rows or compacts; a cold reader (no cache), a
    reader holding the previous version, and the writer all see exactly the live rows."""
    from mjoin.engine import state as st
    from mjoin.engine.operator import StateUpdate

    rng = np.random.default_rng(1)
    root = str(tmp_path)
    live = KeyedRows(pa.table({"_ts": pa.array([], pa.int64()), "_k_c0": pa.array([], pa.int64())}), "_k_c0")
    entry, seen_compaction, appended, lengths = None, False, False, []
    for version in range(1, 30):
        n = int(rng.integers(0, 40))
        t0 = version * 10
        delta = KeyedRows(pa.table({"_ts": pa.array(rng.integers(t0, t0 + 10, n), pa.int64()),
                                    "_k_c0": pa.array(rng.integers(0, 5, n), pa.int64())}), "_k_c0")
        threshold = t0 - 35  # a window of ~35 time units
        full = live.concat(delta)
        new = full.purge(threshold)
        update = StateUpdate(new, delta, threshold, changed=new is not live)
        prev_entry, prev_live = entry, live
        entry = _persist(root, version, entry, update) if update.changed else entry
        live = new
        if entry is None:
            continue
        lengths.append(len(entry["files"]))
        seen_compaction |= prev_entry is not None and len(entry["files"]) == 1 and len(prev_entry["files"]) > 1
        assert entry["tuples"] == len(live)
        expect = sorted(zip(live.key.tolist(), live.ts.tolist()))
        # the writer's cache
        rows, source = st.load_state(root, entry, "_k_c0", 1 << 30)
        assert source == "cache" and sorted(zip(rows.key.tolist(), rows.ts.tolist())) == expect
        # a cold reader
        st.clear_cache()
        rows, source = st.load_state(root, entry, "_k_c0", 1 << 30)
        assert source == "files" and sorted(zip(rows.key.tolist(), rows.ts.tolist())) == expect
        assert (np.diff(rows.key) >= 0).all()
        # a reader holding the previous version reads only the appended file
        if prev_entry is not None and entry["files"][:-1] == prev_entry["files"]:
            st.clear_cache()
            st._cache_put((root, tuple(prev_entry["files"]), prev_entry["after"]), prev_live, 1 << 30)
            rows, source = st.load_state(root, entry, "_k_c0", 1 << 30)
            assert source == "cache+file" and sorted(zip(rows.key.tolist(), rows.ts.tolist())) == expect
            appended = True
    assert appended and seen_compaction and max(lengths) <= st.MAX_FILES and max(lengths) > 1


def test_state_cache_keeps_the_pre_batch_state_when_a_purge_keeps_the_files(tmp_path):
    """A batch that only purges a state (no new rows) keeps its file list; a later stage of the same
    batch (or a re-run) loading the committed entry must get the rows as committed, not the purged ones."""
    from mjoin.engine import state as st
    from mjoin.engine.operator import StateUpdate

    root = str(tmp_path / "state")
    st.clear_cache()
    rows = KeyedRows(pa.table({"_ts": pa.array([10, 20, 30], pa.int64()), "_k_c0": pa.array([1, 2, 3], pa.int64())}),
                     "_k_c0")
    entry = _persist(root, 0, None, StateUpdate(rows, rows, None, True))
    purged = rows.purge(20)
    after = _persist(root, 1, entry, StateUpdate(purged, KeyedRows.empty(rows.table.schema, "_k_c0"), 20, True))
    assert after["files"] == entry["files"] and after["after"] == 20
    got, source = st.load_state(root, entry, "_k_c0", 1 << 30)
    assert source == "cache" and got.ts.tolist() == [10, 20, 30]
    got, source = st.load_state(root, after, "_k_c0", 1 << 30)
    assert source == "cache" and got.ts.tolist() == [30]
