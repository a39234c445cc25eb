/*
 * args.h -- argument parsing and validation of the entry points.
 *
 * args.c parses a FASTCALL call into one slot per keyword and the scalar
 * arguments (integers, dtypes, kernel names); validate.c checks the views of
 * a call and builds its problem.  Validation is complete before any byte of
 * an output is written, so a rejected call leaves the caller's data as it
 * was.  Every message names the argument, what was expected and what was
 * given.
 */
#ifndef AWQ_ARGS_H
#define AWQ_ARGS_H

#include "views.h"

/* ---- calls (args.c) ---- */

/* An entry point's signature: keyword ids (AWQ_KW_*) in positional order;
 * the first `required` are required, at most `positional` may be given by
 * position, the rest are keyword-only. */
typedef struct {
    const char *name;
    const int *kws;
    int nkws;
    int positional;
    int required;
} awq_signature;

/* Fills slots[AWQ_KW_*] with the call's arguments (Py_None where absent;
 * slots of keywords outside the signature stay NULL).  0, or -1 with a
 * TypeError like Python's own. */
int awq_parse_call(awq_state *st, const awq_signature *sig, PyObject *const *args,
                   Py_ssize_t nargs, PyObject *kwnames, PyObject **slots);

/* An integer argument: an int or any object with __index__ (NumPy
 * integers), not a bool.  0, or -1 with TypeError / ValueError (range). */
int awq_parse_int(PyObject *o, const char *name, long long *value);

/* out_dtype: a name, a NumPy dtype or scalar type, or a torch dtype. */
int awq_parse_dtype(PyObject *o, const char *name, awq_dtype *out);

/* kernel: a str naming one of dequantize's kernels (TypeError for a
 * non-str, ValueError for an unknown name). */
int awq_parse_kernel(PyObject *o, int *kernel);

/* ---- problems (validate.c) ---- */

enum { AWQ_ARG_QWEIGHT, AWQ_ARG_QZEROS, AWQ_ARG_SCALES, AWQ_ARG_OUT, AWQ_NUM_ARGS };

/* The views of one dequantize call and the arguments that shape it. */
typedef struct {
    awq_view v[AWQ_NUM_ARGS];
    int have[AWQ_NUM_ARGS];
    /* Py_None when absent; kernel and block_size always are for
     * smart_dequantize, whose tuner chooses them. */
    PyObject *group_size, *out_dtype, *kernel, *block_size;
    int explicit_stream;
} awq_dequantize_call;

extern const char *const awq_arg_names[AWQ_NUM_ARGS];

/* Checks everything about a dequantize call and fills *p (stream and out
 * excepted when out is allocated later) and *cfg.  0, or -1 with an
 * exception set. */
int awq_validate_dequantize(const awq_dequantize_call *c, awq_problem *p, awq_config *cfg);

/* linear's paths: the tuned choice, the fused kernel, or dequantize + the
 * framework's matmul. */
typedef enum { AWQ_PATH_AUTO = 0, AWQ_PATH_FUSED = 1, AWQ_PATH_DEQUANT = 2 } awq_path;

enum {
    AWQ_LIN_X,
    AWQ_LIN_QWEIGHT,
    AWQ_LIN_QZEROS,
    AWQ_LIN_SCALES,
    AWQ_LIN_BIAS,
    AWQ_LIN_OUT,
    AWQ_LIN_NUM_ARGS
};

/* The views of one linear call and the arguments that shape it. */
typedef struct {
    awq_view v[AWQ_LIN_NUM_ARGS];
    int have[AWQ_LIN_NUM_ARGS];
    PyObject *group_size, *path; /* Py_None when absent */
    int explicit_stream;
} awq_linear_call;

extern const char *const awq_lin_arg_names[AWQ_LIN_NUM_ARGS];

/* Checks everything about a linear call and fills *p (y excepted when it is
 * allocated later) and *path.  0, or -1 with an exception set. */
int awq_validate_linear(const awq_linear_call *c, awq_linear_problem *p, awq_path *path);

/* K, and the rows of scales/qzeros, and the group_size argument -> G.
 * 0, or -1 with a ValueError. */
int awq_resolve_group(int64_t K, int64_t groups, PyObject *group_size, int64_t *G);

#endif /* AWQ_ARGS_H */
