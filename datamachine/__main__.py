"""``python -m datamachine`` runs the command line."""

from datamachine.cli import main

main()
