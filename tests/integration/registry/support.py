"""The schema registry the tests use: the stack's Apicurio Registry, or one of your own.

``PGCDC_TEST_REGISTRY_URL`` (with ``PGCDC_TEST_REGISTRY_USER_INFO``, ``user:password``, when it
asks for basic auth) points the tests at a registry of your own with Confluent's API (say,
Confluent's registry or Karapace); unset, they start the stack's (``scripts/stack up
registry``: a real Apicurio Registry, see ``pgcdc/stack/registry.py``), which needs no auth.
A registry with basic auth, for the wrong-password case, is a second Apicurio Registry the
test starts on free ports from the same cached distribution (:func:`registry_with_users`).

Every test writes its own topics (``tests.conftest.topic_prefix``), so its subjects
(``<topic>-key``, ``<topic>-value``) are its own: nothing leaks between tests or runs.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pgcdc.core.ports import REGISTRY_URL
from pgcdc.stack import common
from pgcdc.stack.registry import Registry
from tests.conftest import STACK
from tests.ports import free_port as _free_port


def stack_registry() -> str:
    """Start the stack's registry if it is down (idempotent); its Confluent API URL."""
    up = subprocess.run(
        [str(STACK), "up", "registry"], capture_output=True, text=True, timeout=600, check=False
    )
    if up.returncode != 0:
        raise AssertionError(f"scripts/stack up registry failed:\n{up.stdout}\n{up.stderr}")
    return REGISTRY_URL


@contextmanager
def registry_for_tests() -> Iterator[tuple[str, str]]:
    """(URL, basic-auth user info or '') of the registry the tests use (the module docstring
    says which)."""
    url = os.environ.get("PGCDC_TEST_REGISTRY_URL")
    if url:
        yield url, os.environ.get("PGCDC_TEST_REGISTRY_USER_INFO", "")
        return
    yield stack_registry(), ""


@contextmanager
def registry_with_users(state: Path, users: dict[str, str]) -> Iterator[str]:
    """A second Apicurio Registry that asks for basic auth from ``users``, its state in
    ``state``, on free ports; yields its Confluent API URL and stops it afterwards."""
    paths = common.Paths(stack=state, cache=common.paths().cache)
    registry = Registry(paths, port=_free_port(), management_port=_free_port(), users=users)
    registry.start()
    try:
        registry.wait_ready()
        yield registry.url
    finally:
        registry.stop()


def registry_env(url: str, user_info: str) -> dict[str, str]:
    """The reader's (and the jobs') settings for Avro through that registry."""
    env = {"CDC_SCHEMA__VALUE_FORMAT": "avro", "CDC_SCHEMA__REGISTRY_URL": url}
    if user_info:
        env["CDC_SCHEMA__REGISTRY_BASIC_AUTH_USER_INFO"] = user_info
    return env


def forget_subjects(url: str, user_info: str, prefix: str) -> None:
    """Delete every subject under a test's topic prefix, soft then for good (Confluent's two
    steps), so the stack's registry, which keeps its schemas, does not grow run after run."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    conf = {"url": url} | ({"basic.auth.user.info": user_info} if user_info else {})
    client = SchemaRegistryClient(conf)
    for subject in client.get_subjects():
        if subject.startswith(f"{prefix}."):
            client.delete_subject(subject)
            client.delete_subject(subject, permanent=True)
