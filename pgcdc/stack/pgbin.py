"""Find the PostgreSQL server binaries of whatever version the machine has installed.

Debian and Ubuntu put each major version in ``/usr/lib/postgresql/<N>/bin`` (Debian 12: 15,
Debian 13: 17, Ubuntu 22.04: 14, Ubuntu 24.04: 16), which is not on ``PATH``; other
distributions put ``postgres`` and ``initdb`` on ``PATH``. A data folder only runs with the
major version that created it, so an existing one decides.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from pgcdc.stack.common import StackError

DEBIAN_ROOT = Path("/usr/lib/postgresql")
# The distribution's "current PostgreSQL" package (Debian and Ubuntu alike).
PACKAGE = "postgresql"


def _has_server(bindir: Path) -> bool:
    return (bindir / "postgres").is_file() and (bindir / "initdb").is_file()


def _debian_versions() -> dict[int, Path]:
    found = {}
    for d in DEBIAN_ROOT.glob("*/bin"):
        if d.parent.name.isdigit() and _has_server(d):
            found[int(d.parent.name)] = d
    return found


def installed() -> dict[int, Path]:
    """Every installed server by major: ``PG_BINDIR``, the Debian folders, ``pg_config``,
    ``PATH`` (the first found of a major wins)."""
    found: dict[int, Path] = {}
    explicit = os.environ.get("PG_BINDIR")
    for cand in (
        Path(explicit) if explicit else None,
        *(_debian_versions()[v] for v in sorted(_debian_versions(), reverse=True)),
        _pg_config_bindir(),
        _which_dir("postgres"),
    ):
        if cand is not None and _has_server(cand):
            major = version(cand)
            if major is not None:
                found.setdefault(major, cand)
    return found


def _pg_config_bindir() -> Path | None:
    exe = shutil.which("pg_config")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--bindir"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out) if out and _has_server(Path(out)) else None


def find(data: Path | None = None) -> Path | None:
    """The bin folder to use, or None if no PostgreSQL server is installed.

    Order: ``PG_BINDIR`` (an explicit choice), the version an existing ``data`` folder was
    made by, the newest ``/usr/lib/postgresql/<N>``, ``pg_config --bindir``, ``PATH``.
    """
    explicit = os.environ.get("PG_BINDIR")
    if explicit:
        return Path(explicit) if _has_server(Path(explicit)) else None
    versions = _debian_versions()
    made_by = _data_version(data)
    if made_by is not None:
        return versions.get(made_by) or _matching_path_install(made_by)
    if versions:
        return versions[max(versions)]
    on_path = shutil.which("postgres")
    return _pg_config_bindir() or (Path(on_path).parent if on_path else None)


def _data_version(data: Path | None) -> int | None:
    if data is None:
        return None
    try:
        return int((data / "PG_VERSION").read_text().strip())
    except (OSError, ValueError):
        return None


def _matching_path_install(major: int) -> Path | None:
    for cand in (_pg_config_bindir(), _which_dir("postgres")):
        if cand is not None and _version_of(cand) == major:
            return cand
    return None


def _which_dir(cmd: str) -> Path | None:
    exe = shutil.which(cmd)
    return Path(exe).parent if exe else None


def _version_of(bindir: Path) -> int | None:
    """The major version ``postgres --version`` reports ("postgres (PostgreSQL) 16.4")."""
    try:
        out = subprocess.run(
            [str(bindir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        return int(out.split()[-1].split(".")[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def require(data: Path | None = None) -> Path:
    """:func:`find`, or a clear error saying what to install."""
    found = find(data)
    if found is not None:
        return found
    explicit = os.environ.get("PG_BINDIR")
    if explicit:
        raise StackError(f"PG_BINDIR={explicit} holds no postgres and initdb")
    made_by = _data_version(data)
    if made_by is not None:
        raise StackError(
            f"{data} was created by PostgreSQL {made_by}, which is not installed: install "
            f"postgresql-{made_by}, or delete {data.parent if data else data} to start afresh"
        )
    raise StackError(f"no PostgreSQL server found; install the {PACKAGE} package")


def version(bindir: Path) -> int | None:
    """The major version of the server in ``bindir``."""
    return int(bindir.parent.name) if bindir.parent.name.isdigit() else _version_of(bindir)
