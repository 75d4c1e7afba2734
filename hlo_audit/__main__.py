"""`python -m hlo_audit`: the `hlo-audit` command line."""

from hlo_audit._src.cli.main import main

main()
