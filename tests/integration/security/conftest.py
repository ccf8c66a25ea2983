"""The stack's secured endpoints for the security tests: started on demand, read back as the
``CDC_*`` settings ``scripts/stack env --secure`` prints."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from pgcdc.core.ports import SECURE_SERVICES
from tests.conftest import STACK, Endpoints


@pytest.fixture(scope="session")
def secure_env(endpoints: Endpoints) -> dict[str, str]:
    """``CDC_*`` variables for PostgreSQL over TLS, SASL_SSL Kafka and TLS Redis."""
    if endpoints.via != "native":
        pytest.skip("the secured servers come from the native stack (scripts/stack) only")
    # `up postgres` turns TLS on in a server started before the stack had it (a reload).
    up = subprocess.run(
        [str(STACK), "up", "postgres", *SECURE_SERVICES],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert up.returncode == 0, f"scripts/stack up failed:\n{up.stdout}\n{up.stderr}"
    out = subprocess.run(
        [str(STACK), "env", "--secure"], capture_output=True, text=True, check=True
    ).stdout
    env = {}
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = shlex.split(value)[0]
    return env


def secrets_of(env: dict[str, str]) -> list[str]:
    """The passwords a run with ``env`` knows: none may ever be printed."""
    from urllib.parse import unquote, urlsplit

    redis_password = unquote(urlsplit(env["CDC_REDIS__URL"]).password or "")
    return [s for s in (env["CDC_KAFKA__SASL_PASSWORD"], redis_password) if s]
