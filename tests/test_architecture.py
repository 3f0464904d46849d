"""The house as docs/design.md draws it, checked on the code: the parts of ``include/mjoin/`` stand in layers,
no module imports in a circle, pure logic imports neither Spark nor Airflow (the contracts in pyproject.toml,
checked by import-linter over every import, those inside functions too), and an import sits at the top of its
module unless a measured reason keeps it where it is used (listed here, and said in a comment there)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
LIBRARY = PROJECT / "include" / "mjoin"

#: (file under include/mjoin, top-level module imported) -> why the import is made where it is used
LAZY = {
    ("gates/input.py", "mjoin.gates.input_spark"): "the input gate imports no Spark unless asked to scan with it",
    ("gates/gxengine.py", "great_expectations"): "2.5-8 s to import; every gate module (every loop step) imports it",
    ("gates/gxproject.py", "great_expectations"): "as gxengine: every gate module imports it; the evaluation replay stores nothing",
    ("forecast/holt.py", "statsmodels"): "1.5-3 s to import; readers of a forecast fit none",
    ("evaluation/report.py", "matplotlib"): "1-2 s to import; only a plot needs it",
    ("stats/kernel.py", "pandas"): "on the driver only: Spark's Python workers import this module without pandas",
    ("runtime/cluster.py", "psycopg2"): "optional: only the native cluster's PostgreSQL needs it",
    ("engine/control.py", "psutil"): "optional: a bare Spark driver may not have it",
    ("workloads/tpcds_cache.py", "duckdb_extension_tpcds"): "optional: only generating TPC-DS needs it",
}


def test_import_contracts_hold():
    """lint-imports over the project's contracts ([tool.importlinter] in pyproject.toml)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT / "include"), os.environ.get("PYTHONPATH", "")])}
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(PROJECT / 'pyproject.toml')!r}, no_cache=True))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT, env=env, timeout=300)
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, f"an import contract is broken:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
    assert "0 broken" in proc.stdout and "5 kept" in proc.stdout


def _function_level_imports(path: Path):
    """``(line, module)`` of every import inside a function or class body of ``path``: the top-level package of a
    library, the whole name of one of mjoin's modules."""
    tree = ast.parse(path.read_text())
    top = set()
    for node in tree.body:  # module level, also under if/try
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                top.add(id(sub))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
            name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            root = (name or "").split(".")[0]
            yield node.lineno, ("." if getattr(node, "level", 0) else name if root == "mjoin" else root)


def test_imports_sit_at_the_top_unless_a_measured_reason_keeps_them_lazy():
    found = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        rel = path.relative_to(LIBRARY).as_posix()
        for line, root in _function_level_imports(path):
            found.setdefault((rel, root), []).append(line)
    unexplained = {k: v for k, v in found.items() if k not in LAZY}
    assert not unexplained, ("imports inside functions without a reason (move them to the top of the module, or "
                             f"measure why not and list the reason in LAZY): {unexplained}")
    assert set(LAZY) <= set(found), f"reasons listed for imports that are now at the top: {set(LAZY) - set(found)}"


def test_package_faces_hand_nothing_on():
    """A package's ``__init__`` describes the package and imports nothing: a caller imports a name from the
    module that defines it, so importing one module never loads its whole package (``mjoin.commands`` defines
    the CLI's one error type, nothing more). Packages that are one module with its data files beside it
    (``runtime/jvm``, ``model/schemas``) are modules, not parts."""
    for init in [LIBRARY / "__init__.py", *sorted(LIBRARY.glob("*/__init__.py"))]:
        tree = ast.parse(init.read_text())
        imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and
                   not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
        assert not imports, f"{init.relative_to(PROJECT)} imports {[ast.unparse(n) for n in imports]}"
        assert ast.get_docstring(tree), f"{init.relative_to(PROJECT)} has no docstring saying what the package holds"
