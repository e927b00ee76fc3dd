"""The straggler among the ranks of a distributed run (pure: typed sources in, `Ranks` out)."""

from __future__ import annotations

import msgspec

from loadertop.client import ranks
from loadertop.client.document import Source

import fakes

_BASE = fakes.healthy_doc().sources[0]


def _src(rank: int | None, wait_fraction: float | None, name: str = "train",
         state: str = "running") -> Source:
    pid = 100 + (rank or 0)
    return msgspec.structs.replace(_BASE, id=f"h:{pid}:{name}", host="h", pid=pid, name=name,
                                   rank=rank, state=state, wait_fraction=wait_fraction,
                                   batches_per_s=10.0, age_s=0.1)


def test_straggler_rule():
    assert ranks.straggler([_src(0, 0.02), _src(1, 0.8)]) == "h:101:train"
    assert ranks.straggler([_src(0, 0.02), _src(1, 0.06)]) is None       # both fine
    assert ranks.straggler([_src(0, 0.85), _src(1, 0.9)]) is None        # everyone starves
    assert ranks.straggler([_src(r, 0.05) for r in range(7)] + [_src(7, 0.4)]) == "h:107:train"
    assert ranks.straggler([_src(0, 0.02), _src(1, 0.8, state="gone")]) is None
    assert ranks.straggler([_src(0, 0.02), _src(1, None)]) is None
    assert ranks.straggler([_src(0, 0.02)]) is None                      # one rank: nothing to compare
    unranked = msgspec.structs.replace(_src(1, 0.9), rank=None)
    assert ranks.straggler([_src(0, 0.02), unranked]) is None
    # Groups by loader name: val's ranks are not compared with train's.
    mixed = [_src(0, 0.02), _src(1, 0.03), _src(0, 0.5, "val"), _src(1, 0.5, "val")]
    assert ranks.straggler(mixed) is None
    overview = ranks.overview([_src(0, 0.02), _src(1, 0.8)])
    assert overview.straggler_rank == 1
    assert overview.groups[0].name == "train"
    assert [r.rank for r in overview.groups[0].ranks] == [0, 1]


def test_a_restarted_rank_counts_once_with_its_fresher_report():
    old = msgspec.structs.replace(_src(1, 0.9), age_s=2.5, id="h:999:train", pid=999)
    overview = ranks.overview([_src(0, 0.02), old, _src(1, 0.03)])
    assert overview.straggler is None
    assert [r.id for r in overview.groups[0].ranks] == ["h:100:train", "h:101:train"]
