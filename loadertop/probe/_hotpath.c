/* The shim's hot path in C: `Stamper`, the base of loader.py's instrumented iterators; and the
 * publisher thread's drain of its stamps and its reports' samples (`StampRing.take_split`,
 * `split_stamps`, `bucket_count`, `decimate_micros`, for record.py).
 *
 * Per batch it does what loader.py's pure-Python `_PyStamper` does, with the same stamps: t0
 * (CLOCK_MONOTONIC ns, which is what time.perf_counter_ns reads on Linux), then the wrapped
 * iterator's __next__, then -t1 on a batch, or 0 on an exception (StopIteration included), and
 * any other exception handed to `on_error` once. The stamps go straight into the record's
 * StampRing (below) when `append` is a ring's; else through the `append` callable (a deque's).
 * The batch and the exception object are the wrapped iterator's own; an error inside the shim's
 * own calls (an append, the error note) is cleared, never raised in the training loop's place.
 *
 * Why C: through a real DataLoader a Python __next__ with two time.perf_counter_ns() calls and two
 * deque appends added several times what the same code costs in a tight loop: each call into a
 * builtin pays for caches the loader's own code evicted (CPython 3.11). This type adds a fraction
 * of that, and less with the ring (see StampRing; docs/performance.md gives the figures).
 *
 * With `sampling` set, a batch whose t0 is at or past `next_sample` is handed, after t0 is
 * stamped, to the instance's Python method `_sampled_next(t0)` (the num_workers=0 iterator's
 * detailed measurement, at most every few ms), which returns the batch and appends the exit.
 *
 * Built only on Linux (setup.py); elsewhere, or when it cannot be built, loader.py uses the
 * pure-Python `_PyStamper`, which behaves the same.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <time.h>

/* ---------------------------------------------------------------- StampRing
 *
 * The record's stamps (record.py `events`) where this module is built: raw int64 in a ring, not
 * Python ints in a deque: no int object is made and no method called per stamp, and the loop no
 * longer leaves two ints a batch for the publisher thread to free. The publisher thread
 * `take()`s the stamps (they become Python ints there, off the loop). The ring is cheaper than
 * the deque around a bare Python iterator; through a real DataLoader the two do not differ
 * beyond the noise (docs/performance.md, tests/benchmarks/overhead.py).
 *
 * Values: t0 > 0, -t1 < 0, 0 (left by an exception), and EPOCH_MARK (None in Python, LLONG_MIN
 * here: never a stamp, as -t1 > LLONG_MIN). The ring starts small and doubles as needed up to
 * `capacity`; past that the oldest stamps are overwritten and counted as lost, exactly. Every
 * method runs holding the GIL and never releases it, so the training thread's pushes and the
 * publisher thread's take() never interleave.
 */
#define RING_MARK LLONG_MIN
#define RING_START 1024

typedef struct {
    PyObject_HEAD
    long long *buf;
    Py_ssize_t size;      /* a power of two */
    Py_ssize_t capacity;  /* the most it grows to (a power of two) */
    unsigned long long head, tail;  /* stamps written, stamps taken (or overwritten) */
    unsigned long long lost;        /* overwritten since the last take() */
} StampRing;

static PyTypeObject StampRingType;

/* The n oldest stamps held, into dst; the ring is left as it is. */
static void
ring_copy(const StampRing *r, long long *dst, Py_ssize_t n)
{
    unsigned long long mask = (unsigned long long)(r->size - 1);
    for (Py_ssize_t i = 0; i < n; i++)
        dst[i] = r->buf[(r->tail + (unsigned long long)i) & mask];
}

/* Take the n oldest stamps held. Empty, the ring starts again at its start, whose cache lines
 * the loop's pushes and this read have just touched, not round the whole ring. */
static void
ring_drop(StampRing *r, Py_ssize_t n)
{
    r->tail += (unsigned long long)n;
    if (r->head == r->tail)
        r->head = r->tail = 0;
}

static int
ring_grow(StampRing *r)
{
    if (r->size >= r->capacity)
        return 0;
    Py_ssize_t size = r->size * 2;
    long long *buf = PyMem_Malloc(sizeof(long long) * (size_t)size);
    if (buf == NULL)
        return 0;  /* no memory: overwrite, as at full capacity */
    Py_ssize_t n = (Py_ssize_t)(r->head - r->tail);
    ring_copy(r, buf, n);
    PyMem_Free(r->buf);
    r->buf = buf;
    r->size = size;
    r->tail = 0;
    r->head = (unsigned long long)n;
    return 1;
}

