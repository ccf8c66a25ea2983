"""PostgreSQL majors the machine's distribution does not ship, from Debian roots run with chroot.

Debian 12 ships PostgreSQL 15; Debian 13 (trixie) ships 17 and Debian testing ships 18, all on
the Debian mirror the machine already uses. Their binaries need their own suite's C library,
so each major runs inside a root of its own suite, with ``chroot`` (a chroot shares the host's
network: the server listens on 127.0.0.1 like any other).

A root holds only what the server and its client programs need to run: the
``postgresql-<N>`` and ``postgresql-client-<N>`` packages and the libraries they depend on
(plus ``tzdata``, ``libc-bin`` for the C.UTF-8 locale and ``dash`` for ``/bin/sh``), unpacked
with ``dpkg-deb``, no maintainer scripts run. Left out on purpose: ``postgresql-common`` (Perl
wrappers around the binaries, which are called directly), LLVM (the JIT; ``jit`` is off),
Perl, debconf, locales. That is about 40 MB of packages and a few seconds of unpacking, where
``debootstrap --variant=minbase`` plus the same packages fetched 115 MB and took 1m45s here.

The chain of trust is apt's: ``InRelease`` is checked with ``gpgv`` against the machine's
``debian-archive-keyring``, the package index against ``InRelease``'s SHA-256 and every package
against the index's SHA-256.

Roots are built once per machine into ``CACHE_DIR/pgroots/<major>-<suite>-r<recipe>`` (a lock
keeps two builders apart). A server never runs in the cached root itself: :func:`instance`
makes a copy of hard links (instant, no space) whose data folder is the server's own.
"""

from __future__ import annotations

import fcntl
import fnmatch
import lzma
import os
import pwd
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pgcdc.stack import common, versions

# The Debian suite that ships each major (16 is in none of the suites a Debian mirror carries
# today: bookworm has 15, trixie 17, testing and unstable 18; see docs/own-postgres.md).
SUITES: dict[int, str] = versions.POSTGRES_ROOT_SUITES
# Bump when what goes into a root changes: a new folder is built beside the old one.
RECIPE = 1
DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")

# Dependencies left out (fnmatch patterns): maintainer-script and packaging tools, the JIT,
# Perl. A clause whose alternatives are all left out is dropped.
EXCLUDED = (
    "postgresql-common*",
    "postgresql-client-common",
    "ssl-cert",
    "locales",
    "locales-all",
    "libllvm*",
    "libz3-*",
    "perl",
    "perl-*",
    "libperl*",
    "libjson-perl",
    "debconf",
    "debconf-2.0",
    "cdebconf",
    "adduser",
    "passwd",
    "init-system-helpers",
    "sensible-utils",
    "ucf",
    "lsb-base",
    "sysvinit-utils",
    "logrotate",
    "cron",
    "cron-daemon-common",
    "netbase",
    "media-types",
    "usr-is-merged",
    "usrmerge",
    "base-files",
    "dpkg",
    "coreutils",
    "libpam-modules*",
    "libpam-runtime",
    "gcc-*-base",
)
# Unpacked but useless without what was left out, or never read by a server.
PRUNED = ("usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/lintian")

# Programs run inside a root (the server's user, a clean environment).
CHROOT = "chroot"


@dataclass(frozen=True)
class PgRoot:
    """A built root for one major."""

    path: Path
    major: int
    suite: str
    version: str  # the Debian version of postgresql-<major> in it

    @property
    def bindir(self) -> str:
        """The server's binaries, as seen inside the root."""
        return f"/usr/lib/postgresql/{self.major}/bin"


def available(major: int) -> bool:
    """Whether a root can provide ``major`` on this machine (a Debian suite ships it)."""
    return major in SUITES


def mirror() -> str:
    """The Debian mirror the machine uses (``PGCDC_DEBIAN_MIRROR`` overrides it)."""
    explicit = os.environ.get("PGCDC_DEBIAN_MIRROR")
    if explicit:
        return explicit.rstrip("/")
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for src in sources:
        try:
            text = src.read_text()
        except OSError:
            continue
        # deb822 ("URIs: …") and one-line ("deb [opts] URI suite …") forms.
        for m in re.finditer(r"^\s*(?:URIs:|deb(?:\s+\[[^\]]*\])?)\s+(\S+)", text, re.M):
            uri = m.group(1).rstrip("/")
            if uri.startswith(("http://", "https://")) and uri.endswith("/debian"):
                return uri
    return DEFAULT_MIRROR


