"""`client.tracker_keys`: a source's figures as a tracker's flat scalars (docs/contract.md §11), the
one mapping `loadertop export --tensorboard` and `loadertop.metrics()` share."""

from __future__ import annotations

from loadertop.client.tracker_keys import CATEGORIES, FIGURES, prefix_of, source_metrics
from loadertop.diagnosis import CATEGORIES as DIAGNOSIS_CATEGORIES

from fakes import finished_doc, healthy_doc, killed_worker_doc, main_process_doc, unpaired_doc


def test_every_figure_of_a_healthy_source_under_its_prefix():
    (src,) = healthy_doc().sources
    prefix = prefix_of(src)
    assert prefix == f"loadertop/{src.name}"
    got = source_metrics(src, prefix)
    assert list(got) == [f"{prefix}/{figure}" for figure in FIGURES]  # every one known, in order
    assert all(isinstance(v, float) for v in got.values())
    assert got[f"{prefix}/wait_fraction"] == src.wait_fraction
    assert got[f"{prefix}/batches_per_s"] == src.batches_per_s
    assert got[f"{prefix}/samples_per_s"] == src.samples_per_s
    assert got[f"{prefix}/fetch_ms_p50"] == src.stages.fetch_ms.p50
    assert got[f"{prefix}/collate_ms_p50"] == src.stages.collate_ms.p50
    assert got[f"{prefix}/handoff_ms_p50"] == src.stages.handoff_ms.p50
    assert got[f"{prefix}/num_workers"] == src.config.num_workers == 4
    assert got[f"{prefix}/queue_ready_mean"] == src.queue.ready_mean
    assert got[f"{prefix}/workers_alive"] == 4.0


def test_one_key_per_category_and_only_the_current_one_is_1():
    assert CATEGORIES == DIAGNOSIS_CATEGORIES
    for doc in (healthy_doc(), main_process_doc(), killed_worker_doc()):
        (src,) = doc.sources
        got = source_metrics(src, "p")
        flags = {key.removeprefix("p/bottleneck/"): v for key, v in got.items()
                 if key.startswith("p/bottleneck/")}
        assert list(flags) == list(CATEGORIES)
        assert [c for c, v in flags.items() if v == 1.0] == [src.diagnosis.category]
        assert sum(flags.values()) == 1.0


def test_unknown_figures_are_left_out_never_a_made_up_zero():
    (src,) = unpaired_doc().sources
    assert src.stages.handoff_ms is None
    got = source_metrics(src, "p")
    assert "p/handoff_ms_p50" not in got and "p/fetch_ms_p50" in got
    (src,) = main_process_doc().sources  # num_workers=0: no queue, no workers
    got = source_metrics(src, "p")
    assert got["p/num_workers"] == 0.0 and got["p/workers_alive"] == 0.0


def test_a_finished_source_has_no_workers_alive():
    for doc in (finished_doc(), killed_worker_doc()):
        (src,) = doc.sources
        assert src.state == "finished"
        assert source_metrics(src, "p")["p/workers_alive"] == 0.0
