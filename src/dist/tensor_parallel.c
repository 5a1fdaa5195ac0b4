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
 * check device through host copies, the CPU's bits). The vocabulary-parallel
 * cross-entropy and the shard/gather of parameters and state (set-up and checkpoints)
 * run on host copies: the loss copies this rank's logits [N, V/T] to the host and its
 * gradient back each step (a cost on a GPU, not yet a kernel there). */
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

/* A device other than the CPU and the meta device (the planner's, shapes only): shard,
 * gather and the loss go through host copies there. */
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
 * the maximum over the whole vocabulary (all-gather of the N local maxima), the sum
 * of exp(logit - max) and the target's logit (its owner's value, 0 elsewhere) summed
 * over the group in double; loss = log(sum) + max - target logit. The logits are
 * never gathered; backward needs no communication: d/dlogit = softmax - onehot. */
typedef struct tp_ce_attrs {
    int64_t start, count; /* vocabulary offset of this rank's columns; rows with a target */
} tp_ce_attrs;

static fm_status ce_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    const tp_ce_attrs *a = FM_NODE_ATTRS(n, tp_ce_attrs);
    fm_tensor *lg = n->saved[0], *tg = n->saved[1], *lse = n->saved[2];
    const int64_t rows = lg->shape[0], V = lg->shape[1];
    gin[0] = fm_tensor_zeros(2, lg->shape, FM_F32, fm_tensor_device(lg));
    if (!gin[0]) return fm_last_status();
    const double g = gout[0] ? fm_tensor_item(gout[0]) : 0.0, k = a->count > 0 ? g / (double)a->count : 0.0;
    const float *l = fm_tensor_data(lg);
    const int64_t *t = fm_tensor_data(tg);
    const double *s = fm_tensor_data(lse);
    if (fm_tensor_device(lg).type == FM_DEV_META) return FM_OK; /* the planner: no values */
    float *o = fm_tensor_data(gin[0]);
    for (int64_t i = 0; i < rows && k != 0; i++) {
        if (t[i] < 0) continue;
        for (int64_t j = 0; j < V; j++)
            o[i * V + j] = (float)(k * (exp((double)l[i * V + j] - s[i]) - (t[i] == a->start + j ? 1.0 : 0.0)));
    }
    return FM_OK;
}

/* Per row: the group's max (into mx), then sum-exp and the target's logit summed over
 * the group; lse = max + log(sum); *loss = mean over rows with a target. */
static fm_status ce_rows(fm_dist *tp, const float *l, const int64_t *t, int64_t rows, int64_t V, int64_t start,
                         double *lse, double *loss, int64_t *count) {
    const int T = tp->size;
    float *mx = malloc(sizeof(float) * (size_t)(rows * (T + 1) + 1));
    double *st2 = malloc(sizeof(double) * (size_t)(2 * rows + 1));
    fm_status st = mx && st2 ? FM_OK : fm_set_error(FM_ERR_OOM, "tp_cross_entropy: out of memory");
    for (int64_t i = 0; st == FM_OK && i < rows; i++) {
        float m = -INFINITY;
        for (int64_t j = 0; j < V; j++) m = fmaxf(m, l[i * V + j]);
        mx[i] = m;
    }
    if (st == FM_OK) st = fm_dist_allgather_f32(tp, mx, mx + rows, rows);
    for (int64_t i = 0; st == FM_OK && i < rows; i++) {
        float m = mx[rows + i];
        for (int r = 1; r < T; r++) m = fmaxf(m, mx[rows + (int64_t)r * rows + i]);
        double se = 0;
        for (int64_t j = 0; j < V; j++) se += exp((double)l[i * V + j] - m);
        st2[2 * i] = se;
        st2[2 * i + 1] = t[i] >= start && t[i] < start + V ? (double)l[i * V + (t[i] - start)] : 0.0;
        lse[i] = m; /* the max for now */
    }
    if (st == FM_OK) st = fm_dist_allreduce_sum_f64(tp, st2, 2 * rows);
    double sum = 0;
    int64_t c = 0;
    for (int64_t i = 0; st == FM_OK && i < rows; i++) {
        lse[i] += log(st2[2 * i]);
        if (t[i] < 0) continue;
        sum += lse[i] - st2[2 * i + 1];
        c++;
    }
    *loss = c ? sum / (double)c : NAN;
    *count = c;
    if (!tp->broken) { free(mx); free(st2); }
    return st;
}

