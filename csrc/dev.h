/*
 * dev.h -- the development namespace awq_fast_dequant._C._dev (dev.c).
 */
#ifndef AWQ_DEV_H
#define AWQ_DEV_H

#include "pyawq.h"

/* Builds _C._dev and adds it to the module; 0, or -1 with an exception. */
int awq_dev_add(PyObject *module);

#endif /* AWQ_DEV_H */