static inline void
ring_push(StampRing *r, long long value)
{
    if ((Py_ssize_t)(r->head - r->tail) >= r->size && !ring_grow(r)) {
        r->lost++;
        if (r->size == 0)  /* never initialised (StampRing.__new__ alone): nowhere to write */
            return;
        r->tail++;
    }
    r->buf[r->head & (unsigned long long)(r->size - 1)] = value;
    r->head++;
}

/* A stamp from Python: an int within int64 (LLONG_MIN excluded), or None for an epoch mark. */
static int
ring_push_object(StampRing *r, PyObject *item)
{
    long long value = RING_MARK;
    if (item != Py_None) {
        value = PyLong_AsLongLong(item);
        if (value == -1 && PyErr_Occurred())
            return -1;
        if (value == RING_MARK) {
            PyErr_SetString(PyExc_OverflowError, "StampRing: stamp out of range");
            return -1;
        }
    }
    ring_push(r, value);
    return 0;
}

static PyObject *
ring_append(StampRing *self, PyObject *item)
{
    if (ring_push_object(self, item) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
ring_extend(StampRing *self, PyObject *items)
{
    PyObject *it = PyObject_GetIter(items);
    if (it == NULL)
        return NULL;
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        int failed = ring_push_object(self, item);
        Py_DECREF(item);
        if (failed) {
            Py_DECREF(it);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* take() -> (stamps, lost): every stamp held, oldest first, as ints (None for a mark), and how
 * many were overwritten since the last take(); the ring is then empty.
 *
 * The stamps are copied and taken before any Python object is made: making the list (a
 * GC-tracked object) can start a collection whose finalizers release the GIL and let the
 * training thread push more stamps, which then stay in the ring for the next take. Should
 * making the result fail, what was taken is counted as lost, so the next take() says so. */
static PyObject *
ring_take(StampRing *self, PyObject *unused)
{
    Py_ssize_t n = (Py_ssize_t)(self->head - self->tail);
    long long *s = PyMem_Malloc(sizeof(long long) * ((size_t)n + 1));
    if (s == NULL)
        return PyErr_NoMemory();
    ring_copy(self, s, n);
    ring_drop(self, n);
    unsigned long long lost = self->lost;
    self->lost = 0;
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list != NULL && i < n; i++) {
        PyObject *item = s[i] == RING_MARK ? Py_NewRef(Py_None) : PyLong_FromLongLong(s[i]);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, item);
    }
    PyMem_Free(s);
    PyObject *result = list != NULL ? Py_BuildValue("(NK)", list, lost) : NULL;
    if (result == NULL)
        self->lost += lost + (unsigned long long)n;
    return result;
}

static Py_ssize_t
ring_len(StampRing *self)
{
    return (Py_ssize_t)(self->head - self->tail);
}

static int
ring_init(StampRing *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"capacity", NULL};
    Py_ssize_t capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &capacity))
        return -1;
    if (capacity < 1 || capacity > ((Py_ssize_t)1 << 40) || (capacity & (capacity - 1))) {
        PyErr_SetString(PyExc_ValueError, "StampRing: capacity must be a power of two");
        return -1;
    }
    Py_ssize_t size = capacity < RING_START ? capacity : RING_START;
    long long *buf = PyMem_Malloc(sizeof(long long) * (size_t)size);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(self->buf);
    self->buf = buf;
    self->size = size;
    self->capacity = capacity;
    self->head = self->tail = self->lost = 0;
    return 0;
}

