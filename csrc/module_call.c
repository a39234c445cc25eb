/*
 * module_call.c -- AWQLinear's eager call in C.
 *
 *     _module_call(layer, args, kwargs) -> y, or NotImplemented
 *
 * runs linear(x, qweight, qzeros, scales, bias, group_size=G) on the
 * layer's buffers where nothing that nn.Module's call or AWQLinear.forward
 * looks at is in play, and returns NotImplemented everywhere else, for the
 * layer's Python call to take over (awq_fast_dequant/torch/_module.py).  In
 * Python the same checks are a few dozen attribute reads and calls, each
 * through the interpreter, and they are most of what a layer's call adds
 * to linear()'s host time; here they are dictionary lookups and four C
 * calls.
 *
 * What the checks read is torch's, and the torch integration registers it
 * with _set_module_glue (this file imports nothing); until then every call
 * returns NotImplemented.  A call comes here only when x is one plain
 * torch.Tensor, positional, and
 *   - nn.Module's call is as torch defines it (torch.fx's tracer patches
 *     it) and the layer has no compiled call (Module.compile);
 *   - no hook of the layer's and no global one is registered;
 *   - no TorchScript trace, dispatch mode or forward-mode AD level is
 *     active, and autograd has nothing to record (grad mode off, or
 *     neither x nor the scales nor the bias requires grad);
 *   - the layer's forward is AWQLinear.forward (none set on the instance
 *     or overridden by a subclass), the layer computes alone (no
 *     fuse_projections group), and it has no prepared layout
 *     (prepare_prefill) or x has fewer rows than the layout's min_rows.
 * torch.compile never gets here: the Python call checks
 * torch.compiler.is_compiling() first, which it folds to True.
 *
 * linear()'s TypeError, ValueError and RuntimeError (x not contiguous, a
 * buffer that torch.func wraps, dtypes that autocast would reconcile, ...)
 * return NotImplemented too, and the Python forward, which knows what to
 * do with each, runs the call again; any other exception propagates.
 */
#include "pyawq.h"

#include "linear.h"
#include "module_call.h"

/* The attributes the checks read (of the layer, its type, nn.Module, a
 * tensor, forward_ad), interned once. */
static const char *const kNames[AWQ_MC_NAMES] = {
    [AWQ_MC_COMPILED] = "_compiled_call_impl",
    [AWQ_MC_FORWARD_PRE] = "_forward_pre_hooks",
    [AWQ_MC_FORWARD_HOOKS] = "_forward_hooks",
    [AWQ_MC_BACKWARD_PRE] = "_backward_pre_hooks",
    [AWQ_MC_BACKWARD_HOOKS] = "_backward_hooks",
    [AWQ_MC_FORWARD] = "forward",
    [AWQ_MC_SIBLINGS] = "_siblings",
    [AWQ_MC_PREFILL] = "_prefill",
    [AWQ_MC_MIN_ROWS] = "min_rows",
    [AWQ_MC_SHAPE] = "shape",
    [AWQ_MC_BUFFERS] = "_buffers",
    [AWQ_MC_CALL] = "__call__",
    [AWQ_MC_CALL_IMPL] = "_call_impl",
    [AWQ_MC_REQUIRES_GRAD] = "requires_grad",
    [AWQ_MC_LEVEL] = "_current_level",
};

int awq_module_call_init(awq_state *st)
{
    for (int i = 0; i < AWQ_MC_NAMES; i++) {
        st->mc_names[i] = PyUnicode_InternFromString(kNames[i]);
        if (st->mc_names[i] == NULL)
            return -1;
    }
    st->mc_kwnames = PyTuple_Pack(1, st->kw[AWQ_KW_GROUP_SIZE]);
    return st->mc_kwnames == NULL ? -1 : 0;
}

int awq_module_call_traverse(awq_state *st, visitproc visit, void *arg)
{
    for (int i = 0; i < AWQ_MC_GLUE; i++)
        Py_VISIT(st->mc_glue[i]);
    return 0;
}

void awq_module_call_clear(awq_state *st)
{
    for (int i = 0; i < AWQ_MC_GLUE; i++)
        Py_CLEAR(st->mc_glue[i]);
    for (int i = 0; i < AWQ_MC_NAMES; i++)
        Py_CLEAR(st->mc_names[i]);
    Py_CLEAR(st->mc_kwnames);
}

