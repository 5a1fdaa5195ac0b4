/* The kernel interface: what a backend implements and what an op's front end
 * hands it. A kernel receives one fm_op_call: its inputs, its preallocated
 * outputs (contiguous) and the op's attribute struct (backend/kernel_attrs.h).
 * Kernels of ops without FM_OPF_STRIDED see contiguous inputs (the dispatcher,
 * src/dispatch, copies when needed). Backends include this header and core;
 * never src/ops, src/dispatch or src/autograd. */
#ifndef FATHOM_KERNEL_H
#define FATHOM_KERNEL_H
#include "backend/kernel_attrs.h"
#include "core/backend.h"
#include "fathom/ops.h"

#define FM_CALL_MAX_IN 8
#define FM_CALL_MAX_OUT 4

typedef struct fm_op_call {
    fm_op_id op;
    int n_in, n_out;
    fm_tensor *in[FM_CALL_MAX_IN];  /* an optional input may be NULL */
    fm_tensor *out[FM_CALL_MAX_OUT]; /* preallocated by the front end, contiguous */
    fm_tensor **var_in;             /* variadic ops (CAT): n_in tensors */
    const void *attrs;              /* backend/kernel_attrs.h */
} fm_op_call;

#ifdef __cplusplus
static_assert((int)FM_BACKEND_OP_SLOTS == (int)FM_OP_COUNT, "core's kernel slots must match ops.def");
#else
_Static_assert((int)FM_BACKEND_OP_SLOTS == (int)FM_OP_COUNT, "core's kernel slots must match ops.def");
#endif
#endif
