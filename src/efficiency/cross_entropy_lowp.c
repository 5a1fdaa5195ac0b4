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
#include <stdlib.h>
#include <string.h>

#include "autograd/node.h"
#include "core/tensor_internal.h"
#include "efficiency/efficiency_internal.h"
#include "fathom/autograd.h"
#include "fathom/ops.h"

typedef struct cel_attrs {
    int64_t ignore_index, count;
    double label_smoothing;
} cel_attrs;

int64_t fm_cross_entropy_lowp_rows(int64_t vocab) {
    int64_t r = ((int64_t)1 << 16) / (vocab > 0 ? vocab : 1);
    return r > 8 ? r : 8; /* a large vocabulary: blocks of 8 rows, so the per-block overhead stays small */
}

static fm_status cel_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    const cel_attrs *a = FM_NODE_ATTRS(n, cel_attrs);
    fm_tensor *x = n->saved[0], *t = n->saved[1];
    if (!gout[0] || !fm_node_needs_grad(n, 0)) return FM_OK;
    const int64_t N = x->shape[0], V = x->shape[1], step = fm_cross_entropy_lowp_rows(V);
    /* the mean's scale, as one f32 number for the blocks' sum-reduced backward */
    fm_tensor *gs = fm_tensor_full(0, NULL, fm_tensor_item(gout[0]) / (double)a->count, FM_F32, fm_tensor_device(x));
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
    int64_t count = 0, n = target->shape[0];
    /* the targets are counted from a host copy: they may live on a device */
    int64_t *tg = malloc(sizeof(int64_t) * (size_t)n);
    if (!tg) { fm_set_error(FM_ERR_OOM, "cross_entropy_lowp: no host memory for %lld targets", (long long)n); return NULL; }
    if (fm_tensor_copy_to_host(target, tg, FM_I64) != FM_OK) { free(tg); return NULL; }
    for (int64_t i = 0; i < n; i++) count += tg[i] != ignore_index;
    free(tg);
    if (count == 0) return fm_cross_entropy(logits, target, ignore_index, label_smoothing, FM_REDUCE_MEAN); /* NaN, as it gives */
    /* the forward in the same blocks of rows, so no f32 copy of all the logits exists
     * even for a moment: each block's sum (f32, from f64 row losses) is added in f64 */
    bool prev = fm_set_grad_enabled(false);
    const int64_t V = logits->shape[1], step = fm_cross_entropy_lowp_rows(V);
    double total = 0;
    fm_status st = FM_OK;
    for (int64_t r0 = 0; st == FM_OK && r0 < n; r0 += step) {
        const int64_t k = n - r0 < step ? n - r0 : step;
        fm_tensor *xs = fm_narrow(logits, 0, r0, k), *ts = fm_narrow(target, 0, r0, k);
        fm_tensor *x32 = xs ? fm_to_dtype(xs, FM_F32) : NULL;
        fm_tensor *l = x32 && ts ? fm_cross_entropy(x32, ts, ignore_index, label_smoothing, FM_REDUCE_SUM) : NULL;
        if (l) total += fm_tensor_item(l);
        else st = fm_last_status();
        fm_tensor_release_n(4, xs, ts, x32, l);
    }
    fm_set_grad_enabled(prev);
    fm_tensor *loss = st == FM_OK ? fm_tensor_full(0, NULL, total / (double)count, FM_F32, fm_tensor_device(logits)) : NULL;
    if (!loss) return NULL;
    fm_node *nd = fm_node_begin(FM_OP_CROSS_ENTROPY, 2, (fm_tensor *[]){logits, target}, cel_backward);
    if (nd) {
        nd->name = "cross_entropy_lowp";
        cel_attrs at = {ignore_index, count, label_smoothing};
        FM_NODE_SET_ATTRS(nd, at);
        fm_node_save(nd, 0, logits);
        fm_node_save(nd, 1, target);
        fm_node_finish(nd, 1, &loss);
    }
    return loss;
}
