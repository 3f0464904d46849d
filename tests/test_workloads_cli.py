"""CLI: python -m mjoin generate / land: help, summaries, clear errors with exit 2."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mjoin.cli import main
from mjoin.workloads.manifest import load_manifest
from mjoin.workloads.tpcds_cache import ensure_tables

INCLUDE = Path(__file__).resolve().parent.parent / "include"


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "tpcds-cache"  # shared with the other workloads tests
    ensure_tables(0.01, root)
    return root


@pytest.mark.parametrize("argv, expect", [
    (["generate", "--help"], "tpcds"),
    (["generate", "tpcds", "--help"], "--replay"),
    (["generate", "synthetic", "--help"], "match-drift"),
    (["land", "--help"], "--until"),
])
def test_help(argv, expect, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    assert expect in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["generate", "tpcds", "--sf", "0.001"], "--sf"),
    (["generate", "tpcds", "--cycle", "1.5s"], "--cycle"),
    (["generate", "tpcds", "--rate", "-5"], "--rate"),
    (["generate", "tpcds", "--speedup", "10"], "--speedup"),
    (["generate", "tpcds", "--start", "yesterday"], "--start"),
])
def test_bad_generate_arguments_exit_2_naming_the_option(argv, message, tmp_path, cache, capsys):
    rc = main(argv + ["--out", str(tmp_path / "w"), "--cache", str(cache)] if argv[1] == "tpcds" else argv)
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("argv", [
    ["generate", "tpcds", "--out", "x", "--replay", "shuffled"],
    ["generate", "tpcds", "--out", "x", "--sf", "ten"],
    ["generate", "tpcds", "--out", "x", "--rate", "5", "--duration", "1h"],
    ["generate"],
    ["land", "--workload", "x"],
    ["land", "--workload", "x", "--all", "--until", "+5m"],
])
def test_argparse_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--schedule", "no-such-preset"], "--schedule"), (["--streams", "1"], "--streams"), (["--window", "0s"], "--window"),
    (["--rate", "0"], "--rate"),
])
def test_bad_synthetic_arguments_exit_2(extra, message, tmp_path, capsys):
    assert main(["generate", "synthetic", "--out", str(tmp_path / "w"), "--duration", "1m"] + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not (tmp_path / "w").exists()


def test_bad_schedule_file_exit_2_naming_the_field(tmp_path, capsys):
    bad = tmp_path / "s.yaml"
    bad.write_text("events:\n  - {type: ramp, from: 50%, to: 20%, stream: s0, param: rate, value: 2x}\n")
    assert main(["generate", "synthetic", "--out", str(tmp_path / "w"), "--schedule", str(bad)]) == 2
    assert "events[0].to" in capsys.readouterr().err


def test_synthetic_summary(tmp_path, capsys):
    assert main(["generate", "synthetic", "--out", str(tmp_path / "w"), "--streams", "3", "--duration", "2m",
                 "--schedule", "burst", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    m = load_manifest(tmp_path / "w")
    assert "schedule=burst" in out and all(f"{s}" in out and str(m.rows(s)) in out for s in m.sources)
    assert (tmp_path / "w" / "query.yaml").exists()


def test_land_errors_exit_2(tmp_path, capsys):
    assert main(["land", "--workload", str(tmp_path), "--lake", str(tmp_path / "lake"), "--all"]) == 2
    assert "not a workload" in capsys.readouterr().err


def test_generate_and_land_end_to_end(tmp_path, cache):
    """The real entry point in a subprocess: summaries printed, exit codes, the lake filled."""
    env = {**os.environ, "PYTHONPATH": str(INCLUDE), "MJOIN_CACHE": str(cache)}
    out = tmp_path / "w"
    gen = subprocess.run([sys.executable, "-m", "mjoin", "generate", "tpcds", "--sf", "0.01", "--out", str(out),
                          "--duration", "10m", "--cycle", "1m", "--seed", "5"], env=env, capture_output=True, text=True)
    assert gen.returncode == 0, gen.stderr
    m = load_manifest(out)
    for s in m.sources:
        assert s in gen.stdout and str(m.rows(s)) in gen.stdout
    assert "2026-01-01T00:00:00Z" in gen.stdout and "null keys" in gen.stdout
    lake = tmp_path / "lake"
    landed = subprocess.run([sys.executable, "-m", "mjoin", "land", "--workload", str(out), "--lake", str(lake),
                             "--until", "+3m"], env=env, capture_output=True, text=True)
    assert landed.returncode == 0, landed.stderr
    assert "in 3 cycles" in landed.stdout
    assert sorted(os.listdir(lake / "streams")) == sorted(m.sources)
    again = subprocess.run([sys.executable, "-m", "mjoin", "land", "--workload", str(out), "--lake", str(lake),
                            "--cycles", "5", "--json"], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    import json

    doc = json.loads(again.stdout)
    assert len(doc["cycles"]) == 2 and len(doc["skipped"]) == 3 * len(m.sources)
    bad = subprocess.run([sys.executable, "-m", "mjoin", "generate", "tpcds", "--sf", "0.001", "--out", str(tmp_path / "b")],
                         env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "--sf" in bad.stderr and "Traceback" not in bad.stderr
