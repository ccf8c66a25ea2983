"""The followers' end-to-end tests again with ``CDC_TEST_DOCKER=1`` (marker ``docker``): their
servers are containers of the project's images (testcontainers), the reader and the jobs run
from this checkout. The images are those tests/e2e/test_docker.py uses (prepared once)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.e2e.docker_prepared import FIGURES, prepare_images

pytestmark = [pytest.mark.docker, pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def prepared() -> dict[str, float]:
    return prepare_images(rebuild=False)


# The followers' convergence (a 10k-change workload through reader, Kafka, both jobs) and
# the poison record: what the fixtures must serve. The kill and rebuild cases test the
# pipeline, not the fixtures, and run natively.
TESTCONTAINERS_SUBSET = "converge or poison"


def test_followers_e2e_on_testcontainers(prepared: dict[str, float]) -> None:
    """tests/e2e/test_followers.py's convergence with its servers as testcontainers."""
    env = {k: v for k, v in os.environ.items() if k != "CDC_TEST_NATIVE"}
    env["CDC_TEST_DOCKER"] = "1"
    env["CDC_TEST_FOLLOWERS_CHANGES"] = "5000"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-x",
         "tests/e2e/test_followers.py", "-k", TESTCONTAINERS_SUBSET],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    FIGURES["testcontainers run (s)"] = round(time.monotonic() - t0, 1)
    print("figures:", json.dumps(FIGURES, indent=2))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    # The session said where its servers came from (tests/conftest.py's report header).
    assert "servers: testcontainers" in proc.stdout, proc.stdout[:2000]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed is not None and int(passed.group(1)) >= 2, proc.stdout[-2000:]
