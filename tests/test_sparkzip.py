"""mjoin.runtime.sparkzip: bytecode beside the sources of a zip that Python imports from (Spark's worker path)."""
import os
import subprocess
import sys
import zipfile

from mjoin.runtime import sparkzip


def _zip(path, files):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            z.writestr(name, text)


def _import_from(zip_path, module, tmp_path):
    """``module.__file__`` and ``module.VALUE`` as a fresh interpreter (bytecode writing off, as Spark's
    workers run) imports them from ``zip_path``."""
    env = dict(os.environ, PYTHONPATH=str(zip_path), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-c", f"import {module} as m; print(m.__file__); print(m.VALUE)"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    return out[0], out[1]


def test_adds_bytecode_that_the_import_uses(tmp_path):
    z = tmp_path / "lib.zip"
    _zip(z, {"pkg/__init__.py": "VALUE = 'init'\n", "pkg/mod.py": "VALUE = 'compiled'\n",
             "pkg/broken.py": "def (:\n", "README.txt": "not python"})
    assert not sparkzip.has_bytecode(str(z))
    before = _import_from(z, "pkg.mod", tmp_path)
    assert before == (str(z / "pkg" / "mod.py"), "compiled")

    assert sparkzip.add_bytecode(str(z)) == 2  # __init__ and mod; the broken source gets none
    names = zipfile.ZipFile(z).namelist()
    assert {"pkg/__init__.pyc", "pkg/mod.pyc"} <= set(names) and "pkg/broken.pyc" not in names
    assert {"pkg/__init__.py", "pkg/mod.py", "pkg/broken.py", "README.txt"} <= set(names)  # sources kept
    assert sparkzip.has_bytecode(str(z))
    path, value = _import_from(z, "pkg.mod", tmp_path)
    assert path.endswith("mod.pyc") and value == "compiled"  # loaded from the bytecode, same behaviour
    assert sparkzip.add_bytecode(str(z)) == 0  # idempotent
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_cli_check(tmp_path, capsys):
    z = tmp_path / "lib.zip"
    _zip(z, {"m.py": "VALUE = 1\n"})
    assert sparkzip.main(["--check", str(z)]) == 1
    assert sparkzip.main([str(z)]) == 0
    assert sparkzip.main(["--check", str(z)]) == 0
    assert "has bytecode" in capsys.readouterr().out
