"""`python -m rlctl` entry point."""

from rlctl.cli import main

main()
