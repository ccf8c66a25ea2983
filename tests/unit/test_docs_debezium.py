"""docs/debezium.md lists the parity test's allow-list: every entry, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.debezium_parity.allowlist import ALLOWED

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "debezium.md"


def test_the_doc_lists_every_allow_list_entry() -> None:
    text = DOC.read_text()
    section = text.split("## Field-level differences the parity test allows", 1)[1]
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.MULTILINE)
    assert sorted(listed) == sorted(d.name for d in ALLOWED)
