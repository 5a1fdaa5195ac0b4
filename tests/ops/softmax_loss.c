/* Tests of softmax, log_softmax, cross_entropy and mse_loss: forward values
 * against references computed here in double, f32 (AVX2 path) gradients
 * against the f64 analytic ones, finite-difference gradient checks in f64 with
 * non-contiguous inputs, thread-count independence, and bad input. Row widths
 * like 37 and 1003 exercise the SIMD kernels' tails. */
#include <math.h>
#include <stdlib.h>

#include "test_util.h"
#include "op_test.h"
#include "gradcheck.h"

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "core/parallel.h" /* fm_set_num_threads: results must not depend on it */

static fm_tensor *sl_randn(int nd, const int64_t *shape, fm_dtype dt, uint64_t seed, double scale) {
    fm_tensor *t = op_randn(nd, shape, dt, seed);
    if (t && scale != 1.0) {
        for (int64_t i = 0; i < fm_tensor_numel(t); i++) fm_tensor_set(t, i, fm_tensor_get(t, i) * scale);
    }
    return t;
}

/* Reference (log_)softmax of a [rows, n] row-major array. */
static void ref_softmax(const double *x, double *y, int64_t rows, int64_t n, int log_mode) {
    for (int64_t r = 0; r < rows; r++) {
        const double *a = x + r * n;
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < n; i++) m = a[i] > m ? a[i] : m;
        for (int64_t i = 0; i < n; i++) s += exp(a[i] - m);
        for (int64_t i = 0; i < n; i++) y[r * n + i] = log_mode ? a[i] - m - log(s) : exp(a[i] - m) / s;
    }
}

/* fn(x) along the last axis of a contiguous copy vs the reference */
static void check_softmax_case(int log_mode, fm_tensor *x, int axis, double tol, const char *what) {
    fm_tensor *y = log_mode ? fm_log_softmax(x, axis) : fm_softmax(x, axis);
    CHECK_MSG(y != NULL, "%s: %s", what, fm_last_error());
    if (!y) return;
    CHECK(y->ndim == x->ndim && y->dtype == x->dtype);
    /* reference: move the axis last, run per row, compare through the same view */
    int ax = axis < 0 ? axis + x->ndim : axis;
    fm_tensor *xt = x->ndim ? fm_transpose(x, ax, x->ndim - 1) : fm_tensor_retain(x);
    fm_tensor *yt = y->ndim ? fm_transpose(y, ax, y->ndim - 1) : fm_tensor_retain(y);
    int64_t n = x->ndim ? x->shape[ax] : 1, rows = n ? fm_tensor_numel(x) / n : 0;
    double *hx = op_host(xt), *ref = malloc(sizeof(double) * (size_t)(fm_tensor_numel(x) + 1));
    ref_softmax(hx, ref, rows, n, log_mode);
    double e = op_max_rel_err(yt, ref);
    CHECK_MSG(e <= tol, "%s %s: err %g", log_mode ? "log_softmax" : "softmax", what, e);
    free(hx); free(ref);
    fm_tensor_release_n(3, xt, yt, y);
}

/* Outputs of 8 MiB and more take the non-temporal-store path; its rows must
 * match the same rows computed through the ordinary path (a small copy), bitwise. */
static void check_stream_path(int log_mode) {
    int64_t R = 2048, N = 1024, r = 8;
    fm_tensor *big = sl_randn(2, (int64_t[]){R, N}, FM_F32, 91, 3.0);
    fm_tensor *g = sl_randn(2, (int64_t[]){R, N}, FM_F32, 92, 1.0);
    fm_tensor *nb = fm_narrow(big, 0, 0, r), *ng = fm_narrow(g, 0, 0, r);
    fm_tensor *small = fm_clone(nb), *gs = fm_clone(ng);
    fm_tensor_requires_grad_(big, true);
    fm_tensor_requires_grad_(small, true);
    fm_tensor *yb = log_mode ? fm_log_softmax(big, 1) : fm_softmax(big, 1);
    fm_tensor *ys = log_mode ? fm_log_softmax(small, 1) : fm_softmax(small, 1);
    CHECK(yb && ys && fm_backward(yb, g, false) == FM_OK && fm_backward(ys, gs, false) == FM_OK);
    fm_tensor *yb8 = yb ? fm_narrow(yb, 0, 0, r) : NULL, *db8 = big->grad ? fm_narrow(big->grad, 0, 0, r) : NULL;
    CHECK(op_bitwise_equal(yb8, ys));
    CHECK(op_bitwise_equal(db8, small->grad));
    fm_tensor_release_n(10, big, g, nb, ng, small, gs, yb, ys, yb8, db8);
}

