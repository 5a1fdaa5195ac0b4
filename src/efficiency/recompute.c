/* Selective recomputation: a linear layer whose input activation is recomputed
 * in backward instead of being kept.
 *
 * Why not fm_checkpoint: a checkpointed segment re-runs everything inside it, so
 * wrapping "norm -> linear" or "gelu -> linear" would repeat the matmul, the one
 * expensive part. Here the node saves the inputs of the cheap function f (norm,
 * GELU, attention core) plus the weights; backward re-runs only f (with the tape,
 * the RNG and the autocast setting of the forward), computes the linear's
 * gradients directly (two matmuls, as an ordinary linear backward does) and
 * backpropagates through f. Matmul outputs (the inputs of f) stay stored, as in
 * Korthikanti et al.'s selective recomputation. */
#include <string.h>

#include "amp/autocast.h"
#include "autograd/node.h"
#include "core/tensor_internal.h"
#include "fathom/efficiency.h"

#define RC_MAX 5

typedef struct rc_attrs {
    fm_segment_fn f;
    void *ctx;
    int n_in;
    fm_dtype autocast;
    uint64_t rng_seed, rng_offset;
} rc_attrs;

/* g2 [rows, in] from g [..., in] */
static fm_tensor *rows2(fm_tensor *t) {
    int64_t last = t->shape[t->ndim - 1], rows = last ? fm_tensor_numel(t) / last : 0;
    return fm_reshape(t, 2, (int64_t[]){rows, last});
}

static fm_tensor *as_dtype(fm_tensor *t, fm_dtype dt) {
    if (!t || t->dtype == dt) return t;
    fm_tensor *c = fm_to_dtype(t, dt);
    fm_tensor_release(t);
    return c;
}

/* The gradients of a linear y = x2 w^T + b from go2 [rows, out], op for op as the
 * plain linear computes them under autocast, so that the nodes below give the
 * same bits as fm_linear: the weight's from one matmul, widened to w's dtype; the
 * bias's summed in the output's dtype, then widened (the bias add's broadcast
 * backward, then the cast's). A NULL result pointer: that gradient is not wanted. */
static fm_status param_grads(fm_tensor *go2, fm_tensor *x2, fm_tensor *w, fm_tensor *b, fm_tensor **gw, fm_tensor **gb) {
    if (gw) {
        fm_tensor *got = fm_transpose(go2, 0, 1);
        *gw = got ? as_dtype(fm_matmul(got, x2), w->dtype) : NULL;
        fm_tensor_release(got);
        if (!*gw) return fm_last_status();
    }
    if (gb) {
        fm_tensor *s = fm_sum(go2, 1, (int[]){0}, true);
        fm_tensor *s1 = s ? fm_reshape(s, 1, b->shape) : NULL;
        fm_tensor_release(s);
        *gb = as_dtype(s1, b->dtype);
        if (!*gb) return fm_last_status();
    }
    return FM_OK;
}

/* go2 w, as a tensor of `like`'s shape in dtype dt (the input's gradient) */
static fm_tensor *input_grad(fm_tensor *go2, fm_tensor *w, const fm_tensor *like, fm_dtype dt) {
    fm_tensor *d2 = fm_matmul(go2, w);
    fm_tensor *d = d2 ? as_dtype(fm_reshape(d2, like->ndim, like->shape), dt) : NULL;
    fm_tensor_release(d2);
    return d;
}

