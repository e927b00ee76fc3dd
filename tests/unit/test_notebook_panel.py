"""The notebook's panel as HTML (`views/notebook_panel.py`): what it says of a document, in the
words and colours the other views use, every text escaped, and markup a sanitizing front end
keeps (no script, no style element, inline styles only). How it looks: test_notebook_look.py."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

from loadertop import diagnosis
from loadertop.views import notebook_panel
from loadertop.views.notebook_panel import MAX_WORKER_ROWS, render
from loadertop.views.palette import category_colour, category_style

from fakes import (
    LoaderSim,
    MachineSim,
    WorkerSim,
    _one,
    dead_worker_doc,
    empty_doc,
    findings_multi_source_doc,
    io_bound_doc,
    worker_hung_doc,
)


class _Tags(HTMLParser):
    """Every start tag with its attributes; text outside tags; unbalanced tags noticed."""

    VOID = {"br", "img", "hr", "meta", "input"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1:]}>"
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(markup: str) -> _Tags:
    tags = _Tags()
    tags.feed(markup)
    tags.close()
    assert not tags.open, f"unclosed tags {tags.open}"
    return tags


def text_of(markup: str) -> str:
    return " ".join(" ".join(parse(markup).text).split())


def test_the_banner_says_the_verdict_in_its_words_and_colour_with_evidence_and_advice():
    doc = io_bound_doc()
    markup = render(doc)
    verdict = doc.diagnosis
    assert verdict.category == diagnosis.INPUT_BOUND_IO
    tags = parse(markup)
    root = tags.tags[0]
    assert root[1]["class"] == "loadertop-panel" and root[1]["data-category"] == verdict.category
    text = text_of(markup)
    assert category_style(verdict.category).words.upper() in text
    assert verdict.summary in text
    shown = (*verdict.evidence[:notebook_panel.EVIDENCE_SHOWN],
             *verdict.advice[:notebook_panel.ADVICE_SHOWN])
    for line in shown:
        assert line in text
    colour = category_colour(verdict.category)
    assert f"border-left: 6px solid {colour}" in markup  # the banner's rule, in the verdict's colour


def test_a_loader_shows_rate_wait_time_shares_stages_queue_and_workers():
    doc = io_bound_doc()
    src = doc.sources[0]
    text = text_of(render(doc))
    assert src.batches_per_s is not None and src.wait_fraction is not None
    for needle in (f"{src.name} waiting", "4 workers · batch 64 · ImageFolder",
                   f"batches/s {src.batches_per_s:.3g}", f"waiting {src.wait_fraction * 100:.0f} %",
                   "where the time goes", "waiting for workers", "per batch p50 fetch",
                   "queue ready / in flight / capacity 0 / 8 / 8",
                   "worker pid state fetch p50/p95 ms cpu_frac CPU % RSS"):
        assert needle in text, needle
    for w in src.workers:
        assert f" {w.pid} alive " in text
    assert "machine gpu-node-1 CPU" in text


def test_findings_are_listed_with_severity_summary_advice_and_the_users_frame():
    doc = worker_hung_doc()
    markup = render(doc)
    text = text_of(markup)
    hung = next(f for f in doc.findings if f.kind == "worker_hung")
    assert "CRITICAL worker_hung · worker 1" in text and hung.summary in text
    assert "hung 41 s" in text  # the worker's row says it too
    assert "← your code" in text
    assert "<details" not in markup  # replaced every second: a folded stack would close again


def test_several_loaders_each_get_their_verdict_and_the_banner_names_the_one_it_is_about():
    doc = findings_multi_source_doc()
    text = text_of(render(doc))
    assert "STALLED [val]" in text
    assert "HEALTHY: COMPUTE-BOUND" in text.upper()  # train's own verdict, under its name


def test_every_text_from_the_document_is_escaped():
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    loader = LoaderSim(name="train", dataset=hostile, command=hostile, host="h<b>")
    doc = _one([loader], [MachineSim(host="h<b>")])
    markup = render(doc, note=hostile)
    assert "<script" not in markup and "<img" not in markup
    assert html.escape(hostile) in markup
    tags = parse(markup)
    assert {tag for tag, _ in tags.tags} <= {"div", "span", "b", "br", "code", "table", "thead",
                                              "tbody", "tr", "th", "td", "pre"}
    for tag, attrs in tags.tags:  # inline styles and our own data- attributes, no handler
        assert set(attrs) <= {"style", "class", "title", "data-category", "data-taken-at"}, (tag, attrs)


def test_nothing_yet_says_how_to_get_a_loader_measured():
    markup = render(empty_doc())
    assert 'data-category=""' in markup
    text = text_of(markup)
    assert "WAITING FOR A LOADER" in text and "%loadertop on" in text


def test_without_the_clock_the_same_document_gives_the_same_panel():
    doc = dead_worker_doc()
    assert render(doc, clock=False) == render(doc, clock=False)
    assert "as of" not in render(doc, clock=False) and "data-taken-at" not in render(doc, clock=False)
    with_clock = render(doc)
    assert re.search(r"as of \d\d:\d\d:\d\d", with_clock)
    assert f'data-taken-at="{doc.taken_at}"' in with_clock
    assert "stopped updating" in render(doc, note="stopped updating")


def test_many_workers_are_listed_up_to_the_cap_then_counted():
    workers = [WorkerSim(cpu_percent=50.0, rss_bytes=100 * 1024 * 1024) for _ in range(MAX_WORKER_ROWS + 4)]
    doc = _one([LoaderSim(workers=workers)], [MachineSim()])
    markup = render(doc)
    assert markup.count("<tr>") == MAX_WORKER_ROWS + 1  # the header's row and the cap
    assert "… and 4 more workers" in text_of(markup)