static int softmax_family_forward(int log_mode) {
    OP_BEGIN;
    const char *name = log_mode ? "log_softmax" : "softmax";
    for (int d = 0; d < 2; d++) {
        fm_dtype dt = d ? FM_F64 : FM_F32;
        double tol = d ? 1e-12 : 2e-6;
        int64_t s1[2] = {3, 37}, s2[3] = {2, 3, 4}, s3[2] = {37, 5}, s4[2] = {4, 1003};
        fm_tensor *a = sl_randn(2, s1, dt, 1, 3.0), *b = sl_randn(3, s2, dt, 2, 1.0);
        fm_tensor *c = sl_randn(2, s3, dt, 3, 2.0), *big = sl_randn(2, s4, dt, 4, 10.0);
        check_softmax_case(log_mode, a, -1, tol, "[3,37] last axis");
        check_softmax_case(log_mode, a, 0, tol, "[3,37] axis 0");
        check_softmax_case(log_mode, b, 1, tol, "[2,3,4] axis 1");
        fm_tensor *ct = fm_transpose(c, 0, 1); /* [5, 37] non-contiguous */
        CHECK(!fm_tensor_is_contiguous(ct));
        check_softmax_case(log_mode, ct, 1, tol, "transposed [5,37]");
        /* large offsets: the max subtraction keeps exp in range */
        for (int64_t i = 0; i < 1003; i++) fm_tensor_set(big, i, fm_tensor_get(big, i) + 1000.0);
        check_softmax_case(log_mode, big, -1, tol * 10, "[4,1003] offset 1000");
        /* thread-count independence, bitwise */
        int nt = fm_num_threads();
        fm_set_num_threads(1);
        fm_tensor *y1 = log_mode ? fm_log_softmax(big, 1) : fm_softmax(big, 1);
        fm_set_num_threads(nt > 1 ? nt : 2);
        fm_tensor *y2 = log_mode ? fm_log_softmax(big, 1) : fm_softmax(big, 1);
        fm_set_num_threads(nt);
        CHECK(op_bitwise_equal(y1, y2));
        fm_tensor_release_n(7, a, b, c, ct, big, y1, y2);
    }
    /* -inf logits get probability exactly 0 (log: -inf) */
    fm_tensor *m = fm_tensor_from_data((float[]){0.0f, -INFINITY, 1.0f, -INFINITY, 2.0f, 0.5f, 3.0f, -1.0f, 4.0f, -INFINITY},
                                       1, (int64_t[]){10}, FM_F32);
    fm_tensor *ym = log_mode ? fm_log_softmax(m, 0) : fm_softmax(m, 0);
    CHECK(ym != NULL);
    if (ym) {
        if (log_mode) CHECK(fm_tensor_get(ym, 1) == -INFINITY);
        else CHECK(fm_tensor_get(ym, 1) == 0.0 && fm_tensor_get(ym, 9) == 0.0);
        double ref0 = exp(0.0) / (exp(0) + exp(1) + exp(2) + exp(0.5) + exp(3) + exp(-1) + exp(4));
        CHECK_NEAR(fm_tensor_get(ym, 0), log_mode ? log(ref0) : ref0, 1e-6);
    }
    /* a 0-d tensor is a row of one */
    fm_tensor *s = fm_tensor_scalar(3.5, FM_F64), *ys = log_mode ? fm_log_softmax(s, -1) : fm_softmax(s, 0);
    CHECK(ys && ys->ndim == 0);
    if (ys) CHECK_NEAR(fm_tensor_item(ys), log_mode ? 0.0 : 1.0, 1e-15);
    /* bad input */
    fm_tensor *bad = log_mode ? fm_log_softmax(m, 1) : fm_softmax(m, -2);
    CHECK(bad == NULL);
    CHECK_ERR_CONTAINS(name);
    fm_tensor *it = fm_tensor_arange(0, 4, 1, FM_I64);
    bad = log_mode ? fm_log_softmax(it, 0) : fm_softmax(it, 0);
    CHECK(bad == NULL);
    CHECK_ERR_CONTAINS("floating-point");
    bad = log_mode ? fm_log_softmax(NULL, 0) : fm_softmax(NULL, 0);
    CHECK(bad == NULL);
    fm_tensor_release_n(4, m, ym, s, ys);
    fm_tensor_release(it);
    check_stream_path(log_mode);
    OP_END;
}