static fm_tensor *tp_ce(fm_dist *tp, fm_tensor *logits, fm_tensor *targets, int64_t vocab_start, int64_t vocab_size);

fm_tensor *fm_tp_cross_entropy(fm_dist *tp, fm_tensor *logits0, fm_tensor *targets, int64_t vocab_start,
                               int64_t vocab_size) {
    /* the loss in f32 (as autocast runs one process's cross-entropy): bf16/fp16 logits widened */
    fm_tensor *logits = tp_f32("tp_cross_entropy", tp, logits0);
    if (!logits) return NULL;
    if (!off_host(logits)) {
        fm_tensor *out = tp_ce(tp, logits, targets, vocab_start, vocab_size);
        fm_tensor_release(logits);
        return out;
    }
    /* on a device: the loss of host copies (the copy of the logits is on the tape, so their
     * gradient goes back to the device), and the loss back on the device */
    fm_tensor *lh = fm_tensor_to(logits, FM_CPU), *th = lh && targets ? fm_tensor_to(targets, FM_CPU) : NULL;
    fm_tensor *lossh = th ? tp_ce(tp, lh, th, vocab_start, vocab_size) : NULL;
    fm_tensor *out = lossh ? fm_tensor_to(lossh, fm_tensor_device(logits)) : NULL;
    if (!th && lh && !targets) fm_set_error(FM_ERR_INVALID, "tp_cross_entropy: targets are NULL");
    fm_tensor_release_n(4, logits, lh, th, lossh);
    return out;
}

static fm_tensor *tp_ce(fm_dist *tp, fm_tensor *logits, fm_tensor *targets, int64_t vocab_start, int64_t vocab_size) {
    if (logits->ndim != 2 || !targets || targets->ndim != 1 || targets->shape[0] != logits->shape[0] ||
        logits->shape[1] * tp->size != vocab_size || vocab_start != (int64_t)tp->rank * logits->shape[1]) {
        fm_set_error(FM_ERR_INVALID, "tp_cross_entropy: needs logits [N, %lld/%d] (this rank's vocabulary rows from "
                     "%lld) and targets [N]", (long long)vocab_size, tp->size, (long long)vocab_start);
        return NULL;
    }
    const int64_t rows = logits->shape[0], V = logits->shape[1];
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *lc = fm_clone(logits), *tg = fm_to_dtype(targets, FM_I64);
    fm_tensor *tc = tg ? fm_contiguous(tg) : NULL;
    fm_set_grad_enabled(prev);
    fm_tensor *lse = fm_tensor_empty(1, &rows, FM_F64, fm_tensor_device(logits)), *out = NULL;
    const bool meta = fm_tensor_device(logits).type == FM_DEV_META; /* the planner: shapes and memory only */
    const int64_t *t = tc && !meta ? fm_tensor_data(tc) : NULL;
    fm_status st = lc && tc && lse ? FM_OK : fm_last_status();
    for (int64_t i = 0; st == FM_OK && !meta && i < rows; i++)
        if (t[i] < -1 || t[i] >= vocab_size)
            st = fm_set_error(FM_ERR_INVALID, "tp_cross_entropy: target %lld at row %lld is outside 0..%lld (or -1 "
                              "to ignore)", (long long)t[i], (long long)i, (long long)vocab_size - 1);
    double loss = 0;
    tp_ce_attrs a = {vocab_start, 0};
    /* every rank joins the collectives, even with a bad target of its own */
    if (meta) a.count = rows;
    fm_status cst = meta ? st : lc && tc && lse ? ce_rows(tp, fm_tensor_data(lc), t, rows, V, vocab_start, fm_tensor_data(lse), &loss,
                                              &a.count)
                                    : st;
    if (st == FM_OK) st = cst;
    if (st == FM_OK && (out = fm_tensor_scalar(loss, FM_F32))) {
        fm_node *n = fm_node_begin(FM_OP_CROSS_ENTROPY, 1, &logits, ce_backward);
        if (n) {
            n->name = "tp_cross_entropy";
            fm_node_save(n, 0, lc);
            fm_node_save(n, 1, tc);
            fm_node_save(n, 2, lse);
            FM_NODE_SET_ATTRS(n, a);
            fm_node_finish(n, 1, &out);
        }
    }
    fm_tensor_release_n(4, lc, tg, tc, lse);
    return out;
}
