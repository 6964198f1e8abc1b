"""`python -m antdt.cli`: the `antdt` command (what tests and the demo start)."""

from antdt.cli.app import main

main()
