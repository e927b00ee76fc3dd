"""The straggler in the top-level verdict (issue 37, part 4).

A 2-rank job (gloo, DistributedSampler, an all-reduce each step) whose rank 1 reads 4x slower:
both ranks are seen, rank 0 compute-bound waiting 3 %, rank 1 input-bound on I/O waiting 75 %.
The top-level verdict must say that rank 1's input pipeline holds the whole job back, with rank
1's own category, evidence and advice — not read like a single process's. The document comes
from real wire messages through the real Model (`fakes.straggler_doc`); the rules of `overall`
are checked on fabricated verdicts too.
"""

from __future__ import annotations

import json

from loadertop.client.document import Category, RankFigures, RankGroup, Ranks, Verdict, encode_json
from loadertop.diagnosis import overall

import fakes
from fakes import T0, LoaderSim, MachineSim, Scenario

SLOW, FAST = "cpu-node-1:61001:train", "cpu-node-1:61000:train"
SUMMARY = ("rank 1 holds the job back: its loop waits 75 % of the time for data; the workers wait "
           "on storage or network; rank 0 waits in its step (3 % for data)")


def _source(doc, source_id):
    return next(s for s in doc.sources if s.id == source_id)


def test_the_top_verdict_is_the_stragglers_said_of_it():
    doc = fakes.straggler_doc()
    slow, fast = _source(doc, SLOW), _source(doc, FAST)
    # both ranks are seen, each with its own verdict
    assert (fast.rank, fast.diagnosis.category, fast.wait_fraction) == (0, "compute_bound", 0.03)
    assert (slow.rank, slow.diagnosis.category, slow.wait_fraction) == (1, "input_bound_io", 0.75)
    assert (doc.ranks.straggler, doc.ranks.straggler_rank) == (SLOW, 1)
    top = doc.diagnosis
    assert top.source == SLOW
    assert top.category == "input_bound_io" == slow.diagnosis.category
    assert top.summary == SUMMARY
    # the straggler's own evidence, then the ranks' figures that make it the straggler
    assert top.evidence[:-1] == slow.diagnosis.evidence
    assert top.evidence[-1] == ("wait fraction by rank of 'train': rank 0: 3 %, rank 1: 75 % "
                                "(median 39 %): every step waits for the slowest rank")
    assert top.advice == slow.diagnosis.advice
    assert top.advice[0].startswith("try num_workers=9, if the storage serves 9 reads at once")
    # rank 1's own verdict stays what it was: the source is judged alone
    assert slow.diagnosis.summary == ("the loop waits 75 % of the time for data; the workers wait "
                                      "on storage or network")
    # and `snapshot --json` carries it as is
    top_json = json.loads(encode_json(doc))["diagnosis"]
    assert (top_json["source"], top_json["category"], top_json["summary"]) == \
        (SLOW, "input_bound_io", SUMMARY)


def test_without_a_straggler_the_top_verdict_reads_as_before():
    # both ranks starve alike (0.7 and 0.75): no straggler, the most urgent verdict as is
    loaders = [LoaderSim(pid=61000 + r, host="cpu-node-1", rank=r, batches_per_s=10.0,
                         wait_fraction=w, wait_p50_ms=70.0, wait_p95_ms=100.0, step_p50_ms=25.0,
                         ready=0, ready_mean=0.1, ready_when_waiting=0.0)
               for r, w in ((0, 0.7), (1, 0.75))]
    scenario = Scenario(loaders, [MachineSim(host="cpu-node-1")])
    scenario.run(T0 - 4.0, T0)
    both = scenario.document(T0)
    assert both.ranks.straggler is None
    assert not both.diagnosis.summary.startswith("rank ")
    assert both.diagnosis.summary == both.sources[0].diagnosis.summary


def _verdict(category: Category, summary: str) -> Verdict:
    return Verdict(category=category, summary=summary, evidence=(f"{category} evidence",),
                   advice=(f"{category} advice",))


