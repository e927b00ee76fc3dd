"""`loadertop run`: zero-code instrumentation, names, no double counting, exit codes and signals,
many sources (two loaders, spawn workers, a 2-rank torchrun with gloo) and the straggler.

Jobs are real subprocesses (`python -m loadertop run -q -- ...`) in their own session, killed as a
group at teardown; each test has its own short LOADERTOP_DIR. Viewers are in-process Subscribers
polled against a deadline, plus one `loadertop snapshot --json`. No fixed sleeps on this side.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loadertop.client.document import encode_json

from conftest import clean_env, kill_group, short_tmpdir, snapshot, wait_for

PY = sys.executable
START_S = 60.0  # torch import (1.5 s) and spawn workers (~3 s) on a busy 2-core machine


# --------------------------------------------------------------------------- helpers
class Job:
    """`loadertop run -q [OPTS] -- COMMAND` in its own session, files in a private directory."""

    def __init__(self, tmp: Path, command: list[str], *, run_opts=(), env=None, cwd=None,
                 **popen) -> None:
        self.tmp = tmp
        self.stop_file = tmp / "stop"
        self.env = clean_env(tmp / "d", LT_STOP=str(self.stop_file), LT_TMP=str(tmp), **(env or {}))
        self.out_path, self.err_path = tmp / "out", tmp / "err"
        if "stdout" not in popen:
            popen["stdout"] = open(self.out_path, "wb")
        if "stderr" not in popen:
            popen["stderr"] = open(self.err_path, "wb")
        popen.setdefault("stdin", subprocess.DEVNULL)
        popen.setdefault("start_new_session", True)
        self.proc = subprocess.Popen([PY, "-m", "loadertop", "run", "-q", *run_opts, "--", *command],
                                     env=self.env, cwd=cwd or tmp, **popen)

    @property
    def dir(self) -> Path:
        return Path(self.env["LOADERTOP_DIR"])

    def stderr(self) -> str:
        try:
            return self.err_path.read_text(errors="replace")
        except OSError:
            return ""

    def entries(self) -> list[Path]:
        return sorted(self.dir.glob("*.json")) if self.dir.exists() else []

    def alive(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"job exited {self.proc.returncode}:\n{self.stderr()[-3000:]}")
        return True

    def stop(self, timeout: float = 30.0) -> int:
        self.stop_file.write_text("")
        return self.proc.wait(timeout)

    def kill(self) -> None:
        kill_group(self.proc)


@pytest.fixture
def jobs():
    started: list[Job] = []
    dirs: list[Path] = []

    def start(command, **kwargs) -> Job:
        tmp = short_tmpdir()
        dirs.append(tmp)
        script = kwargs.pop("script", None)
        if script is not None:
            for name, text in script.items():
                path = tmp / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(textwrap.dedent(text))
        job = Job(tmp, command, **kwargs)
        started.append(job)
        return job

    yield start
    for job in started:
        job.kill()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


class Viewer:
    """An in-process viewer (Subscriber + Model) polled until a condition holds."""

    def __init__(self, endpoints=None, directory=None, curve=None) -> None:
        from loadertop.client.model import Model
        from loadertop.client.subscriber import Subscriber

        self.model = Model()
        self.sub = Subscriber(self.model, endpoints, directory=directory,
                              discover=not endpoints, curve=curve)

    def document(self) -> dict:
        """The document as `snapshot --json` prints it (the contract's JSON form)."""
        self.sub.poll(0)
        return json.loads(encode_json(self.model.advance(time.time())))

    def until(self, predicate, timeout: float, what: str, job: Job | None = None) -> dict:
        deadline = time.monotonic() + timeout
        doc = None
        while time.monotonic() < deadline:
            if job is not None:
                job.alive()
            self.sub.poll(50)
            doc = json.loads(encode_json(self.model.advance(time.time())))
            if predicate(doc):
                return doc
        names = [(s["id"], s["rank"], s["state"], s["batches_total"]) for s in (doc or {}).get("sources", [])]
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; sources {names}"
                             + (f"\n{job.stderr()[-3000:]}" if job else ""))

    def close(self) -> None:
        self.sub.close()


def by_name(doc: dict) -> dict:
    return {s["name"]: s for s in doc["sources"]}


def free_ports(n: int) -> int:
    """A base port P with P .. P+n-1 free on 127.0.0.1 (loopback only)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no free consecutive ports")


# A job that loops until the test drops the stop file ($LT_STOP); 60 s cap against a lost test.
LOOP = """
    import os, time
    STOP = os.environ["LT_STOP"]
    def keep_going(_deadline=time.monotonic() + 60):
        return not os.path.exists(STOP) and time.monotonic() < _deadline
