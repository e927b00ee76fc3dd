"""Command-side rules without processes: the demo's shared phase arguments, `run`'s torch check,
and the text report of `loadertop snapshot` / `--once` (on documents of the real model)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import pytest

from loadertop.commands import demo, run
from loadertop.examples import demo_train
from loadertop.examples.demo_train import PHASES, phase_command_line
from loadertop.views.text import banner_text, render_text

import fakes


# ---------------------------------------------------------------------------- demo phases
def _by_name(*names):
    return tuple(p for p in PHASES if p.name in names)


def test_phases_argument():
    assert demo_train.phases_argument("healthy,io,cpu,saturated") == PHASES
    # Canonical order, each once, spaces and empty items ignored.
    assert demo_train.phases_argument(" io , healthy,,io ") == _by_name("healthy", "io")
    for bad, message in (("nope", "unknown phase nope; choose from healthy, io, cpu, saturated"),
                         ("", "unknown phase (none)"), (" , ", "unknown phase (none)"),
                         ("io,x,y", "unknown phase x, y")):
        with pytest.raises(argparse.ArgumentTypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
            demo_train.phases_argument(bad)


def test_phase_seconds_argument():
    assert demo_train.phase_seconds_argument("2.5") == 2.5
    least = demo_train.MIN_PHASE_SECONDS
    assert demo_train.phase_seconds_argument(str(least)) == least
    for bad in ("0.5", "0", "-3", "nan", "abc", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            demo_train.phase_seconds_argument(bad)
    assert demo_train.MIN_PHASE_SECONDS > demo_train.VAL_SECONDS  # a phase trains before its val


@pytest.mark.parametrize("argv", [
    ["--phases", "nope"],
    ["--phases", ""],
    ["--phase-seconds", "0.5"],
    ["--phase-seconds", "soon"],
])
def test_the_command_and_the_job_refuse_the_same_arguments_alike(argv, capsys):
    errors = []
    for parse in (demo.parser().parse_args, demo_train.parse_args):
        with pytest.raises(SystemExit) as info:
            parse(argv)
        assert info.value.code == 2
        errors.append(capsys.readouterr().err.strip().splitlines()[-1].split(": error: ", 1)[1])
    assert errors[0] == errors[1]


def test_the_command_passes_its_phases_to_the_job():
    args = demo.parser().parse_args(["--phase-seconds", "2.25", "--phases", "saturated,io"])
    job_args = demo_train.parse_args(phase_command_line(args.phase_seconds, args.phases))
    assert (job_args.phase_seconds, job_args.phases) == (2.25, _by_name("io", "saturated"))
    defaults = demo.parser().parse_args([])
    assert (defaults.phase_seconds, defaults.phases) == (demo_train.DEFAULT_PHASE_SECONDS, PHASES)


def test_the_job_module_imports_no_torch():
    """`loadertop demo` imports it for the phases, and must answer at once without torch."""
    import subprocess

    code = ("import sys, loadertop.examples.demo_train, loadertop.commands.demo\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'textual')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip()
    assert out == "[]"


# ---------------------------------------------------------------------------- run without torch
def _script(path, first_line: str):
    path.write_text(f"{first_line}\nprint('hi')\n")
    path.chmod(0o755)
    return str(path)


def test_python_of(tmp_path):
    search = os.pathsep.join([str(tmp_path), os.path.dirname(sys.executable)])
    exe_name = os.path.basename(sys.executable)
    by_name = os.path.join(os.path.dirname(sys.executable), exe_name)
    assert run.python_of([sys.executable, "train.py"], search) == sys.executable
    assert run.python_of([exe_name, "train.py"], search) == by_name
    # Console scripts (torchrun) and scripts name their Python on the #! line.
    assert run.python_of([_script(tmp_path / "torchrun", f"#!{sys.executable}")], search) == sys.executable
    env_script = _script(tmp_path / "train_env", f"#!/usr/bin/env -S {exe_name} -u")
    assert run.python_of([env_script], search) == by_name
    # Not a Python, or not to be told without running it.
    assert run.python_of([_script(tmp_path / "job.sh", "#!/bin/sh")], search) is None
    assert run.python_of([_script(tmp_path / "plain", "echo hi")], search) is None
    assert run.python_of(["no-such-command-xyz"], search) is None
    assert run.python_of([], search) is None


def test_is_this_python(tmp_path):
    assert run._is_this_python(sys.executable)
    other = tmp_path / "python3"
    other.symlink_to(os.path.realpath(sys.executable))  # the same binary in another venv's bin
    assert not run._is_this_python(str(other))


def test_importable_answers_as_find_spec_does():
    for name in ("torch", "loadertop", "json", "no_such_module_here"):
        assert run._importable(name) is (importlib.util.find_spec(name) is not None), name


def test_torch_warning(tmp_path, monkeypatch):
    env = {"PATH": os.path.dirname(sys.executable)}
    if importlib.util.find_spec("torch") is not None:
        assert run.torch_warning([sys.executable, "train.py"], env) is None  # torch here: silent
    real_importable = run._importable
    monkeypatch.setattr(run, "_importable", lambda name: name != "torch" and real_importable(name))
    line = run.torch_warning([sys.executable, "train.py"], env)
    assert line == (f"loadertop run: torch is not installed in {sys.executable}, the Python that runs "
                    f"{sys.executable}: its DataLoaders cannot be instrumented (install torch there)")
    # Another Python (it may have torch and loadertop), or one that cannot be told: silent.
    other = tmp_path / "python3"
    other.symlink_to(os.path.realpath(sys.executable))
    assert run.torch_warning([str(other), "train.py"], env) is None
    assert run.torch_warning([_script(tmp_path / "job.sh", "#!/bin/sh")], env) is None


# ---------------------------------------------------------------------------- the text report
def _report_lines(doc) -> list[str]:
    return render_text(doc).splitlines()


def _after(lines: list[str], start: str) -> list[str]:
    i = next(i for i, line in enumerate(lines) if line.strip().startswith(start))
    return lines[i:]


def test_report_says_where_the_time_goes():
    """main_process_bound: 40 % waiting, 84 % of it after the batch was produced."""
    doc = fakes.main_process_bound_doc()
    assert doc.sources[0].diagnosis.category == "main_process_bound"
    where, per_batch = _after(_report_lines(doc), "where the time goes")[:2]
    assert where == "  where the time goes: step 60 % · waiting for workers 6.4 % · handoff 34 %"
    assert per_batch == ("    per batch p50: fetch 11.5 · collate 0.60 · handoff 10.8 ms · "
                         "1024 tensors, 24.0 MiB a batch")


def test_report_says_why_the_split_is_unknown():
    lines = _report_lines(fakes.unpaired_doc("in_order_false"))
    where, per_batch = _after(lines, "where the time goes")[:2]
    assert where == "  where the time goes: step 37 % · waiting 63 % (split unknown: in_order=False)"
    assert "handoff – ms" in per_batch and "collate 4.04" in per_batch
    stalled = _after(_report_lines(fakes.dead_worker_doc()), "where the time goes")
    assert stalled[0].endswith("waiting 100 % (split unknown: no batch received)")
    assert not stalled[1].strip().startswith("per batch")  # nothing known of a batch: no line


def test_report_names_the_straggler_rank_in_its_diagnosis():
    """Issue 37: `loadertop snapshot` (text) of a 2-rank job whose rank 1 reads 4x slower says,
    at the top, that rank 1 holds the job back, with rank 1's evidence and advice; rank 1's own
    section keeps its own verdict."""
    doc = fakes.straggler_doc()
    lines = _report_lines(doc)
    top = _after(lines, "DIAGNOSIS")
    assert top[0] == ("DIAGNOSIS [cpu-node-1:61001:train]: input_bound_io — rank 1 holds the job "
                      "back: its loop waits 75 % of the time for data; the workers wait on storage "
                      "or network; rank 0 waits in its step (3 % for data)")
    assert top[1:4] == ["  evidence: wait fraction 75 % (threshold 10 %)",
                        "  evidence: 100 % of the wait came before the batch was produced: the "
                        "workers are the limit",
                        "  evidence: worker cpu_fraction 0.06 (I/O-bound below 0.50)"]
    assert top[4].startswith("  → try num_workers=9, if the storage serves 9 reads at once: up to ~")
    assert top[5].startswith("  → the storage may already be near its limit")
    rank1 = _after(lines, "train rank 1")
    own = next(line for line in rank1 if line.strip().startswith("DIAGNOSIS"))
    assert own == ("  DIAGNOSIS: input_bound_io — the loop waits 75 % of the time for data; the "
                   "workers wait on storage or network")
    rank0 = _after(lines, "train rank 0")
    assert next(line for line in rank0 if line.strip().startswith("DIAGNOSIS")).startswith(
        "  DIAGNOSIS: compute_bound — the loader keeps up (the loop waits 3 %)")


def test_report_says_a_held_verdict_with_todays_figures_and_the_change_it_holds_back():
    """Issue 50: `loadertop snapshot` a few seconds after the demo turned I/O-bound: the held
    category's words with the wait fraction of the source's own line, and the change pending."""
    lines = _report_lines(fakes.held_verdict_doc())
    top = _after(lines, "DIAGNOSIS")
    assert top[0] == ("DIAGNOSIS [gpu-node-1:41234:train]: compute_bound · changing to "
                      "input_bound_io? — the loader keeps up (the loop waits 21 %): the training "
                      "step is the limit")
    assert top[1] == "  evidence: wait fraction 21 % (threshold 10 %)"
    assert any(line.endswith("waiting 21 % of the time") for line in _after(lines, "train ·"))


def test_the_banner_text_of_a_held_verdict_says_the_change_it_holds_back():
    """`loadertop.verdict()` is the banner's text: with the hysteresis holding compute_bound, the
    TUI's words for the pending change, and today's wait fraction in the summary."""
    head, evidence, advice = banner_text(fakes.held_verdict_doc()).splitlines()
    assert head == ("HEALTHY: COMPUTE-BOUND · changing to input-bound?  [train]  the loader keeps up "
                    "(the loop waits 21 %): the training step is the limit")
    assert evidence.startswith("evidence wait fraction 21 % (threshold 10 %)")
    assert advice.startswith("→ ")


def test_report_time_without_workers_and_when_idle():
    where = _after(_report_lines(fakes.main_process_doc()), "where the time goes")[:2]
    assert where[0] == "  where the time goes: step 45 % · fetching in the loop 55 % · handoff 0.4 %"
    assert where[1] == "    per batch p50: fetch 26.4 · collate 2.50 · handoff 0.06 ms"
    val = _after(_report_lines(fakes.multi_source_doc()), "val rank 0")
    assert _after(val, "where the time goes")[0] == "  where the time goes: not iterated in the window"


def test_report_workers_have_fetch_and_collate():
    lines = _report_lines(fakes.main_process_bound_doc())
    header, first = _after(lines, "worker  pid")[:2]
    assert "fetch p50/p95 ms" in header and "collate p50/p95 ms" in header
    columns = first.split()
    assert columns[:3] == ["0", "41244", "alive"]
    assert columns[3:6] == ["11.0", "/", "16.1"] and columns[6:9] == ["0.6", "/", "1.0"]
    assert header.index("collate") == first.index("0.6 /")  # under its heading


def test_report_lists_findings_with_evidence_advice_and_the_stack():
    """A hung worker: the finding with its figures and fix, and the stack most recent call last
    (as Python prints a traceback), the user's own frame marked."""
    lines = _report_lines(fakes.worker_hung_doc())
    assert "FINDINGS: 2 critical (listed with their source)" in lines
    assert any(line.split()[:3] == ["1", "41245", "hung"] for line in lines)  # the workers' table
    block = _after(lines, "findings (2):")
    assert block[1].startswith("    CRITICAL worker_hung [worker 1] since ")
    assert block[1].endswith(": worker 1 has been inside one batch for 41.0 s, at shards.py:61 in "
                             "_read_record")
    assert block[2] == "      evidence: inside one batch for 41.0 s (threshold 5.0 s)"
    assert "      → a live view of it: py-spy dump --pid 41245" in block
    stack = _after(block, "stack (8 frames, most recent call last):")
    assert [s.strip() for s in stack[1:9]] == [
        *fakes.WORKER_STACK[:5], fakes.WORKER_STACK[5] + "   ← your code", *fakes.WORKER_STACK[6:]]
    loop = _after(block, "CRITICAL loop_hung")
    assert "      stack (11 frames, most recent call last):" in loop
    assert "        /home/ana/proj/train.py:74 in train_one_epoch   ← your code" in loop


