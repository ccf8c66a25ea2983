"""What the Docker modules share: whether this machine can run them, and the prepared engine,
Compose v2, base image and images (``make test`` prepares them in the background from its
start; the fixture waits for that, then finds them present)."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import pytest

from pgcdc.stack import common, docker

# Each module's figures, printed when it ends (the closing notes quote them).
FIGURES: dict[str, Any] = {}


def why_not() -> str | None:
    """Why this machine cannot run the Docker tests, or None when it can."""
    if os.environ.get("CDC_TEST_DOCKER") == "0":
        return "CDC_TEST_DOCKER=0"
    if docker.engine_answers():
        return None
    if os.geteuid() != 0:
        return "no Docker engine answers, and starting one needs root"
    if shutil.which("dockerd") is None and shutil.which("apt-get") is None:
        return "no Docker engine answers, no dockerd, and no apt-get to install docker.io"
    return None


def prepare_images(*, rebuild: bool) -> dict[str, float]:
    """The engine and the images, ready (skips the module when this machine cannot run
    them). ``rebuild``: build the images again from this checkout on the build cache (only
    what changed is redone), which the compose stack needs and testcontainers do not (their
    servers' images hold no code of the project)."""
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    t0 = time.monotonic()
    took = docker.prepare(common.paths())
    FIGURES["prepare (this session)"] = {k: round(v, 1) for k, v in took.items()}
    FIGURES["prepare wall (incl. waiting for the background)"] = round(time.monotonic() - t0, 1)
    if rebuild:
        rebuilt = docker.build_images()
        FIGURES["rebuild on the cache (s)"] = {k: round(v, 1) for k, v in rebuilt.items()}
    log = docker.background_log(common.paths())
    if log.exists():
        FIGURES["background log"] = str(log)
    return took
