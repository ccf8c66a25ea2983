"""pgcdc.stack.pyspark_bytecode: a zip on the path gets bytecode that zipimport uses, once."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from pgcdc.stack import pyspark_bytecode


def _archive(tmp_path: Path) -> Path:
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("pkg/__init__.py", "VALUE = 41 + 1\n")
        z.writestr("pkg/broken.py", "def (:\n")
        z.writestr("pkg/data.txt", "kept\n")
    return archive


def _run(archive: Path, code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(archive)!r}); {code}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout + out.stderr


def test_a_zip_gets_bytecode_that_zipimport_loads_and_is_rewritten_once(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    assert "pkg/__init__.py" in _run(archive, "import pkg; print(pkg.__file__)")

    assert pyspark_bytecode.add_bytecode(archive)
    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
        assert z.read("pkg/data.txt") == b"kept\n"
    # Sources stay (tracebacks); the module that does not compile keeps its source only.
    assert {"pkg/__init__.py", "pkg/__init__.pyc", "pkg/broken.py"} <= names
    assert "pkg/broken.pyc" not in names

    out = _run(archive, "import pkg; print(pkg.__file__, pkg.VALUE, pkg.VALUE.__class__)")
    assert "pkg/__init__.pyc 42" in out
    # The code carries the source's name, as a module compiled by zipimport does.
    out = _run(archive, "import pkg.broken")
    assert "SyntaxError" in out and "pkg/broken.py" in out

    assert not pyspark_bytecode.add_bytecode(archive)  # marked: done once


def test_bytecode_of_another_interpreter_is_made_anew(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    pyspark_bytecode.add_bytecode(archive)
    with zipfile.ZipFile(archive, "a") as z:
        z.comment = b"pgcdc bytecode 00000000"  # as if compiled by another Python
    assert pyspark_bytecode.add_bytecode(archive)
    with zipfile.ZipFile(archive) as z:
        assert z.namelist().count("pkg/__init__.pyc") == 1
    assert "pkg/__init__.pyc 42" in _run(archive, "import pkg; print(pkg.__file__, pkg.VALUE)")
