/*
 * run.c -- a validated problem on its backend; status -> exception (run.h).
 */
#include "run.h"

#include "cpu/cpu.h"
#include "cuda/cuda.h"

int awq_raise_status(awq_status s, int detail, int device)
{
    switch (s) {
    case AWQ_OK: return 0;
    case AWQ_ERR_CUDA:
    case AWQ_ERR_DEVICE: {
        int probe = 0;
        if (device >= 0 && awq_cuda_device_count(&probe) == 0) {
            /* No driver, or no device: the runtime's own words for that
             * ("driver version is insufficient") mislead. */
            PyErr_Format(PyExc_RuntimeError,
                         "the inputs are CUDA tensors (cuda:%d) but this machine has no usable "
                         "CUDA device (CUDA runtime: %s)",
                         device, awq_cuda_error_string(probe));
        } else if (s == AWQ_ERR_DEVICE) {
            PyErr_Format(PyExc_RuntimeError, "CUDA device %d is not available", device);
        } else {
            PyErr_Format(PyExc_RuntimeError, "CUDA error on cuda:%d: %s (cudaError %d)", device,
                         awq_cuda_error_string(detail), detail);
        }
        break;
    }
    case AWQ_ERR_NO_CUDA:
        PyErr_SetString(PyExc_RuntimeError, "awq_fast_dequant was built without CUDA");
        break;
    case AWQ_ERR_CONFIG:
        PyErr_SetString(PyExc_ValueError, "launch configuration not valid for this kernel");
        break;
    case AWQ_ERR_NOMEM: PyErr_NoMemory(); break;
    }
    return -1;
}

int awq_run_dequantize(const awq_problem *p, const awq_config *c)
{
    awq_status s;
    int detail = 0;
    if (awq_numel(p) == 0)
        return 0;
    if (p->device < 0) {
        Py_BEGIN_ALLOW_THREADS
        s = awq_cpu_dequantize(p, c);
        Py_END_ALLOW_THREADS
    } else {
        s = awq_cuda_dequantize(p, c, &detail);
    }
    return awq_raise_status(s, detail, p->device);
}

static awq_status linear_backend(const awq_linear_problem *p, const awq_config *c, int *detail)
{
    awq_status s;
    if (p->device < 0) {
        Py_BEGIN_ALLOW_THREADS
        s = awq_cpu_linear(p, c);
        Py_END_ALLOW_THREADS
    } else {
        s = awq_cuda_linear(p, c, detail);
    }
    return s;
}

int awq_run_linear(const awq_linear_problem *p, const awq_config *c)
{
    int detail = 0;
    if (p->M == 0 || p->N == 0)
        return 0;
    return awq_raise_status(linear_backend(p, c, &detail), detail, p->device);
}

int awq_run_linear_tuned(const awq_linear_problem *p, const awq_config *c)
{
    int detail = 0;
    if (p->M == 0 || p->N == 0)
        return 0;
    awq_status s = linear_backend(p, c, &detail);
    if (s == AWQ_ERR_CONFIG) { /* refused before anything was launched: the default fits */
        const awq_config def = {.kernel = AWQ_KERNEL_AUTO};
        s = linear_backend(p, &def, &detail);
    }
    return awq_raise_status(s, detail, p->device);
}