def _ranks(waits: dict[int, float], straggler: int | None) -> Ranks:
    ranked = tuple(RankFigures(rank=r, id=f"h:{r}:train", wait_fraction=w, batches_per_s=10.0)
                   for r, w in sorted(waits.items()))
    median = sorted(waits.values())[len(waits) // 2]
    return Ranks(straggler=f"h:{straggler}:train" if straggler is not None else None,
                 straggler_rank=straggler,
                 groups=(RankGroup(name="train", median_wait_fraction=median, ranks=ranked),))


WAITS = "the loop waits 40 % of the time for data; the workers compute and CPU is left"
KEEPS_UP = "the loader keeps up (the loop waits 3 %): the training step is the limit"


def test_the_straggler_wins_over_a_more_urgent_looking_category_elsewhere():
    # rank 0's machine is saturated (cpu_saturated ranks above input_bound_cpu), but rank 1 sets
    # the pace of the job: the top verdict is rank 1's
    verdicts = [("h:0:train", _verdict("cpu_saturated", "the loop waits 12 % …")),
                ("h:1:train", _verdict("input_bound_cpu", WAITS))]
    top = overall(verdicts, None, _ranks({0: 0.12, 1: 0.4}, 1))
    assert (top.category, top.source) == ("input_bound_cpu", "h:1:train")
    assert top.summary == ("rank 1 holds the job back: its loop waits 40 % of the time for data; "
                           "the workers compute and CPU is left; rank 0 waits in its step (12 % "
                           "for data)")
    assert top.advice == ("input_bound_cpu advice",)
    assert top.evidence[0] == "input_bound_cpu evidence"
    # without the ranks, as before: the most urgent category
    assert overall(verdicts, None).category == "cpu_saturated"


def test_a_stall_or_memory_pressure_still_comes_first():
    for urgent in ("stalled", "memory_pressure"):
        verdicts = [("h:0:train", _verdict(urgent, f"{urgent} summary")),
                    ("h:1:train", _verdict("input_bound_io", WAITS))]
        top = overall(verdicts, None, _ranks({0: 0.02, 1: 0.4}, 1))
        assert (top.category, top.source, top.summary) == (urgent, "h:0:train", f"{urgent} summary")


def test_a_straggler_not_judged_waiting_is_not_named():
    # its verdict still held at compute_bound (the stabilizer), or too few batches to judge
    for category, summary in (("compute_bound", KEEPS_UP), ("insufficient_data", "3 batches …")):
        verdicts = [("h:0:train", _verdict("compute_bound", KEEPS_UP)),
                    ("h:1:train", _verdict(category, summary))]
        top = overall(verdicts, None, _ranks({0: 0.02, 1: 0.4}, 1))
        assert not top.summary.startswith("rank ")


def test_the_other_ranks_are_named_with_their_wait():
    verdicts = [(f"h:{r}:train", _verdict("compute_bound", KEEPS_UP)) for r in (0, 2, 3)]
    verdicts.insert(1, ("h:1:train", _verdict("main_process_bound",
                                              "the loop waits 40 % of the time although batches "
                                              "are ready: the main process is the limit")))
    top = overall(verdicts, None, _ranks({0: 0.02, 1: 0.4, 2: 0.04, 3: 0.03}, 1))
    assert top.summary == ("rank 1 holds the job back: its loop waits 40 % of the time although "
                           "batches are ready: the main process is the limit; ranks 0, 2 and 3 "
                           "wait in their step (2–4 % for data)")
    assert top.evidence[-1] == ("wait fraction by rank of 'train': rank 0: 2 %, rank 1: 40 %, "
                                "rank 2: 4 %, rank 3: 3 % (median 4 %): every step waits for the "
                                "slowest rank")
    many = {r: 0.03 for r in range(16)} | {7: 0.5}
    verdicts = [(f"h:{r}:train", _verdict("input_bound_io" if r == 7 else "compute_bound",
                                          WAITS if r == 7 else KEEPS_UP)) for r in range(16)]
    top = overall(verdicts, None, _ranks(many, 7))
    assert top.summary.startswith("rank 7 holds the job back: its loop waits")
    assert top.summary.endswith("; the other 15 ranks wait in their step (3 % for data)")
    assert top.evidence[-1].startswith("wait fraction by rank of 'train': rank 7: 50 %, the other "
                                       "15 ranks: 3 % (median 3 %)")


def test_the_model_follows_the_straggler_from_refresh_to_refresh():
    """Rank 1's storage recovers: no straggler is named from the next refresh, and the top verdict
    reads as a source's own again."""
    scenario = fakes.straggler_scenario()
    scenario.run(T0 - 4.0, T0)
    assert scenario.document(T0).diagnosis.summary == SUMMARY
    slow = scenario.loaders[1]
    slow.wait_fraction, slow.wait_p50_ms, slow.wait_p95_ms = 0.03, 2.0, 6.0
    for worker in slow.workers:
        worker.fetch_p50_ms, worker.fetch_p95_ms = 50.0, 62.0
    tops = []
    for i in range(1, 5):
        scenario.run(T0 + 4.0 * (i - 1), T0 + 4.0 * i)
        tops.append(scenario.document(T0 + 4.0 * i).diagnosis)
    # the waits are over at once (a 3 s window), so no rank stands out; the stabilizer still shows
    # rank 1's category for a few refreshes, as its own, said with today's figures, and the
    # change it holds back
    assert tops[0].category == "input_bound_io" and tops[0].source == SLOW
    assert tops[0].summary == "the loop waits 3 % of the time for data; the workers wait on " \
        "storage or network"
    assert tops[0].pending == "compute_bound"
    last = tops[-1]
    assert scenario.model.document().ranks.straggler is None
    assert last.category == "compute_bound" and not last.summary.startswith("rank ")
