"""torchdata's StatefulDataLoader under `run --autotune`: its `state_dict()` in the program's own
count (docs/autotune.md, "StatefulDataLoader"; docs/contract.md §10).

torchdata 0.11 resumes a state_dict only with the `num_workers` it was taken at
(`_StatefulMultiProcessingDataLoaderIter._restore_main_state` asserts `self._num_workers ==
state_dict[_num_workers]`), so one taken while the tuner had set another count would not load into
the program as written. It need not name that count. For a map-style dataset without a state of
its own — the only StatefulDataLoader the tuner tunes (probe/autotune.py, `_why_not_tuned`) — the
state is the sampler's, and nothing of any worker's:

- `_snapshot._main_snapshot`: the sampler and its iterator as they were after the snapshot's
  batch (`_snapshot_step`), the indices pulled (`_sampler_iter_yielded`), `_num_workers` and the
  workers' `_base_seed`;
- `_snapshot._worker_snapshots`: per worker `{worker_id, fetcher_state: None, dataset_state:
  None}` (torchdata's `worker._make_state_dict` for a map-style dataset that is not Stateful);
- `_snapshot._last_yielded_worker_id`: where the workers' round robin goes on at a resume; with
  `in_order=True` it starts at worker 0 each epoch and every worker stays active (map-style), so
  after batch S it is (S - 1) mod num_workers;
- `_steps_since_snapshot`: the batches a resume fetches and drops after the snapshot's.

So the same state in the program's count N has `_num_workers` N, N empty worker states, worker
(S - 1) mod N last, and the epoch's base seed as torch drew it; the sampler's part is as it is.
Loaded into the program, it resumes after the same batch with the same remaining sequence
(tests/functional/test_autotune_inside_epochs.py round-trips one taken after a switch).
"""

from __future__ import annotations

import weakref
from typing import Any


class InProgramTerms:
    """Stands as the `state_dict` of one torchdata iterator (an instance attribute: the
    loader's `state_dict()` calls `self._iterator.state_dict()`): the iterator's own, in the
    program's count. Holds the iterator weakly (no cycle keeps it, or its workers, alive)."""

    __slots__ = ("_iterator", "_count", "_base_seed")

    def __init__(self, iterator: Any, count: int, base_seed: int | None) -> None:
        self._iterator = weakref.ref(iterator)
        self._count = count
        self._base_seed = base_seed

    @classmethod
    def install(cls, iterator: Any, count: int, base_seed: int | None) -> None:
        iterator.state_dict = cls(iterator, count, base_seed)

    def __call__(self) -> dict[str, Any]:
        it = self._iterator()
        if it is None:  # cannot be: the loader calls it through the iterator
            raise ReferenceError("the iterator is gone")
        return in_program_terms(type(it), type(it).state_dict(it), self._count, self._base_seed)


def in_program_terms(kind: Any, state: dict[str, Any], count: int,
                     base_seed: int | None) -> dict[str, Any]:
    """`state` (a state_dict of torchdata's iterator class `kind`) as the program's `count`
    workers would have it; as it is where it holds more than the sampler's state."""
    from torchdata.stateful_dataloader import incremental_state as keys

    snapshot = state.get(kind._SNAPSHOT)
    if not isinstance(snapshot, dict):
        return state
    workers = snapshot.get(kind._WORKER_SNAPSHOTS) or {}
    if any(not isinstance(w, dict) or w.get(keys._FETCHER_STATE) is not None
           or w.get(keys._DATASET_STATE) is not None for w in workers.values()):
        return state  # a worker's own state: no other count can take it
    main = dict(snapshot[kind._MAIN_SNAPSHOT], **{kind._NUM_WORKERS: count})
    if base_seed is not None:
        main[kind._BASE_SEED] = base_seed
    step = int(snapshot[kind._SNAPSHOT_STEP])
    translated = dict(snapshot, **{
        kind._MAIN_SNAPSHOT: main,
        kind._LAST_YIELDED_WORKER_ID: (step - 1) % count,
        kind._WORKER_SNAPSHOTS: {
            f"worker_{i}": {keys._WORKER_ID: i, keys._FETCHER_STATE: None,
                            keys._DATASET_STATE: None} for i in range(count)},
    })
    return dict(state, **{kind._SNAPSHOT: translated})
