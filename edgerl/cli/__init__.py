"""The command line: ``edgerl train | daemon | status | config | view | plot | serve | play |
export | bench | doctor | hw``; see :mod:`edgerl.cli.app` for exit codes."""

from edgerl.cli import machine, policies, training, watching
from edgerl.cli.app import cli, main

__all__ = ["cli", "machine", "main", "policies", "training", "watching"]