static fm_status rc_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    const rc_attrs *a = FM_NODE_ATTRS(n, rc_attrs);
    fm_tensor *w = n->saved[a->n_in], *b = n->saved[a->n_in + 1];
    fm_tensor *leaves[RC_MAX] = {0}, *g = NULL, *dg = NULL, *go2 = NULL, *g2 = NULL;
    fm_status st = FM_OK;
    if (!gout[0]) return FM_OK; /* nothing flows back: inputs get no gradient (engine treats missing as zero) */
    for (int i = 0; i < a->n_in; i++) {
        leaves[i] = fm_alias(n->saved[i]);
        if (!leaves[i]) { st = fm_last_status(); goto done; }
        if (fm_node_needs_grad(n, i)) leaves[i]->requires_grad = true;
    }
    /* recompute f(inputs) with the forward's RNG state and autocast */
    fm_rng *rg = fm_rng_global();
    fm_rng keep = *rg;
    rg->seed = a->rng_seed;
    rg->offset = a->rng_offset;
    fm_dtype prev_ac = fm_autocast_set(a->autocast);
    bool prev = fm_set_grad_enabled(true);
    st = a->f(leaves, a->ctx, &g);
    fm_set_grad_enabled(false);
    if (st != FM_OK) goto restore;
    go2 = rows2(gout[0]);
    g2 = go2 ? rows2(g) : NULL;
    if (!g2) { st = fm_last_status(); goto restore; }
    /* linear backward; matmul applies the forward's autocast to f32 operands */
    st = param_grads(go2, g2, w, b, fm_node_needs_grad(n, a->n_in) ? &gin[a->n_in] : NULL,
                     b && fm_node_needs_grad(n, a->n_in + 1) ? &gin[a->n_in + 1] : NULL);
    if (st != FM_OK) goto restore;
    /* f's output was needed only for the weight gradient: its data goes now, before
     * dg and f's input gradients are allocated. g stays the root of the backward
     * below, which reads only its grad_fn, shape and dtype. A node inside f that
     * saved g holds its own storage reference, so the data lives on exactly when
     * that node needs it. */
    fm_tensor_release(g2);
    g2 = NULL;
    if (g->refcount == 1) {
        fm_storage_release(g->storage);
        g->storage = NULL;
    }
    if (g->requires_grad && !(dg = input_grad(go2, w, g, g->dtype))) { st = fm_last_status(); goto restore; }
restore:
    fm_autocast_set(prev_ac);
    *rg = keep;
    if (st == FM_OK && dg) st = fm_backward_multi(1, &g, &dg, false);
    fm_set_grad_enabled(prev);
    for (int i = 0; st == FM_OK && i < a->n_in; i++) {
        if (!fm_node_needs_grad(n, i)) continue;
        gin[i] = leaves[i]->grad ? fm_tensor_retain(leaves[i]->grad) : fm_tensor_zeros_like(leaves[i]);
        if (!gin[i]) st = fm_last_status();
    }
done:
    for (int i = 0; i < RC_MAX; i++) fm_tensor_release(leaves[i]);
    fm_tensor_release_n(4, g, dg, go2, g2);
    return st;
}

fm_tensor *fm_linear_recompute(fm_segment_fn f, void *ctx, int n_in, fm_tensor *const *inputs, fm_tensor *w, fm_tensor *b) {
    if (!f || !inputs || !w || n_in < 1 || n_in > RC_MAX) {
        fm_set_error(FM_ERR_INVALID, "linear_recompute: need a function, 1..%d inputs and a weight", RC_MAX);
        return NULL;
    }
    fm_rng *rg = fm_rng_global();
    rc_attrs at = {f, ctx, n_in, fm_autocast_get(), rg->seed, rg->offset};
    fm_tensor *g = NULL;
    bool prev = fm_set_grad_enabled(false);
    fm_status st = f(inputs, ctx, &g);
    fm_tensor *y = st == FM_OK ? fm_linear(g, w, b) : NULL;
    fm_set_grad_enabled(prev);
    fm_tensor_release(g);
    if (!y) return NULL;
    fm_tensor *ins[RC_MAX + 2];
    for (int i = 0; i < n_in; i++) ins[i] = inputs[i];
    ins[n_in] = w;
    ins[n_in + 1] = b;
    fm_node *n = fm_node_begin(FM_OP_MATMUL, n_in + 2, ins, rc_backward);
    if (n) {
        n->name = "linear_recompute";
        FM_NODE_SET_ATTRS(n, at);
        for (int i = 0; i < n_in + 2; i++) fm_node_save(n, i, ins[i]);
        fm_node_finish(n, 1, &y);
    }
    return y;
}

