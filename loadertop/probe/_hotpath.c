/* The shim's hot path in C: `Stamper`, the base of loader.py's instrumented iterators.
 *
 * Per batch it does what loader.py's pure-Python `_PyStamper` does, with the same stamps in the
 * same deque: append t0 (CLOCK_MONOTONIC ns, which is what time.perf_counter_ns reads on Linux),
 * call the wrapped iterator's __next__, append -t1 on a batch, or 0 on an exception (StopIteration
 * included) and hand any other exception to `on_error` once. The batch and the exception object
 * are the wrapped iterator's own; an error inside the shim's own calls (the deque's append, the
 * error note) is cleared, never raised in the training loop's place.
 *
 * Why C: through a real DataLoader (TensorDataset, batch_size=1, num_workers=0, ~33 us a batch)
 * a Python __next__ with two time.perf_counter_ns() calls and two deque appends added ~1.5 us a
 * batch here, though the same code costs ~0.3 us in a tight loop: each call into a builtin pays
 * for caches the loader's own code evicted. This type added ~0.5 us in the same run (CPython 3.11).
 *
 * With `sampling` set, a batch whose t0 is at or past `next_sample` is handed, after t0 is
 * appended, to the instance's Python method `_sampled_next(t0)` (the num_workers=0 iterator's
 * detailed measurement, at most every few ms), which returns the batch and appends the exit.
 *
 * Built only on Linux (setup.py); elsewhere, or when it cannot be built, loader.py uses the
 * pure-Python `_PyStamper`, which behaves the same.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    PyObject *next;     /* the wrapped iterator's bound __next__ */
    PyObject *append;   /* the record's deque.append */
    PyObject *on_error; /* record.note_error: called with a non-StopIteration exception */
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

/* The wrapped __next__ raised (or returned NULL without an exception: the end). Stamp the exit,
 * note a real error, and leave the very same exception set. */
static void
left_by_exception(Stamper *self)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    append_stamp(self, PyLong_FromLong(0));
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
    PyObject *start = PyLong_FromLongLong(t0);
    if (start == NULL) {
        PyErr_Clear();
        return PyObject_CallNoArgs(self->next);  /* unmeasured: the batch still comes */
    }
    if (self->sampling && t0 >= self->next_sample) {
        Py_INCREF(start);
        append_stamp(self, start);
        PyObject *batch = PyObject_CallMethodOneArg((PyObject *)self, sampled_name, start);
        Py_DECREF(start);
        return batch;
    }
    append_stamp(self, start);
    PyObject *batch = PyObject_CallNoArgs(self->next);
    if (batch == NULL) {
        left_by_exception(self);
        return NULL;
    }
    append_stamp(self, PyLong_FromLongLong(-now_ns()));
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

static PyObject *
clock_ns(PyObject *module, PyObject *unused)
{
    return PyLong_FromLongLong(now_ns());
}

static PyMethodDef module_methods[] = {
    {"clock_ns", clock_ns, METH_NOARGS, "the clock the stamps are read from (ns)"},
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
    if (sampled_name == NULL || PyType_Ready(&StamperType) < 0)
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
    return m;
}