static void
ring_dealloc(StampRing *self)
{
    PyMem_Free(self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
ring_capacity(StampRing *self, void *closure)
{
    return PyLong_FromSsize_t(self->capacity);
}

static PyObject *ring_take_split(StampRing *self, PyObject *const *args, Py_ssize_t nargs);

static PyMethodDef ring_methods[] = {
    {"append", (PyCFunction)ring_append, METH_O, "append(stamp): an int, or None (an epoch mark)"},
    {"extend", (PyCFunction)ring_extend, METH_O, "extend(stamps)"},
    {"take", (PyCFunction)ring_take, METH_NOARGS,
     "take() -> (stamps, lost): every stamp, oldest first; how many were overwritten"},
    {"take_split", (PyCFunction)(void (*)(void))ring_take_split, METH_FASTCALL,
     "take_split(pending, prev_t1, want_stamps) -> split_stamps' tuple, or None, taking nothing"},
    {NULL}
};

static PyGetSetDef ring_getset[] = {
    {"capacity", (getter)ring_capacity, NULL, "the most stamps held (older ones are lost)", NULL},
    {NULL}
};

static PySequenceMethods ring_as_sequence = {
    .sq_length = (lenfunc)ring_len,
};

static PyTypeObject StampRingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "loadertop.probe._hotpath.StampRing",
    .tp_doc = "StampRing(capacity): a record's stamps, raw int64, for the Stamper "
              "(loadertop/probe/_hotpath.c)",
    .tp_basicsize = sizeof(StampRing),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ring_init,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
    .tp_as_sequence = &ring_as_sequence,
};

/* ---------------------------------------------------------------- Stamper */
typedef struct {
    PyObject_HEAD
    PyObject *next;     /* the wrapped iterator's bound __next__ */
    PyObject *append;   /* the record's events.append */
    PyObject *on_error; /* record.note_error: called with a non-StopIteration exception */
    StampRing *ring;    /* `append`'s ring when it is a StampRing's append (borrowed through it) */
    long long next_sample;
    int sampling;
} Stamper;

static PyObject *sampled_name; /* "_sampled_next", interned */

static inline long long
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
}

/* Append `stamp` (a new reference, may be NULL) and drop it; an error of the shim's is cleared. */
static void
append_stamp(Stamper *self, PyObject *stamp)
{
    if (stamp == NULL) {
        PyErr_Clear();
        return;
    }
    PyObject *r = PyObject_CallOneArg(self->append, stamp);
    Py_DECREF(stamp);
    if (r == NULL)
        PyErr_Clear();
    else
        Py_DECREF(r);
}

/* One stamp: straight into the ring, or through `append` (a deque's, in tests and elsewhere). */
static inline void
stamp(Stamper *self, long long value)
{
    if (self->ring != NULL)
        ring_push(self->ring, value);
    else
        append_stamp(self, PyLong_FromLongLong(value));
}

/* The wrapped __next__ raised (or returned NULL without an exception: the end). Stamp the exit,
 * note a real error, and leave the very same exception set. */
static void
left_by_exception(Stamper *self)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    stamp(self, 0);
    if (type != NULL && !PyErr_GivenExceptionMatches(type, PyExc_StopIteration)) {
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL)
            PyException_SetTraceback(value, tb);
        if (value != NULL) {
            PyObject *r = PyObject_CallOneArg(self->on_error, value);
            if (r == NULL)
                PyErr_Clear();
            else
                Py_DECREF(r);
        }
    }
    PyErr_Restore(type, value, tb);
}

static PyObject *
stamper_iternext(Stamper *self)
{
    long long t0 = now_ns();
    if (self->sampling && t0 >= self->next_sample) {
        PyObject *start = PyLong_FromLongLong(t0);
        if (start == NULL) {
            PyErr_Clear();
            return PyObject_CallNoArgs(self->next);  /* unmeasured: the batch still comes */
        }
        stamp(self, t0);
        PyObject *batch = PyObject_CallMethodOneArg((PyObject *)self, sampled_name, start);
        Py_DECREF(start);
        return batch;
    }
    stamp(self, t0);
    PyObject *batch = PyObject_CallNoArgs(self->next);
    if (batch == NULL) {
        left_by_exception(self);
        return NULL;
    }
    stamp(self, -now_ns());
    return batch;
}

