/* Activation checkpointing: a segment runs forward without a tape, and its
 * backward recomputes the segment with the tape on, then walks it.
 *
 * The recomputation starts from detached aliases of the saved inputs (fresh
 * leaves), so the inner graph is separate from the outer one; the engine is
 * re-entrant (it keeps per-walk state on the stack). The global RNG offset seen by
 * the first forward is stored and restored around the recomputation, so dropout
 * draws the same mask, and the caller's RNG position afterwards is unchanged. */
#include <stdlib.h>
#include <string.h>

#include "autograd/node.h"
#include "core/tensor_internal.h"
#include "fathom/amp.h"

#define CK_MAX 16

typedef struct ck_attrs {
    fm_segment_fn fn;
    void *ctx;
    int n_in, n_out;
    uint64_t rng_seed, rng_offset;
    fm_dtype autocast; /* the recomputation runs under the forward's autocast setting */
} ck_attrs;

static fm_status ck_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    const ck_attrs *a = FM_NODE_ATTRS(n, ck_attrs);
    fm_tensor *leaves[CK_MAX] = {0}, *outs[CK_MAX] = {0};
    fm_status st = FM_OK;
    for (int i = 0; i < a->n_in; i++) {
        leaves[i] = fm_alias(n->saved[i]);
        if (!leaves[i]) { st = fm_last_status(); goto done; }
        if (fm_node_needs_grad(n, i)) leaves[i]->requires_grad = true;
    }
    fm_rng *g = fm_rng_global();
    fm_rng keep = *g;
    g->seed = a->rng_seed;
    g->offset = a->rng_offset;
    bool prev = fm_set_grad_enabled(true);
    fm_dtype prev_ac = fm_autocast_set(a->autocast);
    st = a->fn(leaves, a->ctx, outs);
    fm_autocast_set(prev_ac);
    fm_set_grad_enabled(prev);
    *g = keep;
    if (st != FM_OK) goto done;
    {
        fm_tensor *roots[CK_MAX], *grads[CK_MAX];
        int nr = 0;
        for (int i = 0; i < a->n_out; i++) {
            if (!gout[i] || !outs[i] || !outs[i]->requires_grad) continue;
            roots[nr] = outs[i];
            grads[nr] = gout[i];
            nr++;
        }
        if (nr) st = fm_backward_multi(nr, roots, grads, false);
    }
    for (int i = 0; st == FM_OK && i < a->n_in; i++) {
        if (!fm_node_needs_grad(n, i)) continue;
        gin[i] = leaves[i]->grad ? fm_tensor_retain(leaves[i]->grad) : fm_tensor_zeros_like(leaves[i]);
        if (!gin[i]) st = fm_last_status();
    }
done:
    for (int i = 0; i < CK_MAX; i++) { fm_tensor_release(leaves[i]); fm_tensor_release(outs[i]); }
    return st;
}

fm_status fm_checkpoint(fm_segment_fn fn, void *ctx, int n_in, fm_tensor *const *inputs, int n_out, fm_tensor **outputs) {
    if (!fn || !inputs || !outputs || n_in < 1 || n_out < 1)
        return fm_set_error(FM_ERR_INVALID, "checkpoint: need a function, inputs and outputs");
    if (n_in > CK_MAX || n_out > CK_MAX || n_out > FM_NODE_MAX_OUT || n_in > FM_NODE_MAX_SAVED)
        return fm_set_error(FM_ERR_INVALID, "checkpoint: at most %d inputs and %d outputs", FM_NODE_MAX_SAVED, FM_NODE_MAX_OUT);
    for (int i = 0; i < n_out; i++) outputs[i] = NULL;
    fm_rng *g = fm_rng_global();
    ck_attrs a = {fn, ctx, n_in, n_out, g->seed, g->offset, fm_autocast_get()};
    bool prev = fm_set_grad_enabled(false);
    fm_status st = fn(inputs, ctx, outputs);
    fm_set_grad_enabled(prev);
    if (st != FM_OK) {
        for (int i = 0; i < n_out; i++) { fm_tensor_release(outputs[i]); outputs[i] = NULL; }
        return st;
    }
    fm_node *n = fm_node_begin(FM_OP_COPY, n_in, inputs, ck_backward);
    if (n) {
        n->name = "checkpoint";
        FM_NODE_SET_ATTRS(n, a);
        for (int i = 0; i < n_in; i++) fm_node_save(n, i, inputs[i]);
        fm_node_finish(n, n_out, outputs);
    }
    return FM_OK;
}
