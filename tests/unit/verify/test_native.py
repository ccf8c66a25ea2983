"""The native module's fold (``pgcdc_native.Folder``) gives what the Python fold gives
(:func:`pgcdc.core.row_digest.fold_into` of :func:`~pgcdc.core.row_digest.folded_text`), row
for row and added up, for any id and text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.core import native
from pgcdc.core.row_digest import Folds, fold_into, folded_text

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


def test_the_module_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCDC_NATIVE", "off")
    assert native.module() is None
    monkeypatch.setenv("PGCDC_NATIVE", "on")
    assert (native.module() is None) == (mod is None)
