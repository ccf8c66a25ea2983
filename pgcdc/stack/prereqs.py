"""Install missing Debian packages, once, and only when something is missing.

As root, apt-get runs directly. Otherwise it runs through ``sudo`` when sudo may be used
without a password prompt (or with one, on a terminal); without sudo, the stack stops with
the exact command to run first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from pgcdc.stack import common, pgbin

# Needed whatever the services: downloads, unpacking, certificates, and the JVM for
# Kafka/OpenSearch/mvn.
BASE = {"curl": "curl", "unzip": "unzip", "openssl": "openssl"}
JAVA = {"openjdk-17-jre-headless": "java17", "maven": "mvn"}


def present(probe: str) -> bool:
    """A probe is an absolute path, a command name, or one of the special 'java17' and
    'postgres-server' (any installed PostgreSQL server, see :mod:`pgcdc.stack.pgbin`)."""
    if probe == "java17":
        return any(
            (p / "bin" / "java").exists() for p in Path("/usr/lib/jvm").glob("java-17-openjdk-*")
        )
    if probe == "postgres-server":
        return pgbin.find() is not None
    if probe.startswith("/"):
        return Path(probe).exists()
    return shutil.which(probe) is not None


def _sudo_prefix(missing: list[str]) -> list[str]:
    """[] as root, ["sudo"] when sudo can be used, else a StackError with the command."""
    if os.geteuid() == 0:
        return []
    command = f"sudo apt-get install -y {' '.join(missing)}"
    if shutil.which("sudo") is None:
        raise common.StackError(
            f"missing packages {' '.join(missing)} and no sudo to install them; "
            f"ask an administrator to run: apt-get install -y {' '.join(missing)}"
        )
    no_prompt = subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False)
    if no_prompt.returncode == 0:
        return ["sudo", "-n"]
    if sys.stdin.isatty():
        common.say("sudo will ask for your password to install packages")
        return ["sudo"]
    raise common.StackError(
        f"missing packages {' '.join(missing)}; sudo needs a password and there is no "
        f"terminal to ask on: run `{command}`, then scripts/stack up again"
    )


def ensure(packages: Iterable[dict[str, str]]) -> None:
    """apt-get install the packages whose probe fails; never touch apt when none is missing."""
    wanted: dict[str, str] = {}
    for group in packages:
        wanted.update(group)
    missing = sorted(pkg for pkg, probe in wanted.items() if not present(probe))
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise common.StackError(
            f"missing {' '.join(missing)} and no apt-get: install them with your "
            "distribution's package manager (PostgreSQL: set PG_BINDIR to its bin folder)"
        )
    sudo = _sudo_prefix(missing)
    env = ["env", "DEBIAN_FRONTEND=noninteractive"]
    common.say(f"installing {' '.join(missing)} (apt-get{' via sudo' if sudo else ''})")
    if sudo == ["sudo"]:
        # A password prompt needs the terminal, so these two run attached to it.
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
            if subprocess.run([*sudo, *env, *cmd], check=False).returncode != 0:
                raise common.StackError(f"`sudo {' '.join(cmd)}` failed")
        return
    common.run([*sudo, *env, "apt-get", "update", "-q"], timeout=900)
    common.run(
        [*sudo, *env, "apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        timeout=1800,
    )
