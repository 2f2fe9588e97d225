"""``python -m kernelsmith``: the command line, for a checkout run from source (no entry point)."""

from kernelsmith.cli.main import main

main()
