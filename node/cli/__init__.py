"""The ``intellect-node`` commands: ``main`` parses and dispatches (``node/cli/main.py``);
each group of subcommands has its own module (``ledger``, ``model``, ``weights``,
``devnet``). No library module imports from here."""

from node.cli.main import main

__all__ = ["main"]
