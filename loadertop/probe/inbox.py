"""The workers' samples reach their main process over an AF_UNIX SOCK_SEQPACKET socket.

Each worker process connects once (`worker._Sender.connect`): one `socket()` and one `connect()`,
no thread. A ZeroMQ PUSH socket in each worker cost a context (two threads) and a handshake with
this process's I/O thread before the first batch of every loader, paid at every epoch start
without persistent workers (docs/performance.md gives both). SEQPACKET keeps each message whole
(a send queues all of it or fails with EAGAIN, never part), so a worker's non-blocking send never
blocks and never tears a message; a full socket drops the sample, and the worker counts it
(`WorkerSample.dropped`).

Capacity: what a connection holds between two reads (REPORT_S apart) is bounded by the worker's
send buffer (the kernel counts each message's overhead too, so a default buffer holds few
samples: docs/performance.md). A worker asks for SNDBUF_BYTES; Linux caps it at
net.core.wmem_max.

The socket file lives in the private discovery directory (0700), like the XPUB's ipc socket.
Nothing read here is trusted: each message is decoded and validated by `wire.decode_sample`, and a
message longer than MAX_MESSAGE_BYTES arrives truncated (SEQPACKET discards the rest) and fails
that check.
"""

from __future__ import annotations

import socket

MAX_MESSAGE_BYTES = 64 * 1024  # a WorkerStart with 64 digests is ~20 KB; a sample ~60 bytes
SNDBUF_BYTES = 4 << 20


class WorkerInbox:
    """The listening socket and the workers' connections; used by the publisher thread only."""

    def __init__(self, path: str) -> None:
        self.path = path
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.setblocking(False)
            listener.bind(path)
            listener.listen(socket.SOMAXCONN)  # a burst of workers connecting at an epoch start
        except OSError:
            listener.close()
            raise
        self.listener = listener
        self.connections: list[socket.socket] = []

    def fileno(self) -> int:
        return self.listener.fileno()

    def accept(self) -> int:
        """Take every pending connection (the listener polled readable); how many."""
        taken = 0
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return taken
            except OSError:  # out of fds: the worker's connect already succeeded; it stays queued
                return taken
            conn.setblocking(False)
            self.connections.append(conn)
            taken += 1

    def read(self, limit: int) -> list[bytes]:
        """Up to `limit` messages from all connections, oldest first per connection; the
        connections of workers that have exited (end of file) are closed."""
        self.accept()
        out: list[bytes] = []
        closed = []
        for conn in self.connections:
            while len(out) < limit:
                try:
                    data = conn.recv(MAX_MESSAGE_BYTES)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    data = b""
                if not data:  # the worker has gone (SEQPACKET: an empty read is end of file)
                    closed.append(conn)
                    break
                out.append(data)
        for conn in closed:
            self.connections.remove(conn)
            conn.close()
        return out

    def close(self) -> None:
        for conn in self.connections:
            conn.close()
        self.connections.clear()
        self.listener.close()
