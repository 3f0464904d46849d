"""fsutil.atomic_output / engine.results.write_parquet: a file appears whole or not at all."""
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mjoin.runtime import fsutil
from mjoin.engine.results import write_parquet


@pytest.mark.parametrize("url", [False, True])
def test_atomic_output_replaces_only_on_success(tmp_path, url):
    target = tmp_path / "d" / "f.bin"
    path = f"file://{target}" if url else str(target)
    fsutil.atomic_write_bytes(path, b"first")
    with pytest.raises(RuntimeError):
        with fsutil.atomic_output(path) as f:
            f.write(b"half of the second")
            raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"first"
    assert os.listdir(target.parent) == ["f.bin"]  # the temporary file went with the failure
    with fsutil.atomic_output(path) as f:
        f.write(b"second")
    assert target.read_bytes() == b"second"
    assert os.listdir(target.parent) == ["f.bin"]


def test_write_parquet_streams_to_the_file(tmp_path):
    t = pa.table({"a": pa.array(range(100_000), pa.int64()), "b": pa.array([i % 7 for i in range(100_000)])})
    path = str(tmp_path / "r" / "part.parquet")
    write_parquet(path, t, mtime_ms=1_700_000_000_000)
    assert pq.read_table(path).equals(t)
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"
    assert int(os.stat(path).st_mtime) == 1_700_000_000
