"""Remote monitoring on loopback only: tcp with reconnection, CurveZMQ (authorised viewer gets
data; an unknown key and a plaintext viewer get nothing; a broken configuration publishes
nothing), `loadertop keys`, and the viewer-side key options.

Trainers are `loadertop run --listen tcp://127.0.0.1:PORT -- python train.py` subprocesses;
viewers are in-process Subscribers polled against deadlines (helpers from test_run).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

import test_run
from conftest import clean_env, wait_for
from test_run import LOOP, PY, START_S, Viewer, free_ports

jobs = test_run.jobs  # the `jobs` fixture of test_run, shared (pytest looks fixtures up by name)

TRAIN = LOOP + """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    train_loader = DataLoader(TensorDataset(torch.arange(256.0)), batch_size=8)
    while keep_going():
        for batch in train_loader:
            time.sleep(0.002)
"""
LIVE = ("running", "waiting", "idle", "stalled")


def keys(directory: Path, name: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "loadertop", "keys", str(directory), "--name", name, *extra],
                          capture_output=True, text=True, timeout=30, env=clean_env(directory))


def live(doc: dict, exclude_pid: int | None = None) -> list[dict]:
    return [s for s in doc["sources"] if s["state"] in LIVE and s["pid"] != exclude_pid
            and s["batches_total"] > 0]


# --------------------------------------------------------------------------- tcp, reconnection
@pytest.mark.slow
def test_tcp_viewer_sees_the_trainer_go_and_come_back_on_the_same_port(jobs):
    port = free_ports(1)
    endpoint = f"tcp://127.0.0.1:{port}"
    first = jobs([PY, "train.py"], script={"train.py": TRAIN}, run_opts=("--listen", endpoint))
    viewer = Viewer([endpoint])
    try:
        doc = viewer.until(lambda d: live(d), START_S, "the first trainer", first)
        assert doc["viewer"]["connected"] is True
        old_pid = live(doc)[0]["pid"]
        entry = wait_for(lambda: first.entries(), 5, "the discovery entry")[0]
        assert entry.name == f"{old_pid}.json"
        os.kill(old_pid, signal.SIGKILL)  # no goodbye: the viewer can only notice the silence
        assert first.proc.wait(10) == 128 + signal.SIGKILL  # `run` passes the death on

        doc = viewer.until(lambda d: not d["viewer"]["connected"]
                           and [s["state"] for s in d["sources"]] == ["gone"], 15, "gone")

        second = jobs([PY, "train.py"], script={"train.py": TRAIN}, run_opts=("--listen", endpoint))
        doc = viewer.until(lambda d: live(d, exclude_pid=old_pid) and d["viewer"]["connected"],
                           START_S, "the restarted trainer through the same SUB socket", second)
        states = {s["pid"]: s["state"] for s in doc["sources"]}
        assert states[old_pid] == "gone"  # kept visible, marked
        seen = live(doc, exclude_pid=old_pid)[0]["batches_total"]
    finally:
        viewer.close()
    # The viewer went away; the trainer keeps training (a fresh viewer sees more batches).
    again = Viewer([endpoint])
    try:
        again.until(lambda d: any(s["batches_total"] > seen for s in live(d, exclude_pid=old_pid)),
                    15, "more batches after the first viewer left", second)
    finally:
        again.close()
    assert second.stop() == 0, second.stderr()[-3000:]


# --------------------------------------------------------------------------- CurveZMQ
@pytest.fixture
def key_dirs(tmp_path):
    """trainer pair, an authorised viewer, a stranger; the trainer's authorised-keys directory."""
    from loadertop.remote import create_keys

    for name in ("trainer", "viewer", "stranger"):
        create_keys(tmp_path / name, name)
    authorized = tmp_path / "authorized"
    authorized.mkdir()
    shutil.copy(tmp_path / "viewer" / "viewer.key", authorized)
    return tmp_path


@pytest.mark.slow
def test_curve_only_the_authorised_viewer_receives(jobs, key_dirs):
    from loadertop.remote import curve_client_options

    port = free_ports(1)
    endpoint = f"tcp://127.0.0.1:{port}"
    server_public = key_dirs / "trainer" / "trainer.key"
    job = jobs([PY, "train.py"], script={"train.py": TRAIN}, run_opts=("--listen", endpoint),
               env={"LOADERTOP_CURVE_SECRET": str(key_dirs / "trainer" / "trainer.key_secret"),
                    "LOADERTOP_AUTHORIZED_KEYS": str(key_dirs / "authorized")})
    authorised = Viewer([endpoint], curve=curve_client_options(
        str(key_dirs / "viewer" / "viewer.key_secret"), str(server_public)))
    stranger = Viewer([endpoint], curve=curve_client_options(
        str(key_dirs / "stranger" / "stranger.key_secret"), str(server_public)))
    plaintext = Viewer([endpoint])
    viewers = (authorised, stranger, plaintext)
    try:
        # All three connect together and are polled together; the deadline is the authorised
        # viewer receiving a couple of seconds of reports (4 Hz per loader plus the machine's).
        deadline = time.monotonic() + START_S
        while authorised.model.received < 10:
            job.alive()
            assert time.monotonic() < deadline, "the authorised viewer received nothing"
            for v in viewers:
                v.sub.poll(20)
        for v in viewers:
            v.sub.poll(0)
        doc = authorised.document()
        assert [s["name"] for s in doc["sources"]] == ["train_loader"]
        for v in (stranger, plaintext):
            assert v.model.received == 0 and not v.model.rejected
            assert v.document()["sources"] == []
    finally:
        for v in viewers:
            v.close()
    assert job.stop() == 0, job.stderr()[-3000:]


