/* Tensor parallelism (Megatron style): process groups, the two conjugate autograd
 * ops that bracket a column-parallel/row-parallel pair of linears, and the
 * mapping between a full parameter and its shards.
 *
 *   y = W2 f(g(x W1^T)) with W1 split by rows (columns of the output) and W2 by columns:
 *   tp_copy   before the column-parallel linear: identity forward, all-reduce (sum)
 *             of the input's gradient backward (each rank holds a partial gradient);
 *   tp_reduce after the row-parallel linear: all-reduce (sum) of the partial outputs
 *             forward, identity backward (the gradient is already whole on every rank).
 * Sums go through the communicator (src/dist/comm.c: rank order, in double), so a
 * result does not depend on timing and matches one process to rounding.
 *
 * On a device: the two ops' sums are all-reduces of tensors there (NCCL on CUDA; the
 * check device through host copies, the CPU's bits); the vocabulary-parallel
 * cross-entropy is ops on the logits' device. The shard/gather of parameters and
 * state (set-up and checkpoints) runs on host copies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/node.h"
#include "core/tensor_internal.h"
#include "dist/dist_internal.h"
#include "fathom/autograd.h"
#include "fathom/ops.h"

/* ---- groups ---- */

fm_status fm_dist_split(fm_dist *d, int color, fm_dist **out) {
    if (!d || !out || color < 0) return fm_set_error(FM_ERR_INVALID, "dist split: need a communicator, out and a color >= 0");
    *out = NULL;
    fm_dist *g = calloc(1, sizeof *g);
    if (!g) return fm_set_error(FM_ERR_OOM, "dist split: out of memory");
    g->size = 1;
    g->timeout_s = d->timeout_s;
    g->local_rank = d->local_rank;
    g->local_size = d->local_size;
#if FATHOM_HAVE_MPI
    if (d->mpi) {
        int rc = MPI_Comm_split(d->comm, color, d->rank, &g->comm);
        if (rc != MPI_SUCCESS) {
            free(g);
            char msg[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(rc, msg, &len);
            return fm_set_error(FM_ERR_IO, "dist split: MPI error: %.*s", len, msg);
        }
        MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
        MPI_Comm_rank(g->comm, &g->rank);
        MPI_Comm_size(g->comm, &g->size);
        g->mpi = true;
    }
#endif
    *out = g;
    return FM_OK;
}

fm_status fm_dist_allreduce_sum_f32(fm_dist *d, float *buf, int64_t n) {
    if (!d) return fm_set_error(FM_ERR_INVALID, "all-reduce: communicator is NULL");
    if (d->size == 1 || d->sim) return FM_OK;
    dist_work w;
    memset(&w, 0, sizeof w);
    w.kind = DIST_ALLREDUCE;
    w.what = "tensor-parallel all-reduce";
    w.average = false;
    fm_status st = dist_work_start(&w, d, buf, buf, n);
    if (st == FM_OK) st = dist_work_wait(&w);
    if (!d->broken) dist_work_free(&w); /* after a timeout MPI may still write into the buffers */
    return st;
}

/* ---- the conjugate ops ---- */

static fm_status tp_check(const char *op, const fm_dist *tp, const fm_tensor *x) {
    if (!tp || !x) return fm_set_error(FM_ERR_INVALID, "%s: needs a communicator and a tensor", op);
    if (x->dtype != FM_F32 && x->dtype != FM_BF16 && x->dtype != FM_F16)
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: tensor parallelism runs on f32, bf16 or fp16 tensors (got %s)", op,
                            fm_dtype_name(x->dtype));
    return FM_OK;
}

/* A device other than the CPU and the meta device (the planner's, shapes only): shard
 * and gather go through host copies there. */
static bool off_host(const fm_tensor *t) {
    fm_device_type k = fm_tensor_device(t).type;
    return k != FM_DEV_CPU && k != FM_DEV_META;
}

/* f(t's host copy) back on t's device (f's result is a new reference, or NULL). */
static fm_tensor *via_host(fm_tensor *t, fm_tensor *(*f)(fm_tensor *h, void *ctx), void *ctx) {
    fm_tensor *h = fm_tensor_to(t, FM_CPU), *r = h ? f(h, ctx) : NULL, *out = r ? fm_tensor_to(r, fm_tensor_device(t)) : NULL;
    fm_tensor_release_n(2, h, r);
    return out;
}

/* x as f32, on the tape: a bf16 or fp16 activation (autocast's linear outputs) is
 * widened exactly before its values cross ranks, so the sums are those of f32 (in double) and
 * the gradient flows back through the cast. An f32 x is x itself (retained). */
