"""OpenSearch 2.19 integ-test zip from Maven Central on JDK 17, never as root.

Under root it runs as a locked system user (``cdcstack``); otherwise as the user running
the stack. The integ-test distribution has no security plugin: plain HTTP, no users.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import ClassVar

from pgcdc.core.ports import HOST, OPENSEARCH_TRANSPORT_PORT
from pgcdc.stack import common
from pgcdc.stack.service import Service
from pgcdc.stack.versions import OPENSEARCH_VERSION

VERSION = OPENSEARCH_VERSION
URL = (
    "https://repo1.maven.org/maven2/org/opensearch/distribution/integ-test-zip/opensearch/"
    f"{VERSION}/opensearch-{VERSION}.zip"
)
OS_USER = "cdcstack"  # OpenSearch refuses to run as root
HEAP = "-Xms256m -Xmx512m"


def server_user() -> str | None:
    """The OS user that runs OpenSearch: a system user under root, else ourselves (None)."""
    return OS_USER if os.geteuid() == 0 else None


class OpenSearch(Service):
    name = "opensearch"
    packages: ClassVar[dict[str, str]] = {"openjdk-17-jre-headless": "java17"}
    start_deadline_s = 180

    @property
    def dist(self) -> Path:
        return self.paths.cache / f"opensearch-{VERSION}"

    @property
    def conf(self) -> Path:
        return self.home / "config"

    def owns(self, cmdline: str) -> bool:
        # Matches both the launcher script (before it execs java) and the JVM itself.
        return str(self.dist) in cmdline

    def fetch(self) -> None:
        """Download and unpack the distribution into the cache, once."""
        if (self.dist / "bin" / "opensearch").exists():
            return
        zip_path = common.download(
            URL, self.paths.cache / "downloads" / f"opensearch-{VERSION}.zip"
        )
        common.say(f"unpacking {zip_path.name}")
        with tempfile.TemporaryDirectory(dir=self.paths.cache) as tmp:
            common.run(["unzip", "-q", zip_path, "-d", tmp], timeout=600)
            Path(tmp, f"opensearch-{VERSION}").rename(self.dist)
        self.dist.chmod(0o755)

    def prepare(self) -> None:
        self.fetch()
        user = server_user()
        if user is not None:
            common.ensure_system_user(user)
        for sub in ("data", "logs", "tmp"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        if not (self.conf / "jvm.options").exists():
            shutil.copytree(self.dist / "config", self.conf, dirs_exist_ok=True)
        jvm_orig = self.dist / "config" / "jvm.options"
        # The shipped 1g heap is replaced, so OPENSEARCH_JAVA_OPTS is not the only guard.
        jvm = self.conf / "jvm.options"
        lines = [
            ln for ln in jvm_orig.read_text().splitlines() if not ln.startswith(("-Xms", "-Xmx"))
        ]
        # bin/opensearch runs from the (read-only) distribution folder: make paths absolute.
        logs, data = self.home / "logs", self.home / "data"
        lines = [
            ln.replace("file=logs/", f"file={logs}/")
            .replace("=logs/", f"={logs}/")
            .replace("HeapDumpPath=data", f"HeapDumpPath={data}")
            for ln in lines
        ]
        jvm.write_text("\n".join([*lines, *HEAP.split(), ""]))
        (self.conf / "opensearch.yml").write_text(
            "\n".join(
                [
                    "# Written by scripts/stack on every start; edit pgcdc/stack/opensearch.py instead.",
                    "cluster.name: cdc-stack",
                    "node.name: stack-1",
                    f"path.data: {self.home / 'data'}",
                    f"path.logs: {self.home / 'logs'}",
                    f"network.host: {HOST}",
                    f"http.port: {self.port}",
                    f"transport.port: {OPENSEARCH_TRANSPORT_PORT}",
                    "discovery.type: single-node",
                    "bootstrap.memory_lock: false",
                    # The disk of a dev machine is often >90% full; never go read-only over it.
                    "cluster.routing.allocation.disk.threshold_enabled: false",
                    "",
                ]
            )
        )
        if user is not None:
            self.paths.stack.chmod(0o755)
            self.home.chmod(0o755)
            common.chown(self.home, user, recursive=True)
            for needed in (self.home, self.dist / "bin"):
                common.check_reachable(user, needed)

    def launch(self) -> int:
        env = {
            "OPENSEARCH_JAVA_HOME": str(common.java_home()),
            "OPENSEARCH_PATH_CONF": str(self.conf),
            "OPENSEARCH_TMPDIR": str(self.home / "tmp"),
            "OPENSEARCH_JAVA_OPTS": HEAP,
        }
        # bin/opensearch execs java, so the spawned pid is the server's pid.
        return common.spawn(
            [self.dist / "bin" / "opensearch"],
            log=self.log,
            user=server_user(),
            env=env,
            cwd=self.home,
        )

    def _get(self, path: str) -> dict[str, object] | None:
        try:
            with urllib.request.urlopen(f"http://{self.address}{path}", timeout=5) as r:
                body = json.load(r)
                return body if isinstance(body, dict) else None
        except (OSError, ValueError):
            return None

    def probe(self) -> bool:
        root = self._get("/")
        if root is None or "version" not in root:
            return False
        health = self._get("/_cluster/health")
        return health is not None and health.get("status") in ("yellow", "green")
