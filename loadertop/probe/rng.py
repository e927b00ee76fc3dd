"""Digests of the random states a worker starts with (read once per worker, never drawn from).

torch 2.13's `_worker_loop` seeds `random`, torch and numpy's legacy global state differently in
every worker (base seed + worker id), so those differ unless a `worker_init_fn` re-seeds them alike.
What does not differ is a generator object the dataset made in `__init__` — `np.random.default_rng`,
`np.random.RandomState`, `random.Random`, `torch.Generator` — copied into every worker by fork or
pickle with the same state: every worker then draws the same "random" augmentations (seed §5.3).
Reading a state (`bit_generator.state`, `get_state()`, `getstate()`) never advances it.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: a spawned worker imports this module, and little else
if TYPE_CHECKING:
    from typing import Any

MAX_OBJECTS = 256  # attributes visited from the dataset (a bounded walk, once per worker)
MAX_DEPTH = 3
MAX_STATES = 32


def _digest(value: object) -> str:
    numbers = _numbers(value)
    if numbers is not None:
        # random.getstate(): a tuple of 625 ints. hash() of ints and floats is the same in every
        # process (str and bytes hashes are salted per process, and None's is its address before
        # Python 3.12: `_numbers` spells None as ()), and needs no repr(), the dear part in a
        # fresh worker (docs/performance.md).
        return format(hash(numbers) & 0xFFFF_FFFF_FFFF_FFFF, "016x")
    import hashlib  # here: a spawned worker reads the states before it needs this

    h = hashlib.blake2b(digest_size=8)
    _feed(h, value)
    return h.hexdigest()


def _feed(h: Any, value: object, depth: int = 0) -> None:
    """`value` into the hash, each part length-prefixed (no two values feed the same bytes):
    bytes as they are, tuples item by item, anything else as its repr. A numpy state is
    ("MT19937", 2,496 bytes, pos): fed as bytes, not through their repr (an escape per byte;
    docs/performance.md)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = value if isinstance(value, bytes) else bytes(value)
        h.update(b"b%d:" % len(data))
        h.update(data)
    elif type(value) is tuple and depth < 2:
        h.update(b"t%d:" % len(value))
        for item in value:
            _feed(h, item, depth + 1)
    else:
        text = repr(value).encode()
        h.update(b"r%d:" % len(text))
        h.update(text)


def _numbers(value: Any, depth: int = 0) -> object:
    """`value` made of ints, floats and None only (in tuples nested at most twice), with None as
    () and each float as (x,) so that neither can be mistaken for the other; else None. A tuple of
    ints alone is kept as it is (its types read at C speed, no copy)."""
    kind = type(value)
    if kind is int:
        return value
    if kind is float:
        return (value,)
    if value is None:
        return ()
    if kind is not tuple or depth >= 2:
        return None
    kinds = set(map(type, value))
    if kinds <= {int}:
        return value
    out = []
    for v in value:
        n = _numbers(v, depth + 1)
        if n is None:
            return None
        out.append(n)
    return tuple(out)


def _tensor_bytes(tensor: Any) -> bytes:
    """A generator state's bytes. Through ctypes (which torch has imported) where it is loaded:
    `.numpy().tobytes()` is dearer in a fresh worker, its first numpy bridge (docs/performance.md)."""
    ctypes = sys.modules.get("ctypes")
    if ctypes is not None and tensor.element_size() == 1 and tensor.is_contiguous() \
            and tensor.device.type == "cpu":
        data: bytes = ctypes.string_at(tensor.data_ptr(), tensor.numel())
        return data
    data = tensor.numpy().tobytes()
    return data


def _torch_global_state(torch: Any) -> object:
    """What tells torch's global generator in this worker apart from the other workers'.

    torch 2.13's `_worker_loop` seeds it with `torch.manual_seed(base_seed + worker_id)` (the
    worker info's `seed`) before `worker_init_fn`. While `initial_seed()` still reads that seed,
    this worker's generator started from a seed no other worker of the loader got, so draws since
    cannot make it another's: the seed names it, as a tuple of one int (never the 5,056 bytes of a
    state, which `_digest` hashes another way). That is read at once, where `get_rng_state()` and
    its bytes cost a fresh fork worker a good part of its start message, on the way to the first
    batch (docs/performance.md).
    A `worker_init_fn` that re-seeds (`manual_seed`, or `set_rng_state`, which sets
    `initial_seed()` from the state) changes it, and then the state itself is read, so workers
    re-seeded alike are found sharing it."""
    seed = torch.initial_seed()
    if seed == worker_seed():
        return (seed,)
    return _tensor_bytes(torch.random.get_rng_state())


def _generator_kind(obj: object) -> str | None:
    """The kind of random generator `obj` is, when we know it; else None. Reads no state."""
    import random

    if isinstance(obj, random.Random):
        return "random.Random"
    # numpy.random from sys.modules, never `np.random`: numpy 2's `__getattr__` would import it,
    # in the program's main process too (where the parent walks); and where it is not imported,
    # none of its generators can exist.
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        if isinstance(obj, np_random.Generator):
            return "numpy Generator"
        if isinstance(obj, np_random.RandomState):
            return "numpy RandomState"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Generator):
        return "torch Generator"
    return None