static fm_tensor *tp_f32(const char *op, const fm_dist *tp, fm_tensor *x) {
    if (tp_check(op, tp, x)) return NULL;
    return fm_to_dtype(x, FM_F32);
}

typedef struct tp_attrs {
    fm_dist *tp;
} tp_attrs;

/* A contiguous copy of t (no tape) summed over the group in place. */
static fm_tensor *summed_copy(fm_dist *tp, fm_tensor *t) {
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *c = t->dtype == FM_F32 ? fm_clone(t) : fm_to_dtype(t, FM_F32); /* (a bf16/fp16 gradient: widened) */
    fm_set_grad_enabled(prev);
    if (c && fm_dist_allreduce_sum_tensor(tp, c) != FM_OK) {
        fm_tensor_release(c);
        return NULL;
    }
    return c;
}

static fm_status copy_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    fm_dist *tp = FM_NODE_ATTRS(n, tp_attrs)->tp;
    /* every rank takes part, even one whose output got no gradient */
    fm_tensor *z = gout[0] ? NULL : fm_tensor_zeros(n->out_ndim[0], n->out_shape[0], FM_F32, n->out_device[0]);
    gin[0] = summed_copy(tp, gout[0] ? gout[0] : z);
    fm_tensor_release(z);
    return gin[0] ? FM_OK : fm_last_status();
}

static fm_status reduce_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    gin[0] = gout[0] ? fm_tensor_retain(gout[0])
                     : fm_tensor_zeros(n->out_ndim[0], n->out_shape[0], FM_F32, n->out_device[0]);
    return gin[0] ? FM_OK : fm_last_status();
}

