"""The Debian roots of other PostgreSQL majors: the index, the dependency walk, the mirror,
and the stack's choice of major (no network, no root)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcdc.stack import common, pgbin, pgroot, postgres

pytestmark = pytest.mark.unit

# A Packages index cut down to the shapes the walk meets: versioned dependencies,
# alternatives, a virtual package, Pre-Depends, a continuation line, excluded packages.
INDEX = """\
Package: postgresql-18
Version: 18.6-3
Pre-Depends: postgresql-common (>= 252~)
Depends: libc6 (>= 2.38), libssl3t64 (>= 3.0.0), locales | locales-all,
 libllvm19 (>= 1:19.1), tzdata, debconf (>= 0.5) | debconf-2.0
Filename: pool/main/p/postgresql-18/postgresql-18_18.6-3_amd64.deb
Size: 100
SHA256: aa

Package: postgresql-client-18
Version: 18.6-3
Depends: libpq5 (>= 18~), libreadline8t64 (>= 6.0) | libedit2
Filename: pool/main/p/postgresql-18/postgresql-client-18_18.6-3_amd64.deb
Size: 10
SHA256: bb

Package: libc6
Version: 2.41
Depends: libgcc-s1
Filename: pool/main/g/glibc/libc6.deb
SHA256: cc

Package: libgcc-s1
Version: 14
Filename: pool/main/g/gcc/libgcc-s1.deb
SHA256: dd

Package: libssl3t64
Version: 3.5
Depends: libc6
Provides: libssl3 (= 3.5)
Filename: pool/main/o/openssl/libssl3t64.deb
SHA256: ee

Package: libpq5
Version: 18.6-3
Depends: libssl3
Filename: pool/main/p/postgresql-18/libpq5.deb
SHA256: ff

Package: libreadline8t64
Version: 8.2
Filename: pool/main/r/readline/libreadline8t64.deb
SHA256: 11

Package: tzdata
Version: 2026
Depends: debconf (>= 0.5) | debconf-2.0
Filename: pool/main/t/tzdata/tzdata.deb
SHA256: 22

Package: postgresql-common
Version: 280
Depends: perl
Filename: pool/main/p/postgresql-common/postgresql-common.deb
SHA256: 33

Package: libllvm19
Version: 19
Filename: pool/main/l/llvm/libllvm19.deb
SHA256: 44
"""


def test_the_walk_takes_what_the_server_runs_on_and_leaves_the_rest() -> None:
    index = pgroot.parse_packages(INDEX)
    assert index["postgresql-18"].depends[-1] == ("debconf", "debconf-2.0")
    names = [p.name for p in pgroot.resolve(index, ["postgresql-18", "postgresql-client-18"])]
    assert names == [
        "libc6",
        "libgcc-s1",
        "libpq5",
        "libreadline8t64",
        "libssl3t64",  # through libpq5's virtual libssl3 too, once
        "postgresql-18",
        "postgresql-client-18",
        "tzdata",
    ]


def test_a_dependency_nothing_satisfies_is_one_clear_error() -> None:
    index = pgroot.parse_packages(INDEX.replace("libgcc-s1\n", "libgcc-s2\n", 1))
    with pytest.raises(common.StackError, match="libc6: no package satisfies libgcc-s2"):
        pgroot.resolve(index, ["libc6"])


def test_release_digest_lookup() -> None:
    inrelease = (
        "Origin: Debian\nSHA256:\n 0123 100 main/binary-amd64/Packages\n"
        " abcd 42 main/binary-amd64/Packages.xz\nSHA512:\n ffff 42 main/binary-amd64/Packages.xz\n"
    )
    assert pgroot._release_sha256(inrelease, "main/binary-amd64/Packages.xz") == "abcd"
    with pytest.raises(common.StackError):
        pgroot._release_sha256(inrelease, "main/binary-arm64/Packages.xz")


def test_the_mirror_comes_from_the_machines_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGCDC_DEBIAN_MIRROR", raising=False)
    monkeypatch.setattr(pgroot, "Path", lambda p: tmp_path / Path(p).name)
    (tmp_path / "sources.list").write_text(
        "deb [signed-by=/k.gpg] http://mirror.example/debian-security bookworm-security main\n"
        "deb http://mirror.example/debian bookworm main\n"
    )
    assert pgroot.mirror() == "http://mirror.example/debian"
    monkeypatch.setenv("PGCDC_DEBIAN_MIRROR", "http://other.example/debian/")
    assert pgroot.mirror() == "http://other.example/debian"


def test_16_says_where_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(common.StackError, match=r"PostgreSQL 16 is not in any Debian suite"):
        pgroot.ensure(common.Paths(tmp_path, tmp_path), 16)


def test_the_stacks_choice_of_major_is_kept(tmp_path: Path) -> None:
    paths = common.Paths(tmp_path / "stack", tmp_path / "cache")
    assert postgres.load_choice(paths) == postgres.Choice()  # nothing chosen: the installed one
    postgres.save_choice(paths, postgres.Choice(18, 55999))
    assert postgres.load_choice(paths) == postgres.Choice(18, 55999)
    service = postgres.Postgres(paths)
    assert service.port == 55999
    if 18 not in pgbin.installed():
        assert service.in_root and service.home == paths.stack / "postgres-18"
        assert service.data == paths.stack / "postgres-18/root/var/lib/postgresql/data"
