"""A real Prometheus server for `loadertop export`'s end-to-end test and its fleet benchmark.

Debian's `prometheus` (which `.ci/run` installs), on loopback, scraping one target every
`interval_s`, its data in a working directory of the caller's; queries through its HTTP API.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

PROMETHEUS = shutil.which("prometheus")
READY_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (OSError, urllib.error.URLError):
        return None


class Prometheus:
    """`prometheus` on loopback, scraping `target` every `interval_s`, with `rule_files` loaded
    (evaluated as often); `extra_scrape_metrics`: the target's body size too
    (`scrape_body_size_bytes`)."""

    def __init__(self, workdir: Path, target: str, *, interval_s: int = 1,
                 rule_files: Sequence[Path] = (), extra_scrape_metrics: bool = False) -> None:
        assert PROMETHEUS is not None, "prometheus is not installed"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        rules = "".join(f"  - '{path}'\n" for path in rule_files)
        config.write_text(
            f"global:\n  scrape_interval: {interval_s}s\n  scrape_timeout: {interval_s}s\n"
            f"  evaluation_interval: {interval_s}s\n"
            + (f"rule_files:\n{rules}" if rules else "")
            + "scrape_configs:\n  - job_name: loadertop\n"
            f"    static_configs:\n      - targets: ['{target}']\n")
        self.log = open(workdir / "prometheus.log", "wb")
        features = ["--enable-feature=extra-scrape-metrics"] if extra_scrape_metrics else []
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", *features],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while http_get(f"{self.base}/-/ready", timeout=1.0) is None:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready after {timeout:g} s: {self.logs()}")
            time.sleep(0.1)

    def _api(self, path: str, **args: str) -> dict:
        raw = http_get(f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(args)}")
        assert raw is not None, f"prometheus did not answer {path} {args}: {self.logs()}"
        answer = json.loads(raw)
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """An instant query's result (at `at`, Unix time; now by default)."""
        return self._api("query", query=promql, time=f"{time.time() if at is None else at:.3f}")[
            "result"]

    def rules(self) -> list[dict]:
        """Every recording rule and alert loaded, with its `health` and `lastError`."""
        return [rule for group in self._api("rules")["groups"] for rule in group["rules"]]

    def logs(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self.log.close()