"""

PLAIN_SCRIPT = LOOP + """
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return torch.tensor([float(i * i)])

    def main():
        train_loader = DataLoader(Squares(), batch_size=4, num_workers=2)
        val_loader = DataLoader(Squares(), batch_size=8, num_workers=1,
                                multiprocessing_context="spawn", persistent_workers=True)
        while keep_going():
            for batch in train_loader:
                time.sleep(0.002)
            for batch in val_loader:
                pass
            for batch in DataLoader(Squares(), batch_size=16):  # a new loader every epoch
                pass

    if __name__ == "__main__":
        main()
"""


# --------------------------------------------------------------------------- zero-code runs
@pytest.mark.slow
def test_plain_script_is_instrumented_with_recognisable_names(jobs):
    job = jobs([PY, "train.py"], script={"train.py": PLAIN_SCRIPT})
    wait_for(lambda: job.alive() and job.entries(), START_S, "the job's discovery entry")
    viewer = Viewer(directory=job.dir)
    try:
        doc = viewer.until(
            lambda d: {"train_loader", "val_loader", "loader2"} <= set(by_name(d))
            and all(s["batches_total"] > 0 for s in d["sources"]),
            START_S, "three named sources", job)
    finally:
        viewer.close()
    # One process, three sources; the loader made anew each epoch at one place stays one source.
    assert len(doc["sources"]) == 3, [s["id"] for s in doc["sources"]]
    assert len({s["pid"] for s in doc["sources"]}) == 1
    cfg = by_name(doc)
    assert cfg["train_loader"]["config"]["num_workers"] == 2
    assert cfg["val_loader"]["config"]["worker_context"] == "spawn"
    # The spawn worker imported torch under the same startup hook and started no publisher.
    assert len(job.entries()) == 1, job.entries()

    rc, doc, _out, err = snapshot(job.dir, seconds=1.0)
    assert rc == 0, err
    assert doc["schema"] == "loadertop.snapshot/1"
    assert {"train_loader", "val_loader", "loader2"} == set(by_name(doc))
    assert job.stop() == 0, job.stderr()[-3000:]


@pytest.mark.slow
def test_python_dash_m_and_loadertop_instrument_are_counted_once(jobs):
    main = textwrap.dedent(LOOP) + textwrap.dedent("""
        import os
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        import loadertop

        data = TensorDataset(torch.arange(28.0))          # 7 batches of 4
        raw = DataLoader(data, batch_size=4, num_workers=1)
        mine = loadertop.instrument(raw, name="mine")
        for epoch in range(2):                            # 14 through the proxy
            for batch in mine:
                pass
        for batch in raw:                                 # 7 more, the raw loader: same source
            pass
        plain = DataLoader(data, batch_size=4)
        for i, batch in enumerate(plain):                 # 5, then break
            if i == 4:
                break
        open(os.path.join(os.environ["LT_TMP"], "ready"), "w").close()
        while keep_going():
            time.sleep(0.01)
    """)
    job = jobs([PY, "-m", "pkg"], script={"pkg/__init__.py": "", "pkg/__main__.py": main})
    wait_for(lambda: job.alive() and (job.tmp / "ready").exists(), START_S, "the job to finish its loops")
    viewer = Viewer(directory=job.dir)
    try:
        doc = viewer.until(lambda d: {"mine", "plain"} <= set(by_name(d)), 15, "both sources", job)
    finally:
        viewer.close()
    assert len(doc["sources"]) == 2, [s["id"] for s in doc["sources"]]
    assert by_name(doc)["mine"]["batches_total"] == 21
    assert by_name(doc)["plain"]["batches_total"] == 5
    assert job.stop() == 0, job.stderr()[-3000:]


def test_subclass_iter_runs_once_and_is_measured():
    """In-process: a DataLoader subclass with its own __iter__ calling super() runs its body
    once per epoch under the patch, and its batches are counted once."""
    import torch
    import torch.utils.data.dataloader as dataloader_module
    from torch.utils.data import DataLoader, TensorDataset

    from loadertop.probe import autoinstrument
    from loadertop.probe.publisher import get_publisher

    class Shuffled(DataLoader):
        calls = 0

        def __iter__(self):
            Shuffled.calls += 1
            yield from super().__iter__()

    assert autoinstrument.patch(dataloader_module)
    try:
        assert not autoinstrument.patch(dataloader_module)  # idempotent
        subclassed_loader = Shuffled(TensorDataset(torch.arange(12.0)), batch_size=4)
        for _epoch in range(2):
            assert len(list(subclassed_loader)) == 3
        assert Shuffled.calls == 2
        record = next(r for r in get_publisher().records if r._loader_ref() is subclassed_loader)
        assert record.name == "subclassed_loader"
        deadline = time.monotonic() + 5
        while record.batches_total < 6 and time.monotonic() < deadline:
            time.sleep(0.02)  # the publisher thread drains the events at 50 Hz
        assert record.batches_total == 6
    finally:
        autoinstrument.unpatch(dataloader_module)
    assert "_loadertop_original" not in vars(DataLoader.__iter__)


def test_startup_hook_is_lazy_chains_and_is_a_noop_without_run(tmp_path):
    """Under run: the finder is installed and torch is not imported; the user's own
    sitecustomize (hidden by ours) still runs; without LOADERTOP_RUN nothing is installed."""
    from loadertop.launch import BOOTSTRAP_DIR

    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    probe = ("import os, sys; print(os.environ.get('USER_SITECUSTOMIZE'), 'torch' in sys.modules, "
             "[type(f).__name__ for f in sys.meta_path if 'DataLoader' in type(f).__name__])")
    env = clean_env(tmp_path, PYTHONPATH=str(user))
    out = subprocess.run([PY, "-m", "loadertop", "run", "-q", "--", PY, "-c", probe], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ran False ['_DataLoaderFinder']"
    env["LOADERTOP_DISABLE"] = "1"
    out = subprocess.run([PY, "-m", "loadertop", "run", "-q", "--", PY, "-c", probe], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "ran False []", out.stderr
    env = clean_env(tmp_path, PYTHONPATH=os.pathsep.join([BOOTSTRAP_DIR, str(user)]))
    out = subprocess.run([PY, "-c", probe], env=env, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "ran False []", out.stderr


# --------------------------------------------------------------------------- exit codes, signals
def test_exit_code_and_usage_errors(tmp_path):
    env = clean_env(tmp_path)

    def run(*args):
        return subprocess.run([PY, "-m", "loadertop", "run", *args], env=env, capture_output=True,
                              text=True, timeout=30)

    assert run("--", PY, "-c", "import sys; sys.exit(7)").returncode == 7
    assert run(PY, "-c", "pass").returncode == 0  # `--` is optional
    missing = run("--", "no-such-command-xyz")
    assert missing.returncode == 127 and "command not found" in missing.stderr
    assert run().returncode == 2
    assert run("--listen", "nonsense", "--", PY, "-c", "pass").returncode == 2
    assert run("--bogus", PY).returncode == 2
    assert run("--help").returncode == 0


SIGNAL_CHILD = """
    import os, signal, sys, time
    tmp = os.environ["LT_TMP"]
    got = []
    mode = sys.argv[1]
    if mode == "handle":
        def on_term(signum, frame):
            open(os.path.join(tmp, "got-term"), "w").close()
            sys.exit(3)
        signal.signal(signal.SIGTERM, on_term)
    elif mode == "count-int":
        signal.signal(signal.SIGINT, lambda s, f: got.append(s))
    else:  # Python's own handler, even when started with SIGINT ignored (a shell's `cmd &`)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    open(os.path.join(tmp, "ready"), "w").close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if got:
            time.sleep(0.5)  # time for a duplicate SIGINT to arrive, if one were sent
            open(os.path.join(tmp, "sigints"), "w").write(str(len(got)))
            sys.exit(0)
        time.sleep(0.01)