/* ---- a linear under autocast that does not keep its weight's low-precision copy ----
 *
 * fm_linear under autocast casts the f32 weight to bf16/fp16 and its matmul node
 * saves that copy for the input gradient, so every weight of the model has a
 * second, low-precision copy alive from its forward to its backward (2 bytes a
 * parameter: 20 MiB of the 6-layer 384-wide GPT's 170 MiB of bf16 activations).
 * This node saves the f32 master weight instead, which is alive anyway, and casts
 * it again in backward. The input is saved as the matmul sees it (its autocast
 * copy), and the gradients are the plain linear's, op for op: the same matmuls on
 * the same operands, the bias gradient summed in the output's dtype and widened,
 * the input gradient widened to the input's dtype as the cast's backward does. */
typedef struct ll_attrs {
    fm_dtype autocast, in_dtype;
} ll_attrs;

static fm_status ll_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    const ll_attrs *a = FM_NODE_ATTRS(n, ll_attrs);
    fm_tensor *x = n->saved[0], *w = n->saved[1], *b = n->saved[2];
    fm_tensor *go2 = NULL, *x2 = NULL;
    fm_status st = FM_OK;
    if (!gout[0]) return FM_OK;
    fm_dtype prev_ac = fm_autocast_set(a->autocast);
    go2 = rows2(gout[0]);
    x2 = go2 ? rows2(x) : NULL;
    if (!x2) { st = fm_last_status(); goto done; }
    st = param_grads(go2, x2, w, b, fm_node_needs_grad(n, 1) ? &gin[1] : NULL,
                     b && fm_node_needs_grad(n, 2) ? &gin[2] : NULL);
    if (st == FM_OK && fm_node_needs_grad(n, 0) && !(gin[0] = input_grad(go2, w, x, a->in_dtype))) st = fm_last_status();
done:
    fm_autocast_set(prev_ac);
    fm_tensor_release_n(2, go2, x2);
    return st;
}

static fm_tensor *linear_lowp(fm_tensor *x, fm_tensor *w, fm_tensor *b) {
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *xc = fm_autocast_cast(FM_OP_MATMUL, x); /* as the matmul would cast it */
    fm_tensor *y = xc ? fm_linear(xc, w, b) : NULL;
    fm_set_grad_enabled(prev);
    fm_tensor *ins[3] = {x, w, b};
    fm_node *n = y ? fm_node_begin(FM_OP_MATMUL, b ? 3 : 2, ins, ll_backward) : NULL;
    if (n) {
        n->name = "linear_lowp";
        ll_attrs at = {fm_autocast_get(), x->dtype};
        FM_NODE_SET_ATTRS(n, at);
        fm_node_save(n, 0, xc);
        fm_node_save(n, 1, w);
        if (b) fm_node_save(n, 2, b);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release(xc);
    return y;
}

fm_tensor *fm_efficiency_linear(const fm_efficiency_opts *o, fm_segment_fn f, void *ctx, int n_in,
                                fm_tensor *const *inputs, fm_tensor *w, fm_tensor *b) {
    if (o && o->checkpointing == FM_CKPT_SELECTIVE && fm_grad_enabled()) return fm_linear_recompute(f, ctx, n_in, inputs, w, b);
    fm_tensor *g = NULL;
    if (!f) { fm_set_error(FM_ERR_INVALID, "efficiency_linear: function is NULL"); return NULL; }
    if (f(inputs, ctx, &g) != FM_OK) { fm_tensor_release(g); return NULL; }
    fm_tensor *y = NULL;
    if (fm_autocast_get() != FM_F32 && fm_grad_enabled() && g && w && fm_dtype_is_float(g->dtype) && g->dtype != FM_F64 &&
        w->dtype == FM_F32 && (!b || b->dtype == FM_F32) && w->ndim == 2 && g->ndim >= 1 && g->shape[g->ndim - 1] == w->shape[1] &&
        (!b || (b->ndim == 1 && b->shape[0] == w->shape[0])))
        y = linear_lowp(g, w, b);
    else
        y = fm_linear(g, w, b);
    fm_tensor_release(g);
    return y;
}