@pytest.mark.slow
def test_curve_half_configured_publishes_nothing(jobs, key_dirs):
    """A secret without the authorised keys is an error: one warning, and no plaintext fallback
    (not even the discovery entry); training itself goes on."""
    job = jobs([PY, "train.py"], script={"train.py": TRAIN}, run_opts=("--listen", "tcp://127.0.0.1:0"),
               env={"LOADERTOP_CURVE_SECRET": str(key_dirs / "trainer" / "trainer.key_secret")})
    wait_for(lambda: job.alive() and "LOADERTOP_AUTHORIZED_KEYS" in job.stderr(), START_S,
             "the configuration warning")
    assert job.entries() == []
    assert job.stderr().count("loadertop:") == 1, job.stderr()
    assert job.stop() == 0, job.stderr()[-3000:]


def test_curve_server_configuration_errors(key_dirs):
    from loadertop.remote import CurveConfigError, curve_server_from_env

    secret = str(key_dirs / "trainer" / "trainer.key_secret")
    authorized = str(key_dirs / "authorized")
    assert curve_server_from_env({}) is None
    server = curve_server_from_env({"LOADERTOP_CURVE_SECRET": secret,
                                    "LOADERTOP_AUTHORIZED_KEYS": authorized})
    assert server.authorized == 1 and len(server.public) == len(server.secret) == 40
    broken = [
        {"LOADERTOP_CURVE_SECRET": secret},
        {"LOADERTOP_AUTHORIZED_KEYS": authorized},
        {"LOADERTOP_CURVE_SECRET": str(key_dirs / "trainer" / "trainer.key"),  # the public file
         "LOADERTOP_AUTHORIZED_KEYS": authorized},
        {"LOADERTOP_CURVE_SECRET": str(key_dirs / "nope.key_secret"),
         "LOADERTOP_AUTHORIZED_KEYS": authorized},
        {"LOADERTOP_CURVE_SECRET": secret, "LOADERTOP_AUTHORIZED_KEYS": str(key_dirs / "nope")},
        {"LOADERTOP_CURVE_SECRET": secret, "LOADERTOP_AUTHORIZED_KEYS": "*"},  # not ALLOW_ANY
    ]
    for env in broken:
        with pytest.raises(CurveConfigError):
            curve_server_from_env(env)


def test_viewer_key_options(key_dirs):
    import zmq

    from loadertop.remote import curve_client_options

    secret = str(key_dirs / "viewer" / "viewer.key_secret")
    server = str(key_dirs / "trainer" / "trainer.key")
    options = curve_client_options(secret, server)
    assert set(options) == {zmq.CURVE_PUBLICKEY, zmq.CURVE_SECRETKEY, zmq.CURVE_SERVERKEY}
    with pytest.raises(ValueError, match="go together"):
        curve_client_options(secret, None)
    with pytest.raises(ValueError, match="no secret key"):
        curve_client_options(str(key_dirs / "viewer" / "viewer.key"), server)
    with pytest.raises(OSError):
        curve_client_options(secret, str(key_dirs / "missing.key"))
    # The command line turns a bad key file into a one-line error and exit 2, no traceback.
    out = subprocess.run([PY, "-m", "loadertop", "snapshot", "--seconds", "0.1", "--key", secret,
                          "--server-key", str(key_dirs / "missing.key"), "tcp://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=30, env=clean_env(key_dirs))
    assert out.returncode == 2 and "missing.key" in out.stderr and "Traceback" not in out.stderr


def test_keys_command_writes_a_private_secret_and_never_overwrites(tmp_path):
    out = keys(tmp_path / "k", "laptop")
    assert out.returncode == 0, out.stderr
    public, secret = tmp_path / "k" / "laptop.key", tmp_path / "k" / "laptop.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert str(secret) in out.stdout and "LOADERTOP_AUTHORIZED_KEYS" in out.stdout
    assert "--server-key" in out.stdout
    before = secret.read_bytes()
    again = keys(tmp_path / "k", "laptop")
    assert again.returncode == 1 and "exists" in again.stderr
    assert secret.read_bytes() == before
    forced = keys(tmp_path / "k", "laptop", "--force")
    assert forced.returncode == 0 and secret.read_bytes() != before
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
