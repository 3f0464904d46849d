"""The repository's prose points at things that exist: every relative link in the Markdown files (and its
``#anchor``), every repository path and every ``mjoin.<module>[.<name>]`` named in the docs or in the code's
docstrings and comments, every equation the code cites in docs/algorithms.md, every section cited as
``docs/<file>.md, "<heading>"``. And it speaks to the repository's readers: no "issue N" (a tracker's number
means nothing here) and no notes that live outside the repository."""
from __future__ import annotations

import importlib
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
ALGORITHMS = PROJECT / "docs" / "algorithms.md"


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--", *patterns], capture_output=True, text=True, cwd=PROJECT,
                         check=True).stdout.split()
    return [PROJECT / p for p in out if (PROJECT / p).is_file()]


MARKDOWN = tracked("*.md")
CODE = tracked("*.py", "*.yaml", "*.yml", "Makefile", "*.toml", ".ci/run", "docker/Dockerfile", "docker-compose.yml")
PROSE = MARKDOWN + CODE


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@lru_cache(maxsize=None)
def headings(path: Path) -> list[str]:
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            out.append(m.group(1))
    return out


def anchors(path: Path) -> set[str]:
    seen: dict = {}
    out = set()
    for h in headings(path):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_resolves():
    bad = []
    for md in MARKDOWN:
        text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
        for m in LINK.finditer(text):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z]+://|^mailto:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                bad.append(f"{md.relative_to(PROJECT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{md.relative_to(PROJECT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


#: repository paths as prose names them: a file with one of these extensions, or a folder with a trailing slash,
#: under one of the project's top-level folders
PATH = re.compile(r"(?<![\w./-])((?:include|docs|bench|tests|dags|jobs|plugins|docker|\.ci)/[\w./-]*[\w/])")
EXTENSIONS = (".py", ".md", ".json", ".png", ".yaml", ".yml", ".txt", ".java", ".toml", ".sh", ".html", ".csv", ".cfg")
#: names that stand for a pattern, not a file (a results file per run, a placeholder)
PLACEHOLDER = re.compile(r"[<>*{}]|\.\.\.|/N\b|XXX")


def test_every_repository_path_named_exists():
    bad = []
    for f in PROSE:
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for m in PATH.finditer(line):
                p = m.group(1).rstrip(".")
                end = m.end(1)
                if PLACEHOLDER.search(line[m.start(1):end + 2]) or not (p.endswith(EXTENSIONS) or p.endswith("/")):
                    continue
                if not (PROJECT / p).exists():
                    bad.append(f"{f.relative_to(PROJECT)}:{n}: {p}")
    assert not bad, "paths that do not exist:\n" + "\n".join(bad)


#: ``mjoin.<part>...`` where <part> is a package or module of the library (not a suite name ``mjoin.stats.{...}``,
#: a file name ``mjoin.json`` or a config key)
PARTS = "|".join(sorted(p.stem if p.is_file() else p.name for p in (PROJECT / "include" / "mjoin").iterdir()
                        if not p.name.startswith("_") and (p.is_dir() or p.suffix == ".py")))
DOTTED = re.compile(rf"(?<![\w.])mjoin\.(?:{PARTS})(?:\.[A-Za-z_]\w*)*(?![\w]|\.[{{<\w])")


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_mjoin_name_resolves():
    """``mjoin.a.b.c`` in prose and docstrings is a module or an attribute of one (a renamed or moved name
    leaves no stale pointer behind). Logger names and the JVM class's package are not modules."""
    names = {}
    for f in PROSE:
        for m in DOTTED.finditer(f.read_text(errors="replace")):
            name = m.group(0).rstrip(".")
            if name.startswith("mjoin.spark.") or name in ("mjoin.spark",):  # the JVM class's Java package
                continue
            names.setdefault(name, f.relative_to(PROJECT))
    bad = [f"{where}: {name}" for name, where in sorted(names.items()) if not _resolves(name)]
    assert not bad, "names that are no module or attribute:\n" + "\n".join(bad)


ISSUE = re.compile(r"\bissues?\s*#?\d+\b|\bissue-\d+\b", re.I)


def test_no_tracker_numbers_or_outside_notes():
    bad = []
    for f in PROSE:
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if ISSUE.search(line) or re.search(r"\b(ALGORITHMS|ARCHITECTURE)\.md\b", line):
                bad.append(f"{f.relative_to(PROJECT)}:{n}: {line.strip()[:120]}")
    assert not bad, "\n".join(bad)


def equations() -> set[int]:
    """The numbers of docs/algorithms.md's equations: a display line in a code block ending with ``(N)``."""
    out, fenced = set(), False
    for line in ALGORITHMS.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and (m := re.search(r"\((\d+)\)\s*$", line)):
            out.add(int(m.group(1)))
    return out


EQ = re.compile(r"\bEqs?\.\s*(\d+)(?:\s*[-–]\s*(\d+))?((?:\s*,\s*\d+)*)")


def test_cited_equations_exist():
    """Every ``Eq. N`` (or ``Eq. N-M``, ``Eq. N, M``) the code and the docs cite is an equation of
    docs/algorithms.md (the papers' own numbers are cited with the paper's name: "the PSP paper's Eq. 5")."""
    have = equations()
    assert have, "docs/algorithms.md numbers no equation"
    bad = []
    for f in PROSE:
        if f == ALGORITHMS:
            continue
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for m in EQ.finditer(line):
                before = line[:m.start()].lower()
                if re.search(r"paper'?s?\s*(,\s*)?$|paper's\s+$|\bpsp\b[^.]*$|pmjoin['’]s\s*$", before[-40:]):
                    continue
                lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
                cited = set(range(lo, hi + 1)) | {int(x) for x in re.findall(r"\d+", m.group(3) or "")}
                if cited - have:
                    bad.append(f"{f.relative_to(PROJECT)}:{n}: Eq. {sorted(cited - have)}")
    assert not bad, "equations cited but not in docs/algorithms.md:\n" + "\n".join(bad)


SECTION = re.compile(r"(docs/[\w/]+\.md|bench/[\w/]+\.md|README\.md),\s*\"([^\"]{3,80})\"")


def test_cited_sections_exist():
    bad = []
    for f in PROSE:
        text = f.read_text(errors="replace")
        for m in SECTION.finditer(text.replace("\n", " ")):
            path, title = PROJECT / m.group(1), m.group(2)
            if not path.exists():
                bad.append(f"{f.relative_to(PROJECT)}: {m.group(1)} (no such file)")
            elif not any(title.lower() in h.lower() for h in headings(path)):
                bad.append(f"{f.relative_to(PROJECT)}: {m.group(1)}, \"{title}\" (no such heading)")
    assert not bad, "\n".join(bad)


def test_readme_is_short():
    lines = (PROJECT / "README.md").read_text().splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines: measurements go to bench/RESULTS.md, operations to docs/"


@pytest.mark.parametrize("doc", ["docs/algorithms.md", "docs/design.md", "docs/operations.md", "bench/RESULTS.md"])
def test_the_project_docs_exist(doc):
    assert (PROJECT / doc).is_file() and (PROJECT / doc).stat().st_size > 1000