static int softmax_forward(void) { return softmax_family_forward(0); }
static int log_softmax_forward(void) { return softmax_family_forward(1); }

typedef struct sm_gc { int log_mode, axis; } sm_gc;
static fm_tensor *sm_fn(fm_tensor **in, void *ctx) {
    sm_gc *c = ctx;
    return c->log_mode ? fm_log_softmax(in[0], c->axis) : fm_softmax(in[0], c->axis);
}

/* f32 backward (AVX2 kernels) against the f64 analytic gradient of the same data */
static void check_f32_grad(gc_fn fn, void *ctx, int64_t rows, int64_t cols, const char *what) {
    fm_tensor *x64 = sl_randn(2, (int64_t[]){rows, cols}, FM_F64, 77, 2.0);
    fm_tensor *x32 = fm_to_dtype(x64, FM_F32);
    fm_tensor_requires_grad_(x64, true);
    fm_tensor_requires_grad_(x32, true);
    fm_tensor *y64 = fn(&x64, ctx), *y32 = fn(&x32, ctx);
    CHECK(y64 && y32);
    if (y64 && y32) {
        fm_tensor *g64 = sl_randn(y64->ndim, y64->shape, FM_F64, 78, 1.0), *g32 = fm_to_dtype(g64, FM_F32);
        CHECK(fm_backward(y64, g64, false) == FM_OK);
        CHECK(fm_backward(y32, g32, false) == FM_OK);
        if (x64->grad && x32->grad) {
            double *ref = op_host(x64->grad);
            double e = op_max_rel_err(x32->grad, ref);
            CHECK_MSG(e <= 1e-5, "%s f32 grad err %g", what, e);
            free(ref);
        } else {
            CHECK(x64->grad && x32->grad);
        }
        fm_tensor_release_n(2, g64, g32);
    }
    fm_tensor_release_n(4, x64, x32, y64, y32);
}

static int softmax_family_grad(int log_mode) {
    OP_BEGIN;
    fm_tensor *base = sl_randn(2, (int64_t[]){5, 3}, FM_F64, 11, 1.5);
    fm_tensor *x = fm_transpose(base, 0, 1); /* [3, 5], non-contiguous leaf */
    fm_tensor_requires_grad_(x, true);
    fm_tensor *xs[1] = {x};
    sm_gc c0 = {log_mode, 0}, c1 = {log_mode, -1};
    CHECK(gradcheck(log_mode ? "log_softmax axis0" : "softmax axis0", sm_fn, 1, xs, &c0, 1e-6, 1e-6));
    CHECK(gradcheck(log_mode ? "log_softmax axis-1" : "softmax axis-1", sm_fn, 1, xs, &c1, 1e-6, 1e-6));
    /* a contiguous leaf, 3-D, middle axis */
    fm_tensor *leaf = sl_randn(3, (int64_t[]){2, 4, 3}, FM_F64, 12, 1.0);
    fm_tensor_requires_grad_(leaf, true);
    fm_tensor *xs2[1] = {leaf};
    sm_gc c2 = {log_mode, 1};
    CHECK(gradcheck(log_mode ? "log_softmax 2" : "softmax 2", sm_fn, 1, xs2, &c2, 1e-6, 1e-6));
    check_f32_grad(sm_fn, &c1, 6, 1003, log_mode ? "log_softmax" : "softmax");
    check_f32_grad(sm_fn, &c0, 37, 9, log_mode ? "log_softmax axis0" : "softmax axis0");
    fm_tensor_release_n(3, base, x, leaf);
    OP_END;
}
static int softmax_grad(void) { return softmax_family_grad(0); }
static int log_softmax_grad(void) { return softmax_family_grad(1); }

OP_TEST("softmax", softmax_forward, softmax_grad)
OP_TEST("log_softmax", log_softmax_forward, log_softmax_grad)

/* ---- cross-entropy ---- */
static double ref_ce(const double *x, const int64_t *t, int64_t N, int64_t C, int64_t ignore, double eps,
                     fm_reduction red, double *rows) {
    double s = 0;
    int64_t k = 0;
    for (int64_t r = 0; r < N; r++) {
        const double *a = x + r * C;
        double m = -INFINITY, se = 0, sx = 0;
        for (int64_t i = 0; i < C; i++) { m = a[i] > m ? a[i] : m; sx += a[i]; }
        for (int64_t i = 0; i < C; i++) se += exp(a[i] - m);
        double lse = m + log(se), l = 0;
        if (t[r] != ignore) { l = (1 - eps) * (lse - a[t[r]]) + eps * (lse - sx / C); k++; }
        if (rows) rows[r] = l;
        s += l;
    }
    return red == FM_REDUCE_MEAN ? s / (double)k : s;
}

