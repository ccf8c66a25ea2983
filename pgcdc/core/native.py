"""pgcdc's native module (``native/``, Rust, built by ``make`` where ``cargo`` is found):
loops that cost Python too much per row. Each has a Python twin that gives the same
answers (the tests hold both to one), so pgcdc runs without it, only slower.

``PGCDC_NATIVE=off`` makes pgcdc take the Python paths although the module is installed. A
module built from other sources than this code's (its ``INTERFACE`` is not
:data:`INTERFACE`: a checkout updated without ``make install``) is not used either, and one
log line says so: a module that lacks what this code calls would stop a job.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

log = logging.getLogger(__name__)

# What this code calls in the module: raised with each change to its classes or functions,
# with the module's own number (native/src/lib.rs).
INTERFACE = 8
_told: set[object] = set()


def module() -> ModuleType | None:
    """``pgcdc_native``, or None when it is not installed, is of another interface, or
    ``PGCDC_NATIVE`` is off."""
    if os.environ.get("PGCDC_NATIVE", "").strip().lower() in ("0", "off", "false", "no"):
        return None
    try:
        mod = importlib.import_module("pgcdc_native")
    except ImportError:
        return None
    found = getattr(mod, "INTERFACE", None)
    if found != INTERFACE:
        if found not in _told:
            _told.add(found)
            log.warning(
                "pgcdc_native is of interface %s, this pgcdc needs %s: running without it "
                "(make install builds it again)",
                found,
                INTERFACE,
            )
        return None
    return mod
