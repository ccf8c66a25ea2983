"""Who owns a topic prefix and a slot (cdc.ownership): the pure decisions."""

from __future__ import annotations

import pytest

from cdc.ownership import (
    SOURCE_KEY,
    PrefixOwnedError,
    Source,
    claim_prefix,
    slot_claimed_in,
    state_topic_prefixes,
    unowned_slot_message,
)
from cdc.state import Phase, ReaderState

pytestmark = pytest.mark.unit

A = Source("7300000000000000001", "app", "a_slot")
B = Source("7300000000000000002", "app", "b_slot")  # same database name, another cluster


def slot_record(database: str, slot: str) -> dict[bytes, bytes | None]:
    return {f"{database}/{slot}".encode(): ReaderState(slot, database, Phase.STREAMING).to_json()}


def test_an_unclaimed_prefix_is_claimed_and_its_owner_again_passes() -> None:
    assert claim_prefix({}, A, "p", "p.__cdc_state") is True
    owned = {SOURCE_KEY: A.to_json()}
    assert claim_prefix(owned, A, "p", "p.__cdc_state") is False
    # Another slot of the same database is the same source (it writes the same rows).
    assert claim_prefix(owned, Source(A.system_identifier, "app", "new"), "p", "t") is False


def test_another_cluster_or_database_is_refused_naming_both_and_the_setting() -> None:
    owned = {SOURCE_KEY: A.to_json()}
    for other in (B, Source(A.system_identifier, "billing", "a_slot")):
        with pytest.raises(PrefixOwnedError) as caught:
            claim_prefix(owned, other, "p", "p.__cdc_state")
        text = str(caught.value)
        assert "\n" not in text
        for part in (
            A.describe(),
            other.describe(),
            "p.__cdc_state",
            "CDC_KAFKA__TOPIC_PREFIX",
            "CDC_KAFKA__CLAIM_PREFIX",
        ):
            assert part in text


def test_a_state_topic_from_before_sources_were_recorded_is_judged_by_its_slot_records() -> None:
    assert claim_prefix(slot_record("app", "a_slot"), A, "p", "t") is True
    with pytest.raises(PrefixOwnedError, match="database shop"):
        claim_prefix(slot_record("shop", "s"), A, "p", "t")
    # A reset slot (a tombstone) no longer says anything.
    assert claim_prefix({b"shop/s": None}, A, "p", "t") is True
    # Records of a slot's queue and keys are not slot records.
    assert claim_prefix({b"shop/s#keys": b"{}", b"shop/s#snapshots": b"{}"}, A, "p", "t")


def test_an_owner_recorded_without_a_system_identifier_is_completed() -> None:
    vague = {SOURCE_KEY: Source("", "app").to_json()}
    assert claim_prefix(vague, A, "p", "t") is True
    assert claim_prefix(vague, Source("", "app"), "p", "t") is False


def test_a_slot_is_claimed_by_a_live_record_of_the_same_source() -> None:
    assert slot_claimed_in(slot_record("app", "a_slot"), A)
    assert not slot_claimed_in({b"app/a_slot": None}, A)
    assert not slot_claimed_in({SOURCE_KEY: B.to_json(), **slot_record("app", "a_slot")}, A)
    assert state_topic_prefixes(["x.__cdc_state", "p.__cdc_state", "x.public.t"], "p") == ["x"]


def test_the_refusal_of_a_slot_says_whose_it_seems_and_the_ways_past() -> None:
    mine = unowned_slot_message("s", "new", ["old"], None, False)
    assert "under topic prefix old (old.__cdc_state), not under new" in mine
    theirs = unowned_slot_message("s", "new", [], "process 7", True)
    assert "another tool" in theirs and "process 7" in theirs and "lost" in theirs
    for text in (mine, theirs):
        assert "CDC_POSTGRES__SLOT_NAME" in text and "--adopt-slot" in text
