"""The job's in-state counting routines (mjoin.stats.instate) against a brute force, on random states: every
directed edge's q, m and s (each probe's matching rows, one by one), and window_tuples and kappa of every stream,
group and cell per cycle end, over states with duplicate event times, rows exactly at the window's edges
(``ts_u - W`` and ``ts_u``), negative keys, key groups that are and are not a function of the class's key, an
empty stream and one without rows in the counted cycles; through every path the counting takes (the probes
looked up in their own key bucket or through the keys' argsort, a key's rows checked one by one or counted by two
binary searches in rows sorted by time or not, one code per key for every group and cell set or one per set).
Pure numpy and pyarrow: no Spark."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from mjoin.engine.compiled import key_name
from mjoin.engine.operator import KeyedRows
from mjoin.model.keygroups import group_of, num_groups
from mjoin.stats import instate
from mjoin.stats.instate import Emission, Part, range_span, range_width
from mjoin.stats.kernel import CELL_KIND, EDGE, KAPPA, WT

TAU = 10
WINDOWS = (30, 25, 47, 30)  # per stream (time units: the state's event times)
KEY_BUCKETS, KEY_RANGES, BUCKETS = 16, 8, 3


def _data(rng, streams, lo, hi, rows=160, keys=12, empty=(), quiet=()):
    """Per stream: event times drawn from few values (ties everywhere; the cycle ends and ``e - W`` among them)
    and keys from ``[-3, keys)``; ``empty``: streams without rows, ``quiet``: without rows in the cycles."""
    t_lo, t_hi = lo * TAU - max(WINDOWS) - 3, hi * TAU + 12
    out = {}
    for s in streams:
        n = 0 if s in empty else rows
        ts = rng.integers(t_lo, t_hi, n)
        if s in quiet:
            ts = np.where((ts >= lo * TAU) & (ts < hi * TAU), lo * TAU - 1, ts)
        out[s] = {"_ts": ts, "x": rng.integers(-3, keys, n), "y": rng.integers(-3, keys, n) + 1000}
    return out


def _states(data, key_cols, classes, *, parts: bool, time_sorted: bool):
    """{class: {stream: [Part or KeyedRows per bucket]}} as a task holds them: pmod(key, BUCKETS) buckets, each
    sorted by key (stable: a key's rows in arrival order, here random; ``time_sorted``: in time order)."""
    out = {}
    for c in classes:
        for b in range(BUCKETS):
            for s, cols in data.items():
                if c not in key_cols[s]:
                    continue
                k = cols[key_cols[s][c]]
                sel = np.flatnonzero(np.mod(k, BUCKETS) == b)
                if time_sorted:
                    sel = sel[np.lexsort((cols["_ts"][sel], k[sel]))]
                table = pa.table({"_ts": pa.array(cols["_ts"][sel], pa.int64()),
                                  **{key_name(c2): pa.array(cols[col][sel], pa.int64())
                                     for c2, col in key_cols[s].items()}})
                rows = KeyedRows(table, key_name(c))
                if len(rows):
                    out.setdefault(c, {}).setdefault(s, []).append(Part(rows, b) if parts else rows)
    return out


def _counted(em, states):
    """``{(kind, sid, r, g, j): value}`` of what the tasks report, summed over the classes' counts, with the
    window_tuples and kappa deltas summed up into values per cycle."""
    got = Counter()
    for c, st in states.items():
        t = em.counts(c, st)
        if t is None:
            continue
        d = t.to_pydict()
        for kind, sid, r, g, j, v0, v1, v2 in zip(*(d[k] for k in ("kind", "sid", "r", "g", "j", "v0", "v1", "v2"))):
            base, what = divmod(kind, CELL_KIND)
            if what == EDGE:
                for i, v in enumerate((v0, v1, v2)):
                    got[(kind, sid, r, g, j, i)] += v
            elif what in (WT, KAPPA) and kind != instate.SPAN:
                for jj in range(j, em.hi):  # deltas: the value at every later cycle
                    got[(kind, sid, 0, g, jj, 0)] += v0
    return Counter({k: v for k, v in got.items() if v})


def _brute(em, data, key_cols, ci, cells, span):
    """The same counts, one probe and one row at a time."""
    cls = em.classes[ci]
    rule = em.rule
    rule_col = {s: key_cols[s].get(rule["attr_class"]) for s in key_cols} if rule else {}

    def group(s, i):
        return int(group_of(np.array([data[s][rule_col[s]][i]]), rule)[0]) if rule else 0

    def labels(key):
        out = []
        for _, how in cells:
            if how == "mod":
                out.append(key % KEY_BUCKETS)
            else:
                out.append(min(max(key // range_width(span, KEY_RANGES), 0), min(KEY_RANGES, span) - 1))
        return out

    want = Counter()
    members = em.class_members[ci]
    for sid in members:
        s = em.streams[sid]
        ts, keys = data[s]["_ts"], data[s][key_cols[s][cls]]
        for j in range(em.lo, em.hi):
            e = (j + 1) * TAU
            inside = [i for i in range(len(ts)) if e - WINDOWS[sid] < ts[i] <= e]
            sets = [(0, lambda i: group(s, i))] + [(CELL_KIND * (c + 1), lambda i, c=c: labels(int(keys[i]))[c])
                                                  for c in range(len(cells))]
            for base, lab in sets:
                if em.first_class[sid] == ci:
                    for i in inside:
                        want[(base + WT, sid, 0, lab(i), j, 0)] += 1
                for g, _ in {(lab(i), int(keys[i])) for i in inside}:
                    want[(base + KAPPA, sid, 0, g, j, 0)] += 1
            for u in range(len(ts)):  # the probes of the cycle
                if not j * TAU <= ts[u] < e:
                    continue
                codes = [(EDGE, group(s, u))] + [(CELL_KIND * (c + 1) + EDGE, lab) for c, lab in
                                                 enumerate(labels(int(keys[u])))]
                for r in members:
                    if r == sid:
                        continue
                    rs = em.streams[r]
                    t_r, k_r = data[rs]["_ts"], data[rs][key_cols[rs][cls]]
                    hits = sum(1 for i in range(len(t_r)) if k_r[i] == keys[u] and ts[u] - WINDOWS[r] < t_r[i] <= ts[u]
                               and (em.rule is None or group(rs, i) == group(s, u)))
                    for kind, g in codes:
                        want[(kind, sid, r, g, j, 0)] += 1
                        want[(kind, sid, r, g, j, 1)] += hits > 0
                        want[(kind, sid, r, g, j, 2)] += hits
    return Counter({k: v for k, v in want.items() if v})


ONE_CLASS = {"a": {"c0": "x"}, "b": {"c0": "x"}, "c": {"c0": "x"}, "d": {"c0": "x"}}
#: a and c also in class c1 (key y): c1's groups under a rule on c0 are not a function of c1's key
TWO_CLASSES = {"a": {"c0": "x", "c1": "y"}, "b": {"c0": "x"}, "c": {"c0": "x", "c1": "y"}, "d": {"c0": "x"}}


def _emission(key_cols, classes, rule, lo, hi):
    streams = tuple(key_cols)
    return Emission(tau_us=TAU, lo=lo, hi=hi, streams=streams, windows_us=WINDOWS,
                    first_class=tuple(classes.index(next(iter(key_cols[s]))) for s in streams), classes=classes,
                    class_members=tuple(tuple(i for i, s in enumerate(streams) if c in key_cols[s]) for c in classes),
                    rule=rule, buckets=8, key_buckets=KEY_BUCKETS, key_ranges=KEY_RANGES)


PATHS = {  # (Part with its bucket or plain KeyedRows, a key's rows in time order, MANY_ROWS, JOINT_CODES)
    "buckets": (True, False, 4, 1 << 20),
    "argsort": (False, False, 4, 1 << 20),
    "binary-search": (True, False, -10 ** 6, 1 << 20),
    "binary-search-sorted": (True, True, -10 ** 6, 1 << 20),
    "binary-search-argsort": (False, False, -10 ** 6, 1 << 20),
    "one-code-per-set": (True, False, 4, 0),
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("rule", [None, {"method": "hash", "attr_class": "c0", "groups": 3},
                                  {"method": "range", "attr_class": "c0", "bounds": [2, 7]}])
@pytest.mark.parametrize("cycles", [1, 3])
def test_one_class_counts_equal_the_brute_force(path, rule, cycles, monkeypatch):
    parts, time_sorted, many, joint = PATHS[path]
    monkeypatch.setattr(instate, "MANY_ROWS", many)
    monkeypatch.setattr(instate, "JOINT_CODES", joint)
    rng = np.random.default_rng(cycles * 7 + len(path) + (num_groups(rule) if rule else 0))
    lo = 100
    data = _data(rng, ONE_CLASS, lo, lo + cycles, empty=("d",), quiet=("c",))
    em = _emission(ONE_CLASS, ("c0",), rule, lo, lo + cycles)
    states = _states(data, ONE_CLASS, ("c0",), parts=parts, time_sorted=time_sorted)
    span = max(1, range_span(max(int(v["x"].max()) for v in data.values() if len(v["x"]))))
    got = _counted(em, states)
    want = _brute(em, data, ONE_CLASS, 0, em.cell_sets(), span)
    assert got == want, sorted(set(got.items()) ^ set(want.items()))[:10]
    kinds = {k[0] for k in want}
    assert {EDGE, WT, KAPPA, CELL_KIND + EDGE, 2 * CELL_KIND + KAPPA} <= kinds  # every statistic exercised
    assert any(k[0] == EDGE and k[5] == 2 and v > 1 for k, v in want.items())  # probes with several matches


@pytest.mark.parametrize("path", ["buckets", "argsort", "binary-search", "binary-search-argsort"])
@pytest.mark.parametrize("rule", [None, {"method": "hash", "attr_class": "c0", "groups": 2}])
def test_groups_of_another_class_equal_the_brute_force(path, rule, monkeypatch):
    """Class c1 under key groups of c0: a probe matches the rows of its key and its group."""
    parts, time_sorted, many, joint = PATHS[path]
    monkeypatch.setattr(instate, "MANY_ROWS", many)
    rng = np.random.default_rng(3)
    lo = 50
    data = _data(rng, TWO_CLASSES, lo, lo + 2, rows=120, keys=5)
    em = _emission(TWO_CLASSES, ("c0", "c1"), rule, lo, lo + 2)
    states = _states(data, TWO_CLASSES, ("c0", "c1"), parts=parts, time_sorted=time_sorted)
    got = _counted(em, states)
    want = _brute(em, data, TWO_CLASSES, 0, (), 1) + _brute(em, data, TWO_CLASSES, 1, (), 1)
    assert got == want, sorted(set(got.items()) ^ set(want.items()))[:10]
    assert any(k[0] == EDGE and k[1] == 0 and k[2] == 2 and k[5] == 2 and v for k, v in want.items())  # c1's edge


def test_window_edges_count_exactly():
    """A row at ``e - W`` is out of the window at ``e``, one at ``e`` in it; a probe's match at ``ts_u - W_r`` is
    out, at ``ts_u`` in (two keys of one stream each, one probe)."""
    lo, W = 10, WINDOWS[1]
    e = (lo + 1) * TAU
    data = {"a": {"_ts": np.array([lo * TAU + 5]), "x": np.array([1])},
            "b": {"_ts": np.array([e - W, e, lo * TAU + 5 - W, lo * TAU + 5, lo * TAU + 5]), "x": np.array([2, 2, 1, 1, 1])}}
    cols = {"a": {"c0": "x"}, "b": {"c0": "x"}}
    em = Emission(tau_us=TAU, lo=lo, hi=lo + 1, streams=("a", "b"), windows_us=(30, W), first_class=(0, 0),
                  classes=("c0",), class_members=((0, 1),), rule=None, key_buckets=0, key_ranges=0)
    for parts in (True, False):
        got = _counted(em, _states(data, cols, ("c0",), parts=parts, time_sorted=False))
        assert got[(WT, 1, 0, 0, lo, 0)] == 3 and got[(KAPPA, 1, 0, 0, lo, 0)] == 2  # not the rows at e - W, before
        assert (got[(EDGE, 0, 1, 0, lo, 0)], got[(EDGE, 0, 1, 0, lo, 1)], got[(EDGE, 0, 1, 0, lo, 2)]) == (1, 1, 2)
        assert got == _brute(em, data, cols, 0, (), 1)
