"""A Jupyter kernel of this very Python, for the notebook's tests and benchmark: the `python3`
kernel spec an ipykernel wheel installs runs `python` from PATH, which need not be this one (a
virtual environment that is not activated), so a spec of our own names `sys.executable`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

NAME = "loadertop-test"


def kernel_manager(spec_dir: Path) -> Any:
    """A `jupyter_client.KernelManager` (not started) whose kernel is ipykernel on this Python;
    its spec is written under `spec_dir`."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    kernel = spec_dir / NAME
    kernel.mkdir(parents=True, exist_ok=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "loadertop test", "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(spec_dir)], ensure_native_kernel=False)
    return KernelManager(kernel_name=NAME, kernel_spec_manager=specs)
