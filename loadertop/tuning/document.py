"""The `loadertop tune --json` document (docs/contract.md §6), schema `loadertop.tune/1`, as typed Structs.

Like `loadertop.client.document`: frozen msgspec Structs, a field's definition order is its key order,
the types carry the ranges, and a figure that cannot be known is None (JSON null). The contract's
keys come first in each object; the others are additive (stable within schema 1).

`trials` lists every run of the program in the order they ran: a count measured twice (a result
within noise of its neighbour) appears twice, `run` 1 and 2. `best` is the recommended count,
its runs merged; it is None when no count can be recommended (no trial measured, or a loader
whose num_workers cannot change safely: `unsafe` says why).
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from loadertop.client.document import Category, Count, Fraction, NonNegative, Percent

TUNE_SCHEMA: Final = "loadertop.tune/1"

#: Why a trial ran: the program's own setting (the live advice's input), the first count, the
#: climb (two more a time), the refinement around the best, a repeat (a result within noise of
#: its neighbour), or a count given with --workers.
TrialReason = Literal["own_setting", "start", "climb", "refine", "repeat", "listed"]


class _Figures(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Base of the document's objects (see `loadertop.client.document._Figures`)."""


class TrialFigures(_Figures, frozen=True, kw_only=True):
    """One run of the program with one num_workers, measured after its warm-up."""

    # ---- docs/contract.md §6
    num_workers: Count | None  # None only for a program-own-setting trial that made no loader
    samples_per_s: NonNegative | None  # batches/s x batch size (batches/s when it is unknown)
    wait_fraction: Fraction | None
    cpu_percent: Percent | None  # the machine's, averaged over the measurement
    mem_available_bytes: Count | None  # the lowest seen during the measurement
    swap_active: bool | None  # swap-in (or swap-out with little memory left) during it
    category: Category | None  # the main loader's verdict at the end of the measurement
    exit: str | None  # "exit 3: <stderr tail>", "killed by SIGKILL: …"; None while it ran on
    # ---- additive
    exit_code: int | None = None  # the program's, when it ended during the trial (-N: signal N)
    run: Count = 1  # 2 for the repeat of a count
    reason: TrialReason = "listed"
    spread_samples_per_s: NonNegative | None = None  # the standard error of samples_per_s
    batches_per_s: NonNegative | None = None
    batch_size: Count | None = None
    loader: str | None = None  # the main loader's name (the one with the most batches)
    sources: Count = 0  # its sources: one per process (rank) that iterated it
    workers_rss_bytes: Count | None = None  # all its workers together, at the end
    worker_rss_bytes: Count | None = None  # one worker, on average
    # One worker's private memory (USS), on average, where the probe's slow readings (every 5 s)
    # came within the trial: what one more worker costs (RSS counts the pages shared with the
    # main process, torch's libraries among them).
    worker_uss_bytes: Count | None = None
    memory_short: bool = False  # swap active or available memory below the diagnosis threshold
    measured_s: NonNegative = 0.0  # the time the measurement covers
    startup_s: NonNegative | None = None  # from the start of the program to its first batch
    batches_per_epoch: NonNegative | None = None  # the main loader's, when epochs ended in it
    iterable: bool | None = None  # the main loader's dataset is an IterableDataset
    problem: str | None = None  # why the trial gave no figure (no DataLoader, override refused)


class BestFigures(_Figures, frozen=True, kw_only=True):
    num_workers: Count
    samples_per_s: NonNegative
    spread_samples_per_s: NonNegative | None = None


class UnsafeFigures(_Figures, frozen=True, kw_only=True):
    """Evidence that changing num_workers changes what the program trains on: an iterable
    dataset that every worker yields whole (epochs grow with the worker count)."""

    reason: Literal["duplicated_iterable"]
    num_workers: tuple[Count, Count]
    batches_per_epoch: tuple[NonNegative, NonNegative]


class TuneDocument(_Figures, frozen=True, kw_only=True):
    # ---- docs/contract.md §6
    schema: Literal["loadertop.tune/1"]
    command: str  # the command line, shell-quoted
    trials: tuple[TrialFigures, ...]
    best: BestFigures | None
    recommendation: str
    # ---- additive
    rate_unit: Literal["samples/s", "batches/s"] = "samples/s"
    strategy: Literal["default", "listed"] = "default"
    cores_available: NonNegative | None = None  # cgroup quota and affinity applied
    max_workers: Count | None = None
    trial_seconds: NonNegative = 0.0
    started_at: NonNegative = 0.0  # Unix time
    duration_s: NonNegative = 0.0
    interrupted: bool = False  # Ctrl-C: the trials measured before it
    stopped_because: str | None = None  # why the search ended
    unsafe: UnsafeFigures | None = None


def encode_json(document: TuneDocument, *, indent: int = 2) -> bytes:
    raw = msgspec.json.encode(document)
    return msgspec.json.format(raw, indent=indent) if indent else raw


def decode_json(raw: bytes | str) -> TuneDocument:
    """Parse and validate a document; raises `msgspec.ValidationError` / `DecodeError`."""
    return msgspec.json.decode(raw, type=TuneDocument)