static int cross_entropy_forward(void) {
    OP_BEGIN;
    int64_t N = 7, C = 11;
    int64_t tg[7] = {3, 0, 10, -100, 5, 5, 1};
    for (int d = 0; d < 2; d++) {
        fm_dtype dt = d ? FM_F64 : FM_F32;
        double tol = d ? 1e-12 : 2e-6;
        fm_tensor *base = sl_randn(2, (int64_t[]){C, N}, dt, 21, 3.0);
        fm_tensor *x = fm_transpose(base, 0, 1); /* [N, C] non-contiguous */
        double *hx = op_host(x);
        for (int ti = 0; ti < 2; ti++) {
            fm_tensor *t;
            if (ti) {
                int32_t t32[7];
                for (int i = 0; i < 7; i++) t32[i] = (int32_t)tg[i];
                t = fm_tensor_from_data(t32, 1, &N, FM_I32);
            } else {
                t = fm_tensor_from_data(tg, 1, &N, FM_I64);
            }
            double eps_list[2] = {0.0, 0.15};
            for (int e = 0; e < 2; e++) {
                for (int red = 0; red < 3; red++) {
                    double rows[7];
                    double ref = ref_ce(hx, tg, N, C, -100, eps_list[e], (fm_reduction)red, rows);
                    fm_tensor *l = fm_cross_entropy(x, t, -100, eps_list[e], (fm_reduction)red);
                    CHECK_MSG(l != NULL, "cross_entropy: %s", fm_last_error());
                    if (!l) continue;
                    if (red == FM_REDUCE_NONE) {
                        CHECK(l->ndim == 1 && l->shape[0] == N);
                        double er = op_max_rel_err(l, rows);
                        CHECK_MSG(er <= tol, "ce none %s eps %g err %g", fm_dtype_name(dt), eps_list[e], er);
                    } else {
                        CHECK(l->ndim == 0);
                        CHECK_NEAR(fm_tensor_item(l), ref, tol);
                    }
                    fm_tensor_release(l);
                }
            }
            fm_tensor_release(t);
        }
        free(hx);
        fm_tensor_release_n(2, base, x);
    }
    /* 1-D logits with a 0-d target; wide rows through the SIMD tail */
    fm_tensor *x1 = sl_randn(1, (int64_t[]){1003}, FM_F32, 5, 4.0);
    int64_t t1v = 1002;
    fm_tensor *t1 = fm_tensor_from_data(&t1v, 0, NULL, FM_I64);
    fm_tensor *l1 = fm_cross_entropy(x1, t1, -100, 0.0, FM_REDUCE_NONE);
    CHECK(l1 && l1->ndim == 0);
    if (l1) {
        double *h = op_host(x1);
        double ref = ref_ce(h, &t1v, 1, 1003, -100, 0.0, FM_REDUCE_SUM, NULL);
        CHECK_NEAR(fm_tensor_item(l1), ref, 2e-6);
        free(h);
    }
    /* every row ignored: mean is 0/0 = NaN, as PyTorch */
    fm_tensor *x2 = sl_randn(2, (int64_t[]){2, 3}, FM_F32, 6, 1.0);
    fm_tensor *t2 = fm_tensor_from_data((int64_t[]){-1, -1}, 1, (int64_t[]){2}, FM_I64);
    fm_tensor *l2 = fm_cross_entropy(x2, t2, -1, 0.0, FM_REDUCE_MEAN);
    CHECK(l2 && isnan(fm_tensor_item(l2)));
    /* bad input */
    fm_tensor *t3 = fm_tensor_from_data((int64_t[]){1, 3}, 1, (int64_t[]){2}, FM_I64);
    CHECK(fm_cross_entropy(x2, t3, -100, 0.0, FM_REDUCE_MEAN) == NULL);
    CHECK_ERR_CONTAINS("target 3");
    fm_tensor *t4 = fm_tensor_from_data((int32_t[]){-7, 0}, 1, (int64_t[]){2}, FM_I32);
    CHECK(fm_cross_entropy(x2, t4, -100, 0.0, FM_REDUCE_SUM) == NULL);
    CHECK_ERR_CONTAINS("target -7");
    fm_tensor *t5 = fm_tensor_from_data((int64_t[]){0, 1, 2}, 1, (int64_t[]){3}, FM_I64);
    CHECK(fm_cross_entropy(x2, t5, -100, 0.0, FM_REDUCE_MEAN) == NULL);
    CHECK_ERR_CONTAINS("cross_entropy: target shape [3] does not match logits [2, 3]");
    fm_tensor *tf = fm_tensor_zeros(1, (int64_t[]){2}, FM_F32, FM_CPU);
    CHECK(fm_cross_entropy(x2, tf, -100, 0.0, FM_REDUCE_MEAN) == NULL);
    CHECK_ERR_CONTAINS("i64 or i32");
    CHECK(fm_cross_entropy(x2, t2, -100, 1.5, FM_REDUCE_MEAN) == NULL);
    CHECK_ERR_CONTAINS("label_smoothing");
    CHECK(fm_cross_entropy(x2, t2, -1, 0.0, (fm_reduction)9) == NULL);
    CHECK_ERR_CONTAINS("reduction");
    fm_tensor *x3 = sl_randn(3, (int64_t[]){2, 3, 4}, FM_F32, 7, 1.0);
    CHECK(fm_cross_entropy(x3, t2, -1, 0.0, FM_REDUCE_MEAN) == NULL);
    CHECK_ERR_CONTAINS("[2, 3, 4]");
    fm_tensor_release_n(8, x1, t1, l1, x2, t2, l2, t3, t4);
    fm_tensor_release_n(4, t5, tf, x3, NULL);
    OP_END;
}

