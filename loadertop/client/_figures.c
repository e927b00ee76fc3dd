/* The viewer's distributions in C: `stats_of_parts`, as client/distributions.py's pure-Python
 * one computes it, to the same float bits.
 *
 * Why: a viewer watching a fleet computes ~13 distributions per source and refresh (the loop's
 * waits and steps, each worker's fetch and collate, the stages'): 1,700 a second at 128 sources,
 * where the Python one spends most of its ~3 us per call in the interpreter and in
 * `round(x, 3)`'s decimal conversion, not in the sort (docs/performance.md, "The TUI watching
 * many sources").
 *
 * Exactness, step by step against the Python (CPython 3.10+ float semantics, IEEE-754 doubles):
 * - an int below 2**53 converts to a double exactly, in Python and here; the quotients
 *   `v / 1000.0` and `sum / n` are then single correctly rounded IEEE divisions on both sides;
 * - the percentile's interpolation `low + (high - low) * f` is the same three operations, each
 *   rounded (built with -ffp-contract=off: no fused multiply-add);
 * - `round(x, 3)` is the double nearest to x's exact value rounded to 3 decimals (ties to
 *   even). Here: y = x * 1000 (rounded), r = nearbyint(y). Where y lies further than one ulp
 *   from a half, x * 1000's exact value rounds to r too, and the double nearest to r / 1000 is
 *   r / 1000.0 (r below 2**53). Nearer a half, Python's own `round` decides.
 * Anything else (a value or a sum past 2**53, a value that is not an int) is left to the Python
 * function given to `bind`, which computes the figures as it always did.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <string.h>

#define EXACT_MS_BELOW_US 4000000000000000LL /* as distributions._EXACT_MS_BELOW_US */
#define TWO_53 9007199254740992LL

static PyObject *stats_type = NULL;   /* document.Stats */
static PyObject *fallback = NULL;     /* distributions' pure-Python stats_of_parts */
static PyObject *round_fn = NULL;     /* builtins.round */
static PyObject *stats_kwnames = NULL; /* ("mean", "p50", "p95", "p99", "max") */

