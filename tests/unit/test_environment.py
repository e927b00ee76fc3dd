"""`loadertop.environment`: the one place for environment names, and its reading rules."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import loadertop
from loadertop import environment

PACKAGE = Path(loadertop.__file__).resolve().parent
BOOTSTRAP = PACKAGE / "probe" / "_bootstrap"
SITECUSTOMIZE = BOOTSTRAP / "sitecustomize.py"


def _string_constants(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_sitecustomize_literals_are_the_constants():
    """The start-up hook spells the names out (it must not import loadertop first): they must be
    the names `loadertop run` sets."""
    literals = {s for s in _string_constants(SITECUSTOMIZE) if s.startswith("LOADERTOP_")}
    assert literals == {environment.LOADERTOP_RUN, environment.LOADERTOP_RUN_WARNED}


def test_no_module_spells_a_variable_name_of_its_own():
    """Every name is defined in environment.py; elsewhere it is imported (docstrings may name
    them in prose: only whole-string constants count)."""
    names = set(environment.LOADERTOP_VARIABLES) | {environment.NO_COLOR, *environment.RANK_VARIABLES}
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path in (PACKAGE / "environment.py", SITECUSTOMIZE):
            continue
        found = _string_constants(path) & names
        if found:
            offenders[str(path.relative_to(PACKAGE))] = sorted(found)
    assert offenders == {}


def test_the_hook_imports_nothing_without_loadertop_run(tmp_path):
    """Every Python below `loadertop run` reads the hook; without LOADERTOP_RUN=1 it must not
    even import loadertop (another virtualenv may not have it)."""
    env = {k: v for k, v in os.environ.items() if k != environment.LOADERTOP_RUN}
    env["PYTHONPATH"] = str(BOOTSTRAP)
    code = "import sys; print(sorted(m for m in sys.modules if m.startswith('loadertop')))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True, cwd=tmp_path).stdout.strip()
    assert out == "[]"
    env[environment.LOADERTOP_RUN] = "1"  # and the check is what stops it: with it set, it does
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True, cwd=tmp_path).stdout.strip()
    assert "loadertop.probe.autoinstrument" in out


@pytest.mark.parametrize("value, disabled", [
    (None, False), ("", False), ("0", False), ("1", True), ("yes", True), ("true", True),
])
def test_disabled(value, disabled):
    env = {} if value is None else {environment.LOADERTOP_DISABLE: value}
    assert environment.disabled(env) is disabled


@pytest.mark.parametrize("flag, env, no_color", [
    (False, {}, False),
    (True, {}, True),
    (False, {"NO_COLOR": "1"}, True),
    # Present counts, empty or not: Textual 8.2.8 turns the screen monochrome on presence.
    (False, {"NO_COLOR": ""}, True),
])
def test_no_color(flag, env, no_color):
    assert environment.no_color(flag, env) is no_color


@pytest.mark.parametrize("env, rank", [
    ({}, None),
    ({"RANK": "3", "LOCAL_RANK": "1", "SLURM_PROCID": "7"}, 3),  # torchrun's global rank first
    ({"LOCAL_RANK": "1", "SLURM_PROCID": "7"}, 1),
    ({"SLURM_PROCID": "7"}, 7),
    ({"RANK": "", "LOCAL_RANK": "2"}, 2),  # unusable values are skipped
    ({"RANK": "-1", "SLURM_PROCID": "0"}, 0),
    ({"RANK": "two"}, None),
    ({"RANK": "٣"}, None),  # a digit to isdigit(), not to a rank
])
def test_rank(env, rank):
    assert environment.rank(env) == rank


def test_local_rank_and_endpoint_and_run_hook():
    assert environment.local_rank({"LOCAL_RANK": "2", "RANK": "5"}) == 2
    assert environment.local_rank({"RANK": "5"}) is None
    assert environment.endpoint({environment.LOADERTOP_ENDPOINT: "tcp://h:1"}) == "tcp://h:1"
    assert environment.endpoint({environment.LOADERTOP_ENDPOINT: ""}) is None
    assert environment.endpoint({}) is None
    assert environment.run_hook_enabled({environment.LOADERTOP_RUN: "1"})
    assert not environment.run_hook_enabled({environment.LOADERTOP_RUN: "0"})
    assert not environment.run_hook_enabled({})


def test_every_user_facing_variable_is_in_the_readme():
    readme = (PACKAGE.parent / "README.md").read_text()
    for name in (environment.LOADERTOP_DISABLE, environment.LOADERTOP_DIR,
                 environment.LOADERTOP_ENDPOINT, environment.LOADERTOP_CURVE_SECRET,
                 environment.LOADERTOP_AUTHORIZED_KEYS, environment.NO_COLOR,
                 *environment.RANK_VARIABLES):
        assert f"`{name}" in readme or f"{name}=" in readme, name
