"""`loadertop attach [--listen ENDPOINT] PID` / `loadertop attach --detach PID`.

Thin: the checks and the injection live in `loadertop.attach` (this side) and
`loadertop.probe.attach` (inside the target). Every failure is one line on stderr and its own
exit code (`loadertop.attach.EXIT_*`, listed in docs/attach.md).
"""

from __future__ import annotations

import os
import sys
import time

from loadertop import discovery
from loadertop._version import __version__
from loadertop.attach import AttachError

TYPE_CHECKING = False  # not typing's, as in the other commands
if TYPE_CHECKING:
    import argparse
    from typing import Any

GOODBYE_TIMEOUT_S = 3.0  # the publisher notices a stop within REPORT_S (0.25 s)


def parser() -> argparse.ArgumentParser:
    import argparse

    from loadertop.attach import EXIT_CODES

    codes = ", ".join(f"{code} {kind}" for kind, code in EXIT_CODES.items())
    p = argparse.ArgumentParser(
        prog="loadertop attach",
        description="Instrument the DataLoaders of a running training process that was started "
                    "without loadertop, from their next batch on (needs ptrace permission over "
                    "PID, and gdb below Python 3.14); --detach undoes it. Watch it with "
                    "`loadertop` or `loadertop snapshot`.",
        epilog=f"exit codes: 0 done, 2 usage, {codes}")
    p.add_argument("pid", type=int, metavar="PID")
    p.add_argument("--detach", action="store_true",
                   help="restore the original methods, say goodbye, stop the publisher thread")
    p.add_argument("--listen", metavar="ENDPOINT", default=None, type=listen_endpoint,
                   help="publish on ENDPOINT (tcp://HOST:PORT, HOST:PORT or PORT) instead of a "
                        "private socket in the discovery directory")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="how long the job's main thread may take to reach Python code (default 10)")
    return p


def listen_endpoint(text: str) -> str:
    """--listen: the endpoint as the target's publisher will take it, or argparse's error."""
    import argparse

    from loadertop import endpoints

    try:
        return str(endpoints.parse_listen(text))
    except endpoints.EndpointError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str]) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    try:
        return _attach(args)
    except AttachError as exc:
        print(f"loadertop attach: {exc.message}", file=sys.stderr)
        return exc.exit_code


def _attach(args: argparse.Namespace) -> int:
    from loadertop.attach import inject
    from loadertop.attach import target as target_mod
    from loadertop.probe.attach import PROTOCOL

    pid = args.pid
    target = target_mod.inspect(pid)
    directory = discovery.discovery_dir()
    mode = "detach" if args.detach else "attach"
    if mode == "attach":
        entry = discovery.read_entry(discovery.entry_path(directory, pid))
        if entry is not None and entry.process_alive():
            raise AttachError("already", f"pid {pid} is already attached or instrumented (its "
                                         f"publisher is {entry.endpoint}): watch it with `loadertop`")
    params = {"protocol": PROTOCOL, "version": __version__, "directory": str(directory),
              "endpoint": args.listen}
    result = inject.run(target, mode, params, args.timeout)
    if not result.get("ok"):
        kind = str(result.get("error") or "failed")
        raise AttachError(kind, str(result.get("message") or "the target gave no reason"))
    pause = _pause_text(result)
    if mode == "detach":
        sources = result.get("sources") or {}
        measured = ", ".join(f"{name} ({n} batches)" for name, n in sources.items()) or "no loader"
        gone = _wait_gone(result.get("entry"), GOODBYE_TIMEOUT_S)
        said = "said goodbye, publisher stopped" if gone else \
            f"publisher still stopping after {GOODBYE_TIMEOUT_S:g} s"
        print(f"detached from pid {pid}: methods restored; {measured}: {said}{pause}")
        return 0
    print(f"attached to pid {pid} (Python {result.get('python')}, {result.get('executable')}): "
          f"its DataLoaders are measured from their next batch on{pause}")
    print(f"  watch: loadertop {pid}    (or loadertop snapshot)    undo: loadertop attach "
          f"--detach {pid}")
    return 0


def _wait_gone(entry: str | None, timeout: float) -> bool:
    """The publisher thread removes its discovery entry after its goodbyes."""
    if not entry:
        return True
    deadline = time.monotonic() + timeout
    while os.path.exists(entry):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _pause_text(result: dict[str, Any]) -> str:
    parts = []
    if result.get("stopped_ms") is not None:
        parts.append(f"stopped {result['stopped_ms']:g} ms by gdb")
    if result.get("pause_ms") is not None:
        parts.append(f"its main thread {result['pause_ms']:g} ms in loadertop's code")
    return f" (the job paused: {', '.join(parts)})" if parts else ""

