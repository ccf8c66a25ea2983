"""Install missing Debian packages, once, and only when something is missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from pgcdc.stack import common

# Needed whatever the services: downloads, unpacking, and the JVM for Kafka/OpenSearch/mvn.
BASE = {"curl": "curl", "unzip": "unzip"}
JAVA = {"openjdk-17-jre-headless": "java17", "maven": "mvn"}


def present(probe: str) -> bool:
    """A probe is an absolute path, a command name, or the special 'java17'."""
    if probe == "java17":
        return any(
            (p / "bin" / "java").exists() for p in Path("/usr/lib/jvm").glob("java-17-openjdk-*")
        )
    if probe.startswith("/"):
        return Path(probe).exists()
    return shutil.which(probe) is not None


def ensure(packages: Iterable[dict[str, str]]) -> None:
    """apt-get install the packages whose probe fails; never touch apt when none is missing."""
    wanted: dict[str, str] = {}
    for group in packages:
        wanted.update(group)
    missing = sorted(pkg for pkg, probe in wanted.items() if not present(probe))
    if not missing:
        return
    if os.geteuid() != 0:
        raise common.StackError(
            f"missing packages {' '.join(missing)}; run as root or install them"
        )
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    common.say(f"installing {' '.join(missing)} (apt-get)")
    common.run(["apt-get", "update", "-q"], env=env, timeout=900)
    common.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        env=env,
        timeout=1800,
    )
