"""``python -m datamachine.cli``."""

from datamachine.cli import main

main()
