"""The one compiled part: the shim's hot path (loadertop/probe/_hotpath.c), Linux only.

Optional: where it cannot be built (no compiler, no Python headers) the install goes on and the
probe uses its pure-Python hot path, which measures the same. Everything else is in pyproject.toml.
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):  # its clock is CLOCK_MONOTONIC: perf_counter_ns on Linux
    ext_modules.append(Extension("loadertop.probe._hotpath", ["loadertop/probe/_hotpath.c"],
                                 optional=True))

setup(ext_modules=ext_modules)
