"""The `turnkit` command's entry point, kept outside the `turnkit` package.

Importing `turnkit` takes seconds (LangGraph, SQLAlchemy, litellm…), and the script pip
writes for a command imports its entry point before it calls it: with `turnkit.cli:main`
there, Ctrl-C during those seconds printed a traceback. This module imports nothing of
turnkit's until `main` runs, so Ctrl-C at any moment of the start ends the command quietly
with status 130, as it does once the command runs.
"""

from __future__ import annotations

__all__ = ("main",)

INTERRUPTED = 130
"""The exit status after Ctrl-C: 128 + SIGINT, what a shell reports for it."""


def main() -> int:
    """Run the `turnkit` command (`turnkit.cli.main`); Ctrl-C while it loads exits 130."""
    try:
        from turnkit.cli import main as command

        return command()
    except KeyboardInterrupt:
        return INTERRUPTED