static int
stamper_init(Stamper *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"next", "append", "on_error", "sampling", NULL};
    PyObject *next, *append, *on_error;
    int sampling = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|p", kwlist, &next, &append, &on_error,
                                     &sampling))
        return -1;
    Py_INCREF(next);
    Py_INCREF(append);
    Py_INCREF(on_error);
    Py_XSETREF(self->next, next);
    Py_XSETREF(self->append, append);
    Py_XSETREF(self->on_error, on_error);
    /* A StampRing's bound append: push into the ring directly (the bound method, held in
     * self->append, keeps the ring alive). */
    self->ring = NULL;
    if (PyCFunction_Check(append) && PyCFunction_GET_FUNCTION(append) == (PyCFunction)ring_append
            && PyCFunction_GET_SELF(append) != NULL
            && Py_IS_TYPE(PyCFunction_GET_SELF(append), &StampRingType))
        self->ring = (StampRing *)PyCFunction_GET_SELF(append);
    self->sampling = sampling;
    self->next_sample = 0;  /* the first batch is a sampled one */
    return 0;
}

static int
stamper_traverse(Stamper *self, visitproc visit, void *arg)
{
    Py_VISIT(self->next);
    Py_VISIT(self->append);
    Py_VISIT(self->on_error);
    return 0;
}

static int
stamper_clear(Stamper *self)
{
    Py_CLEAR(self->next);
    self->ring = NULL;
    Py_CLEAR(self->append);
    Py_CLEAR(self->on_error);
    return 0;
}

static void
stamper_dealloc(Stamper *self)
{
    /* A Python subclass's instance: subtype_dealloc drops the heap type's reference after this
     * (its base, this type, is static), so it is not dropped here. */
    PyObject_GC_UnTrack(self);
    stamper_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Not initialised (a subclass that never called __init__): iterating says so, as Python would. */
static PyObject *
stamper_iternext_checked(Stamper *self)
{
    if (self->next == NULL || self->append == NULL || self->on_error == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "loadertop Stamper used before __init__");
        return NULL;
    }
    return stamper_iternext(self);
}

static PyMemberDef stamper_members[] = {
    {"_next", T_OBJECT, offsetof(Stamper, next), READONLY, "the wrapped iterator's __next__"},
    {"_append", T_OBJECT, offsetof(Stamper, append), READONLY, "the record's deque.append"},
    {"next_sample", T_LONGLONG, offsetof(Stamper, next_sample), 0,
     "perf_counter_ns from which the next batch is a sampled one"},
    {NULL}
};

static PyTypeObject StamperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "loadertop.probe._hotpath.Stamper",
    .tp_doc = "Stamper(next, append, on_error, sampling=False): the hot path (see loader.py)",
    .tp_basicsize = sizeof(Stamper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)stamper_init,
    .tp_traverse = (traverseproc)stamper_traverse,
    .tp_clear = (inquiry)stamper_clear,
    .tp_dealloc = (destructor)stamper_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)stamper_iternext_checked,
    .tp_members = stamper_members,
};

/* ---------------------------------------------------------------- the publisher thread's drain
 *
 * record.py's drain turns the stamps into waits and steps while holding the GIL the training loop
 * needs. In Python that is slices, min/max, map and a sort per histogram (docs/performance.md:
 * its cost a batch); these do the same in one pass each (StampRing.take_split, above it, splits
 * the ring's stamps where they
 * lie), and decimate_micros the report's samples. record.py keeps the pure-Python path for where
 * this is not built, and tests/unit/test_drain.py holds both to the same figures.
 */

/* An exact int that fits int64, into *out; 0 (no exception set) for anything else. */
static int
as_i64(PyObject *obj, long long *out)
{
    int overflow = 0;
    if (!PyLong_CheckExact(obj))
        return 0;
    *out = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* Build a list of n int64 values; NULL with an exception on failure. */
static PyObject *
list_of(const long long *values, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]);
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

/* Whether the raw stamps s[0..total) alternate as t0, -t1, t0, -t1, ... with an odd last t0
 * allowed: every t0 > 0, every exit < 0 and not RING_MARK (an epoch mark fails both). */
static int
stamps_alternate(const long long *s, Py_ssize_t total)
{
    for (Py_ssize_t i = 0; i + 1 < total; i += 2)
        if (s[i] <= 0 || s[i + 1] >= 0 || s[i + 1] == RING_MARK)
            return 0;
    return !(total % 2) || s[total - 1] > 0;
}

