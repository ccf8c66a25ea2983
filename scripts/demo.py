#!/usr/bin/env python3
"""`make demo`: runs ``python -m demo`` (demo/__main__.py) with the same arguments.

This file's name would shadow the ``demo`` package (a script's directory comes first on
``sys.path``), so it starts the package in an interpreter that does not prepend it (``-P``).
"""

import os
import sys

os.execv(sys.executable, [sys.executable, "-P", "-m", "demo", *sys.argv[1:]])
