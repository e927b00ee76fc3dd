"""The worker count the live advice names, for `loadertop tune`'s first trial."""

from __future__ import annotations

from loadertop.client.document import SourceFigures, SystemFigures
from loadertop.diagnosis.capacity import fewer_workers_target, more_did_not_help, worker_plan
from loadertop.diagnosis.categories import cpu_saturated, input_bound_cpu, input_bound_io
from loadertop.diagnosis.facts import Facts
from loadertop.diagnosis.registry import diagnose


def advised_num_workers(source: SourceFigures, system: SystemFigures | None) -> int | None:
    """The worker count the live advice would have the user try for `source`, or None when it
    advises none (the loader is not input-bound, more workers are not predicted to help, or
    fetch and step times are unknown). For `loadertop tune`'s first trial."""
    verdict = diagnose(source, system)
    facts = Facts.read(source, system)
    if verdict.category == cpu_saturated.CATEGORY:
        fewer = fewer_workers_target(facts)
        return fewer[0] if fewer is not None else None
    if verdict.category not in (input_bound_io.CATEGORY, input_bound_cpu.CATEGORY):
        return None
    if facts.slow_worker is not None:
        return None
    if more_did_not_help(facts) is not None:
        return None
    plan = worker_plan(facts)
    return plan.count if plan is not None else None