/* split_stamps' tuple from raw stamps that alternate (stamps_alternate); NULL on an error. */
static PyObject *
split_alternating(const long long *s, Py_ssize_t total, int has_prev, long long prev_t1, int want)
{
    Py_ssize_t batches = total / 2;
    PyObject *waits = NULL, *steps = NULL, *t0s = Py_None, *t1s = Py_None, *result = NULL;
    PyObject *trailing = Py_None, *first_t0 = Py_None, *first_t1 = Py_None, *last_t1 = Py_None;
    Py_INCREF(Py_None); Py_INCREF(Py_None); Py_INCREF(Py_None);
    Py_INCREF(Py_None); Py_INCREF(Py_None); Py_INCREF(Py_None);
    /* t0, t1, then waits and steps computed in place over the scratch */
    long long *t0 = PyMem_Malloc(sizeof(long long) * (3 * (size_t)batches + 1));
    if (t0 == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    long long *t1 = t0 + batches, *scratch = t1 + batches;
    for (Py_ssize_t k = 0; k < batches; k++) {
        t0[k] = s[2 * k];
        t1[k] = -s[2 * k + 1];
    }
    for (Py_ssize_t k = 0; k < batches; k++)
        scratch[k] = t1[k] - t0[k];
    waits = list_of(scratch, batches);
    if (waits == NULL)
        goto done;
    Py_ssize_t n_steps = 0;
    if (batches && has_prev && t0[0] >= prev_t1)
        scratch[n_steps++] = t0[0] - prev_t1;
    for (Py_ssize_t k = 0; k + 1 < batches; k++)
        scratch[n_steps++] = t0[k + 1] - t1[k];
    steps = list_of(scratch, n_steps);
    if (steps == NULL)
        goto done;
    if (total % 2) {
        Py_SETREF(trailing, PyLong_FromLongLong(s[total - 1]));
        if (trailing == NULL)
            goto done;
    }
    if (batches) {
        Py_SETREF(first_t0, PyLong_FromLongLong(t0[0]));
        Py_SETREF(first_t1, PyLong_FromLongLong(t1[0]));
        Py_SETREF(last_t1, PyLong_FromLongLong(t1[batches - 1]));
        if (first_t0 == NULL || first_t1 == NULL || last_t1 == NULL)
            goto done;
    }
    if (want) {
        Py_SETREF(t0s, list_of(t0, batches));
        if (t0s == NULL)
            goto done;
        Py_SETREF(t1s, list_of(t1, batches));
        if (t1s == NULL)
            goto done;
    }
    result = PyTuple_Pack(8, waits, steps, trailing, first_t0, first_t1, last_t1, t0s, t1s);
done:
    PyMem_Free(t0);
    Py_XDECREF(waits);
    Py_XDECREF(steps);
    Py_XDECREF(trailing);
    Py_XDECREF(first_t0);
    Py_XDECREF(first_t1);
    Py_XDECREF(last_t1);
    Py_XDECREF(t0s);
    Py_XDECREF(t1s);
    return result;
}

/* prev_t1 (None or an int64) into *has_prev, *value; 0 for anything else. */
static int
prev_stamp(PyObject *prev, int *has_prev, long long *value)
{
    *has_prev = prev != Py_None;
    *value = 0;
    return !*has_prev || as_i64(prev, value);
}

/* split_stamps(pending, chunk, prev_t1, want_stamps) -> tuple | None
 *
 * The stamps are [pending] + chunk (pending None: chunk alone), expected as t0, -t1, t0, -t1, ...
 * with an odd last t0 (a loop inside next() right now) allowed. None, touching nothing, unless
 * every t0 is an int > 0 and every exit an int < 0, all within int64 (an epoch mark, an
 * exception's 0, a stamp out of place: record.py's per-stamp loop takes that chunk).
 * Else (waits, steps, trailing, first_t0, first_t1, last_t1, t0s, t1s): waits t1 - t0; steps the
 * gaps t0[k+1] - t1[k], led by t0[0] - prev_t1 when prev_t1 is an int <= t0[0]; trailing the odd
 * last t0 or None; the firsts and last None without a whole batch; t0s and t1s (lists) only with
 * want_stamps, else None. */
static PyObject *
split_stamps(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "split_stamps(pending, chunk, prev_t1, want_stamps)");
        return NULL;
    }
    PyObject *pending = args[0], *chunk = args[1];
    int want = PyObject_IsTrue(args[3]);
    if (want < 0)
        return NULL;
    if (!PyList_CheckExact(chunk)) {
        PyErr_SetString(PyExc_TypeError, "split_stamps: chunk must be a list");
        return NULL;
    }
    int has_prev;
    long long prev_t1;
    if (!prev_stamp(args[2], &has_prev, &prev_t1))
        Py_RETURN_NONE;
    int lead = pending != Py_None;
    Py_ssize_t total = PyList_GET_SIZE(chunk) + lead;
    long long *s = PyMem_Malloc(sizeof(long long) * ((size_t)total + 1));
    if (s == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < total; i++) {
        if (!as_i64(i < lead ? pending : PyList_GET_ITEM(chunk, i - lead), &s[i])) {
            PyMem_Free(s);
            Py_RETURN_NONE;
        }
    }
    PyObject *result;
    if (stamps_alternate(s, total))
        result = split_alternating(s, total, has_prev, prev_t1, want);
    else
        result = Py_NewRef(Py_None);
    PyMem_Free(s);
    return result;
}

