"""Passwords of the secured servers' users, made once and kept in ``.stack/tls/``.

Random rather than well known, so that a test scanning logs for them proves something, and
readable only by the user who runs the stack (mode 0600). ``scripts/stack env --secure``
prints them as the ``CDC_*`` settings that reach the secured servers.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from pgcdc.stack import common

KAFKA_ADMIN = "admin"  # the broker's own SCRAM user (inter-broker, user management)
KAFKA_USER = "cdc"  # what the reader, the jobs and the tests log in as
REDIS_USER = "cdc"


@dataclass(frozen=True)
class Credentials:
    kafka_admin_password: str
    kafka_password: str
    redis_password: str


def load(paths: common.Paths) -> Credentials:
    """The stack's passwords, created on first use."""
    path = paths.stack / "tls" / "credentials.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # A recognisable prefix: a scan for leaked secrets cannot match anything by chance.
        fresh = {
            "kafka_admin_password": "kadm-" + secrets.token_urlsafe(18),
            "kafka_password": "kpw-" + secrets.token_urlsafe(18),
            "redis_password": "rpw-" + secrets.token_urlsafe(18),
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(fresh, indent=2) + "\n")
        tmp.chmod(0o600)
        tmp.replace(path)
    try:
        return Credentials(**json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise common.StackError(
            f"{path} is damaged; delete it and run scripts/stack up again"
        ) from e
