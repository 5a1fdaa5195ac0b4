/* Cross-entropy on low-precision logits (efficiency_internal.h).
 *
 * Under autocast, fm_cross_entropy casts bf16 logits to f32 and its node keeps
 * that f32 copy, twice the bytes of the logits, until backward, where the
 * gradient is made in f32 too and only then narrowed: at the start of backward
 * the f32 logits, their f32 gradient and the bf16 gradient are all alive. With a
 * large vocabulary that is the step's peak (kjv-gpt: 4 + 4 MiB at V = 512). Here
 * the node keeps the bf16 logits; backward widens a block of rows (2^16 logits,
 * 256 KiB in f32, or 8 rows of a larger vocabulary), runs the same
 * f32 cross-entropy backward on it and narrows its gradient into the bf16 result.
 * Row by row the arithmetic is the f32 one; the mean's 1/count reaches each block
 * as an f32 scale (exact when count is a power of two, else within one f32
 * rounding of the unblocked scale). The forward goes by the same blocks, so an
 * f32 copy of all the logits never exists; its loss is the sum of the blocks' f32
 * sums, within one f32 rounding of the unblocked one. */

#include "autograd/node.h"
#include "core/tensor_internal.h"
#include "efficiency/efficiency_internal.h"
#include "fathom/autograd.h"
#include "fathom/ops.h"

typedef struct cel_attrs {
    int64_t ignore_index;
    double label_smoothing;
} cel_attrs;

int64_t fm_cross_entropy_lowp_rows(int64_t vocab) {
    int64_t r = ((int64_t)1 << 16) / (vocab > 0 ? vocab : 1);
    return r > 8 ? r : 8; /* a large vocabulary: blocks of 8 rows, so the per-block overhead stays small */
}

static fm_status cel_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    const cel_attrs *a = FM_NODE_ATTRS(n, cel_attrs);
    fm_tensor *x = n->saved[0], *t = n->saved[1], *count = n->saved[2];
    if (!gout[0] || !fm_node_needs_grad(n, 0)) return FM_OK;
    const int64_t N = x->shape[0], V = x->shape[1], step = fm_cross_entropy_lowp_rows(V);
    /* the mean's scale, as one f32 number for the blocks' sum-reduced backward: the
     * gradient / count in f64 rounded to f32, on the device (no host read) */
    fm_tensor *g64 = fm_to_dtype(gout[0], FM_F64), *q = g64 ? fm_div(g64, count) : NULL;
    fm_tensor *gs = q ? fm_to_dtype(q, FM_F32) : NULL;
    fm_tensor_release_n(2, g64, q);
    fm_tensor *dx = gs ? fm_tensor_empty(2, x->shape, x->dtype, fm_tensor_device(x)) : NULL;
    fm_status st = dx ? FM_OK : fm_last_status();
    for (int64_t r0 = 0; st == FM_OK && r0 < N; r0 += step) {
        const int64_t k = N - r0 < step ? N - r0 : step;
        fm_tensor *xs = fm_narrow(x, 0, r0, k), *ts = fm_narrow(t, 0, r0, k);
        fm_tensor *x32 = xs ? fm_to_dtype(xs, FM_F32) : NULL, *l = NULL;
        if (x32 && ts) {
            x32->requires_grad = true;
            bool prev = fm_set_grad_enabled(true);
            l = fm_cross_entropy(x32, ts, a->ignore_index, a->label_smoothing, FM_REDUCE_SUM);
            fm_set_grad_enabled(prev);
        }
        st = l ? fm_backward(l, gs, false) : fm_last_status();
        fm_tensor *ds = st == FM_OK ? fm_narrow(dx, 0, r0, k) : NULL;
        if (st == FM_OK) st = ds && x32->grad ? fm_copy_(ds, x32->grad) : fm_set_error(FM_ERR_INTERNAL, "cross_entropy_lowp: no gradient");
        fm_tensor_release_n(5, xs, ts, x32, l, ds);
    }
    fm_tensor_release(gs);
    if (st != FM_OK) { fm_tensor_release(dx); return st; }
    gin[0] = dx;
    return FM_OK;
}

fm_tensor *fm_cross_entropy_lowp(fm_tensor *logits, fm_tensor *target, int64_t ignore_index, double label_smoothing) {
    if (!logits || !target || logits->ndim != 2 || (logits->dtype != FM_BF16 && logits->dtype != FM_F16) ||
        target->ndim != 1 || target->shape[0] != logits->shape[0] || (target->dtype != FM_I64 && target->dtype != FM_I32))
        return fm_cross_entropy(logits, target, ignore_index, label_smoothing, FM_REDUCE_MEAN);
    const int64_t n = target->shape[0], V = logits->shape[1], step = fm_cross_entropy_lowp_rows(V);
    const fm_device dev = fm_tensor_device(logits);
    /* Everything stays on the logits' device (no host read, so no wait on a GPU): the
     * count of targets that are not ignored, and the forward in the same blocks of rows
     * as the backward, so no f32 copy of all the logits exists even for a moment: each
     * block's f32 sum (from f64 row losses) is added in f64, and the total / count in
     * f64 is rounded once to f32. No target counted (all ignored) gives 0 / 0 = NaN, as
     * the mean does. */
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *ig = fm_tensor_full(0, NULL, (double)ignore_index, target->dtype, dev);
    fm_tensor *keep = ig ? fm_ne(target, ig) : NULL, *keep64 = keep ? fm_to_dtype(keep, FM_F64) : NULL;
    fm_tensor *count = keep64 ? fm_sum(keep64, 0, NULL, false) : NULL;
    fm_tensor *total = count ? fm_tensor_zeros(0, NULL, FM_F64, dev) : NULL;
    fm_tensor_release_n(3, ig, keep, keep64);
    fm_status st = total ? FM_OK : fm_last_status();
    for (int64_t r0 = 0; st == FM_OK && r0 < n; r0 += step) {
        const int64_t k = n - r0 < step ? n - r0 : step;
        fm_tensor *xs = fm_narrow(logits, 0, r0, k), *ts = fm_narrow(target, 0, r0, k);
        fm_tensor *x32 = xs ? fm_to_dtype(xs, FM_F32) : NULL;
        fm_tensor *l = x32 && ts ? fm_cross_entropy(x32, ts, ignore_index, label_smoothing, FM_REDUCE_SUM) : NULL;
        fm_tensor *l64 = l ? fm_to_dtype(l, FM_F64) : NULL, *sum = l64 ? fm_add(total, l64) : NULL;
        if (sum) {
            fm_tensor_release(total);
            total = sum;
        } else st = fm_last_status();
        fm_tensor_release_n(5, xs, ts, x32, l, l64);
    }
    fm_tensor *mean = st == FM_OK ? fm_div(total, count) : NULL;
    fm_tensor *loss = mean ? fm_to_dtype(mean, FM_F32) : NULL;
    fm_set_grad_enabled(prev);
    fm_tensor_release_n(2, total, mean);
    if (!loss) { fm_tensor_release(count); return NULL; }
    fm_node *nd = fm_node_begin(FM_OP_CROSS_ENTROPY, 2, (fm_tensor *[]){logits, target}, cel_backward);
    if (nd) {
        nd->name = "cross_entropy_lowp";
        cel_attrs at = {ignore_index, label_smoothing};
        FM_NODE_SET_ATTRS(nd, at);
        fm_node_save(nd, 0, logits);
        fm_node_save(nd, 1, target);
        fm_node_save(nd, 2, count);
        fm_node_finish(nd, 1, &loss);
    }
    fm_tensor_release(count);
    return loss;
}