/* StampRing.take_split(pending, prev_t1, want_stamps) -> tuple | None
 *
 * take() and split_stamps(pending, stamps, prev_t1, want_stamps) at once, for the drain's steady
 * case, reading the raw stamps where they lie: no int is made for a stamp and read back (the two
 * calls made 4 ints a batch and read 2 of them again). None, taking nothing, where
 * split_stamps would refuse the stamps, or when stamps were lost since the last take: the drain
 * then take()s them and goes its general way.
 *
 * As in ring_take, the stamps are copied and taken before any Python object is made, and
 * counted as lost should making the result fail. */
static PyObject *
ring_take_split(StampRing *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "take_split(pending, prev_t1, want_stamps)");
        return NULL;
    }
    int want = PyObject_IsTrue(args[2]);
    if (want < 0)
        return NULL;
    int has_prev, lead = args[0] != Py_None;
    long long prev_t1, pending = 0;
    if (self->lost || (lead && !as_i64(args[0], &pending)) ||
            !prev_stamp(args[1], &has_prev, &prev_t1))
        Py_RETURN_NONE;
    /* From here to the copy's end nothing can run Python code: the count cannot change. */
    Py_ssize_t n = (Py_ssize_t)(self->head - self->tail), total = n + lead;
    long long *s = PyMem_Malloc(sizeof(long long) * ((size_t)total + 1));
    if (s == NULL)
        return PyErr_NoMemory();
    s[0] = pending;
    ring_copy(self, s + lead, n);
    if (!stamps_alternate(s, total)) {
        PyMem_Free(s);
        Py_RETURN_NONE;
    }
    ring_drop(self, n);
    PyObject *result = split_alternating(s, total, has_prev, prev_t1, want);
    PyMem_Free(s);
    if (result == NULL)
        self->lost += (unsigned long long)n;
    return result;
}

#define MAX_BOUNDS 64

/* bucket_count(bounds, counts, values) -> int | None
 *
 * record.BucketCounts.add: each value into the first bucket whose bound it does not exceed (a
 * value equal to a bound is in that bound's bucket, Prometheus's `le`), the last beyond every
 * bound; `counts` (a list of len(bounds) + 1 ints) is added to in place; returns the values' sum.
 * None, touching nothing, when a value is not an int within int64 or the sum would leave it. */
static PyObject *
bucket_count(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyTuple_CheckExact(args[0]) || !PyList_CheckExact(args[1]) ||
            !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "bucket_count(bounds: tuple, counts: list, values: list)");
        return NULL;
    }
    PyObject *bounds_obj = args[0], *counts = args[1], *values = args[2];
    Py_ssize_t n_bounds = PyTuple_GET_SIZE(bounds_obj);
    if (n_bounds > MAX_BOUNDS || PyList_GET_SIZE(counts) != n_bounds + 1) {
        PyErr_SetString(PyExc_ValueError, "bucket_count: counts must have len(bounds) + 1 items");
        return NULL;
    }
    long long bounds[MAX_BOUNDS];
    for (Py_ssize_t i = 0; i < n_bounds; i++)
        if (!as_i64(PyTuple_GET_ITEM(bounds_obj, i), &bounds[i]))
            Py_RETURN_NONE;
    long long added[MAX_BOUNDS + 1] = {0};
    long long sum = 0;
    Py_ssize_t n = PyList_GET_SIZE(values);
    for (Py_ssize_t j = 0; j < n; j++) {
        long long v;
        if (!as_i64(PyList_GET_ITEM(values, j), &v) || __builtin_add_overflow(sum, v, &sum))
            Py_RETURN_NONE;
        Py_ssize_t lo = 0, hi = n_bounds;  /* the first bound >= v (bisect_left) */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (bounds[mid] < v)
                lo = mid + 1;
            else
                hi = mid;
        }
        added[lo]++;
    }
    for (Py_ssize_t i = 0; i <= n_bounds; i++) {
        if (!added[i])
            continue;
        PyObject *more = PyLong_FromLongLong(added[i]);
        if (more == NULL)
            return NULL;
        PyObject *now = PyNumber_Add(PyList_GET_ITEM(counts, i), more);
        Py_DECREF(more);
        if (now == NULL)
            return NULL;
        PyList_SetItem(counts, i, now);  /* steals `now`, drops the old count */
    }
    return PyLong_FromLongLong(sum);
}

