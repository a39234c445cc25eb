/*
 * module_call.h -- AWQLinear's eager call in C (module_call.c).
 */
#ifndef AWQ_MODULE_CALL_H
#define AWQ_MODULE_CALL_H

#include "pyawq.h"

/* Module state: the interned names (at exec), the registered objects. */
int awq_module_call_init(awq_state *st);
int awq_module_call_traverse(awq_state *st, visitproc visit, void *arg);
void awq_module_call_clear(awq_state *st);

/* _set_module_glue(module_type, module_call, module_call_impl, global_hooks,
 * tracing_state, dispatch_modes, grad_enabled, forward_ad, tensor_type,
 * forward) */
PyObject *awq_py_set_module_glue(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* _module_call(layer, args, kwargs) -> y, or NotImplemented */
PyObject *awq_py_module_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* AWQ_MODULE_CALL_H */
