"""Test-only: a reader started with this folder on ``PYTHONPATH`` and ``PGCDC_KILL_AT`` set
SIGKILLs itself at a named point of its Kafka transactions (the real producer, the real
broker; only the moment of the kill is chosen).

``PGCDC_KILL_AT`` is ``<point>:<n>``, the point at the reader's n-th commit of a Kafka
transaction:

- ``before_commit``: the transaction's records are produced, its commit not asked for;
- ``after_commit``: Kafka committed it, the slot is not yet confirmed to it;
- ``mid_abort``: an abort of the transaction was asked for and is under way.

The process prints ``injected kill: <point>`` to stderr first, so the test can tell that the
kill it asked for is the one that happened.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

_SPEC = os.environ.get("PGCDC_KILL_AT")

if _SPEC:
    import confluent_kafka

    _POINT, _, _NTH = _SPEC.partition(":")
    _AT = int(_NTH or 1)
    _Producer = confluent_kafka.Producer

    def _die(point: str) -> None:
        sys.stderr.write(f"injected kill: {point}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    class _KillingProducer(_Producer):  # type: ignore[misc, valid-type]
        commits = 0

        def __init__(self, conf: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            super().__init__(conf, *args, **kwargs)
            self._transactional = "transactional.id" in conf

        def commit_transaction(self, *args: Any) -> Any:
            if not self._transactional:
                return super().commit_transaction(*args)
            type(self).commits += 1
            due = type(self).commits == _AT
            if due and _POINT == "before_commit":
                _die(_POINT)
            if due and _POINT == "mid_abort":
                threading.Thread(target=super().abort_transaction, args=(30,), daemon=True).start()
                time.sleep(0.002)
                _die(_POINT)
            done = super().commit_transaction(*args)
            if due and _POINT == "after_commit":
                _die(_POINT)
            return done

    confluent_kafka.Producer = _KillingProducer