typedef struct ce_gc { fm_tensor *target; double eps; fm_reduction red; int64_t ignore; } ce_gc;
static fm_tensor *ce_fn(fm_tensor **in, void *ctx) {
    ce_gc *c = ctx;
    return fm_cross_entropy(in[0], c->target, c->ignore, c->eps, c->red);
}

static int cross_entropy_grad(void) {
    OP_BEGIN;
    int64_t N = 5, C = 6;
    fm_tensor *t = fm_tensor_from_data((int64_t[]){2, -100, 5, 0, 2}, 1, &N, FM_I64);
    /* f32 (AVX2) backward vs f64 analytic on wide rows, with smoothing and an ignored row */
    int64_t N2 = 6, C2 = 1003;
    fm_tensor *t2 = fm_tensor_from_data((int64_t[]){0, 1002, 17, -100, 500, 8}, 1, &N2, FM_I64);
    ce_gc c2 = {t2, 0.1, FM_REDUCE_MEAN, -100};
    check_f32_grad(ce_fn, &c2, N2, C2, "cross_entropy");
    /* a logits gradient of 8 MiB takes the streaming store path; compare its first rows with a small batch */
    {
        int64_t R = 2048, C3 = 1024, r = 4;
        fm_tensor *big = sl_randn(2, (int64_t[]){R, C3}, FM_F32, 93, 3.0);
        fm_tensor *tb = fm_tensor_empty(1, &R, FM_I64, FM_CPU);
        for (int64_t i = 0; i < R; i++) fm_tensor_set(tb, i, (double)((i * 37) % C3));
        fm_tensor *nb = fm_narrow(big, 0, 0, r), *nt = fm_narrow(tb, 0, 0, r);
        fm_tensor *small = fm_clone(nb), *ts = fm_clone(nt);
        fm_tensor_requires_grad_(big, true);
        fm_tensor_requires_grad_(small, true);
        fm_tensor *lb = fm_cross_entropy(big, tb, -100, 0.1, FM_REDUCE_SUM);
        fm_tensor *ls = fm_cross_entropy(small, ts, -100, 0.1, FM_REDUCE_SUM);
        CHECK(lb && ls && fm_backward(lb, NULL, false) == FM_OK && fm_backward(ls, NULL, false) == FM_OK);
        fm_tensor *db = big->grad ? fm_narrow(big->grad, 0, 0, r) : NULL;
        CHECK(op_bitwise_equal(db, small->grad));
        fm_tensor_release_n(10, big, tb, nb, nt, small, ts, lb, ls, db, NULL);
    }
    /* gradcheck on a non-contiguous leaf: [C, N] storage viewed as [N, C] */
    fm_tensor *lbase = sl_randn(2, (int64_t[]){C, N}, FM_F64, 32, 2.0);
    fm_tensor *leaf = fm_transpose(lbase, 0, 1);
    fm_tensor_requires_grad_(leaf, true);
    fm_tensor *xs[1] = {leaf};
    for (int red = 0; red < 3; red++) {
        ce_gc c = {t, 0.2, (fm_reduction)red, -100};
        CHECK(gradcheck("cross_entropy smooth", ce_fn, 1, xs, &c, 1e-6, 1e-6));
        ce_gc c0 = {t, 0.0, (fm_reduction)red, -100};
        CHECK(gradcheck("cross_entropy", ce_fn, 1, xs, &c0, 1e-6, 1e-6));
    }
    fm_tensor_release_n(4, lbase, leaf, t, t2);
    OP_END;
}
OP_TEST("cross_entropy", cross_entropy_forward, cross_entropy_grad)