def test_report_says_how_the_loop_ended():
    crashed = _report_lines(fakes.killed_worker_doc())
    assert crashed[_index(crashed, "train · ")].split(" · ")[2] == "crashed"
    assert _after(crashed, "ended at ")[0].endswith(
        ": exception: RuntimeError: DataLoader worker (pid 4321) is killed by signal: Killed.")
    died = _after(crashed, "CRITICAL worker_died")
    assert "worker 2 (pid 4321) died: killed by SIGKILL (signal 9), most likely the OOM killer" in died[0]
    finished = _report_lines(fakes.finished_doc())
    assert finished[_index(finished, "train · ")].split(" · ")[2] == "finished"
    assert _after(finished, "ended at ")[0].endswith(": finished")
    assert not any(line.startswith("FINDINGS") for line in finished)
    assert not any("ended" in line for line in _report_lines(fakes.healthy_doc()))


def test_report_lists_the_machines_findings():
    lines = _report_lines(fakes.shm_low_doc())
    block = _after(lines, "findings of the machine (1):")
    assert block[1].startswith("    WARNING shm_low since ")
    assert block[2].startswith("      evidence: /dev/shm: 3 MiB free of 64 MiB")
    assert block[3].startswith("      → in Docker, a bigger --shm-size")


def _index(lines: list[str], start: str) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith(start))
