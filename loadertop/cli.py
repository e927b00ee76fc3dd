"""Command line: which command runs, and how it leaves; each command parses its own arguments
in its module under `loadertop/commands/` (`main(argv)`).

Imports are lazy so `loadertop --help` and `--version` answer at once (no torch, no textual):
only the chosen command's module is imported.
"""

from __future__ import annotations

import os
import signal
import sys

# `loadertop NAME ...` runs loadertop.commands.NAME; anything else is the viewer's arguments.
COMMANDS = ("snapshot", "run", "attach", "tune", "record", "replay", "report", "export", "demo",
            "keys", "ls")
DEFAULT_COMMAND = "view"  # `loadertop [ENDPOINT ...]`: the live viewer; its --help lists COMMANDS


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            return _dispatch(argv)
        finally:  # argparse's --help and usage errors leave by SystemExit: flush for them too
            sys.stdout.flush()  # here, where a closed pipe can still be answered in order
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`loadertop snapshot | head`): what it wanted it has. Point stdout
        # at /dev/null so that the interpreter's own flush at exit does not raise again (the
        # recipe of Python's signal module documentation), and exit as a writer killed by
        # SIGPIPE would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in COMMANDS:
        name, rest = argv[0], argv[1:]
    else:
        name, rest = DEFAULT_COMMAND, argv
    module = f"loadertop.commands.{name}"
    # __import__, not importlib.import_module: the statement's path, which -X importtime logs
    # (the import tests read it), and no importlib to load outside an editable install.
    __import__(module)
    code: int = sys.modules[module].main(rest)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