/* *out = round(x, 3) as Python computes it; -1 with an exception set on failure, else 0. */
static int round3(double x, double *out) {
    double y = x * 1000.0;
    if (isfinite(y) && y >= 0.0 && y < 4503599627370496.0 /* 2**52 */) {
        double r = nearbyint(y);
        double margin = 0.5 - fabs(y - r);
        double ulp = nextafter(y, INFINITY) - y;
        if (margin > ulp) {
            *out = r / 1000.0;
            return 0;
        }
    }
    PyObject *res = PyObject_CallFunction(round_fn, "di", x, 3);
    if (res == NULL)
        return -1;
    *out = PyFloat_AsDouble(res);
    Py_DECREF(res);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* The percentile q of the sorted samples `v` (n of them), in ms, as stats_of_us computes it. */
static int percentile_ms(const long long *v, Py_ssize_t n, int q, int exact, double *out) {
    double pos = (double)((long long)(n - 1) * q) / 100.0;
    Py_ssize_t lo = (Py_ssize_t)pos;
    Py_ssize_t hi = lo + 1 < n - 1 ? lo + 1 : n - 1;
    double f = pos - (double)lo;
    if (f != 0.0 || !exact) {
        double low = (double)v[lo] / 1000.0;
        return round3(low + ((double)v[hi] / 1000.0 - low) * f, out);
    }
    *out = (double)v[lo] / 1000.0;
    return 0;
}

/* Sorts v[0..n) ascending: insertion sort for a few, else least-significant-digit radix on the
   bytes the largest value needs (a window's samples in us: 3 bytes up to 16 s), through `tmp`. */
static void sort_samples(long long *v, long long *tmp, Py_ssize_t n, long long top) {
    if (n <= 24) {
        for (Py_ssize_t i = 1; i < n; i++) {
            long long x = v[i];
            Py_ssize_t j = i;
            for (; j > 0 && v[j - 1] > x; j--)
                v[j] = v[j - 1];
            v[j] = x;
        }
        return;
    }
    long long *src = v, *dst = tmp;
    for (int shift = 0; shift < 64 && (top >> shift) != 0; shift += 8) {
        Py_ssize_t count[257] = {0};
        for (Py_ssize_t i = 0; i < n; i++)
            count[((src[i] >> shift) & 0xff) + 1]++;
        for (int b = 0; b < 256; b++)
            count[b + 1] += count[b];
        for (Py_ssize_t i = 0; i < n; i++)
            dst[count[(src[i] >> shift) & 0xff]++] = src[i];
        long long *t = src;
        src = dst;
        dst = t;
    }
    if (src != v)
        memcpy(v, src, (size_t)n * sizeof(long long));
}

#define STACK_SAMPLES 256

static PyObject *stats_of_parts(PyObject *self, PyObject *parts) {
    if (stats_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_figures.bind() was not called");
        return NULL;
    }
    if (!PyList_CheckExact(parts))
        return PyObject_CallOneArg(fallback, parts);
    Py_ssize_t count = PyList_GET_SIZE(parts), n = 0;
    for (Py_ssize_t p = 0; p < count; p++) {
        PyObject *part = PyList_GET_ITEM(parts, p);
        if (PyTuple_CheckExact(part))
            n += PyTuple_GET_SIZE(part);
        else if (PyList_CheckExact(part))
            n += PyList_GET_SIZE(part);
        else
            return PyObject_CallOneArg(fallback, parts);
    }
    if (n == 0)
        Py_RETURN_NONE;
    long long small[2 * STACK_SAMPLES];
    long long *v = n <= STACK_SAMPLES ? small : PyMem_Malloc(2 * (size_t)n * sizeof(long long));
    if (v == NULL)
        return PyErr_NoMemory();
    long long sum = 0, top = 0;
    Py_ssize_t i = 0;
    int to_python = 0;
    for (Py_ssize_t p = 0; p < count && !to_python; p++) {
        /* The parts are tuples (decoded from the wire) or lists; nothing here runs Python code,
           so none of them can change while it is read. */
        PyObject *part = PyList_GET_ITEM(parts, p);
        PyObject **items = PyTuple_CheckExact(part) ? &PyTuple_GET_ITEM(part, 0)
                                                     : PySequence_Fast_ITEMS(part);
        Py_ssize_t size = Py_SIZE(part);
        for (Py_ssize_t k = 0; k < size; k++) {
            PyObject *item = items[k];
            int overflow = 0;
            long long x = PyLong_CheckExact(item) ? PyLong_AsLongLongAndOverflow(item, &overflow)
                                                   : -1;
            if (overflow || x < 0 || x >= TWO_53) {
                if (x == -1 && PyErr_Occurred())
                    PyErr_Clear();
                to_python = 1;
                break;
            }
            v[i++] = x;
            sum += x; /* both below 2**53: no overflow before the check */
            if (sum >= TWO_53) {
                to_python = 1;
                break;
            }
            if (x > top)
                top = x;
        }
    }
    PyObject *result = NULL;
    if (to_python) {
        result = PyObject_CallOneArg(fallback, parts);
        goto done;
    }
    sort_samples(v, v + n, n, top);
    int exact = top < EXACT_MS_BELOW_US;
    double mean, p50, p95, p99, max;
    if (percentile_ms(v, n, 50, exact, &p50) < 0 || percentile_ms(v, n, 95, exact, &p95) < 0 ||
        percentile_ms(v, n, 99, exact, &p99) < 0 ||
        round3((double)sum / (double)n / 1000.0, &mean) < 0)
        goto done;
    if (exact)
        max = (double)top / 1000.0;
    else if (round3((double)top / 1000.0, &max) < 0)
        goto done;
    PyObject *args[5] = {NULL, NULL, NULL, NULL, NULL};
    double figures[5] = {mean, p50, p95, p99, max};
    for (int f = 0; f < 5; f++) {
        args[f] = PyFloat_FromDouble(figures[f]);
        if (args[f] == NULL)
            goto free_args;
    }
    result = PyObject_Vectorcall(stats_type, args, 0, stats_kwnames);
free_args:
    for (int f = 0; f < 5; f++)
        Py_XDECREF(args[f]);
done:
    if (v != small)
        PyMem_Free(v);
    return result;
}

static PyObject *bind(PyObject *self, PyObject *args) {
    PyObject *type, *python;
    if (!PyArg_ParseTuple(args, "OO:bind", &type, &python))
        return NULL;
    Py_INCREF(type);
    Py_XSETREF(stats_type, type);
    Py_INCREF(python);
    Py_XSETREF(fallback, python);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- the window's walk
 * client/window.py's `python_walk`, reading each report's fields where msgspec keeps them: a
 * field of a Struct is a slot with a member descriptor (msgspec 0.18+), whose offset `bind_walk`
 * looks up once per type. A report of another type, an unset slot, a number that is not an int
 * (or a float where one is summed) or a sum past 64 bits: the walk returns None and Python walks.
 */
enum { R_BATCHES, R_INTERVAL, R_WAIT_NS, R_WAIT_US, R_STEP_US, R_QUEUE, R_PROCESS_CPU,
       R_LOOP_CPU, R_FETCH_WALL, R_FETCH_CPU, R_STAGES, R_WORKERS, R_COUNT };
static const char *report_fields[R_COUNT] = {
    "batches", "interval_s", "wait_ns", "wait_us", "step_us", "queue", "process_cpu_ns",
    "loop_cpu_ns", "loop_fetch_wall_ns", "loop_fetch_cpu_ns", "stages", "workers"};
enum { Q_SAMPLES, Q_READY, Q_IN_FLIGHT, Q_WAITING, Q_WAITING_READY, Q_CPU, Q_WALL, Q_COUNT };
static const char *queue_fields[Q_COUNT] = {
    "samples", "ready_sum", "in_flight_sum", "waiting_samples", "waiting_ready_samples",
    "waiting_cpu_ns", "waiting_wall_ns"};
enum { W_ID, W_PID, W_FETCH_US, W_COLLATE_US, W_BATCHES, W_WALL, W_CPU, W_COUNT };
static const char *worker_fields[W_COUNT] = {
    "id", "pid", "fetch_us", "collate_us", "batches", "fetch_wall_ns", "fetch_cpu_ns"};

static PyTypeObject *report_type = NULL, *queue_type = NULL, *worker_type = NULL;
static Py_ssize_t report_off[R_COUNT], queue_off[Q_COUNT], worker_off[W_COUNT];

/* The offsets of `names` in `type`; 0 where one is not a plain object slot (then no C walk). */
static int slot_offsets(PyTypeObject *type, const char **names, int count, Py_ssize_t *out) {
    for (int i = 0; i < count; i++) {
        PyObject *descr = PyObject_GetAttrString((PyObject *)type, names[i]);
        if (descr == NULL) {
            PyErr_Clear();
            return 0;
        }
        int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (ok)
            out[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
        if (!ok)
            return 0;
    }
    return 1;
}

static PyObject *bind_walk(PyObject *self, PyObject *args) {
    PyObject *report, *queue, *worker;
    if (!PyArg_ParseTuple(args, "O!O!O!:bind_walk", &PyType_Type, &report, &PyType_Type, &queue,
                          &PyType_Type, &worker))
        return NULL;
    if (!slot_offsets((PyTypeObject *)report, report_fields, R_COUNT, report_off) ||
        !slot_offsets((PyTypeObject *)queue, queue_fields, Q_COUNT, queue_off) ||
        !slot_offsets((PyTypeObject *)worker, worker_fields, W_COUNT, worker_off))
        Py_RETURN_FALSE;
    Py_INCREF(report);
    Py_XSETREF(report_type, (PyTypeObject *)report);
    Py_INCREF(queue);
    Py_XSETREF(queue_type, (PyTypeObject *)queue);
    Py_INCREF(worker);
    Py_XSETREF(worker_type, (PyTypeObject *)worker);
    Py_RETURN_TRUE;
}

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off))) /* borrowed; NULL if unset */

