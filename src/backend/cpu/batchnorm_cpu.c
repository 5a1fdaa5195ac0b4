/* CPU kernels for batch norm and its backward: per-channel statistics and sums
 * in double over x viewed as [outer, C, inner], then one elementwise pass (the
 * loops are in batchnorm_loops.h). */
#include <math.h>
#include <string.h>

#include "backend/cpu/conv_avx2.h"
#include "backend/cpu/conv_shared.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

/* x viewed as [outer, C, inner]: NCHW [N, C, *] has outer = N; NHWC (channels
 * last) has inner = 1. Per-channel sums are accumulated in double. For inner == 1
 * the rows are split into fixed 256-row blocks whose partial sums are added in
 * order, so the result is the same for any thread count. */
typedef struct bn_job {
    int64_t outer, C, inner;
    const void *x, *w, *b, *dy;
    void *y, *dx;
    const double *mean, *rstd;      /* per channel, double copies */
    double *part;                   /* [nblk, 2, C] partial sums (inner == 1) */
    const double *coef;             /* backward per-channel coefficients [3, C] */
} bn_job;

#define BN_ROWS 256

/* The loops, once per element type (batchnorm_loops.h). */
#define T float
#define SFX(name) name##_f32
#include "backend/cpu/batchnorm_loops.h"
#undef T
#undef SFX
#define T double
#define SFX(name) name##_f64
#include "backend/cpu/batchnorm_loops.h"
#undef T
#undef SFX

static void bn_shape(const fm_tensor *x, fm_layout layout, int64_t *outer, int64_t *C, int64_t *inner) {
    if (layout == FM_NHWC) {
        *C = x->shape[x->ndim - 1];
        *inner = 1;
        *outer = *C ? fm_tensor_numel(x) / *C : 0;
    } else {
        *outer = x->shape[0];
        *C = x->shape[1];
        *inner = 1;
        for (int d = 2; d < x->ndim; d++) *inner *= x->shape[d];
    }
}

static double getd(const fm_tensor *t, int64_t i) {
    return t->dtype == FM_F32 ? (double)((const float *)fm_tensor_data(t))[i] : ((const double *)fm_tensor_data(t))[i];
}
static void setd(fm_tensor *t, int64_t i, double v) {
    if (t->dtype == FM_F32) ((float *)fm_tensor_data(t))[i] = (float)v;
    else ((double *)fm_tensor_data(t))[i] = v;
}

/* Per-channel sums over [outer, C, inner] into part[0..C) and part[C..2C): for
 * pass "stats" (dy == NULL) mean and biased variance; for "bsum" sum(dy) and
 * sum(dy * xhat). `mean`/`rstd` are needed by the second kind. */
static fm_status bn_reduce(bn_job *j, bool f32, bool backward, double *out2c) {
    j->part = out2c;
    if (j->inner != 1 || j->outer == 0) {
        if (j->inner == 0 || j->outer == 0) { memset(out2c, 0, (size_t)(2 * j->C) * sizeof(double)); return FM_OK; }
        fm_range_fn fn = backward ? (f32 ? bn_bsum_nchw_f32 : bn_bsum_nchw_f64) : (f32 ? bn_stats_nchw_f32 : bn_stats_nchw_f64);
        fm_parallel_for(j->C, grain_for(0, j->outer * j->inner), fn, j);
        return FM_OK;
    }
    int64_t nblk = (j->outer + BN_ROWS - 1) / BN_ROWS;
    fm_tensor *pt = scratch(nblk * 2 * j->C, FM_F64);
    if (!pt) return fm_last_status();
    double *p = fm_tensor_data(pt);
    j->part = p;
    double M = (double)j->outer;
    if (backward) {
        fm_parallel_for(nblk, 1, f32 ? bn_bsum_rows_f32 : bn_bsum_rows_f64, j);
        for (int64_t c = 0; c < 2 * j->C; c++) {
            double s = 0;
            for (int64_t blk = 0; blk < nblk; blk++) s += p[blk * 2 * j->C + c];
            out2c[c] = s;
        }
        for (int64_t c = 0; c < j->C; c++) out2c[j->C + c] *= j->rstd[c];
    } else {
        const double *saved_mean = j->mean;
        j->mean = NULL;
        fm_parallel_for(nblk, 1, f32 ? bn_rows_sum_f32 : bn_rows_sum_f64, j);
        for (int64_t c = 0; c < j->C; c++) {
            double s = 0;
            for (int64_t blk = 0; blk < nblk; blk++) s += p[blk * j->C + c];
            out2c[c] = s / M;
        }
        j->mean = out2c;
        fm_parallel_for(nblk, 1, f32 ? bn_rows_sum_f32 : bn_rows_sum_f64, j);
        for (int64_t c = 0; c < j->C; c++) {
            double s = 0;
            for (int64_t blk = 0; blk < nblk; blk++) s += p[blk * j->C + c];
            out2c[j->C + c] = s / M;
        }
        j->mean = saved_mean;
    }
    j->part = out2c;
    fm_tensor_release(pt);
    return FM_OK;
}

