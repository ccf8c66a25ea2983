"""The schema registry for Avro: Apicurio Registry from Maven Central, on Java 21+.

Started on demand (``scripts/stack up --registry``, or ``up registry``): only Avro users need
it. Clients use its Confluent-compatible API at ``/apis/ccompat/v7`` (what
``schema.registry_url`` takes, see ``pgcdc.core.ports.REGISTRY_URL``); its health checks
answer on a management port of their own.

The distribution (``io.apicurio:apicurio-registry-app``, ``tar.gz``, classifier ``all``) is a
ready Quarkus application (``quarkus-run.jar`` with ``lib/``, ``app/``, ``quarkus/``); it is
checked against Maven Central's SHA-1 and unpacked into the cache once. It runs with:

- storage in an H2 database file under ``.stack/registry/`` (an in-memory one would lose
  every schema on ``down``/``up`` while Kafka keeps the records that name them by id);
- Confluent's default compatibility rule, BACKWARD (Apicurio's own default is none);
- a small JVM: 512 MB heap at most, the serial collector, the quick compiler only. It
  answered 2.7 s after the start on this 2-core machine, having used 3.3 s of CPU, and kept
  about 260 MB resident, 310 MB after the registry tests (``docs/avro.md``).

No authentication by default, as Confluent's registry. With ``users`` (tests) it asks for
HTTP basic auth from Quarkus' embedded users and answers 401 to anyone else.
"""

from __future__ import annotations

import base64
import json
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from pgcdc.core.ports import HOST, OPTIONAL_PORTS, REGISTRY_MANAGEMENT_PORT
from pgcdc.stack import common
from pgcdc.stack.service import Service
from pgcdc.stack.versions import APICURIO_REGISTRY_VERSION, REGISTRY_JAVA_MAJOR

VERSION = APICURIO_REGISTRY_VERSION
ARTIFACT = f"apicurio-registry-app-{VERSION}-all.tar.gz"
URL = f"https://repo1.maven.org/maven2/io/apicurio/apicurio-registry-app/{VERSION}/{ARTIFACT}"
JVM = ["-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
# Confluent's default; Apicurio's is no rule at all.
COMPATIBILITY = "BACKWARD"
API = "/apis/ccompat/v7"


def download(paths: common.Paths) -> Path:
    """The distribution's ``tar.gz`` in the download cache, fetched once and checked against
    Maven Central's SHA-1 (a mismatch deletes it). The registry's image builds from it too
    (``pgcdc.stack.docker.stage_caches``)."""
    archive = common.download(URL, paths.cache / "downloads" / ARTIFACT)
    try:
        with urllib.request.urlopen(URL + ".sha1", timeout=30) as r:
            want = r.read().decode().split()[0].strip()
    except OSError as e:
        raise common.StackError(f"cannot fetch {URL}.sha1: {e}") from e
    got = common.file_sha1(archive)
    if got != want:
        archive.unlink()
        raise common.StackError(
            f"{ARTIFACT}: SHA-1 {got} is not Maven Central's {want}; deleted, run up again"
        )
    return archive


class Registry(Service):
    name = "registry"
    start_deadline_s = 90

    def __init__(
        self,
        paths: common.Paths,
        *,
        port: int | None = None,
        management_port: int | None = None,
        users: dict[str, str] | None = None,
    ) -> None:
        super().__init__(paths)
        self._port = OPTIONAL_PORTS[self.name] if port is None else port
        self.management_port = (
            REGISTRY_MANAGEMENT_PORT if management_port is None else management_port
        )
        self.users = dict(users or {})

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """Confluent's API of this registry: a client's ``url`` (``schema.registry_url``)."""
        return f"http://{self.address}{API}"

    @property
    def dist(self) -> Path:
        return self.paths.cache / f"apicurio-registry-{VERSION}"

    @property
    def data(self) -> Path:
        return self.home / "data"

    def owns(self, cmdline: str) -> bool:
        return "quarkus-run.jar" in cmdline and f"-Dquarkus.http.port={self.port} " in (
            cmdline + " "
        )

    def fetch(self) -> None:
        """Download (checked against Maven Central's SHA-1) and unpack, once."""
        if (self.dist / "quarkus-run.jar").exists():
            return
        archive = download(self.paths)
        common.say(f"unpacking {archive.name}")
        with tempfile.TemporaryDirectory(dir=self.paths.cache) as tmp:
            unpacked = Path(tmp, "dist")
            with tarfile.open(archive) as tar:  # no top folder: lib/, app/, quarkus/, the jar
                tar.extractall(unpacked, filter="data")
            if not (unpacked / "quarkus-run.jar").exists():
                raise common.StackError(f"{ARTIFACT} holds no quarkus-run.jar")
            unpacked.rename(self.dist)
        self.dist.chmod(0o755)

    def prepare(self) -> None:
        self.fetch()
        self.data.mkdir(parents=True, exist_ok=True)
        if self.users:
            self.home.chmod(0o700)  # the command line holds the users' passwords

    def java_options(self) -> list[str]:
        """The JVM's flags and the application's settings, as ``-D`` system properties."""
        settings = {
            "apicurio.storage.kind": "sql",
            "apicurio.storage.sql.kind": "h2",
            "apicurio.datasource.url": f"jdbc:h2:file:{self.data / 'registry'}",
            "quarkus.http.host": HOST,
            "quarkus.http.port": str(self.port),
            "quarkus.management.host": HOST,
            "quarkus.management.port": str(self.management_port),
            "apicurio.rules.global.compatibility": COMPATIBILITY,
        }
        if self.users:
            settings |= {
                "quarkus.http.auth.basic": "true",
                "apicurio.authn.mechanism.priority": "basic",
                "quarkus.security.users.embedded.enabled": "true",
                "quarkus.security.users.embedded.plain-text": "true",
            }
            settings |= {
                f"quarkus.security.users.embedded.users.{user}": password
                for user, password in self.users.items()
            }
        return [*JVM, *(f"-D{k}={v}" for k, v in settings.items())]

    def launch(self) -> int:
        home = common.java_home_at_least(
            REGISTRY_JAVA_MAJOR, needed_by=f"Apicurio Registry {VERSION}"
        )
        return common.spawn(
            [home / "bin" / "java", *self.java_options(), "-jar", self.dist / "quarkus-run.jar"],
            log=self.log,
            cwd=self.home,
        )

    def _get(self, url: str) -> object:
        request = urllib.request.Request(url)
        if self.users:
            user, password = next(iter(self.users.items()))
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=5) as r:
            return json.load(r)

    def probe(self) -> bool:
        """Ready by its own health check, and Confluent's API answers."""
        try:
            health = self._get(f"http://{HOST}:{self.management_port}/health/ready")
            if not isinstance(health, dict) or health.get("status") != "UP":
                return False
            return isinstance(self._get(f"{self.url}/subjects"), list)
        except (OSError, ValueError, urllib.error.HTTPError):
            return False