/* decimate_micros(samples, limit) -> list | None
 *
 * record.py's `_micros(wire.decimate(samples, limit))` in one pass: at most `limit` of the
 * samples (ns), the (i * n // limit)-th of n, each floor-divided by 1000 (µs). Made at every
 * report for the loop's waits and steps, thousands a report at the fastest loaders, where the two
 * Python steps were a large part of the publisher thread's time (docs/performance.md). None,
 * making nothing, when a
 * picked sample is not an int within int64 (Python then does it). */
static PyObject *
decimate_micros(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "decimate_micros(samples: list, limit: int)");
        return NULL;
    }
    PyObject *samples = args[0];
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    if (limit < 1) {
        PyErr_SetString(PyExc_ValueError, "decimate_micros: limit must be >= 1");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(samples), m = n <= limit ? n : limit;
    if (n > limit && (unsigned long long)n > ULLONG_MAX / (unsigned long long)limit)
        Py_RETURN_NONE;  /* i * n would overflow: Python's ints do it */
    /* Read every value before making the list: its allocation can run Python code. */
    long long *values = PyMem_Malloc(sizeof(long long) * ((size_t)m + 1));
    if (values == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < m; i++) {
        Py_ssize_t at = n <= limit ? i : (Py_ssize_t)(
            (unsigned long long)i * (unsigned long long)n / (unsigned long long)limit);
        long long v;
        if (!as_i64(PyList_GET_ITEM(samples, at), &v)) {
            PyMem_Free(values);
            Py_RETURN_NONE;
        }
        long long q = v / 1000;  /* C truncates toward zero; Python's // floors */
        values[i] = (v % 1000 != 0 && v < 0) ? q - 1 : q;
    }
    PyObject *out = list_of(values, m);
    PyMem_Free(values);
    return out;
}

static PyObject *
clock_ns(PyObject *module, PyObject *unused)
{
    return PyLong_FromLongLong(now_ns());
}

static PyMethodDef module_methods[] = {
    {"clock_ns", clock_ns, METH_NOARGS, "the clock the stamps are read from (ns)"},
    {"split_stamps", (PyCFunction)(void (*)(void))split_stamps, METH_FASTCALL,
     "split_stamps(pending, chunk, prev_t1, want_stamps): the drain's bulk path (record.py)"},
    {"bucket_count", (PyCFunction)(void (*)(void))bucket_count, METH_FASTCALL,
     "bucket_count(bounds, counts, values): BucketCounts.add's counting (record.py)"},
    {"decimate_micros", (PyCFunction)(void (*)(void))decimate_micros, METH_FASTCALL,
     "decimate_micros(samples, limit): a report's samples, decimated, in us (record.py)"},
    {NULL}
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT, "loadertop.probe._hotpath", "The shim's hot path (see Stamper).", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    sampled_name = PyUnicode_InternFromString("_sampled_next");
    if (sampled_name == NULL || PyType_Ready(&StamperType) < 0 ||
            PyType_Ready(&StampRingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&hotpath_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&StamperType);
    if (PyModule_AddObject(m, "Stamper", (PyObject *)&StamperType) < 0) {
        Py_DECREF(&StamperType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&StampRingType);
    if (PyModule_AddObject(m, "StampRing", (PyObject *)&StampRingType) < 0) {
        Py_DECREF(&StampRingType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "RING_START", RING_START) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