static fm_status batch_norm_kernel(const fm_op_call *c) {
    const fm_bn_attrs *a = c->attrs;
    fm_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2], *rm = c->in[3], *rv = c->in[4];
    fm_tensor *y = c->out[0], *smean = c->out[1], *srstd = c->out[2];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    bool f32 = x->dtype == FM_F32;
    bn_job j = {.x = fm_tensor_data(x), .w = w ? fm_tensor_data(w) : NULL, .b = b ? fm_tensor_data(b) : NULL,
                .y = fm_tensor_data(y)};
    bn_shape(x, a->layout, &j.outer, &j.C, &j.inner);
    fm_tensor *st = scratch(4 * j.C, FM_F64); /* mean, var, rstd, spare */
    if (!st) return fm_last_status();
    double *mean = fm_tensor_data(st), *var = mean + j.C, *rstd = mean + 2 * j.C;
    if (a->training) {
        fm_status s = bn_reduce(&j, f32, false, mean);
        if (s != FM_OK) { fm_tensor_release(st); return s; }
        double M = (double)(j.outer * j.inner);
        for (int64_t ch = 0; ch < j.C; ch++) {
            if (rm) setd(rm, ch, (1 - a->momentum) * getd(rm, ch) + a->momentum * mean[ch]);
            if (rv) setd(rv, ch, (1 - a->momentum) * getd(rv, ch) + a->momentum * var[ch] * M / (M - 1));
        }
    } else {
        for (int64_t ch = 0; ch < j.C; ch++) { mean[ch] = getd(rm, ch); var[ch] = getd(rv, ch); }
    }
    for (int64_t ch = 0; ch < j.C; ch++) {
        rstd[ch] = 1.0 / sqrt(var[ch] + a->eps);
        setd(smean, ch, mean[ch]);
        setd(srstd, ch, rstd[ch]);
    }
    j.mean = mean; j.rstd = rstd;
    int64_t items = j.inner == 1 ? j.outer : j.outer * j.C;
    fm_parallel_for(items, grain_for(0, j.inner == 1 ? j.C : j.inner), f32 ? bn_apply_f32 : bn_apply_f64, &j);
    fm_tensor_release(st);
    return FM_OK;
}

static fm_status batch_norm_backward_kernel(const fm_op_call *c) {
    const fm_bn_attrs *a = c->attrs;
    fm_tensor *dy = c->in[0], *x = c->in[1], *w = c->in[2], *smean = c->in[3], *srstd = c->in[4];
    fm_tensor *dx = c->out[0], *dw = c->out[1], *db = c->out[2];
    if (x->dtype != FM_F32 && x->dtype != FM_F64) return fm_cpu_unsupported_dtype(c, x->dtype);
    bool f32 = x->dtype == FM_F32;
    bn_job j = {.x = fm_tensor_data(x), .dy = fm_tensor_data(dy), .dx = dx ? fm_tensor_data(dx) : NULL};
    bn_shape(x, a->layout, &j.outer, &j.C, &j.inner);
    fm_tensor *st = scratch(7 * j.C, FM_F64); /* mean, rstd, sums[2C], coef[3C] */
    if (!st) return fm_last_status();
    double *mean = fm_tensor_data(st), *rstd = mean + j.C, *sums = mean + 2 * j.C, *coef = mean + 4 * j.C;
    for (int64_t ch = 0; ch < j.C; ch++) { mean[ch] = getd(smean, ch); rstd[ch] = getd(srstd, ch); }
    j.mean = mean; j.rstd = rstd;
    fm_status s = bn_reduce(&j, f32, true, sums);
    if (s != FM_OK) { fm_tensor_release(st); return s; }
    double M = (double)(j.outer * j.inner);
    for (int64_t ch = 0; ch < j.C; ch++) {
        if (dw) setd(dw, ch, sums[j.C + ch]);
        if (db) setd(db, ch, sums[ch]);
        double wc = w ? getd(w, ch) : 1.0, r = rstd[ch];
        if (a->training) { /* dx = w*r*(dy - mean(dy) - xhat*mean(dy*xhat)) */
            coef[ch] = wc * r;
            coef[j.C + ch] = -wc * r * r * sums[j.C + ch] / M;
            coef[2 * j.C + ch] = -wc * r * sums[ch] / M;
        } else {
            coef[ch] = wc * r; coef[j.C + ch] = 0; coef[2 * j.C + ch] = 0;
        }
    }
    j.coef = coef;
    if (dx) {
        int64_t items = j.inner == 1 ? j.outer : j.outer * j.C;
        fm_parallel_for(items, grain_for(0, j.inner == 1 ? j.C : j.inner), f32 ? bn_dx_f32 : bn_dx_f64, &j);
    }
    fm_tensor_release(st);
    return FM_OK;
}

void fm_cpu_kernels_batch_norm(fm_backend *b) {
    b->kernels[FM_OP_BATCH_NORM] = batch_norm_kernel;
    b->kernels[FM_OP_BATCH_NORM_BACKWARD] = batch_norm_backward_kernel;
}
