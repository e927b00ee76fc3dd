"""Training jobs with a known resource pitfall, for the slow readings' findings (issue 10).

    python tests/workloads/resource_jobs.py KIND [--duration S] [--status FILE] [...]

Each job iterates an instrumented DataLoader with two fork workers for `--duration` seconds
(default 120) and writes `--status` (JSON, replaced atomically) with its phase and batches, as
`train.py` does. Kinds:

    healthy         a plain loader: no pitfall (no false alarms)
    copy_on_read    the dataset holds a large list of Python strings (pytorch#13246) read in
                    shuffled order: each read writes the string's reference count, so every
                    worker copies the page it lives on: USS grows, RSS stays flat. --items
                    strings of ~4 KiB (one page each), --batch-size items per batch, one batch
                    every --step-ms: the growth rate per worker is about
                    batch_size / step / 2 workers x 4 KiB, plus --pages-per-s x 4 KiB read by
                    the worker's clock (a rate that does not depend on the loop's).
    fd_low          lowers its soft RLIMIT_NOFILE to --fd-limit and opens files until
                    --fd-share of it is in use, then trains normally.
    threads         worker_init_fn raises torch's intra-op threads to --threads and every item
                    multiplies a small matrix: each worker runs an OpenMP pool of that size.
    shm_low         fills the file system at LOADERTOP_SHM_PATH until --shm-free-mib are left.
                    With --tmpfs-mib N that file system is a tmpfs of N MiB the job mounts in a
                    mount namespace of its own (unshare(1); as non-root in a user namespace),
                    which ends with the job: nothing is left mounted on the host. The job
                    re-executes itself there, keeping its pid.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

REEXEC_MARK = "LT_RESOURCE_JOBS_IN_NAMESPACE"


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=("healthy", "copy_on_read", "fd_low", "threads", "shm_low"))
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--status", default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--items", type=int, default=100_000, help="copy_on_read: list length")
    p.add_argument("--pages-per-s", type=float, default=0.0,
                   help="copy_on_read: each worker also reads this many strings a second, by its "
                        "clock (its pages copied whatever the loop's rate)")
    p.add_argument("--fd-limit", type=int, default=256)
    p.add_argument("--fd-share", type=float, default=0.85)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--tmpfs-mib", type=int, default=0)
    p.add_argument("--tmpfs-dir", default=None)
    p.add_argument("--shm-free-mib", type=float, default=1.0)
    return p.parse_args(argv)


def write_status(path: str | None, **status) -> None:
    if not path:
        return
    status["pid"] = os.getpid()
    with open(path + ".tmp", "w") as fh:
        json.dump(status, fh)
    os.replace(path + ".tmp", path)


def enter_tmpfs(args) -> None:
    """Re-execute this job in a new mount namespace with a tmpfs of --tmpfs-mib at --tmpfs-dir
    (exec keeps the pid: the test's handle on the job stays valid)."""
    if os.environ.get(REEXEC_MARK) == "1":
        return
    os.environ[REEXEC_MARK] = "1"
    unshare = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    script = 'mount -t tmpfs -o size="$0"m loadertop-test "$1" && shift && exec "$@"'
    os.execvp("unshare", [*unshare, "--", "sh", "-c", script, str(args.tmpfs_mib),
                          args.tmpfs_dir, sys.executable, os.path.abspath(__file__),
                          *sys.argv[1:]])


def fill_to(path: str, free_bytes: float) -> int:
    """Write one file into `path` until about `free_bytes` are left there; its size."""
    st = os.statvfs(path)
    size = max(0, int(st.f_bavail * st.f_frsize - free_bytes))
    block = b"\0" * (1 << 20)
    written = 0
    with open(os.path.join(path, "filler"), "wb") as fh:
        while written < size:
            written += fh.write(block[:min(len(block), size - written)])
    return written


def open_files_until(limit: int, share: float) -> list:
    files = []
    target = int(limit * share)
    while len(os.listdir("/proc/self/fd")) < target:
        files.append(open(os.devnull, "rb"))
    return files


def main(argv=None) -> int:
    args = parse(argv)
    if args.kind == "shm_low" and args.tmpfs_mib:
        enter_tmpfs(args)
    write_status(args.status, phase="starting", batches=0)

    import torch
    from torch.utils.data import DataLoader, Dataset

    import loadertop

    class Strings(Dataset):
        """copy_on_read: a list of Python strings of ~4 KiB, one page each. With `pages_per_s`,
        each read also reads the strings due by the worker's clock since its first read, in list
        order: the worker copies that many pages a second however often the loop asks for a
        batch (the loop's own reads add theirs)."""

        def __init__(self, n: int, pages_per_s: float = 0.0) -> None:
            pad = "x" * 4000
            self.items = [f"{i:09d}{pad}" for i in range(n)]
            self.pages_per_s = pages_per_s
            self._read_since: list[float] | None = None  # [first read's time, strings read]

        def __len__(self) -> int:
            return len(self.items)

        def __getitem__(self, i: int):
            if self.pages_per_s:
                self._read_due()
            return len(self.items[i])

        def _read_due(self) -> None:
            now = time.monotonic()
            if self._read_since is None:
                self._read_since = [now, 0]
            since, done = self._read_since
            due = min(len(self.items), int((now - since) * self.pages_per_s))
            for j in range(int(done), due):
                self.items[j]  # its reference count is written: its page is copied
            self._read_since[1] = max(done, due)

    class Plain(Dataset):
        def __init__(self, matmul: bool = False) -> None:
            self.matmul = matmul

        def __len__(self) -> int:
            return 10**7

        def __getitem__(self, i: int):
            if self.matmul:
                a = torch.ones(64, 64)
                return (a @ a)[0, :2].clone()
            return torch.tensor([i])

    def many_threads(worker_id: int) -> None:
        torch.set_num_threads(args.threads)

    keep: list = []
    kwargs: dict = {}
    shuffle = False
    if args.kind == "copy_on_read":
        dataset: Dataset = Strings(args.items, args.pages_per_s)
        shuffle = True
    elif args.kind == "threads":
        dataset = Plain(matmul=True)
        kwargs["worker_init_fn"] = many_threads
    else:
        dataset = Plain()
    if args.kind == "fd_low":
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(args.fd_limit, hard), hard))
        keep = open_files_until(args.fd_limit, args.fd_share)
    if args.kind == "shm_low":
        fill_to(os.environ["LOADERTOP_SHM_PATH"], args.shm_free_mib * (1 << 20))

    torch.set_num_threads(1)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=shuffle,
                        num_workers=args.workers, multiprocessing_context="fork",
                        persistent_workers=True, **kwargs)
    loader = loadertop.instrument(loader, name=args.kind)
    batches = 0
    end = time.monotonic() + args.duration
    last_status = 0.0
    while time.monotonic() < end:
        for _batch in loader:
            batches += 1
            time.sleep(args.step_ms / 1000.0)
            now = time.monotonic()
            if now - last_status >= 0.05:
                last_status = now
                write_status(args.status, phase="running", batches=batches)
            if now >= end:
                break
    write_status(args.status, phase="done", batches=batches)
    del keep
    return 0


if __name__ == "__main__":
    sys.exit(main())
