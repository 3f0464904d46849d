"""Named drift schedules (``--schedule <name>``), written in the schedule format of schedule.py.

All are relative to the base rate (``x``), the base domain (``d``) and the
duration (``%``), so they work for any ``--rate``, ``--domain``, ``--duration``
and number of streams. The stationary base gives stream ``s_i`` the rate
``2 (i + 1) / (n + 1)`` x base (mean: the base rate; for 4 streams 0.4x, 0.8x,
1.2x, 1.6x) and rotates its popular keys by ``i * 0.05`` of the domain, so the
streams differ in rate and in match rates and the best probe order is not trivial.
"""
from __future__ import annotations

import copy


def _stationary(n: int) -> dict:
    streams = {f"s{i}": {"rate": f"{2 * (i + 1) / (n + 1):.12g}x", "shift": f"{0.05 * i:.12g}d"} for i in range(n)}
    return {"description": "nothing changes: rates 2(i+1)/(n+1) x base, hot keys rotated by 5% of the domain per stream",
            "defaults": {"zipf": 1.0, "offset": 0, "null_rate": 0.0}, "streams": streams, "events": []}


def _rate_swap(n: int) -> dict:
    doc = _stationary(n)
    first, last = doc["streams"]["s0"]["rate"], doc["streams"][f"s{n - 1}"]["rate"]
    doc["description"] = f"s0 and s{n - 1} swap rates at 50%: the slowest stream becomes the fastest (the best order changes)"
    doc["events"] = [{"type": "step", "at": "50%", "stream": "s0", "param": "rate", "value": last},
                     {"type": "step", "at": "50%", "stream": f"s{n - 1}", "param": "rate", "value": first}]
    return doc


def _match_drift(n: int) -> dict:
    doc = _stationary(n)
    doc["description"] = (f"s{n - 1}'s keys drift out of the others' domain between 25% and 75% "
                          f"(offset 0 -> 1 domain): every gamma into and out of s{n - 1} falls to 0")
    doc["events"] = [{"type": "ramp", "from": "25%", "to": "75%", "stream": f"s{n - 1}", "param": "offset", "value": "1d"}]
    return doc


def _skew_drift(n: int) -> dict:
    doc = _stationary(n)
    doc["streams"]["s0"]["zipf"] = 0.6
    doc["description"] = "s0's key popularity sharpens from Zipf 0.6 to 1.6 between 25% and 75% (its kappa falls, mu rises)"
    doc["events"] = [{"type": "ramp", "from": "25%", "to": "75%", "stream": "s0", "param": "zipf", "value": 1.6}]
    return doc


def _burst(n: int) -> dict:
    doc = _stationary(n)
    doc["description"] = "s1's rate is multiplied by 5 between 40% and 50%"
    doc["events"] = [{"type": "burst", "from": "40%", "to": "50%", "stream": "s1", "factor": 5}]
    return doc


def _mixed(n: int) -> dict:
    doc = _stationary(n)
    first, last = doc["streams"]["s0"]["rate"], doc["streams"][f"s{n - 1}"]["rate"]
    drift = f"s{max(n - 2, 0)}"
    doc["description"] = (f"a burst of s1 (x4, 10-15%), s0 and s{n - 1} swap rates at 30%, "
                          f"{drift}'s keys drift out of the domain between 50% and 80%")
    doc["events"] = [{"type": "burst", "from": "10%", "to": "15%", "stream": "s1", "factor": 4},
                     {"type": "step", "at": "30%", "stream": "s0", "param": "rate", "value": last},
                     {"type": "step", "at": "30%", "stream": f"s{n - 1}", "param": "rate", "value": first},
                     {"type": "ramp", "from": "50%", "to": "80%", "stream": drift, "param": "offset", "value": "1d"}]
    return doc