/* *sum += the int `o`; 0 if `o` is not an int or the sum leaves 64 bits. */
static int add_int(long long *sum, PyObject *o) {
    if (o == NULL || !PyLong_CheckExact(o))
        return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return !__builtin_add_overflow(*sum, x, sum);
}

typedef struct {
    PyObject *id, *pid;          /* borrowed from a report of the window (the deque holds it) */
    long long n_id, n_pid;       /* pid -1: None */
    PyObject *fetch, *collate;   /* lists of the reports' tuples */
    long long batches, wall, cpu;
} WorkerAcc;

static PyObject *walk(PyObject *self, PyObject *args) {
    PyObject *reports;
    double since;
    if (!PyArg_ParseTuple(args, "Od:walk", &reports, &since))
        return NULL;
    if (report_type == NULL)
        Py_RETURN_NONE;
    /* The window is the deque's tail: found from the right, walked oldest first. */
    PyObject *reversed = PyObject_CallMethod(reports, "__reversed__", NULL);
    if (reversed == NULL)
        return NULL;
    PyObject *recent = PyList_New(0);
    if (recent == NULL) {
        Py_DECREF(reversed);
        return NULL;
    }
    PyObject *item;
    while ((item = PyIter_Next(reversed)) != NULL) {
        double received;
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2 ||
            ((received = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 0))) == -1.0 && PyErr_Occurred())) {
            Py_DECREF(item);
            Py_DECREF(reversed);
            Py_DECREF(recent);
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        if (received < since) {
            Py_DECREF(item);
            break;
        }
        int failed = PyList_Append(recent, PyTuple_GET_ITEM(item, 1));
        Py_DECREF(item);
        if (failed < 0) {
            Py_DECREF(reversed);
            Py_DECREF(recent);
            return NULL;
        }
    }
    Py_DECREF(reversed);
    if (PyErr_Occurred()) {
        Py_DECREF(recent);
        return NULL;
    }
    PyObject *result = NULL, *wait_us = NULL, *step_us = NULL, *stages = NULL, *workers = NULL;
    WorkerAcc acc_small[16];
    WorkerAcc *acc = acc_small;
    Py_ssize_t n_acc = 0, cap_acc = 16;
    long long batches = 0, wait_ns = 0, q[Q_COUNT] = {0}, process_ns = 0, loop_ns = 0,
              fetch_wall = 0, fetch_cpu = 0;
    double covered = 0.0, process_s = 0.0, loop_s = 0.0;
    Py_ssize_t n = PyList_GET_SIZE(recent);
    int ok = 1;
    wait_us = PyList_New(n);
    step_us = PyList_New(n);
    stages = PyList_New(0);
    if (wait_us == NULL || step_us == NULL || stages == NULL)
        goto error;
    for (Py_ssize_t r = n - 1; r >= 0 && ok; r--) {
        PyObject *m = PyList_GET_ITEM(recent, r);
        Py_ssize_t slot = n - 1 - r;
        if (!Py_IS_TYPE(m, report_type)) {
            ok = 0;
            break;
        }
        PyObject *interval = SLOT(m, report_off[R_INTERVAL]);
        PyObject *wus = SLOT(m, report_off[R_WAIT_US]), *sus = SLOT(m, report_off[R_STEP_US]);
        PyObject *queue = SLOT(m, report_off[R_QUEUE]), *ws = SLOT(m, report_off[R_WORKERS]);
        PyObject *pcpu = SLOT(m, report_off[R_PROCESS_CPU]), *lcpu = SLOT(m, report_off[R_LOOP_CPU]);
        PyObject *st = SLOT(m, report_off[R_STAGES]);
        if (interval == NULL || !PyFloat_CheckExact(interval) || wus == NULL || sus == NULL ||
            queue == NULL || !Py_IS_TYPE(queue, queue_type) || ws == NULL ||
            !PyTuple_CheckExact(ws) || pcpu == NULL || lcpu == NULL || st == NULL) {
            ok = 0;
            break;
        }
        double interval_s = PyFloat_AS_DOUBLE(interval);
        ok = add_int(&batches, SLOT(m, report_off[R_BATCHES])) &&
             add_int(&wait_ns, SLOT(m, report_off[R_WAIT_NS])) &&
             add_int(&fetch_wall, SLOT(m, report_off[R_FETCH_WALL])) &&
             add_int(&fetch_cpu, SLOT(m, report_off[R_FETCH_CPU]));
        for (int k = 0; k < Q_COUNT && ok; k++)
            ok = add_int(&q[k], SLOT(queue, queue_off[k]));
        if (!ok)
            break;
        covered += interval_s;
        Py_INCREF(wus);
        PyList_SET_ITEM(wait_us, slot, wus);
        Py_INCREF(sus);
        PyList_SET_ITEM(step_us, slot, sus);
        /* The training process's CPU: only the reports that carry it (an older probe's don't). */
        if (pcpu != Py_None) {
            if (!(ok = add_int(&process_ns, pcpu)))
                break;
            process_s += interval_s;
        }
        if (lcpu != Py_None) {
            if (!(ok = add_int(&loop_ns, lcpu)))
                break;
            loop_s += interval_s;
        }
        if (st != Py_None && PyList_Append(stages, st) < 0)
            goto error;
        Py_ssize_t nw = PyTuple_GET_SIZE(ws);
        for (Py_ssize_t j = 0; j < nw && ok; j++) {
            PyObject *mw = PyTuple_GET_ITEM(ws, j);
            if (!Py_IS_TYPE(mw, worker_type)) {
                ok = 0;
                break;
            }
            PyObject *id = SLOT(mw, worker_off[W_ID]), *pid = SLOT(mw, worker_off[W_PID]);
            PyObject *fus = SLOT(mw, worker_off[W_FETCH_US]);
            PyObject *cus = SLOT(mw, worker_off[W_COLLATE_US]);
            long long n_id = 0, n_pid = 0;
            if (id == NULL || pid == NULL || fus == NULL || cus == NULL || !add_int(&n_id, id) ||
                (pid != Py_None && !add_int(&n_pid, pid))) {
                ok = 0;
                break;
            }
            if (pid == Py_None)
                n_pid = -1;
            /* Workers come in the same order report after report: look where this one was. */
            WorkerAcc *a = NULL;
            if (j < n_acc && acc[j].n_id == n_id && acc[j].n_pid == n_pid)
                a = &acc[j];
            for (Py_ssize_t k = 0; a == NULL && k < n_acc; k++)
                if (acc[k].n_id == n_id && acc[k].n_pid == n_pid)
                    a = &acc[k];
            if (a == NULL) {
                if (n_acc == cap_acc) {
                    WorkerAcc *grown = PyMem_Malloc(2 * (size_t)cap_acc * sizeof(WorkerAcc));
                    if (grown == NULL) {
                        PyErr_NoMemory();
                        goto error;
                    }
                    memcpy(grown, acc, (size_t)n_acc * sizeof(WorkerAcc));
                    if (acc != acc_small)
                        PyMem_Free(acc);
                    acc = grown;
                    cap_acc *= 2;
                }
                a = &acc[n_acc];
                a->id = id;
                a->pid = pid;
                a->n_id = n_id;
                a->n_pid = n_pid;
                a->batches = a->wall = a->cpu = 0;
                a->fetch = PyList_New(0);
                a->collate = PyList_New(0);
                n_acc++;
                if (a->fetch == NULL || a->collate == NULL)
                    goto error;
            }
            if (PyList_Append(a->fetch, fus) < 0 || PyList_Append(a->collate, cus) < 0)
                goto error;
            ok = add_int(&a->batches, SLOT(mw, worker_off[W_BATCHES])) &&
                 add_int(&a->wall, SLOT(mw, worker_off[W_WALL])) &&
                 add_int(&a->cpu, SLOT(mw, worker_off[W_CPU]));
        }
    }
    if (!ok) { /* Python walks this one */
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    workers = PyDict_New();
    if (workers == NULL)
        goto error;
    for (Py_ssize_t k = 0; k < n_acc; k++) {
        WorkerAcc *a = &acc[k];
        PyObject *key = PyTuple_Pack(2, a->id, a->pid);
        PyObject *sums = key == NULL ? NULL
            : Py_BuildValue("(OOLLL)", a->fetch, a->collate, a->batches, a->wall, a->cpu);
        int failed = sums == NULL || PyDict_SetItem(workers, key, sums) < 0;
        Py_XDECREF(key);
        Py_XDECREF(sums);
        if (failed)
            goto error;
    }
    /* An empty window's `covered` is the int 0, as Python's sum starts (JSON `0`, not `0.0`). */
    PyObject *covered_obj = n ? PyFloat_FromDouble(covered) : PyLong_FromLong(0);
    if (covered_obj == NULL)
        goto error;
    result = Py_BuildValue("(LNLOOLLLLLLLLdLdLLOO)", batches, covered_obj, wait_ns, wait_us,
                           step_us, q[Q_SAMPLES], q[Q_READY], q[Q_IN_FLIGHT], q[Q_WAITING],
                           q[Q_WAITING_READY], q[Q_CPU], q[Q_WALL], process_ns, process_s,
                           loop_ns, loop_s, fetch_wall, fetch_cpu, stages, workers);
    goto done;
error:
    result = NULL;
done:
    for (Py_ssize_t k = 0; k < n_acc; k++) {
        Py_XDECREF(acc[k].fetch);
        Py_XDECREF(acc[k].collate);
    }
    if (acc != acc_small)
        PyMem_Free(acc);
    Py_XDECREF(wait_us);
    Py_XDECREF(step_us);
    Py_XDECREF(stages);
    Py_XDECREF(workers);
    Py_DECREF(recent);
    return result;
}

static PyMethodDef methods[] = {
    {"stats_of_parts", stats_of_parts, METH_O,
     "{mean, p50, p95, p99, max} in ms of the samples (whole us) of a list of tuples, or None."},
    {"bind", bind, METH_VARARGS, "bind(Stats, python_stats_of_parts): the type made, the fallback."},
    {"walk", walk, METH_VARARGS,
     "walk(reports, since): the window's sums as window.python_walk gives them, or None."},
    {"bind_walk", bind_walk, METH_VARARGS,
     "bind_walk(LoaderReport, QueueReport, WorkerReport): whether the C walk can read them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_figures", "The viewer's distributions in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__figures(void) {
    PyObject *builtins = PyEval_GetBuiltins(); /* borrowed */
    round_fn = builtins ? PyDict_GetItemString(builtins, "round") : NULL;
    if (round_fn == NULL) {
        PyErr_SetString(PyExc_ImportError, "no builtins.round");
        return NULL;
    }
    Py_INCREF(round_fn);
    stats_kwnames = Py_BuildValue("(sssss)", "mean", "p50", "p95", "p99", "max");
    if (stats_kwnames == NULL)
        return NULL;
    return PyModule_Create(&module);
}
