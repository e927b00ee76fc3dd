"""What the viewer commands share: turning ENDPOINT arguments into a live Subscriber."""

from __future__ import annotations

import sys
import time

from loadertop import discovery


class UsageError(Exception):
    """A user mistake with a one-line explanation; printed without a traceback."""


def open_subscriber(endpoint_args: list[str], *, window_s: float = 3.0, key: str | None = None,
                    server_key: str | None = None, drop_vanished: bool = False):
    from loadertop.endpoints import EndpointError, resolve
    from loadertop.viewer.model import Model
    from loadertop.viewer.subscriber import Subscriber

    directory = discovery.discovery_dir()
    try:
        endpoints = [resolve(e, directory) for e in endpoint_args]
    except EndpointError as exc:
        raise UsageError(str(exc)) from None
    curve = None
    if key or server_key:
        from loadertop.remote import curve_client_options

        try:
            curve = curve_client_options(key, server_key)
        except (OSError, ValueError) as exc:
            raise UsageError(str(exc)) from None
    model = Model(window_s=window_s)
    return Subscriber(model, endpoints, directory=directory, curve=curve,
                      drop_vanished=drop_vanished)


def no_sources_message(sub) -> str:
    if sub.discover:
        return (f"no instrumented process found in {sub.directory}\n"
                "  wrap a loader with loadertop.instrument(loader), run `loadertop run -- python train.py`,\n"
                "  or give an endpoint: loadertop tcp://HOST:PORT")
    return ("no data received from " + ", ".join(sub.sockets) +
            " (is the trainer running, and publishing there?)")


def watch(sub, seconds: float) -> None:
    """Receive for `seconds`, waking on data (no fixed sleeps)."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        sub.poll(timeout_ms=min(left, 0.1) * 1000)


def print_error(message: str) -> None:
    print(f"loadertop: {message}", file=sys.stderr)