/* ---- MSE ---- */
static int mse_loss_forward(void) {
    OP_BEGIN;
    for (int d = 0; d < 2; d++) {
        fm_dtype dt = d ? FM_F64 : FM_F32;
        double tol = d ? 1e-12 : 1e-6;
        fm_tensor *base = sl_randn(2, (int64_t[]){40000, 3}, dt, 41, 1.0);
        fm_tensor *a = fm_transpose(base, 0, 1); /* [3, 40000] non-contiguous: several blocks */
        fm_tensor *b = sl_randn(2, (int64_t[]){1, 40000}, dt, 42, 1.0); /* broadcast over rows */
        double *ha = op_host(a), *hb = op_host(b), s = 0;
        double *rows = malloc(sizeof(double) * 120000);
        for (int64_t r = 0; r < 3; r++)
            for (int64_t i = 0; i < 40000; i++) {
                double df = ha[r * 40000 + i] - hb[i];
                rows[r * 40000 + i] = df * df;
                s += df * df;
            }
        fm_tensor *lm = fm_mse_loss(a, b, FM_REDUCE_MEAN), *ls = fm_mse_loss(a, b, FM_REDUCE_SUM);
        fm_tensor *ln = fm_mse_loss(a, b, FM_REDUCE_NONE);
        CHECK(lm && ls && ln);
        if (lm) CHECK_NEAR(fm_tensor_item(lm), s / 120000, tol);
        if (ls) CHECK_NEAR(fm_tensor_item(ls), s, tol);
        if (ln) {
            CHECK(ln->ndim == 2 && ln->shape[0] == 3 && ln->shape[1] == 40000);
            CHECK(op_max_rel_err(ln, rows) <= tol);
        }
        free(ha); free(hb); free(rows);
        fm_tensor_release_n(6, base, a, b, lm, ls, ln);
    }
    fm_tensor *a = fm_tensor_zeros(2, (int64_t[]){2, 3}, FM_F32, FM_CPU);
    fm_tensor *b = fm_tensor_zeros(1, (int64_t[]){4}, FM_F32, FM_CPU);
    fm_tensor *c = fm_tensor_zeros(2, (int64_t[]){2, 3}, FM_F64, FM_CPU);
    CHECK(fm_mse_loss(a, b, FM_REDUCE_MEAN) == NULL);
    CHECK_ERR_CONTAINS("mse_loss: input shape [2, 3] and target shape [4]");
    CHECK(fm_mse_loss(a, c, FM_REDUCE_MEAN) == NULL);
    CHECK_ERR_CONTAINS("dtype");
    CHECK(fm_mse_loss(a, a, (fm_reduction)-1) == NULL);
    CHECK_ERR_CONTAINS("reduction");
    fm_tensor_release_n(3, a, b, c);
    OP_END;
}

static fm_tensor *mse_fn(fm_tensor **in, void *ctx) { return fm_mse_loss(in[0], in[1], *(fm_reduction *)ctx); }

static int mse_loss_grad(void) {
    OP_BEGIN;
    fm_tensor *raw = sl_randn(2, (int64_t[]){4, 3}, FM_F64, 51, 1.0);
    fm_tensor *base = fm_transpose(raw, 0, 1); /* [3, 4] non-contiguous leaf */
    fm_tensor *t = sl_randn(1, (int64_t[]){4}, FM_F64, 52, 1.0); /* broadcast against [3, 4] */
    fm_tensor_requires_grad_(base, true);
    fm_tensor_requires_grad_(t, true);
    for (int red = 0; red < 3; red++) {
        fm_reduction r = (fm_reduction)red;
        fm_tensor *xs[2] = {base, t};
        CHECK(gradcheck("mse_loss", mse_fn, 2, xs, &r, 1e-6, 1e-6));
    }
    fm_tensor_release_n(3, raw, base, t);
    OP_END;
}
OP_TEST("mse_loss", mse_loss_forward, mse_loss_grad)