def architecture() -> str:
    """dpkg's name for this machine's architecture (amd64, arm64, ...)."""
    exe = shutil.which("dpkg")
    if exe:
        out = subprocess.run([exe, "--print-architecture"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


def root_path(paths: common.Paths, major: int) -> Path:
    return paths.cache / "pgroots" / f"{major}-{SUITES[major]}-r{RECIPE}"


def find(paths: common.Paths, major: int) -> PgRoot | None:
    """The built root of ``major``, or None."""
    if major not in SUITES:
        return None
    path = root_path(paths, major)
    try:
        version = (path / ".pgcdc-root").read_text().split()[0]
    except (OSError, IndexError):
        return None
    return PgRoot(path, major, SUITES[major], version)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def ensure(paths: common.Paths, major: int) -> PgRoot:
    """The root of ``major``, built first if this machine has none."""
    if major not in SUITES:
        raise common.StackError(
            f"PostgreSQL {major} is not in any Debian suite this stack builds roots from "
            f"(it has {', '.join(f'{m} ({s})' for m, s in sorted(SUITES.items()))}); install "
            f"postgresql-{major} on this machine (e.g. from apt.postgresql.org) and the stack "
            "uses it directly"
        )
    _require_root_privileges()
    found = find(paths, major)
    if found is not None:
        return found
    final = root_path(paths, major)
    with _locked(final.with_name(final.name + ".lock")):
        found = find(paths, major)  # built meanwhile by another process
        if found is not None:
            return found
        t0 = time.monotonic()
        common.say(f"building a Debian {SUITES[major]} root for PostgreSQL {major} in {final}")
        tmp = final.with_name(f"{final.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            version, fetched = _build(tmp, major, SUITES[major])
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        common.say(
            f"root for PostgreSQL {major} ({version}) built in {time.monotonic() - t0:.1f}s "
            f"({fetched / 1e6:.0f} MB of packages)"
        )
    built = find(paths, major)
    assert built is not None
    return built


def _require_root_privileges() -> None:
    if os.geteuid() != 0:
        raise common.StackError(
            "PostgreSQL majors other than the installed one run in a Debian root with chroot, "
            "which needs root: run as root (or with sudo)"
        )


# ------------------------------------------------------------------------------ the index


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    filename: str
    sha256: str
    size: int
    depends: tuple[tuple[str, ...], ...]  # clauses of alternatives (names only)
    provides: tuple[str, ...]


def _relation_names(field: str) -> tuple[tuple[str, ...], ...]:
    """``a (>= 1), b | c:any`` → ((a,), (b, c))."""
    clauses = []
    for clause in field.split(","):
        alts = []
        for alt in clause.split("|"):
            name = alt.strip().split(" ", 1)[0].split("(", 1)[0].split(":", 1)[0].strip()
            if name:
                alts.append(name)
        if alts:
            clauses.append(tuple(alts))
    return tuple(clauses)


def parse_packages(text: str) -> dict[str, Package]:
    """A Debian ``Packages`` index, by package name (the last stanza of a name wins)."""
    out: dict[str, Package] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" not in fields or "Filename" not in fields:
            continue
        deps = ", ".join(f for f in (fields.get("Pre-Depends"), fields.get("Depends")) if f)
        out[fields["Package"]] = Package(
            name=fields["Package"],
            version=fields.get("Version", ""),
            filename=fields["Filename"],
            sha256=fields.get("SHA256", ""),
            size=int(fields.get("Size", "0")),
            depends=_relation_names(deps),
            provides=tuple(a[0] for a in _relation_names(fields.get("Provides", ""))),
        )
    return out


def _excluded(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in EXCLUDED)


def resolve(index: dict[str, Package], wanted: list[str]) -> list[Package]:
    """``wanted`` and everything they depend on, but the :data:`EXCLUDED` packages.

    For each dependency the first alternative that is a real package (or that a real package
    provides) is taken, unless one of the alternatives is already in.
    """
    providers: dict[str, str] = {}
    for p in index.values():
        for virtual in p.provides:
            providers.setdefault(virtual, p.name)
    chosen: dict[str, Package] = {}
    todo = list(wanted)
    while todo:
        name = todo.pop()
        if name in chosen:
            continue
        pkg = index.get(name) or index.get(providers.get(name, ""))
        if pkg is None:
            raise common.StackError(f"package {name} is not in the index")
        chosen[pkg.name] = pkg
        for clause in pkg.depends:
            alts = [a for a in clause if not _excluded(a)]
            if not alts or any(a in chosen for a in alts):
                continue
            pick = next((a for a in alts if a in index or a in providers), None)
            if pick is None:
                raise common.StackError(f"{pkg.name}: no package satisfies {' | '.join(clause)}")
            todo.append(pick)
    return sorted(chosen.values(), key=lambda p: p.name)


def _release_sha256(inrelease: str, member: str) -> str:
    """The SHA-256 ``InRelease`` lists for ``member`` (e.g. main/binary-amd64/Packages.xz)."""
    section = inrelease.split("\nSHA256:", 1)[1] if "\nSHA256:" in inrelease else ""
    for line in section.splitlines()[1:]:
        if not line.startswith(" "):
            break
        digest, _size, name = line.split()
        if name == member:
            return digest
    raise common.StackError(f"InRelease lists no SHA-256 for {member}")


def _fetch_verified(url: str, dest: Path, sha256: str) -> None:
    common.run(
        ["curl", "-fsSL", "--retry", "4", "--retry-delay", "2", "-o", dest, url], timeout=900
    )
    got = common.file_digest(dest, "sha256")
    if got != sha256:
        raise common.StackError(f"{url}: SHA-256 {got} is not the index's {sha256}")


def load_index(base: str, suite: str, arch: str, workdir: Path) -> dict[str, Package]:
    """The suite's main package index, its signature and digest checked."""
    inrelease = workdir / "InRelease"
    common.run(
        ["curl", "-fsSL", "--retry", "4", "-o", inrelease, f"{base}/dists/{suite}/InRelease"]
    )
    if shutil.which("gpgv") is None or not KEYRING.exists():
        raise common.StackError(
            f"gpgv and {KEYRING} are needed to check Debian's signature: "
            "apt-get install gpgv debian-archive-keyring"
        )
    common.run(["gpgv", "--keyring", KEYRING, inrelease])
    member = f"main/binary-{arch}/Packages.xz"
    packages = workdir / "Packages.xz"
    _fetch_verified(
        f"{base}/dists/{suite}/{member}",
        packages,
        _release_sha256(inrelease.read_text(errors="replace"), member),
    )
    return parse_packages(lzma.decompress(packages.read_bytes()).decode("utf-8", "replace"))


# ------------------------------------------------------------------------------ the build


def _server_ids() -> tuple[int, int]:
    """uid and gid of ``postgres`` inside roots: the host's postgres user's when it has one
    (files read the same from both sides), else 999."""
    try:
        entry = pwd.getpwnam("postgres")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 999, 999


def server_ids(root: Path) -> tuple[int, int]:
    """uid and gid of the root's ``postgres`` user."""
    for line in (root / "etc" / "passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == "postgres":
            return int(parts[2]), int(parts[3])
    raise common.StackError(f"{root} has no postgres user")


def _build(root: Path, major: int, suite: str) -> tuple[str, int]:
    """Build the root in ``root``; returns (postgresql's Debian version, bytes fetched)."""
    work = root.with_name(root.name + ".debs")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        base = mirror()
        index = load_index(base, suite, architecture(), work)
        server = f"postgresql-{major}"
        if server not in index:
            raise common.StackError(f"{suite} on {base} has no {server}")
        packages = resolve(
            index, [server, f"postgresql-client-{major}", "tzdata", "libc-bin", "dash"]
        )
        debs = [work / Path(p.filename).name for p in packages]
        with ThreadPoolExecutor(4) as pool:
            for fut in [
                pool.submit(_fetch_verified, f"{base}/{p.filename}", d, p.sha256)
                for p, d in zip(packages, debs, strict=True)
            ]:
                fut.result()
        fetched = sum(d.stat().st_size for d in debs)
        _unpack(root, debs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _finish(root, major)
    version = index[server].version
    (root / ".pgcdc-root").write_text(
        f"{version} {suite} recipe {RECIPE}\n"
        + "".join(f"{p.name} {p.version}\n" for p in packages)
    )
    return version, fetched


def _unpack(root: Path, debs: list[Path]) -> None:
    # Debian's merged /usr: /bin, /sbin, /lib and /lib64 point into /usr (programs name
    # /lib64/ld-linux-x86-64.so.2 as their interpreter), and unpacking must keep the links.
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        (root / link).symlink_to(f"usr/{link}")
    for deb in debs:
        extract = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
        untar = subprocess.run(
            ["tar", "-x", "--keep-directory-symlink", "--no-same-owner", "-C", str(root)],
            stdin=extract.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
        if extract.stdout is not None:
            extract.stdout.close()
        if extract.wait() != 0 or untar.returncode != 0:
            raise common.StackError(f"cannot unpack {deb.name}: {untar.stderr.strip()[-500:]}")


def _finish(root: Path, major: int) -> None:
    """Users, devices, /bin/sh, /tmp; prune; check the programs start."""
    uid, gid = _server_ids()
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\n"
        f"postgres:x:{uid}:{gid}:PostgreSQL:/var/lib/postgresql:/bin/sh\n"
    )
    (etc / "group").write_text(f"root:x:0:\npostgres:x:{gid}:\n")
    sh = root / "usr" / "bin" / "sh"
    if not sh.exists():
        sh.symlink_to("dash")
    for d, mode in (("tmp", 0o1777), ("var/lib/postgresql", 0o755), ("dev", 0o755)):
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d).chmod(mode)
    os.chown(root / "var/lib/postgresql", uid, gid)
    for name, major_minor in (
        ("null", (1, 3)),
        ("zero", (1, 5)),
        ("full", (1, 7)),
        ("random", (1, 8)),
        ("urandom", (1, 9)),
    ):
        node = root / "dev" / name
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(*major_minor))
        node.chmod(0o666)
    for sub in PRUNED:
        shutil.rmtree(root / sub, ignore_errors=True)
    lib = root / "usr" / "lib" / "postgresql" / str(major) / "lib"
    shutil.rmtree(lib / "bitcode", ignore_errors=True)  # LLVM bitcode for the JIT
    (lib / "llvmjit.so").unlink(missing_ok=True)
    (lib / "llvmjit_types.bc").unlink(missing_ok=True)
    for exe in ("postgres", "initdb", "pg_ctl", "pg_basebackup", "psql"):
        out = run_in(root, [f"/usr/lib/postgresql/{major}/bin/{exe}", "--version"], check=False)
        if out.returncode != 0:
            raise common.StackError(
                f"{exe} of PostgreSQL {major} does not run in its root: "
                f"{(out.stderr or out.stdout).strip()[-500:]}"
            )


# ------------------------------------------------------------------------------ running


def environment(major: int) -> dict[str, str]:
    """The whole environment of a program run in a root (nothing of the host's leaks in)."""
    return {
        "PATH": f"/usr/lib/postgresql/{major}/bin:/usr/bin:/usr/sbin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": "/var/lib/postgresql",
        "TZ": "UTC",
    }


def chroot_command(root: Path, argv: list[str], *, as_server: bool = True) -> list[str]:
    """``argv`` run inside ``root``, as its postgres user unless ``as_server`` is False."""
    cmd = [CHROOT]
    if as_server:
        uid, gid = server_ids(root)
        cmd.append(f"--userspec={uid}:{gid}")
        cmd.append(f"--groups={gid}")
    return [*cmd, str(root), *argv]


def major_of(root: Path) -> int:
    """The PostgreSQL major a root holds."""
    found = sorted(int(p.name) for p in (root / "usr/lib/postgresql").iterdir() if p.name.isdigit())
    if not found:
        raise common.StackError(f"{root} holds no PostgreSQL")
    return found[-1]


def run_in(
    root: Path, argv: list[str], *, as_server: bool = True, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a program inside ``root`` to completion; StackError on failure with ``check``."""
    proc = subprocess.run(
        chroot_command(root, argv, as_server=as_server),
        env=environment(major_of(root)),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise common.StackError(f"{' '.join(argv)} failed ({proc.returncode}) in {root}: {tail}")
    return proc


def spawn_in(root: Path, argv: list[str], *, log: Path) -> int:
    """Start a long-running program inside ``root`` as its postgres user, detached (its own
    session), output appended to ``log``; returns its pid (chroot execs the program, so it
    is the program's)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            chroot_command(root, argv),
            env=environment(major_of(root)),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc.pid


def instance(root: PgRoot, dest: Path) -> Path:
    """A copy of ``root`` at ``dest`` made of hard links (the cache stays untouched: servers
    write only below their own data folder); a full copy across file systems."""
    if (dest / ".pgcdc-root").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    done = subprocess.run(
        ["cp", "-al", str(root.path), str(tmp)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        common.run(["cp", "-a", root.path, tmp], timeout=600)
    tmp.rename(dest)
    return dest


def root_of_process(pid: int) -> Path | None:
    """The root directory a process runs in (``/`` for one outside any chroot)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/root"))
    except OSError:
        return None