def _stripes(n: int) -> dict:
    """PMJoin's case: key groups that favour different probe orders, drifting.

    The key's residue mod 32 is its stripe (schedule.py). ``s1`` is hot on stripes 0-13 and
    ``s2`` on 16-29 (a hot key 10^9 times as popular as a cold one: the other keys hardly
    ever see them); ``s0`` (twice their rate) and the others (1% of it) are uniform; the
    rates' mean is the base rate. A new tuple of ``s0`` should probe ``s2`` first where ``s1``
    is hot (it dies at once) and ``s1`` first where ``s2`` is; one order for all keys fetches
    the hot stream's whole key list for a part of them. Hash and range groups mix both
    (a residue class spans the key range; hash ``D <= 16`` takes stripes ``c`` and ``c + 16``
    together); buckets ``key mod B`` (``32 | B``) rank the streams by rate in three ways, which
    the rate-based rule finds. The hot stripes drift: ``s1``'s and ``s2``'s shift ramp by 2
    over the workload, so buckets change groups and the rule must be recomputed; the gaps of
    2 stripes keep the two hot sets apart within any window shorter than the workload. So
    there are next to no results: a key hot in one striped stream is cold in the other."""
    striped = [(i, shift) for i, shift in ((1, 0), (2, 16)) if i < n]  # two streams: s1 alone is striped
    weight = [2.0] + [1.0 if i < 3 else 0.01 for i in range(1, n)]
    norm = n / sum(weight)  # the rates' mean is the base rate, as in every preset
    streams = {f"s{i}": {"rate": f"{w * norm:.12g}x"} for i, w in enumerate(weight)}
    for i, shift in striped:
        streams[f"s{i}"].update({"stripes": 32, "hot": 14, "contrast": 1e9, "shift": shift})
    return {"description": "s1 hot on key stripes 0-13 mod 32, s2 on 16-29, s0 and the rest uniform; the hot "
                           "stripes drift by 2 (PMJoin: key groups favour different orders)",
            "defaults": {"zipf": 0.0, "offset": 0, "null_rate": 0.0}, "streams": streams,
            "events": [{"type": "ramp", "from": "0%", "to": "100%", "stream": f"s{i}", "param": "shift",
                        "value": shift + 2} for i, shift in striped]}


# ---- the probe order decides the work: a hot stream over a wide domain, sparse filters -------------------------
#
# ``s0`` (the source) is uniform over the base domain [0, d); the *hot* stream is uniform over [0, 2d) at 4x the
# source's rate, so a lookup from the source's keys always hits it and fetches ~mu_hot tuples; the *filters* are
# uniform over [0, d) and sparse (1/800 of the source's rate: a lookup into one hits a few percent of the time).
# The best order of the source (and of the hot stream's keys inside [0, d)) probes the filters first and the hot
# stream last; the worst fetches the hot stream's whole key list and then dies at a filter. selectivity_first
# orders by the fraction of a window one lookup matches, gamma mu / |W|, which for uniform keys is about
# 1 / (the stream's domain): it puts the hot stream (domain 2d) before the filters (domain d) whatever the rates,
# the order dppick's cost model (which weighs gamma and mu) avoids. Which stream is hot drifts.

_FILTER = 0.00125  # a filter's rate, in source rates
_HOT = 4.0  # the hot stream's rate, in source rates


def _hot_filter_norm(n: int) -> float:
    """The source's rate in base rates when one stream is hot and ``n - 2`` are filters: the rates' mean is the base
    rate (as in every preset)."""
    return n / (1.0 + _HOT + (n - 2) * _FILTER)


def _hot_filter_base(n: int, hot: str, description: str) -> dict:
    """``s0`` the source, ``hot`` the hot stream over 2d, every other stream a sparse filter; the rates' mean is the
    base rate (:func:`_hot_filter_norm`)."""
    norm = _hot_filter_norm(n)
    streams = {"s0": {"rate": f"{norm:.12g}x", "domain": "1d"}}
    for i in range(1, n):
        s = f"s{i}"
        streams[s] = ({"rate": f"{_HOT * norm:.12g}x", "domain": "2d"} if s == hot else
                      {"rate": f"{_FILTER * norm:.12g}x", "domain": "1d"})
    return {"description": description, "defaults": {"zipf": 0.0, "offset": 0, "shift": 0, "null_rate": 0.0},
            "streams": streams, "events": []}


