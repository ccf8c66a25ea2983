"""Where the local stack keeps its state, and the signal key it generates for its readers.

``scripts/stack`` (native servers) and ``make docker-up`` (compose) write one random key to
``<STACK_DIR>/signal-secret`` the first time they start. A reader and ``cdc snapshot`` whose
``postgres.dsn`` points at the local stack's PostgreSQL (127.0.0.1:55432) and that are given
no key of their own sign and check signals with it, so the local stack works with nothing to
configure while its password (``cdc``) is far too short to derive a key from.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from pgcdc.core.ports import PORTS

REPO = Path(__file__).resolve().parents[2]
SIGNAL_SECRET_FILE = "signal-secret"
# The addresses a DSN may give for the local stack's PostgreSQL.
_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def stack_dir() -> Path:
    """The stack's state folder: ``STACK_DIR``, else ``.stack`` in the repository."""
    return Path(os.environ.get("STACK_DIR") or REPO / ".stack").resolve()


def signal_secret_path() -> Path:
    return stack_dir() / SIGNAL_SECRET_FILE


def is_local_stack(host: str | None, port: str | int | None) -> bool:
    """Whether a DSN's host and port are the local stack's PostgreSQL."""
    return (host or "") in _LOCAL_HOSTS and str(port or "") == str(PORTS["postgres"])


def read_secret(path: Path) -> str | None:
    """The key in ``path`` (surrounding blanks stripped), or None if there is no such file."""
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def ensure_secret(path: Path) -> str:
    """The key in ``path``, written first (32 random bytes, URL-safe base64, mode 0600) if
    the file does not exist yet. Written aside and linked into place, so two starts at once
    agree on one key and neither reads a half-written file."""
    found = read_secret(path)
    if found is not None:
        return found
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32)
    aside = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    try:
        os.link(aside, path)
    except FileExistsError:
        key = read_secret(path) or key
    finally:
        aside.unlink()
    return key