"""


def _ready(job: Job) -> None:
    wait_for(lambda: job.alive() and (job.tmp / "ready").exists(), 20, "the child to start")


def test_sigterm_reaches_the_child_and_signal_deaths_map_to_128_plus_n(jobs):
    handled = jobs([PY, "child.py", "handle"], script={"child.py": SIGNAL_CHILD})
    default = jobs([PY, "child.py", "default"], script={"child.py": SIGNAL_CHILD})
    interrupted = jobs([PY, "child.py", "default"], script={"child.py": SIGNAL_CHILD})
    for job in (handled, default, interrupted):
        _ready(job)
    os.kill(handled.proc.pid, signal.SIGTERM)
    os.kill(default.proc.pid, signal.SIGTERM)
    os.kill(interrupted.proc.pid, signal.SIGINT)  # `kill -INT` to run alone is forwarded
    assert handled.proc.wait(10) == 3
    assert (handled.tmp / "got-term").exists()
    assert default.proc.wait(10) == 128 + signal.SIGTERM
    assert interrupted.proc.wait(10) == 128 + signal.SIGINT  # Python re-raises SIGINT at exit


def test_ctrl_c_in_a_terminal_interrupts_the_child_once(jobs):
    """^C on a real (pseudo) terminal reaches the whole foreground group: `run` must not forward
    a second SIGINT on top of the one the child got from the terminal."""
    master, slave = pty.openpty()

    def controlling_tty():
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        job = jobs([PY, "child.py", "count-int"], script={"child.py": SIGNAL_CHILD},
                   stdin=slave, stdout=slave, stderr=slave, preexec_fn=controlling_tty)
        _ready(job)
        os.write(master, b"\x03")
        assert job.proc.wait(10) == 0
        assert (job.tmp / "sigints").read_text() == "1"
    finally:
        os.close(master)
        os.close(slave)


# --------------------------------------------------------------------------- distributed
DDP_SCRIPT = LOOP + """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.distributed import DistributedSampler

    dist.init_process_group("gloo")
    RANK = dist.get_rank()

    class Items(Dataset):
        def __len__(self):
            return 100000
        def __getitem__(self, i):
            if RANK == 1:
                time.sleep(0.004)  # rank 1 loads slowly: it holds rank 0 back at the all-reduce
            return torch.tensor([float(i)])

    train_loader = DataLoader(Items(), batch_size=4, sampler=DistributedSampler(Items()))
    flag = torch.zeros(1)
    for batch in train_loader:
        flag.fill_(1.0 if not keep_going() else 0.0)
        dist.all_reduce(flag)  # every rank stops at the same step
        if flag.item() > 0:
            break
    dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_two_ranks_are_two_sources_and_the_straggler_is_named(jobs):
    base = free_ports(3)
    listen, master_port = f"tcp://127.0.0.1:{base}", base + 2
    job = jobs([PY, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(master_port), "ddp.py"],
               script={"ddp.py": DDP_SCRIPT}, run_opts=("--listen", listen),
               env={"GLOO_SOCKET_IFNAME": "lo"})  # gloo's own sockets stay on loopback too
    # --listen with torchrun: local rank N listens on PORT+N.
    viewer = Viewer([listen, f"tcp://127.0.0.1:{base + 1}"])
    try:
        doc = viewer.until(
            lambda d: sorted(s["rank"] for s in d["sources"] if s["batches_total"] > 0) == [0, 1],
            START_S, "two ranked sources", job)
        doc = viewer.until(lambda d: d["ranks"]["straggler"] is not None, 20, "a straggler", job)
        # issue 37: once rank 1's own verdict says its loop waits for data (the stabilizer shows
        # a new category after a few refreshes), the top-level verdict is rank 1's, said of it
        top = viewer.until(lambda d: d["ranks"]["straggler"] is not None and d["diagnosis"][
            "summary"].startswith("rank 1 holds the job back: its loop waits "), 20,
            "the straggler named in the top verdict", job)
    finally:
        viewer.close()
    sources = {s["rank"]: s for s in doc["sources"]}
    assert sources[0]["pid"] != sources[1]["pid"]
    assert sources[0]["name"] == sources[1]["name"] == "train_loader"
    assert doc["ranks"]["straggler"] == sources[1]["id"]
    assert doc["ranks"]["straggler_rank"] == 1
    verdict, slow = top["diagnosis"], {s["rank"]: s for s in top["sources"]}[1]
    assert verdict["source"] == slow["id"] == top["ranks"]["straggler"], verdict
    assert verdict["category"] == slow["diagnosis"]["category"], (verdict, slow["diagnosis"])
    assert verdict["advice"] == slow["diagnosis"]["advice"]
    assert "; rank 0 waits in its step (" in verdict["summary"], verdict["summary"]
    entries = {e.name for e in job.entries()}
    assert len(entries) == 2, entries  # the torchrun agent iterates nothing: no entry of its own
    assert job.stop(60) == 0, job.stderr()[-3000:]


def test_rank_port_offset_is_idempotent():
    from loadertop.probe.autoinstrument import apply_rank_port

    env = {"LOADERTOP_ENDPOINT": "tcp://0.0.0.0:5555", "LOCAL_RANK": "3"}
    apply_rank_port(env)
    assert env["LOADERTOP_ENDPOINT"] == "tcp://0.0.0.0:5558"
    apply_rank_port(env)  # a child of that rank (a spawned worker) inherits the offset one
    assert env["LOADERTOP_ENDPOINT"] == "tcp://0.0.0.0:5558"
    for untouched in ({"LOADERTOP_ENDPOINT": "tcp://0.0.0.0:5555"},
                      {"LOADERTOP_ENDPOINT": "ipc:///tmp/x.sock", "LOCAL_RANK": "1"},
                      {"LOADERTOP_ENDPOINT": "tcp://127.0.0.1:0", "LOCAL_RANK": "1"}):
        before = dict(untouched)
        apply_rank_port(untouched)
        assert untouched == before