def _hot_rotate(n: int) -> dict:
    """Steps in rates and key popularity: the hot role moves from s1 to s2 to ... (the old hot stream becomes a
    filter over d, the next filter becomes hot over 2d), at 10% + j * 90% / (n - 1)."""
    m = n - 1
    doc = _hot_filter_base(n, "s1", "")
    norm = _hot_filter_norm(n)
    hot_rate, filter_rate = f"{_HOT * norm:.12g}x", f"{_FILTER * norm:.12g}x"
    at = [f"{10 + 90 * j / m:.12g}%" for j in range(1, m)]
    for j, t in enumerate(at, start=1):
        old, new = f"s{j}", f"s{j + 1}"
        doc["events"] += [{"type": "step", "at": t, "stream": old, "param": "rate", "value": filter_rate},
                          {"type": "step", "at": t, "stream": old, "param": "domain", "value": "1d"},
                          {"type": "step", "at": t, "stream": new, "param": "rate", "value": hot_rate},
                          {"type": "step", "at": t, "stream": new, "param": "domain", "value": "2d"}]
    doc["description"] = ("s0 the source over d; s1 hot (4x s0, uniform over 2d), the others sparse filters over d; "
                          f"the hot role steps on to s2, s3, ... at {', '.join(at) or 'never'} "
                          "(selectivity_first puts the hot stream first: it matches the least of its window)")
    return doc


def _hot_ramp(n: int) -> dict:
    """Ramps in rates: s1 fades from hot to a filter while s2 (over 3d) grows from a filter to hot, 25%-75%."""
    doc = _hot_filter_base(n, "s1", "")
    norm = _hot_filter_norm(n)
    hot_rate, filter_rate = f"{_HOT * norm:.12g}x", f"{_FILTER * norm:.12g}x"
    if n > 2:
        doc["streams"]["s2"]["domain"] = "3d"
        doc["events"] = [{"type": "ramp", "from": "25%", "to": "75%", "stream": "s1", "param": "rate",
                          "value": filter_rate},
                         {"type": "ramp", "from": "25%", "to": "75%", "stream": "s2", "param": "rate",
                          "value": hot_rate}]
    doc["description"] = ("s0 the source over d; s1 hot over 2d fades to a sparse filter while s2 (over 3d) grows "
                          "from a sparse filter to hot, ramps 25%-75%; the others sparse filters over d")
    return doc


def _hot_burst(n: int) -> dict:
    """Bursts in rates: each filter in turn bursts x100 for 10% of the workload (it stops filtering: a lookup into
    it hits and fetches ~mu_hot / 16 tuples), from 30% on, 15% apart."""
    doc = _hot_filter_base(n, "s1", "")
    spans = []
    for k, i in enumerate(range(2, n)):
        a = 30 + 15 * k
        if a + 10 > 100:
            break
        spans.append(f"s{i} {a}-{a + 10}%")
        doc["events"].append({"type": "burst", "from": f"{a}%", "to": f"{a + 10}%", "stream": f"s{i}",
                              "factor": 100})
    doc["description"] = ("s0 the source over d; s1 hot over 2d; the sparse filters burst x100 in turn ("
                          f"{', '.join(spans) or 'none'}): while it bursts a filter filters nothing")
    return doc


# ---- two attribute classes: the order decides how many partial results are materialised ------------------------
#
# ``s0`` (the hub) carries ``key`` and ``key2``; ``s1`` joins it on ``key``, ``s2..`` join it (and each other) on
# ``key2``: the TPC-DS two-class query's shape (cu = s0 links sr = s1 on one class with wr, cr = s2, s3 on the other).
# A lookup that changes class cannot share the partial results' one key: the engine materialises them and looks
# each one up (rho = mu in the cost model), so a hot stream fetched *before* a class change multiplies the lookups
# after it. The roles are the hot presets' (a hot stream at 4x the hub's rate over a key domain of 2d, sparse
# filters at 1/800 of it over d); which class holds the hot stream and which the filters drifts, so the best order
# crosses classes early (filter first, then the other class) or late.


