"""The native module's fold (``pgcdc_native.Folder``) gives what the Python fold gives
(:func:`pgcdc.core.row_digest.fold_into` of :func:`~pgcdc.core.row_digest.folded_text`), row
for row and added up, for any id and text."""

from __future__ import annotations

import importlib
import logging
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.core import native
from pgcdc.core.row_digest import Folds, fold_into, folded_text, stored, stored_function

pytestmark = pytest.mark.unit

mod = native.module()
needs_module = pytest.mark.skipif(
    mod is None, reason="pgcdc_native is not installed (make install builds it where cargo is)"
)


@needs_module
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=300)), max_size=50))
def test_the_native_fold_is_the_python_fold(rows: list[tuple[bytes, bytes]]) -> None:
    assert mod is not None
    folder = mod.Folder()
    want: Folds = {}
    for key, text in rows:
        assert mod.folded(key, text) == folded_text(key, text)
        folder.add(key, text)
        fold_into(want, *folded_text(key, text))
    assert folder.folds() == want


LONGS = st.integers(-(2**63), 2**63 - 1)  # what a document holds: JSON's integers


@needs_module
@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=30),
    st.dictionaries(
        st.text(max_size=10),
        st.one_of(st.none(), st.booleans(), LONGS, st.text(), st.lists(LONGS)),
        max_size=12,
    ),
)
def test_the_digest_the_search_follower_keeps_is_pythons(key: str, doc: dict[str, object]) -> None:
    """What the search follower keeps beside a document, hashed natively, is
    :func:`~pgcdc.core.row_digest.stored`'s."""
    natively = stored_function()
    assert natively is not stored  # the native twin
    assert natively(key, doc) == stored(key, doc)


def test_an_installed_module_is_of_this_interface() -> None:
    """The module's number and pgcdc's agree: else every native test above would skip
    quietly (``make install`` builds the module again)."""
    try:
        installed = importlib.import_module("pgcdc_native")
    except ImportError:
        pytest.skip("pgcdc_native is not installed (make install builds it where cargo is)")
    assert getattr(installed, "INTERFACE", None) == native.INTERFACE


def test_a_module_of_another_interface_is_not_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A module built from older sources (a checkout updated without ``make install``) is
    left aside with one log line, not called into a crash."""
    stale = types.ModuleType("pgcdc_native")  # as stop 50 built it: no INTERFACE
    monkeypatch.setitem(sys.modules, "pgcdc_native", stale)
    monkeypatch.setattr(native, "_told", set())
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.module() is None
        assert native.module() is None
        assert stored_function() is stored
    assert [r.getMessage() for r in caplog.records] == [
        f"pgcdc_native is of interface None, this pgcdc needs {native.INTERFACE}: running "
        "without it (make install builds it again)"
    ]
    stale.INTERFACE = native.INTERFACE  # type: ignore[attr-defined]
    assert native.module() is stale


def test_the_module_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCDC_NATIVE", "off")
    assert native.module() is None
    assert stored_function() is stored
    monkeypatch.setenv("PGCDC_NATIVE", "on")
    assert (native.module() is None) == (mod is None)


@needs_module
def test_bytes_that_are_no_reply_are_refused_not_a_crash() -> None:
    """What a server (or something posing as one) sends that is no reply to ``SCAN``: a
    length past any buffer, arrays nested past any reply, a type no reply has. Each raises
    ``ValueError``; a reply not yet whole waits."""
    assert mod is not None

    def scan(data: bytes) -> object:
        state = mod.CacheFold(3, [b"a"], [b'"a"'], b"p:*", 10)
        state.feed(data)
        return state.scan()

    for bad in (
        b"$18446744073709551615\r\n",
        b"$9223372036854775807\r\nx\r\n",
        b"*1\r\n" * 100 + b":1\r\n",
        b"!3\r\nabc\r\n",
    ):
        with pytest.raises(ValueError):
            scan(bad)
    assert scan(b"*2\r\n$1\r\n0\r\n*1000000\r\n") is None  # an array not yet whole
    request, scans, keys = scan(b"*2\r\n$2\r\n17\r\n*1\r\n$4\r\np:k1\r\n")
    assert (scans, keys) == (True, 1) and request.startswith(b"*6\r\n$4\r\nSCAN\r\n$2\r\n17\r\n")
    assert request.endswith(b"*2\r\n$7\r\nHGETALL\r\n$4\r\np:k1\r\n")
