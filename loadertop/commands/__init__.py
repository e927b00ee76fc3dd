"""The subcommands of `loadertop`, one module each, named as the command is (`view` is
`loadertop` with no command): each builds its own parser (`parser()`, or `run`'s hand-written
`parse`, which spares `run`'s start-up argparse) and runs with `main(argv)`; `loadertop.cli`
walks the table of them.

Kept empty but for `UsageError`: importing a command imports this first, and `run`'s start-up is
added to every job's.
"""


class UsageError(Exception):
    """A user mistake with a one-line explanation; printed without a traceback (exit 2)."""
