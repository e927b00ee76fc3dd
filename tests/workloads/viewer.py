"""A minimal real viewer for the never-blocks tests: a ZeroMQ SUB socket on ENDPOINT.

    python tests/workloads/viewer.py ENDPOINT [--read]

Prints "first" on stdout as soon as the first loadertop frame arrives (so the test knows the
subscription is established), then either keeps reading (`--read`) or stops reading altogether:
a viewer that is slow as can be, frames pile up until its high-water mark. Meant to be frozen
with SIGSTOP or killed by the test.
"""

from __future__ import annotations

import sys
import time

import zmq


def main() -> int:
    endpoint = sys.argv[1]
    read = "--read" in sys.argv[2:]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 10)  # tiny: the publisher's side fills up soon
    sock.setsockopt(zmq.SUBSCRIBE, b"loadertop/")
    sock.connect(endpoint)
    if not sock.poll(30_000):
        print("timeout", flush=True)
        return 1
    sock.recv()
    print("first", flush=True)
    while True:
        if read:
            sock.recv()
        else:
            time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
