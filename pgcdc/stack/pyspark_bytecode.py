"""Compiled bytecode inside the venv's ``pyspark.zip`` and ``py4j-*-src.zip``.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and the py4j zip first on the
``PYTHONPATH`` of every Python process it starts: the driver, each worker daemon (one per
kind of worker: tasks, and the Python data source's planners), the streaming source's runner
and the workers they fork. pyspark as published ships those zips with sources only, and
Python's zipimport cannot cache what it compiles, so each of those processes compiles every
pyspark module it imports, again: measured here, ``import pyspark.sql, pyspark.worker`` costs
0.65 s of CPU from the zip and 0.13 s from the installed package; a sync job starts six to
ten such processes, and the suite starts many jobs.

:func:`ensure` rewrites each zip once with a ``.pyc`` beside each ``.py`` (compiled by this
interpreter, unchecked hash-based: the archive never changes under it), which zipimport
prefers; sources stay for tracebacks, and an interpreter of another version (another magic
number) reads the sources as before. The rewrite is atomic and marked in the archive's
comment, so it is done once per install: ``make install`` and the images' Dockerfile run
``python -m pgcdc.stack.pyspark_bytecode``; a venv made otherwise runs it by hand, and runs
the same without it, only slower to start.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import zipfile
from pathlib import Path

_FLAGS_UNCHECKED_HASH = (0b01).to_bytes(4, "little")


def _marker() -> bytes:
    return b"pgcdc bytecode " + importlib.util.MAGIC_NUMBER.hex().encode()


def spark_python_lib() -> Path | None:
    """``<pyspark package>/python/lib`` of the installed pyspark (found without importing
    it), or None when pyspark is not installed or is a Spark distribution's."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "python" / "lib"
    return lib if (lib / "pyspark.zip").is_file() else None


def _pyc(source: bytes, filename: str) -> bytes:
    code = compile(source, filename, "exec", dont_inherit=True)
    return (
        importlib.util.MAGIC_NUMBER
        + _FLAGS_UNCHECKED_HASH
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


def add_bytecode(archive: Path) -> bool:
    """Rewrite ``archive`` with a ``.pyc`` beside each ``.py`` unless it carries them for
    this interpreter already; whether it was rewritten. A source that does not compile is
    left without one (zipimport then reports its error, as before)."""
    marker = _marker()
    with zipfile.ZipFile(archive) as zin:
        if zin.comment == marker:
            return False
        tmp = archive.with_name(f"{archive.name}.{os.getpid()}.part")
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
                names = set(zin.namelist())
                for info in zin.infolist():
                    if info.filename.endswith(".pyc") and info.filename[:-1] in names:
                        continue  # another interpreter's, or ours from before: made anew
                    data = zin.read(info)
                    zout.writestr(info, data)
                    if not info.filename.endswith(".py"):
                        continue
                    # The name zipimport gives the module's source: tracebacks read the same.
                    try:
                        pyc = _pyc(data, f"{archive}{os.sep}{info.filename}")
                    except (SyntaxError, ValueError):
                        continue
                    entry = zipfile.ZipInfo(info.filename + "c", info.date_time)
                    entry.compress_type = zipfile.ZIP_DEFLATED
                    zout.writestr(entry, pyc)
                zout.comment = marker
            tmp.replace(archive)
        finally:
            tmp.unlink(missing_ok=True)
    return True


def ensure() -> list[Path]:
    """Bytecode in the installed pyspark's zips (see the module's docstring); the archives
    rewritten now (none when done before, or when pyspark is not installed here)."""
    lib = spark_python_lib()
    if lib is None:
        return []
    done = []
    for archive in sorted(lib.glob("*.zip")):
        try:
            if add_bytecode(archive):
                done.append(archive)
        except OSError:  # a read-only install: Spark runs the same, only slower to start
            continue
    return done


def main() -> int:
    done = ensure()
    for archive in done:
        print(f"pyspark_bytecode: compiled {archive}")
    if not done:
        print("pyspark_bytecode: nothing to do (done before, or no pip-installed pyspark)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
