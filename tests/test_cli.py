"""The command line: ``python -m mjoin <command> --help`` works for every command module, and a bad
query spec exits 2 naming the field. Real subprocesses (the entry point a user runs)."""
from __future__ import annotations

import os
import pkgutil
import subprocess
import sys

import pytest
import yaml

import mjoin.commands

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command_names() -> list[str]:
    """Every public module of mjoin.commands (found here independently of mjoin.cli)."""
    names = []
    for info in pkgutil.iter_modules(mjoin.commands.__path__):
        if info.name.startswith("_"):
            continue
        mod = __import__(f"mjoin.commands.{info.name}", fromlist=["NAME"])
        assert hasattr(mod, "NAME") and hasattr(mod, "run") and hasattr(mod, "add_arguments"), (
            f"mjoin/commands/{info.name}.py is not a command module (NAME, HELP, add_arguments, run)")
        names.append(mod.NAME)
    return sorted(names)


COMMANDS = command_names()


def mjoin(*argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "mjoin", *argv], capture_output=True, text=True, cwd=PROJECT,
                          timeout=timeout)


@pytest.fixture(scope="module")
def helps():
    """``--help`` of every command, run concurrently (each process imports every command module)."""
    procs = {c: subprocess.Popen([sys.executable, "-m", "mjoin", c, "--help"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=PROJECT) for c in COMMANDS}
    out = {}
    for c, p in procs.items():
        stdout, stderr = p.communicate(timeout=180)
        out[c] = (p.returncode, stdout, stderr)
    return out


def test_there_are_commands():
    assert {"check", "generate", "query", "land"} <= set(COMMANDS)


def test_top_level_help_lists_every_command():
    res = mjoin("--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: python -m mjoin")
    for c in COMMANDS:
        assert f"\n    {c} " in res.stdout or f"\n    {c}\n" in res.stdout, c
    assert "`" not in res.stdout  # plain text, no reST markup leaking from docstrings


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(helps, command):
    rc, stdout, stderr = helps[command]
    assert rc == 0, stderr
    assert stdout.startswith(f"usage: python -m mjoin {command}"), stdout[:200]
    assert "-h, --help" in stdout
    assert "Traceback" not in stderr


def test_query_command_on_a_bad_spec_exits_2_naming_the_field(tmp_path):
    doc = yaml.safe_load(open(os.path.join(PROJECT, "include", "queries", "tpcds_returns_by_address.yaml")))
    doc["streams"][1]["window"] = "five minutes"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    res = mjoin("query", str(bad))
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.startswith("error: ") and "streams[1] (sr).window" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    # and the shipped spec is fine
    ok = mjoin("query", "tpcds_returns_by_address")
    assert ok.returncode == 0 and "class c0: cu.c_current_addr_sk = sr.sr_addr_sk" in ok.stdout


def test_unknown_command_exits_2():
    res = mjoin("no-such-command")
    assert res.returncode == 2 and "invalid choice" in res.stderr


def test_run_usage_errors_come_before_spark(tmp_path):
    """An interval run without its interval, or with a spec that does not exist, exits 2 naming what is
    missing, before a Spark session starts (no Spark banner in the output)."""
    r = mjoin("run", "--query", "tpcds_returns_by_address", "--lake", str(tmp_path), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "interval evaluation needs --from, --to, --cycle" in r.stderr
    r2 = mjoin("run", "--stream", "--query", str(tmp_path / "nope.yaml"), "--lake", str(tmp_path))
    assert r2.returncode == 2 and "nope.yaml" in r2.stderr
    for out in (r, r2):
        assert "SparkContext" not in out.stderr and "log4j" not in out.stderr
