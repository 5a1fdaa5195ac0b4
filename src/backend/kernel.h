/* The kernel interface: what a backend implements and what an op's front end
 * hands it. A kernel receives one fm_op_call: its inputs, its preallocated
 * outputs (contiguous) and the op's attribute struct (backend/kernel_attrs.h).
 * Kernels of ops without FM_OPF_STRIDED see contiguous inputs (the dispatcher,
 * src/dispatch, copies when needed), or, where their backend sets
 * rows_strided[op] (core/backend.h), inputs whose last dim is unit-stride. Backends include this header and core;
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

/* The unary ops whose kernels take integer tensors (the rest need floats). */
static inline bool fm_ew_unary_takes_ints(fm_op_id op) {
    return op == FM_OP_COPY || op == FM_OP_NEG || op == FM_OP_ABS || op == FM_OP_RELU || op == FM_OP_CLAMP ||
           op == FM_OP_SIGN || op == FM_OP_FLOOR || op == FM_OP_CEIL || op == FM_OP_ROUND;
}

/* Whether a low-precision call may run a slice of its batch at a time (op_info.c):
 * SDPA and its backward treat each batch element on its own, so a call whose tensors
 * are all contiguous and lead with the same batch B > 1 gives the same bits sliced.
 * The CPU backend runs such calls an eighth of the batch at a time (its f32 scratch
 * an eighth too); the meta device accounts for the same scratch. */
bool fm_call_batch_slices(const fm_op_call *c, int64_t *batch);

/* A count of kernel runs whose products ran on bf16 hardware (oneDNN's bf16
 * GEMM, the AVX512-BF16 attention), bumped by those kernels from any thread.
 * The profiler reads it around each op to mark the op's span with the precision
 * its products actually ran in (a bf16 request that fell back to f32 products,
 * such as a conv with columns shorter than 16, is not marked), so that MFU is
 * taken against the matching peak. With ops dispatched from several threads at
 * once, an op may be marked by another's products. */
void fm_kernel_note_lowp_products(void);
uint64_t fm_kernel_lowp_products(void);

#ifdef __cplusplus
static_assert((int)FM_BACKEND_OP_SLOTS == (int)FM_OP_COUNT, "core's kernel slots must match ops.def");
#else
_Static_assert((int)FM_BACKEND_OP_SLOTS == (int)FM_OP_COUNT, "core's kernel slots must match ops.def");
#endif
#endif
