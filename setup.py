"""The compiled parts: the shim's hot path (loadertop/probe/_hotpath.c, Linux only) and the
viewer's distributions (loadertop/client/_figures.c).

Both optional: where one cannot be built (no compiler, no Python headers) the install goes on and
its pure-Python twin runs instead, which measures and computes the same. Everything else is in
pyproject.toml.
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):  # its clock is CLOCK_MONOTONIC: perf_counter_ns on Linux
    ext_modules.append(Extension("loadertop.probe._hotpath", ["loadertop/probe/_hotpath.c"],
                                 optional=True))

# -ffp-contract=off (GCC, Clang): no fused multiply-add, so the interpolations round as Python's.
ext_modules.append(Extension("loadertop.client._figures", ["loadertop/client/_figures.c"],
                             extra_compile_args=[] if sys.platform == "win32" else ["-ffp-contract=off"],
                             optional=True))

setup(ext_modules=ext_modules)
