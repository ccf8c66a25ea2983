"""``python -m cdc``."""

from cdc.cli import main

main()
