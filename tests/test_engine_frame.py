"""The frame's layouts (engine/frame.py): payload slots shared by type, the input layout inside the whole frame,
and the driver-local path's rows in the input layout carrying each stream's payload in its slots."""
from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mjoin.engine.routing import route_local
from mjoin.engine.compiled import EngineQuery, key_name
from mjoin.engine.frame import (arrow_frame_schema, arrow_input_schema, delta_columns, frame_ddl, input_ddl,
                                payload_slots, to_layout)
from mjoin.engine.normalize import inspect_files, normalize_local
from mjoin.model.query import parse_query


def _query():
    """Streams of different payload widths and types (a: two longs and a string, b: a decimal and a long,
    c: no payload besides its key)."""
    streams = [
        {"name": "a", "event_time": "ts", "window": "1m", "keys": ["k"],
         "columns": {"ts": "timestamp", "k": "long", "x": "long", "s": "string", "y": "long"}},
        {"name": "b", "event_time": "ts", "window": "1m", "keys": ["k"],
         "columns": {"ts": "timestamp", "k": "long", "amt": "decimal(7,2)", "z": "long"}},
        {"name": "c", "event_time": "ts", "window": "1m", "keys": ["k"], "columns": {"ts": "timestamp", "k": "long"}},
    ]
    out = ["a.x AS ax", "a.s AS as_", "a.y AS ay", "b.amt AS bamt", "b.z AS bz", "c.k AS ck"]
    return parse_query({"name": "frametest", "streams": streams, "predicates": ["a.k = b.k", "b.k = c.k"],
                        "output": out})


def test_slots_are_shared_by_type_and_the_input_layout_is_part_of_the_frame():
    eq = EngineQuery.from_query(_query())
    slots, of = payload_slots(eq)
    types = dict(frame_ddl(eq))
    # as many slots of a type as the stream with most columns of that type needs
    by_type: dict = {}
    for _, t in slots:
        by_type[t] = by_type.get(t, 0) + 1
    need: dict = {}
    for s in eq.streams:
        for t in {types[n] for n in eq.payload_columns(s)}:
            need[t] = max(need.get(t, 0), sum(types[n] == t for n in eq.payload_columns(s)))
    assert by_type == need
    for s in eq.streams:
        assert [n for n, _ in of[s]] == eq.payload_columns(s)
        assert len({slot for _, slot in of[s]}) == len(of[s])  # a stream's columns in different slots
        for name, slot in of[s]:
            assert types[slot] == types[name]
        # where a delta holds its state columns: same types, same order
        assert [types[c] for c in delta_columns(eq, s)] == [types[c] for c in eq.state_columns(s)]
    inp = input_ddl(eq)
    assert set(inp) <= set(frame_ddl(eq))  # every input column is a frame column of the same type
    assert not set(eq.all_payload_columns) & {n for n, _ in inp}
    assert len(inp) < len(frame_ddl(eq))


def test_local_rows_carry_each_streams_payload_in_its_slots(tmp_path):
    q = _query()
    eq = EngineQuery.from_query(q)
    rng = np.random.default_rng(3)
    files, written = {}, {}
    for s in q.streams:
        n = 50
        cols = {"ts": pa.array((1_700_000_000_000_000 + rng.integers(0, 60_000_000, n)).astype("datetime64[us]")),
                "k": pa.array(rng.integers(0, 10, n))}
        for c, t in s.columns.items():
            if c in cols:
                continue
            cols[c] = (pa.array(rng.integers(0, 1000, n)) if t == "long" else
                       pa.array([f"v{i}" for i in rng.integers(0, 99, n)]) if t == "string" else
                       pa.array([None if i % 7 == 0 else Decimal(int(i)) / 100 for i in rng.integers(0, 10**6, n)],
                                pa.decimal128(7, 2)))
        table = pa.table(cols)
        path = tmp_path / s.name / "part-0.parquet"
        path.parent.mkdir()
        pq.write_table(table, path)
        files[s.name], written[s.name] = [str(path)], table
    table = normalize_local(q, eq, inspect_files(q, eq, files))
    assert table.schema == arrow_input_schema(eq)
    s_idx = table.column("_s").to_numpy()
    for s in eq.streams:
        mine = table.filter(pa.array(s_idx == eq.index(s)))
        state = mine.select(delta_columns(eq, s)).rename_columns(eq.state_columns(s))
        src = written[s]
        for (col, _), name in zip(eq.payload[s], eq.payload_columns(s)):
            assert state.column(name).to_pylist() == src.column(col).cast(state.schema.field(name).type).to_pylist()
        assert state.column(key_name(eq.stream_classes[s][0])).to_pylist() == src.column("k").to_pylist()
    routed = route_local(table, eq, 4, arrow_input_schema(eq))
    assert routed.schema == arrow_input_schema(eq)
    assert int(np.sum(routed.column("_kind").to_numpy() == 1)) == table.num_rows  # one class: each row once
    # the whole frame holds the input layout's rows unchanged (later stages)
    full = to_layout(routed, arrow_frame_schema(eq))
    assert full.select(routed.column_names).equals(routed)
