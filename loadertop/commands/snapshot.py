"""`loadertop snapshot`: watch S seconds, print one report or the JSON document, exit."""

from __future__ import annotations

import sys
import time

from loadertop.commands.common import UsageError, no_sources_message, open_subscriber, print_error, watch
from loadertop.document import Document


def take(endpoint_args: list[str], seconds: float, *, key=None,
         server_key=None) -> tuple[Document | None, str | None]:
    """(document, None) or (None, error message)."""
    sub = open_subscriber(endpoint_args, window_s=seconds, key=key, server_key=server_key)
    try:
        if not sub.found_any():
            return None, no_sources_message(sub)
        watch(sub, seconds)
        doc = sub.model.advance(time.time())
        if not doc.sources:
            return None, ("no data received from " + ", ".join(sub.sockets) +
                          f" within {seconds:g} s (is the trainer running and iterating an"
                          " instrumented loader?)")
        return doc, None
    finally:
        sub.close()


def main(args) -> int:
    if args.seconds <= 0:
        print_error("--seconds must be positive")
        return 2
    try:
        doc, error = take(args.endpoints, args.seconds, key=args.key, server_key=args.server_key)
    except UsageError as exc:
        print_error(str(exc))
        return 2
    if doc is None:
        print_error(error)
        return 1
    from loadertop.viewer.report import render_json, render_text

    sys.stdout.write(render_json(doc) + "\n" if args.json else render_text(doc))
    return 0
