"""``scripts/spark-submit`` (a script without ``.py``) loaded as a module, for its tests."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "spark-submit"


def load() -> ModuleType:
    """The script's functions, its ``main`` not run."""
    loader = importlib.machinery.SourceFileLoader("spark_submit", str(SCRIPT))
    spec = importlib.util.spec_from_loader("spark_submit", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