def _read_state(kind: str, obj: Any) -> object:
    """A copy of the state of a generator of that kind (`_generator_kind`)."""
    if kind == "random.Random":
        return obj.getstate()
    if kind == "numpy Generator":
        return obj.bit_generator.state
    if kind == "numpy RandomState":
        state = obj.get_state(legacy=False)
        return (state["bit_generator"], state["state"]["key"].tobytes(), state["state"]["pos"])
    return _tensor_bytes(obj.get_state())


def _state_of(obj: object) -> tuple[str, object] | None:
    """(kind, a copy of its state) when `obj` is a random generator we know, else None."""
    kind = _generator_kind(obj)
    return None if kind is None else (kind, _read_state(kind, obj))


def find_generators(dataset: object) -> list[tuple[str, object]]:
    """(name, generator) for the random generators reachable from `dataset`'s attributes:
    breadth first, bounded (MAX_OBJECTS visited, MAX_DEPTH deep, MAX_STATES found). Reads no
    state: the parent runs it just before it forks the workers (loader._generators_for_fork),
    and the workers read the states."""
    out: list[tuple[str, object]] = []
    seen: set[int] = set()
    queue: list[tuple[str, object, int]] = [("dataset", dataset, 0)]
    visited = 0
    while queue and visited < MAX_OBJECTS and len(out) < MAX_STATES:
        name, obj, depth = queue.pop(0)
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        visited += 1
        try:
            kind = _generator_kind(obj)
        except Exception:
            kind = None
        if kind is not None:
            out.append((f"{name} ({kind})"[:256], obj))
            continue
        if depth >= MAX_DEPTH:
            continue
        try:
            attrs = vars(obj)
        except TypeError:
            attrs = None
        if isinstance(attrs, dict):
            for key, value in list(attrs.items())[:64]:
                if _worth_visiting(value):
                    queue.append((f"{name}.{key}", value, depth + 1))
        elif isinstance(obj, (list, tuple)) and len(obj) <= 16:
            for i, value in enumerate(obj):
                if _worth_visiting(value):
                    queue.append((f"{name}[{i}]", value, depth + 1))
    return out


def worker_seed() -> int | None:
    """This worker's seed (torch 2.13's `WorkerInfo.seed`, base seed + worker id); None outside a
    worker or where torch keeps it elsewhere."""
    worker = sys.modules.get("torch.utils.data._utils.worker")
    return getattr(getattr(worker, "_worker_info", None), "seed", None)


def capture(dataset: object, untouched: bool = False,
            generators: list[tuple[str, object]] | None = None) -> list[tuple[str, object]]:
    """(state name, a copy of the state): the process-wide states and the generators reachable
    from `dataset`'s attributes. Copies (getstate() and get_state() return new objects), so the
    draws that follow cannot change them before `digest`.

    `untouched`: nothing of the program has run in this worker since torch 2.13's `_worker_loop`
    seeded `random`, torch and numpy's legacy state from this worker's seed (no worker_init_fn of
    the program, a map-style dataset, whose fetcher torch makes without calling the dataset).
    Then no other worker's states can equal these, and the seed names the first two, as
    `_torch_global_state` names torch's, instead of reading them on the way to the first batch.
    With it, `generators` (when given) are those `find_generators` found in the parent before it
    forked this worker: the same objects here, and nothing since could have made another, so the
    walk (mostly first touches of what it reads there) is not made again (docs/performance.md)."""
    out: list[tuple[str, object]] = []
    seed = worker_seed() if untouched else None
    try:
        if seed is not None:
            out.append(("random", (seed,)))
        else:
            import random

            out.append(("random", random.getstate()))
        np_random = sys.modules.get("numpy.random")  # torch's seeding imported it
        if np_random is not None:
            if seed is not None:
                out.append(("numpy global", (seed,)))
            else:
                kind, key, pos, *_ = np_random.get_state()
                out.append(("numpy global", (kind, key.tobytes(), pos)))
        torch = sys.modules.get("torch")
        if torch is not None:
            out.append(("torch", _torch_global_state(torch)))
    except Exception:
        pass
    if seed is None or generators is None:
        generators = find_generators(dataset)
    for name, obj in generators:
        try:
            kind = _generator_kind(obj)
            if kind is not None:
                out.append((name, _read_state(kind, obj)))
        except Exception:
            pass
    return out


def digest(captured: list[tuple[str, object]]) -> dict[str, str]:
    """State name -> digest of what `capture` read."""
    out: dict[str, str] = {}
    for name, state in captured:
        try:
            out[name] = _digest(state)
        except Exception:
            pass
    return out


_PLAIN = (int, float, str, bytes, bool, type(None))


def _worth_visiting(value: object) -> bool:
    """Plain data (numbers, strings, numpy arrays, tensors) holds no generator: skipped cheaply.
    `torch.Generator` lives in module "torch" too, so generator types are let through by name."""
    if isinstance(value, _PLAIN):
        return False
    kind = type(value)
    return kind.__module__ not in ("numpy", "torch") or kind.__name__ in ("Generator",
                                                                         "RandomState")