PyObject *awq_py_set_module_glue(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    awq_state *st = awq_get_state(module);
    int ok = nargs == AWQ_MC_GLUE && PyType_Check(args[AWQ_MC_MODULE_TYPE]) &&
             PyType_Check(args[AWQ_MC_TENSOR]) && PyTuple_Check(args[AWQ_MC_GLOBAL_HOOKS]);
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(args[AWQ_MC_GLOBAL_HOOKS]); i++)
        ok = PyDict_Check(PyTuple_GET_ITEM(args[AWQ_MC_GLOBAL_HOOKS], i));
    if (!ok) {
        PyErr_SetString(PyExc_TypeError,
                        "_set_module_glue(module_type, module_call, module_call_impl, "
                        "global_hooks, tracing_state, dispatch_modes, grad_enabled, forward_ad, "
                        "tensor_type, forward): two types and a tuple of dicts among them");
        return NULL;
    }
    for (int i = 0; i < AWQ_MC_GLUE; i++)
        Py_XSETREF(st->mc_glue[i], Py_NewRef(args[i]));
    Py_RETURN_NONE;
}

/* 1 when x has fewer rows (the product of its leading dimensions) than the
 * prepared layout `pre` takes (its min_rows): the call is linear()'s; 0 when
 * it has as many or more, for forward to run the prefill kernel; -1 with an
 * exception. */
static int below_prefill(awq_state *st, PyObject *pre, PyObject *x)
{
    PyObject *least = PyObject_GetAttr(pre, st->mc_names[AWQ_MC_MIN_ROWS]);
    if (least == NULL)
        return -1;
    const long long min_rows = PyLong_AsLongLong(least);
    Py_DECREF(least);
    if (min_rows == -1 && PyErr_Occurred())
        return -1;
    PyObject *shape = PyObject_GetAttr(x, st->mc_names[AWQ_MC_SHAPE]);
    if (shape == NULL)
        return -1;
    int r = 0; /* a 0-d x: forward's to refuse */
    if (PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) >= 1) {
        long long rows = 1;
        for (Py_ssize_t i = 0; i + 1 < PyTuple_GET_SIZE(shape) && rows < min_rows; i++) {
            const long long n = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
            if (n == -1 && PyErr_Occurred()) {
                Py_DECREF(shape);
                return -1;
            }
            rows = n > 0 && rows > min_rows / n ? min_rows : rows * n; /* no overflow */
        }
        r = rows < min_rows;
    }
    Py_DECREF(shape);
    return r;
}

/* 1 when d[key] is an empty dict, 0 when it is anything else or missing,
 * -1 with an exception. */