fm_tensor *fm_tp_copy(fm_dist *tp, fm_tensor *x0) {
    fm_tensor *x = tp_f32("tp_copy", tp, x0), *y = x ? fm_alias(x) : NULL;
    if (!y) { fm_tensor_release(x); return NULL; }
    fm_node *n = fm_node_begin(FM_OP_COPY, 1, &x, copy_backward);
    if (n) {
        tp_attrs a = {tp};
        n->name = "tp_copy";
        FM_NODE_SET_ATTRS(n, a);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release(x);
    return y;
}

fm_tensor *fm_tp_reduce(fm_dist *tp, fm_tensor *x0) {
    fm_tensor *x = tp_f32("tp_reduce", tp, x0), *y = x ? summed_copy(tp, x) : NULL;
    if (!y) { fm_tensor_release(x); return NULL; }
    fm_node *n = fm_node_begin(FM_OP_COPY, 1, &x, reduce_backward);
    if (n) {
        tp_attrs a = {tp};
        n->name = "tp_reduce";
        FM_NODE_SET_ATTRS(n, a);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release(x);
    return y;
}

/* ---- shards of a parameter ---- */

static fm_status split_check(const fm_tp_split *s, const fm_tensor *t, int parts, int64_t *len) {
    if (!s || !t || parts < 1 || s->dim < 0 || s->dim >= t->ndim || t->ndim > 2 || s->n_seg < 1 ||
        s->n_seg > FM_TP_MAX_SEG)
        return fm_set_error(FM_ERR_INVALID, "tensor parallel: bad split (dim %d, %d segments) of a %d-D tensor",
                            s ? s->dim : -1, s ? s->n_seg : 0, t ? t->ndim : 0);
    int64_t total = 0;
    for (int k = 0; k < s->n_seg; k++) {
        if (s->seg[k] < 1 || s->seg[k] % parts)
            return fm_set_error(FM_ERR_INVALID, "tensor parallel: a segment of %lld does not split into %d equal parts",
                                (long long)s->seg[k], parts);
        total += s->seg[k];
    }
    *len = total;
    return FM_OK;
}

/* Copies between a full [rows, cols] buffer and rank r's shard of it (to_shard: full ->
 * shard). The split dimension holds the segments; rank r owns part r of each. */
static void shard_copy(const fm_tp_split *s, int64_t rows, int64_t cols, int parts, int r, float *full, float *shard,
                       bool to_shard) {
    const int64_t lcols = s->dim == 1 ? cols / parts : cols;
    int64_t foff = 0, loff = 0;
    for (int k = 0; k < s->n_seg; k++) {
        const int64_t part = s->seg[k] / parts, src = foff + (int64_t)r * part;
        if (s->dim == 0) {
            float *f = full + src * cols, *l = shard + loff * cols;
            if (to_shard) memcpy(l, f, sizeof(float) * (size_t)(part * cols));
            else memcpy(f, l, sizeof(float) * (size_t)(part * cols));
        } else {
            for (int64_t i = 0; i < rows; i++) {
                float *f = full + i * cols + src, *l = shard + i * lcols + loff;
                if (to_shard) memcpy(l, f, sizeof(float) * (size_t)part);
                else memcpy(f, l, sizeof(float) * (size_t)part);
            }
        }
        foff += s->seg[k];
        loff += part;
    }
}

static void dims2(const fm_tensor *t, int64_t *rows, int64_t *cols) {
    *rows = t->shape[0];
    *cols = t->ndim == 2 ? t->shape[1] : 1;
}

typedef struct shard_args {
    int parts, rank;
    const fm_tp_split *s;
    fm_dist *tp;
} shard_args;

static fm_tensor *shard_host(fm_tensor *h, void *ctx) {
    const shard_args *a = ctx;
    return fm_tp_shard(a->parts, a->rank, h, a->s);
}

fm_tensor *fm_tp_shard(int parts, int rank, fm_tensor *full, const fm_tp_split *s) {
    int64_t len = 0;
    if (split_check(s, full, parts, &len)) return NULL;
    if (off_host(full) && full->dtype == FM_F32) return via_host(full, shard_host, &(shard_args){parts, rank, s, NULL});
    const bool meta = fm_tensor_device(full).type == FM_DEV_META; /* shapes only */
    if (full->shape[s->dim] != len || full->dtype != FM_F32 || rank < 0 || rank >= parts) {
        fm_set_error(FM_ERR_INVALID, "tensor parallel: cannot take shard %d of %d of a tensor of %lld along dim %d "
                     "(the split covers %lld; f32 tensors only)", rank, parts, (long long)full->shape[s->dim],
                     s->dim, (long long)len);
        return NULL;
    }
    fm_tensor *c = fm_contiguous(full);
    int64_t shape[2] = {full->shape[0], full->ndim == 2 ? full->shape[1] : 1}, rows, cols;
    dims2(full, &rows, &cols);
    shape[s->dim] /= parts;
    fm_tensor *out = c ? fm_tensor_empty(full->ndim, shape, FM_F32, fm_tensor_device(full)) : NULL;
    if (out && !meta) shard_copy(s, rows, cols, parts, rank, fm_tensor_data(c), fm_tensor_data(out), true);
    fm_tensor_release(c);
    return out;
}

static fm_tensor *gather_host(fm_tensor *h, void *ctx) {
    const shard_args *a = ctx;
    return fm_tp_gather(a->tp, h, a->s);
}

fm_tensor *fm_tp_gather(fm_dist *tp, fm_tensor *local, const fm_tp_split *s) {
    if (tp_check("tp_gather", tp, local)) return NULL;
    if (off_host(local)) return via_host(local, gather_host, &(shard_args){0, 0, s, tp});
    const int T = tp->size;
    int64_t len = 0, rows, cols;
    if (split_check(s, local, T, &len)) return NULL;
    if (local->shape[s->dim] * T != len) {
        fm_set_error(FM_ERR_INVALID, "tensor parallel: a shard of %lld along dim %d is not 1/%d of %lld",
                     (long long)local->shape[s->dim], s->dim, T, (long long)len);
        return NULL;
    }
    int64_t shape[2] = {local->shape[0], local->ndim == 2 ? local->shape[1] : 1}, n = fm_tensor_numel(local);
    shape[s->dim] = len;
    fm_tensor *c = fm_contiguous(local);
    fm_tensor *out = c ? fm_tensor_empty(local->ndim, shape, FM_F32, fm_tensor_device(local)) : NULL;
    float *all = out ? malloc(sizeof(float) * (size_t)(n * T + 1)) : NULL;
    fm_status st = !out ? fm_last_status() : !all ? fm_set_error(FM_ERR_OOM, "tp_gather: out of memory") : FM_OK;
    if (st == FM_OK) st = fm_dist_allgather_f32(tp, fm_tensor_data(c), all, n);
    if (st == FM_OK && fm_tensor_device(local).type != FM_DEV_META) {
        dims2(out, &rows, &cols);
        for (int r = 0; r < T; r++) shard_copy(s, rows, cols, T, r, fm_tensor_data(out), all + (int64_t)r * n, false);
    }
    if (!tp->broken) free(all);
    fm_tensor_release(c);
    if (st != FM_OK) { fm_tensor_release(out); return NULL; }
    return out;
}

fm_tensor *fm_tp_unshard(int parts, fm_tensor *const *shards, const fm_tp_split *s) {
    int64_t len = 0, rows, cols;
    if (!shards || parts < 1 || !shards[0]) {
        fm_set_error(FM_ERR_INVALID, "tensor parallel: unshard needs %d shards", parts);
        return NULL;
    }
    if (split_check(s, shards[0], parts, &len)) return NULL;
    fm_tensor *first = shards[0];
    for (int r = 0; r < parts; r++) {
        fm_tensor *t = shards[r];
        if (!t || t->dtype != FM_F32 || fm_tensor_device(t).type != FM_DEV_CPU || t->ndim != first->ndim ||
            memcmp(t->shape, first->shape, sizeof(int64_t) * (size_t)t->ndim) || t->shape[s->dim] * parts != len) {
            fm_set_error(FM_ERR_INVALID, "tensor parallel: shard %d of %d is not an f32 CPU tensor of 1/%d of %lld along "
                         "dim %d, shaped as shard 0", r, parts, parts, (long long)len, s->dim);
            return NULL;
        }
    }
    int64_t shape[2] = {first->shape[0], first->ndim == 2 ? first->shape[1] : 1};
    shape[s->dim] = len;
    fm_tensor *out = fm_tensor_empty(first->ndim, shape, FM_F32, FM_CPU);
    if (!out) return NULL;
    dims2(out, &rows, &cols);
    for (int r = 0; r < parts; r++) {
        fm_tensor *c = fm_contiguous(shards[r]);
        if (!c) { fm_tensor_release(out); return NULL; }
        shard_copy(s, rows, cols, parts, r, fm_tensor_data(out), fm_tensor_data(c), false);
        fm_tensor_release(c);
    }
    return out;
}

/* ---- vocabulary-parallel cross-entropy ----
 * Each rank holds logits [N, V/T] for vocabulary rows [start, start + V/T). Per row:
 * the maximum over the whole vocabulary (all-gather of the N local maxima; a constant
 * shift, off the tape), the sum of exp(logit - max) and the target's shifted logit (its
 * owner's value, 0 elsewhere), each summed over the group by fm_tp_reduce (all-reduce
 * forward, identity backward: every rank's loss is the same, so each gets the whole
 * gradient of its own part); loss = mean over rows with a target of log(sum) - target.
 * The logits are never gathered, and it is all ops on the logits' device (autograd
 * gives d/dlogit = softmax - onehot): no copy to the host but the targets' check.
 * Rows with target -1 count for nothing. */
fm_tensor *fm_tp_cross_entropy(fm_dist *tp, fm_tensor *logits0, fm_tensor *targets, int64_t vocab_start,
                               int64_t vocab_size) {
    /* the loss in f32 (as autocast runs one process's cross-entropy): bf16/fp16 logits widened */
    fm_tensor *logits = tp_f32("tp_cross_entropy", tp, logits0);
    if (!logits) return NULL;
    if (logits->ndim != 2 || !targets || targets->ndim != 1 || targets->shape[0] != logits->shape[0] ||
        logits->shape[1] * tp->size != vocab_size || vocab_start != (int64_t)tp->rank * logits->shape[1]) {
        fm_tensor_release(logits);
        fm_set_error(FM_ERR_INVALID, "tp_cross_entropy: needs logits [N, %lld/%d] (this rank's vocabulary rows from "
                     "%lld) and targets [N]", (long long)vocab_size, tp->size, (long long)vocab_start);
        return NULL;
    }
    const int64_t N = logits->shape[0], V = logits->shape[1];
    const fm_device dev = fm_tensor_device(logits);
    const bool meta = dev.type == FM_DEV_META; /* the planner: shapes and memory only */
    /* the targets on the host: checked, then this rank's column of each (0 where another
     * rank owns it), whether it does, and whether the row counts */
    int64_t *idx = calloc((size_t)(N > 0 ? N : 1), sizeof(int64_t));
    float *own = calloc((size_t)(N > 0 ? N : 1), sizeof(float)), *valid = calloc((size_t)(N > 0 ? N : 1), sizeof(float));
    fm_status st = idx && own && valid ? FM_OK : fm_set_error(FM_ERR_OOM, "tp_cross_entropy: out of host memory");
    int64_t count = meta ? N : 0, bad_row = -1, bad_target = 0;
    if (st == FM_OK && !meta) {
        int64_t *t = idx; /* read in place, then rewritten row by row */
        st = fm_tensor_copy_to_host(targets, t, FM_I64);
        for (int64_t i = 0; st == FM_OK && i < N; i++) {
            if (t[i] < -1 || t[i] >= vocab_size) { /* the row counts for nothing; the error is returned at the end */
                if (bad_row < 0) bad_row = i, bad_target = t[i];
                valid[i] = own[i] = 0.0f;
                idx[i] = 0;
                continue;
            }
            const bool mine = t[i] >= vocab_start && t[i] < vocab_start + V;
            valid[i] = t[i] >= 0 ? 1.0f : 0.0f;
            count += t[i] >= 0;
            own[i] = mine ? 1.0f : 0.0f;
            idx[i] = mine ? t[i] - vocab_start : 0;
        }
    }
    fm_tensor *hidx = NULL, *hown = NULL, *hval = NULL, *tidx = NULL, *town = NULL, *tval = NULL;
    fm_tensor *mloc = NULL, *all = NULL, *m = NULL, *sh = NULL, *e = NULL, *sl = NULL, *s = NULL, *g = NULL, *gm = NULL;
    fm_tensor *g1 = NULL, *tl = NULL, *ls = NULL, *li = NULL, *lv = NULL, *sum = NULL, *out = NULL;
    if (st == FM_OK) {
        const int64_t n2[2] = {N, 1};
        hidx = fm_tensor_from_data(idx, 2, n2, FM_I64);
        hown = fm_tensor_from_data(own, 1, &N, FM_F32);
        hval = fm_tensor_from_data(valid, 1, &N, FM_F32);
        tidx = hidx ? fm_tensor_to(hidx, dev) : NULL;
        town = hown ? fm_tensor_to(hown, dev) : NULL;
        tval = hval ? fm_tensor_to(hval, dev) : NULL;
        if (!tidx || !town || !tval) st = fm_last_status();
    }
    /* a rank with a bad target of its own joins every collective below (that row counts for
     * nothing), then returns its error: the other ranks are not left waiting in a sum */
    const int ax1[1] = {1}, ax0[1] = {0};
    bool prev = fm_set_grad_enabled(false);
    mloc = fm_amax(logits, 1, ax1, false); /* [N]: the shift, off the tape */
    int64_t TN[2] = {tp->size, N};
    all = mloc ? fm_tensor_empty(2, TN, FM_F32, dev) : NULL;
    fm_status cst = !all ? fm_last_status() : meta ? FM_OK : fm_dist_allgather_tensor(tp, mloc, all);
    m = cst == FM_OK ? fm_amax(all, 1, ax0, true) : NULL; /* [1, N] */
    fm_set_grad_enabled(prev);
    if (st == FM_OK) st = cst;
    fm_tensor *mcol = m ? fm_reshape(m, 2, (int64_t[]){N, 1}) : NULL;
    if (st == FM_OK && !(mcol && (sh = fm_sub(logits, mcol)) && (e = fm_exp(sh)) && (sl = fm_sum(e, 1, ax1, false))))
        st = fm_last_status();
    s = st == FM_OK ? fm_tp_reduce(tp, sl) : NULL; /* [N]: sum of exp over the whole vocabulary */
    if (st == FM_OK && !(s && (g = fm_gather(sh, 1, tidx)) && (g1 = fm_reshape(g, 1, &N)) && (gm = fm_mul(g1, town))))
        st = fm_last_status();
    tl = st == FM_OK ? fm_tp_reduce(tp, gm) : NULL; /* [N]: the target's shifted logit */
    if (st == FM_OK && !(tl && (ls = fm_log(s)) && (li = fm_sub(ls, tl)) && (lv = fm_mul(li, tval)) && (sum = fm_sum(lv, 0, NULL, false)) &&
                         (out = fm_mul_scalar(sum, count ? 1.0 / (double)count : NAN))))
        st = fm_last_status();
    fm_tensor_release_n(8, hidx, hown, hval, tidx, town, tval, mloc, all);
    fm_tensor_release_n(8, m, mcol, sh, e, sl, s, g, tl);
    fm_tensor_release_n(7, g1, gm, ls, li, lv, sum, logits);
    free(idx);
    free(own);
    free(valid);
    if (st == FM_OK && bad_row >= 0)
        st = fm_set_error(FM_ERR_INVALID, "tp_cross_entropy: target %lld at row %lld is outside 0..%lld (or -1 to ignore)",
                          (long long)bad_target, (long long)bad_row, (long long)vocab_size - 1);
    if (st != FM_OK) { fm_tensor_release(out); return NULL; }
    return out;
}
