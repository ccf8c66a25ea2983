"""pgcdc's native module (``native/``, Rust, built by ``make`` where ``cargo`` is found):
loops that cost Python too much per row. Each has a Python twin that gives the same
answers (the tests hold both to one), so pgcdc runs without it, only slower.

``PGCDC_NATIVE=off`` makes pgcdc take the Python paths although the module is installed.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def module() -> ModuleType | None:
    """``pgcdc_native``, or None when it is not installed or ``PGCDC_NATIVE`` is off."""
    if os.environ.get("PGCDC_NATIVE", "").strip().lower() in ("0", "off", "false", "no"):
        return None
    try:
        return importlib.import_module("pgcdc_native")
    except ImportError:
        return None
