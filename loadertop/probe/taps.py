"""In-process readers of what the publisher sends: this process's own reports, with no socket
(docs/contract.md §12; the notebook's panel reads them through `loadertop.inprocess`).

The publisher thread hands every message it sends (the loaders' reports, the machine's figures,
the goodbyes) to each open tap, with the time it sent it: a bounded deque's append, no lock
(`collections.deque.append` and `popleft` are atomic in CPython, one thread on each end). The
reader drains it on its own thread whenever it likes; a reader that stops reading loses the
oldest messages, never blocks the publisher.

An open tap counts as a viewer (`watching()`): while one is open the publisher takes what only a
viewer needs (queue depth, the machine's figures every second), as it does while a socket is
subscribed; the reader's figures are then the ones `loadertop snapshot` computes.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from loadertop import wire

#: Messages a tap keeps for its reader: at 4 reports a second per loader and 1 of the machine,
#: minutes of a few loaders' reports for a reader that reads every second.
MAX_MESSAGES = 4096

#: (when the publisher sent it, the message, the endpoint it was published on)
Delivered = tuple[float, wire.Message, str]


class Tap:
    """One reader's queue of the publisher's messages."""

    __slots__ = ("_messages", "__weakref__")

    def __init__(self, maxlen: int = MAX_MESSAGES) -> None:
        self._messages: deque[Delivered] = deque(maxlen=maxlen)

    def put(self, message: wire.Message, at: float, endpoint: str) -> None:
        """The publisher thread's side."""
        self._messages.append((at, message, endpoint))

    def drain(self) -> list[Delivered]:
        """Everything delivered since the last drain, oldest first (the reader's side)."""
        out: list[Delivered] = []
        pop = self._messages.popleft
        while True:
            try:
                out.append(pop())
            except IndexError:
                return out


_lock = threading.Lock()
# Replaced, never changed in place: the publisher thread iterates whichever tuple it read.
_open: tuple[Tap, ...] = ()


def open_tap(maxlen: int = MAX_MESSAGES) -> Tap:
    """A new tap, delivered every message sent from now on until `close_tap`."""
    global _open
    tap = Tap(maxlen)
    with _lock:
        _open = (*_open, tap)
    return tap


def close_tap(tap: Tap) -> None:
    global _open
    with _lock:
        _open = tuple(t for t in _open if t is not tap)


def watching() -> bool:
    """Whether a tap is open: the publisher samples as for a subscribed viewer."""
    return bool(_open)


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker, a process the program forks) has no reader of its
    own: its parent's taps are the parent's (and the lock may have been held by a thread that
    is not in the child)."""
    global _open, _lock
    _open = ()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def deliver(message: wire.Message, endpoint: str) -> None:
    """The publisher thread, for each message it sends (a few a second per loader)."""
    taps = _open
    if taps:
        at = time.time()
        for tap in taps:
            tap.put(message, at, endpoint)
