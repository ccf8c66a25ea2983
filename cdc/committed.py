"""What a transactional reader has committed to Kafka (``kafka.exactly_once``).

The position is a record of the state topic (key ``<database>/<slot>#committed``) written
inside each Kafka transaction, so Kafka holds it exactly when it holds the records before it.
It is read back with ``read_committed`` (:mod:`cdc.state` reads the state topic that way).

The restart rule, in one place: a change record whose version (its transaction's commit LSN,
its order in that transaction) is at or below :attr:`Committed.version` is in Kafka already
and is not produced again; the slot is confirmed only up to :attr:`Committed.end_lsn`, the end
of the last PostgreSQL transaction Kafka holds whole. A slot confirmed beyond ``end_lsn`` may
have skipped changes Kafka never got: the reader stops (:func:`check_slot`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import orjson

from pgcdc.core.errors import SlotError
from pgcdc.core.lsn import Lsn

# A whole transaction: every order of it.
WHOLE = math.inf


def committed_key(database: str, slot: str) -> bytes:
    return f"{database}/{slot}#committed".encode()


def transactional_id(system_identifier: str, database: str, slot: str) -> str:
    """One per slot of one database of one cluster: a second reader of the same slot takes
    the id over and fences the first (``init_transactions``)."""
    return f"pgcdc-{system_identifier or 'unknown'}-{database}-{slot}"


@dataclass(frozen=True)
class Committed:
    """Everything up to here is in Kafka, committed."""

    # End of the last PostgreSQL transaction held whole (or an idle keepalive's position):
    # the slot may be confirmed up to here.
    end_lsn: Lsn
    # Version of the last change record held: its transaction's commit LSN and its order;
    # ``order`` None means that transaction is held whole. None before any change.
    commit_lsn: Lsn | None = None
    order: int | None = None
    updated_at: float = 0.0

    @property
    def version(self) -> tuple[int, float] | None:
        """(commit LSN, order) at or below which a record is held; None: none is."""
        if self.commit_lsn is None:
            return None
        return (self.commit_lsn.value, WHOLE if self.order is None else self.order)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "end_lsn": str(self.end_lsn),
                "commit_lsn": str(self.commit_lsn) if self.commit_lsn is not None else None,
                "order": self.order,
                "updated_at": self.updated_at,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Committed:
        d = orjson.loads(data)
        return cls(
            end_lsn=Lsn.parse(d["end_lsn"]),
            commit_lsn=Lsn.parse(d["commit_lsn"]) if d.get("commit_lsn") else None,
            order=d.get("order"),
            updated_at=float(d.get("updated_at") or 0.0),
        )

    def describe(self) -> str:
        if self.commit_lsn is None:
            return f"up to {self.end_lsn}"
        part = "" if self.order is None else f" (its records up to order {self.order})"
        return f"up to {self.end_lsn}, last transaction committed at {self.commit_lsn}{part}"


def check_slot(slot: str, confirmed: Lsn, committed: Committed, transactional: str) -> None:
    """Stop when the slot is confirmed beyond what Kafka holds: the changes between may be
    missing from Kafka, and PostgreSQL cannot send them again."""
    if confirmed > committed.end_lsn:
        raise SlotError(
            f"slot {slot} is confirmed up to {confirmed}, but Kafka holds the changes only "
            f"{committed.describe()} (transactional.id {transactional}): the changes between "
            "may be missing from Kafka, and the slot cannot go back. Was the slot advanced "
            "outside this reader, or the state topic's record lost? To carry on, take a new "
            "snapshot: `cdc reset-state`, then start the reader"
        )


class Position:
    """The streamer's side of the restart rule: what to skip, and what the next commit of
    the open Kafka transaction makes Kafka hold. It only ever moves forward: a run replays
    from the slot, which may stand before what an earlier run committed, and what it
    replays (skipped) must not move the position back, or a later restart would write it
    again."""

    def __init__(self, committed: Committed | None, start: Lsn) -> None:
        self.held = committed if committed is not None else Committed(start)
        # Records at or below this version are in Kafka; None once the stream is past it.
        self._skip = committed.version if committed is not None else None
        self.replaying = self._skip is not None

    def skips(self, commit_lsn: int, order: int) -> bool:
        """Whether the record of this version is in Kafka already (not to be produced)."""
        skip = self._skip
        return skip is not None and (commit_lsn, order) <= skip

    def transaction_ended(self, commit_lsn: Lsn, end_lsn: Lsn) -> None:
        """A PostgreSQL transaction's Commit, its records all produced (or skipped)."""
        held = self.held
        version = (commit_lsn.value, WHOLE)
        if held.version is None or version > held.version:
            held = replace(held, commit_lsn=commit_lsn, order=None)
        if end_lsn > held.end_lsn:
            held = replace(held, end_lsn=end_lsn)
        self.held = held
        skip = self._skip
        if skip is not None and commit_lsn.value >= skip[0]:
            self._skip = None  # every later record is new
            self.replaying = False

    def split(self, commit_lsn: Lsn, order: int) -> None:
        """The open PostgreSQL transaction's records up to ``order`` are produced (or
        skipped); the rest comes in a later Kafka transaction."""
        held = self.held
        if held.version is None or (commit_lsn.value, order) > held.version:
            self.held = replace(held, commit_lsn=commit_lsn, order=order)

    def idle(self, lsn: Lsn) -> bool:
        """A keepalive's position with nothing in flight: held from now on; whether it
        moved."""
        if lsn <= self.held.end_lsn:
            return False
        self.held = replace(self.held, end_lsn=lsn)
        return True
