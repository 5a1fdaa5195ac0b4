/* The op-info table (name, arity, flags, autocast policy, kernel group), built from ops.def: the names that
 * errors, the profiler and the kernels' own messages use. */
#include <string.h>

#include "backend/kernel.h"

static const fm_op_info k_ops[FM_OP_COUNT] = {
#define X(id, name, nin, nout, flags, prec, group) [FM_OP_##id] = {#name, nin, nout, flags, FM_PREC_##prec, FM_GROUP_##group},
#include "fathom/ops.def"
#undef X
};

const fm_op_info *fm_op_get_info(fm_op_id op) { return (unsigned)op < FM_OP_COUNT ? &k_ops[op] : NULL; }

static uint64_t g_lowp_products;

void fm_kernel_note_lowp_products(void) { __atomic_fetch_add(&g_lowp_products, 1, __ATOMIC_RELAXED); }
uint64_t fm_kernel_lowp_products(void) { return __atomic_load_n(&g_lowp_products, __ATOMIC_RELAXED); }

fm_op_id fm_op_find(const char *name) {
    for (int i = 0; i < FM_OP_COUNT; i++)
        if (!strcmp(k_ops[i].name, name)) return (fm_op_id)i;
    return FM_OP_COUNT;
}

bool fm_call_batch_slices(const fm_op_call *c, int64_t *batch) {
    if (c->op != FM_OP_SDPA && c->op != FM_OP_SDPA_BACKWARD) return false;
    int64_t B = -1;
    for (int i = 0; i < c->n_in + c->n_out; i++) {
        const fm_tensor *t = i < c->n_in ? c->in[i] : c->out[i - c->n_in];
        if (!t || t->ndim < 2 || !fm_tensor_is_contiguous(t)) return false;
        if (B < 0) B = t->shape[0];
        else if (t->shape[0] != B) return false;
    }
    *batch = B;
    return B > 1;
}