def _two_class_base(n: int, hot: str, description: str) -> dict:
    """:func:`_hot_filter_base` on two classes: ``s0`` the hub (``key`` and ``key2`` over d), ``s1`` on ``key``,
    ``s2..`` on ``key2`` (their domain is ``key2_domain``); ``hot`` the hot stream (the last one if there are fewer).
    With 2 streams there is no second class (a pair joined on two keys is a composite key, which the query
    format does not have): the preset is one class on ``key``."""
    doc = _hot_filter_base(n, hot if int(hot[1:]) < n else f"s{n - 1}", description)
    if n > 2:
        streams = doc["streams"]
        streams["s0"]["key2_domain"] = "1d"
        for i in range(2, n):
            streams[f"s{i}"]["key2_domain"] = streams[f"s{i}"].pop("domain")
        doc["keys"] = {"s0": ["key", "key2"], **{f"s{i}": ["key2"] for i in range(2, n)}}
    return doc


def _role_steps(at: str, stream: str, role: str, norm: float) -> list:
    """Steps that make ``stream`` hot (rate 4x the hub's, its join key over 2d) or a filter (1/800, over d)."""
    dom = "domain" if stream == "s1" else "key2_domain"
    rate, width = (_HOT * norm, "2d") if role == "hot" else (_FILTER * norm, "1d")
    return [{"type": "step", "at": at, "stream": stream, "param": "rate", "value": f"{rate:.12g}x"},
            {"type": "step", "at": at, "stream": stream, "param": dom, "value": width}]


def _two_class_step(n: int) -> dict:
    """Steps across classes: s1 (on key) hot and the key2 streams filters until 40%, s1 a filter from then on and s2
    (on key2) hot from 60%: the hub's best order crosses classes late (key2 filters first, s1 last), then early (s1
    first). The gap keeps the two hot streams out of each other's windows (up to 20% of the duration): while both
    are dense an order crossing between them materialises mu_1 x mu_2 partial results per tuple (a first version
    stepped both at 50%; one fixed order's batch at the step took 30 s of task CPU)."""
    doc = _two_class_base(n, "s1", "")
    norm = _hot_filter_norm(n)
    doc["events"] = _role_steps("40%", "s1", "filter", norm) + (_role_steps("60%", "s2", "hot", norm) if n > 2 else [])
    doc["description"] = ("two classes (s0 on key and key2, s1 on key, s2.. on key2): s1 hot over 2d and the key2 "
                          "streams sparse filters until 40%, then s1 a filter, and s2 hot over 2d from 60%")
    return doc


def _two_class_burst(n: int) -> dict:
    """Bursts across classes: s2 (on key2) hot, s1 (on key) and s3.. sparse filters; s1 bursts x100 on 30-45% (the
    filter on key stops filtering: cross to key2's filter first), s3 on 60-75% (the other way round)."""
    doc = _two_class_base(n, "s2", "")
    doc["events"] = [{"type": "burst", "from": "30%", "to": "45%", "stream": "s1", "factor": 100}]
    if n > 3:
        doc["events"].append({"type": "burst", "from": "60%", "to": "75%", "stream": "s3", "factor": 100})
    doc["description"] = ("two classes (s0 on key and key2, s1 on key, s2.. on key2): s2 hot over 2d, s1 and s3.. "
                          "sparse filters; s1 bursts x100 on 30-45%, s3 on 60-75%: each stops filtering")
    return doc


PRESETS = {
    "stationary": _stationary,
    "rate-swap": _rate_swap,
    "match-drift": _match_drift,
    "skew-drift": _skew_drift,
    "burst": _burst,
    "mixed": _mixed,
    "stripes": _stripes,
    "hot-rotate": _hot_rotate,
    "hot-ramp": _hot_ramp,
    "hot-burst": _hot_burst,
    "twoclass-step": _two_class_step,
    "twoclass-burst": _two_class_burst,
}


def preset_document(name: str, streams: int) -> dict:
    """The schedule document of a preset for ``streams`` streams (a fresh copy)."""
    return copy.deepcopy(PRESETS[name](int(streams)))


def describe_presets(streams: int = 4) -> str:
    return "\n".join(f"  {name:<12} {preset_document(name, streams)['description']}" for name in PRESETS)