static int empty_dict_at(PyObject *d, PyObject *key)
{
    PyObject *v = PyDict_GetItemWithError(d, key); /* borrowed */
    if (v == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return PyDict_Check(v) && PyDict_GET_SIZE(v) == 0;
}

/* 1 when v (a new reference, released here) is the object expected, 0
 * when not, -1 when v is NULL (an exception is set). */
static int same_as(PyObject *v, PyObject *expected)
{
    if (v == NULL)
        return -1;
    int same = v == expected;
    Py_DECREF(v);
    return same;
}

/* 1 when tensor.requires_grad is True (None has none), -1 with an
 * exception. */
static int requires_grad(awq_state *st, PyObject *tensor)
{
    return tensor == Py_None
               ? 0
               : same_as(PyObject_GetAttr(tensor, st->mc_names[AWQ_MC_REQUIRES_GRAD]), Py_True);
}

/* 1 when the layer may run linear() here, with new references to x, the
 * four buffers and G in call[0..5]; 0 when not, -1 with an exception,
 * either way with call[] empty. */
static int may_run(awq_state *st, PyObject *layer, PyObject *args, PyObject *kwargs,
                   PyObject *call[6])
{
    PyObject *const *glue = st->mc_glue;
    PyObject *const *name = st->mc_names;
    if (glue[AWQ_MC_MODULE_TYPE] == NULL || !PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 1 ||
        (kwargs != NULL && (!PyDict_Check(kwargs) || PyDict_GET_SIZE(kwargs) != 0)))
        return 0;
    PyObject *x = PyTuple_GET_ITEM(args, 0);
    if (Py_TYPE(x) != (PyTypeObject *)glue[AWQ_MC_TENSOR])
        return 0;
    PyObject *globals = glue[AWQ_MC_GLOBAL_HOOKS];
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(globals); i++)
        if (PyDict_GET_SIZE(PyTuple_GET_ITEM(globals, i)) != 0)
            return 0;
    /* nn.Module's call as torch defines it; AWQLinear's forward */
    PyObject *module_type = glue[AWQ_MC_MODULE_TYPE], *type = (PyObject *)Py_TYPE(layer);
    int r = same_as(PyObject_GetAttr(module_type, name[AWQ_MC_CALL]), glue[AWQ_MC_MODULE_CALL]);
    if (r == 1)
        r = same_as(PyObject_GetAttr(module_type, name[AWQ_MC_CALL_IMPL]),
                    glue[AWQ_MC_MODULE_CALL_IMPL]);
    if (r == 1)
        r = same_as(PyObject_GetAttr(type, name[AWQ_MC_FORWARD]), glue[AWQ_MC_FORWARD_FN]);
    if (r != 1)
        return r;

    PyObject *d = PyObject_GenericGetDict(layer, NULL);
    if (d == NULL)
        return -1;
    /* no compiled call (set on the instance by Module.compile; nn.Module's
     * None otherwise), no instance forward, no group */
    PyObject *v = PyDict_GetItemWithError(d, name[AWQ_MC_COMPILED]);
    if (v != NULL)
        r = v == Py_None;
    else
        r = PyErr_Occurred() ? -1
                             : same_as(PyObject_GetAttr(type, name[AWQ_MC_COMPILED]), Py_None);
    if (r == 1 && (PyDict_GetItemWithError(d, name[AWQ_MC_FORWARD]) != NULL || PyErr_Occurred()))
        r = 0;
    if (r == 1 && (v = PyDict_GetItemWithError(d, name[AWQ_MC_SIBLINGS])) != NULL && v != Py_None)
        r = 0;
    /* no prepared layout (prepare_prefill), or fewer rows than it takes: from
     * min_rows on forward runs the prefill kernel */
    if (r == 1 && (v = PyDict_GetItemWithError(d, name[AWQ_MC_PREFILL])) != NULL && v != Py_None) {
        Py_INCREF(v);
        r = below_prefill(st, v, x);
        Py_DECREF(v);
    }
    for (int i = AWQ_MC_FORWARD_PRE; r == 1 && i <= AWQ_MC_BACKWARD_HOOKS; i++)
        r = empty_dict_at(d, name[i]);
    PyObject *buffers = r == 1 ? PyDict_GetItemWithError(d, name[AWQ_MC_BUFFERS]) : NULL;
    if (r == 1 && (buffers == NULL || !PyDict_Check(buffers)))
        r = 0;
    static const int kBuffers[4] = {AWQ_KW_QWEIGHT, AWQ_KW_QZEROS, AWQ_KW_SCALES, AWQ_KW_BIAS};
    call[0] = x;
    for (int i = 0; r == 1 && i < 4; i++) /* a scale or bias made a Parameter is not here */
        if ((call[1 + i] = PyDict_GetItemWithError(buffers, st->kw[kBuffers[i]])) == NULL)
            r = 0;
    if (r == 1 && (call[5] = PyDict_GetItemWithError(d, st->kw[AWQ_KW_GROUP_SIZE])) == NULL)
        r = 0;
    /* Held from here: the calls below may run Python code (a collection's
     * finalizers), which could take them out of the layer's dict. */
    for (int i = 0; i < 6; i++)
        call[i] = r == 1 ? Py_NewRef(call[i]) : NULL;
    Py_DECREF(d);
    if (r != 1)
        return PyErr_Occurred() ? -1 : 0;

    /* no trace, dispatch mode or forward-mode AD level */
    r = same_as(PyObject_CallNoArgs(glue[AWQ_MC_TRACING_STATE]), Py_None);
    if (r == 1) {
        PyObject *n = PyObject_CallNoArgs(glue[AWQ_MC_DISPATCH_MODES]);
        r = n == NULL ? -1 : PyLong_Check(n) && PyLong_AsLong(n) == 0;
        Py_XDECREF(n);
    }
    if (r == 1) {
        PyObject *level = PyObject_GetAttr(glue[AWQ_MC_FORWARD_AD], name[AWQ_MC_LEVEL]);
        r = level == NULL ? -1 : PyLong_Check(level) && PyLong_AsLong(level) < 0;
        Py_XDECREF(level);
    }
    /* nothing for autograd to record */
    int grad = r == 1 ? same_as(PyObject_CallNoArgs(glue[AWQ_MC_GRAD_ENABLED]), Py_True) : 0;
    if (grad < 0)
        r = -1;
    for (int i = 0; r == 1 && grad && i < 3; i++) {
        int g = requires_grad(st, call[i == 0 ? 0 : i + 2]); /* x, scales, bias */
        r = g < 0 ? -1 : !g;
    }
    for (int i = 0; r != 1 && i < 6; i++)
        Py_CLEAR(call[i]);
    return r;
}

PyObject *awq_py_module_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    awq_state *st = awq_get_state(module);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_module_call(layer, args, kwargs) takes 3 arguments");
        return NULL;
    }
    PyObject *call[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    const int r = may_run(st, args[0], args[1], args[2] == Py_None ? NULL : args[2], call);
    if (r <= 0)
        return r < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    PyObject *y = awq_py_linear(module, call, 5, st->mc_kwnames);
    for (int i = 0; i < 6; i++)
        Py_DECREF(call[i]);
    if (y == NULL && (PyErr_ExceptionMatches(PyExc_TypeError) ||
                      PyErr_ExceptionMatches(PyExc_ValueError) ||
                      PyErr_ExceptionMatches(PyExc_RuntimeError))) {
        PyErr_Clear();
        return Py_NewRef(Py_NotImplemented);
    }
    return y;
}
