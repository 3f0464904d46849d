"""contract.Seen, indexed per stream by size, name and fingerprint (so it stays cheap at thousands of files): the same verdicts as a scan of
every remembered file in order (the definition of input.no_duplicate_files), on random landings."""
from __future__ import annotations

import random

from mjoin.lake import contract
from mjoin.lake.contract import SAME_BYTES, SAME_NAME, SAME_ROWS, FileFacts, Seen, SeenFile


def scan_duplicate_of(files: list, facts: FileFacts, positional) -> tuple[str, str] | None:
    """The rule as a scan of every remembered file in order (the reference the index must agree with)."""
    same = [f for f in files if f.stream == facts.stream and f.path != facts.path]
    sized = [f for f in same if facts.size is not None and f.size == facts.size]
    if sized:
        try:
            digest = contract.content_hash(facts.path)
        except OSError:
            digest = None
        for f in sized if digest is not None else ():
            if f.sha256 is None:  # hashed once, when first compared (a file gone later still compares)
                try:
                    f.sha256 = contract.content_hash(f.path)
                except OSError:
                    continue
            if f.sha256 == digest:
                return f.label, SAME_BYTES
    if not facts.rows:
        return None
    name = facts.path.rsplit("/", 1)[-1]
    if not positional.fullmatch(name):
        for f in same:
            if f.rows and f.path.rsplit("/", 1)[-1] == name:
                return f.label, SAME_NAME
    if facts.fingerprint:
        for f in same:
            if f.rows and f.fingerprint == facts.fingerprint:
                return f.label, SAME_ROWS
    return None


def _landing(tmp_path, rng: random.Random, n: int) -> list[FileFacts]:
    """``n`` files over 3 streams whose sizes, contents, names and fingerprints collide now and then; some
    without rows, some deleted after landing (their bytes can no longer be compared)."""
    out = []
    for i in range(n):
        name = rng.choice(["part-00000.parquet", "part-00001.parquet", "orders.parquet", "extra.parquet",
                           f"unique-{i}.parquet"])
        path = tmp_path / f"arrival={i}" / name
        path.parent.mkdir()
        body = rng.choice([b"aaaa", b"bbbb", b"cccccc", bytes([i % 256]) * 4, b"x" * (5 + i)])
        path.write_bytes(body)
        rows = rng.choice([0, None, 3, 3, 7])
        fp = rng.choice([None, "f1", "f2", f"f-{i}"]) if rows else None
        out.append(FileFacts(path=str(path), stream=rng.choice("abc"), size=len(body), rows=rows, fingerprint=fp))
    return out


def test_index_gives_the_scans_verdicts(tmp_path):
    rng = random.Random(7)
    facts = _landing(tmp_path, rng, 300)
    seen, remembered, kinds = Seen(), [], set()
    for i, f in enumerate(facts):
        if i % 40 == 39:  # an earlier file gone: only its name or fingerprint can still tell
            gone = rng.choice(remembered)
            if gone.path != f.path:
                (tmp_path / gone.path).unlink(missing_ok=True)
        want = scan_duplicate_of(remembered, f, seen.positional)
        assert seen.duplicate_of(f) == want, f
        kinds.add(want[1] if want else None)
        if want is None or rng.random() < 0.2:  # also remember some duplicates (the gate's lookback does)
            seen.add(f, label=f"L{i}")
            remembered.append(SeenFile(path=f.path, label=f"L{i}", stream=f.stream, size=f.size, rows=f.rows,
                                       fingerprint=f.fingerprint))
    assert kinds == {None, SAME_BYTES, SAME_NAME, SAME_ROWS}  # every verdict was exercised


def test_a_file_never_duplicates_itself_and_streams_stay_apart(tmp_path):
    p = tmp_path / "orders.parquet"
    p.write_bytes(b"abcd")
    f = FileFacts(path=str(p), stream="a", size=4, rows=3, fingerprint="f")
    seen = Seen()
    seen.add(f)
    assert seen.duplicate_of(f) is None
    assert seen.duplicate_of(FileFacts(path=str(p), stream="b", size=4, rows=3, fingerprint="f")) is None
    q = tmp_path / "other.parquet"
    q.write_bytes(b"abcd")
    assert seen.duplicate_of(FileFacts(path=str(q), stream="a", size=4, rows=3, fingerprint="g")) == (str(p), SAME_BYTES)


def test_restored_and_forgotten_files_are_indexed_again(tmp_path):
    """A Seen restored from its JSON (the streaming job's manifest) and one after forget_before judge as the
    scan over their remembered files does."""
    rng = random.Random(3)
    facts = _landing(tmp_path, rng, 120)
    seen = Seen()
    for i, f in enumerate(facts[:80]):
        seen.add(f, label=f"L{i}", ts_max=float(i))
    restored = Seen(seen.to_json())
    assert restored.to_json() == seen.to_json()
    assert restored.forget_before(40.0) == 40 and len(restored.files) == 40
    for f in facts[80:]:
        assert restored.duplicate_of(f) == scan_duplicate_of(restored.files, f, restored.positional)
        assert seen.duplicate_of(f) == scan_duplicate_of(seen.files, f, seen.positional)
    assert any(seen.duplicate_of(f) != restored.duplicate_of(f) for f in facts[80:])  # forgetting changed verdicts
