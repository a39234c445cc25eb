/*
 * args.c -- parsing the arguments of a call (args.h).
 */
#include "args.h"

#include <string.h>

int awq_parse_call(awq_state *st, const awq_signature *sig, PyObject *const *args,
                   Py_ssize_t nargs, PyObject *kwnames, PyObject **slots)
{
    for (int i = 0; i < AWQ_KW_COUNT; i++)
        slots[i] = NULL;
    if (nargs > sig->positional) {
        PyErr_Format(PyExc_TypeError, "%s() takes %d positional arguments but %zd were given",
                     sig->name, sig->positional, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        slots[sig->kws[i]] = args[i];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < nkw; j++) {
        /* Interned names compare by pointer: a call with keywords costs a
         * few compares instead of a dict. */
        PyObject *key = PyTuple_GET_ITEM(kwnames, j);
        int idx = -1;
        for (int i = 0; i < sig->nkws && idx < 0; i++)
            if (key == st->kw[sig->kws[i]])
                idx = sig->kws[i];
        for (int i = 0; i < sig->nkws && idx < 0; i++)
            if (PyUnicode_Compare(key, st->kw[sig->kws[i]]) == 0)
                idx = sig->kws[i];
        if (idx < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'",
                         sig->name, key);
            return -1;
        }
        if (slots[idx] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'", sig->name,
                         st->kw[idx]);
            return -1;
        }
        slots[idx] = args[nargs + j];
    }
    for (int i = 0; i < sig->nkws; i++) {
        int k = sig->kws[i];
        if (slots[k] != NULL)
            continue;
        if (i < sig->required) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%U'", sig->name,
                         st->kw[k]);
            return -1;
        }
        slots[k] = Py_None;
    }
    return 0;
}

int awq_parse_int(PyObject *o, const char *name, long long *value)
{
    if (PyBool_Check(o) || (!PyLong_Check(o) && !PyIndex_Check(o))) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.200s", name,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *i = PyNumber_Index(o);
    if (i == NULL)
        return -1;
    int overflow = 0;
    *value = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (*value == -1 && PyErr_Occurred())
        return -1;
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%s is out of range: %R", name, o);
        return -1;
    }
    return 0;
}

/* The spellings a dtype argument may take, besides the canonical names. */
static int dtype_from_name(const char *s, awq_dtype *out)
{
    static const struct {
        const char *name;
        awq_dtype t;
    } aliases[] = {{"half", AWQ_F16},   {"fp16", AWQ_F16}, {"f16", AWQ_F16}, {"bf16", AWQ_BF16},
                   {"float", AWQ_F32}, {"fp32", AWQ_F32}, {"f32", AWQ_F32}};
    if (strncmp(s, "torch.", 6) == 0)
        s += 6;
    if (awq_dtype_parse(s, out) == 0)
        return 0;
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcmp(s, aliases[i].name) == 0) {
            *out = aliases[i].t;
            return 0;
        }
    return -1;
}

int awq_parse_dtype(PyObject *o, const char *name, awq_dtype *out)
{
    const char *s = NULL;
    PyObject *str = NULL;
    int r = -1;

    if (PyUnicode_Check(o)) {
        s = PyUnicode_AsUTF8(o);
    } else {
        PyArray_Descr *d = NULL;
        if (PyArray_DescrCheck(o) || PyType_Check(o)) {
            if (PyArray_DescrConverter2(o, &d) && d != NULL) {
                str = PyObject_Str((PyObject *)d);
                Py_DECREF(d);
            }
            PyErr_Clear();
        }
        if (str == NULL)
            str = PyObject_Str(o); /* torch.float16 prints as "torch.float16" */
        if (str == NULL)
            return -1;
        s = PyUnicode_AsUTF8(str);
    }
    if (s == NULL)
        goto done;
    if (dtype_from_name(s, out) == 0)
        r = 0;
    else
        PyErr_Format(PyExc_TypeError,
                     "%s must be float16, bfloat16 or float32 (a name, NumPy or torch dtype), "
                     "got %R",
                     name, o);
done:
    Py_XDECREF(str);
    return r;
}

int awq_parse_kernel(PyObject *o, int *kernel)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError,
                     "kernel must be a str: 'auto', 'v1', 'v2', 'v3', 'v4' (CUDA) or 'cpu', got "
                     "%.200s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    const char *s = PyUnicode_AsUTF8(o);
    if (s == NULL)
        return -1;
    awq_kernel k;
    if (awq_kernel_parse(s, &k) == 0) {
        *kernel = (int)k;
        return 0;
    }
    PyErr_Format(PyExc_ValueError,
                 "kernel must be one of 'auto', 'v1', 'v2', 'v3', 'v4' (CUDA) or 'cpu', got %R", o);
    return -1;
}
