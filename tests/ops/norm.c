/* Tests of layer_norm, rms_norm, embedding and dropout: forward values against
 * references computed here in double, f32 (AVX2 path) gradients against the f64
 * analytic ones, finite-difference gradient checks in f64 on non-contiguous
 * inputs, thread-count independence (bitwise), and bad input. */
#include <math.h>
#include <stdlib.h>

#include "test_util.h"
#include "op_test.h"
#include "gradcheck.h"

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "core/parallel.h" /* fm_set_num_threads: results must not depend on it */

/* Reference norm over rows of n; w/b may be NULL. */
static void ref_norm(int rms, const double *x, const double *w, const double *b, double *y, int64_t rows, int64_t n,
                     double eps) {
    for (int64_t r = 0; r < rows; r++) {
        const double *a = x + r * n;
        double mean = 0, var = 0;
        if (!rms) {
            for (int64_t i = 0; i < n; i++) mean += a[i];
            mean /= (double)n;
        }
        for (int64_t i = 0; i < n; i++) var += (a[i] - mean) * (a[i] - mean);
        double rstd = 1.0 / sqrt(var / (double)n + eps);
        for (int64_t i = 0; i < n; i++)
            y[r * n + i] = (a[i] - mean) * rstd * (w ? w[i] : 1.0) + (b ? b[i] : 0.0);
    }
}

/* x is [rows, n] logically (possibly a view); k normalized dims */
static void check_norm(int rms, fm_tensor *x, int k, fm_tensor *w, fm_tensor *b, double eps, double tol, const char *what) {
    fm_tensor *y = rms ? fm_rms_norm(x, w, eps) : fm_layer_norm(x, k, w, b, eps);
    CHECK_MSG(y != NULL, "%s: %s", what, fm_last_error());
    if (!y) return;
    CHECK(y->ndim == x->ndim && y->dtype == x->dtype);
    int64_t n = 1;
    for (int i = x->ndim - k; i < x->ndim; i++) n *= x->shape[i];
    double *hx = op_host(x), *hw = w ? op_host(w) : NULL, *hb = b ? op_host(b) : NULL;
    double *ref = malloc(sizeof(double) * (size_t)fm_tensor_numel(x));
    ref_norm(rms, hx, hw, hb, ref, fm_tensor_numel(x) / n, n, eps);
    double e = op_max_rel_err(y, ref);
    CHECK_MSG(e <= tol, "%s %s %s: err %g", rms ? "rms_norm" : "layer_norm", fm_dtype_name(x->dtype), what, e);
    free(hx); free(hw); free(hb); free(ref);
    fm_tensor_release(y);
}

/* Outputs of 8 MiB and more take the non-temporal-store path, and rows with a
 * next row of the same thread prefetch it; rows of output and input gradient
 * must match the same rows computed through the ordinary path (a small copy),
 * bitwise. */
static void check_stream_path(int rms) {
    int64_t R = 2048, N = 1024, r = 8;
    fm_tensor *big = op_randn(2, (int64_t[]){R, N}, FM_F32, 61), *g = op_randn(2, (int64_t[]){R, N}, FM_F32, 62);
    fm_tensor *w = op_randn(1, &N, FM_F32, 63), *b = rms ? NULL : op_randn(1, &N, FM_F32, 64);
    fm_tensor *nb = fm_narrow(big, 0, 0, r), *ng = fm_narrow(g, 0, 0, r);
    fm_tensor *small = fm_clone(nb), *gs = fm_clone(ng);
    fm_tensor_requires_grad_(big, true);
    fm_tensor_requires_grad_(small, true);
    fm_tensor *yb = rms ? fm_rms_norm(big, w, 1e-6) : fm_layer_norm(big, 1, w, b, 1e-5);
    fm_tensor *ys = rms ? fm_rms_norm(small, w, 1e-6) : fm_layer_norm(small, 1, w, b, 1e-5);
    CHECK(yb && ys && fm_backward(yb, g, false) == FM_OK && fm_backward(ys, gs, false) == FM_OK);
    fm_tensor *yb8 = yb ? fm_narrow(yb, 0, 0, r) : NULL, *db8 = big->grad ? fm_narrow(big->grad, 0, 0, r) : NULL;
    CHECK_MSG(op_bitwise_equal(yb8, ys), "%s: streamed rows differ from the ordinary path", rms ? "rms_norm" : "layer_norm");
    CHECK_MSG(op_bitwise_equal(db8, small->grad), "%s backward: streamed rows differ", rms ? "rms_norm" : "layer_norm");
    fm_tensor_release_n(12, big, g, w, b, nb, ng, small, gs, yb, ys, yb8, db8);
}

static int norm_forward(int rms) {
    OP_BEGIN;
    for (int d = 0; d < 2; d++) {
        fm_dtype dt = d ? FM_F64 : FM_F32;
        double tol = d ? 1e-12 : 3e-6;
        fm_tensor *x = op_randn(2, (int64_t[]){5, 37}, dt, 1);
        fm_tensor *w = op_randn(1, (int64_t[]){37}, dt, 2), *b = op_randn(1, (int64_t[]){37}, dt, 3);
        check_norm(rms, x, 1, w, rms ? NULL : b, 1e-5, tol, "[5,37] w b");
        check_norm(rms, x, 1, NULL, NULL, 1e-5, tol, "[5,37] no params");
        check_norm(rms, x, 1, w, NULL, 1e-3, tol, "[5,37] w only");
        if (!rms) check_norm(rms, x, 1, NULL, b, 1e-5, tol, "[5,37] b only");
        fm_tensor *base = op_randn(2, (int64_t[]){1003, 4}, dt, 4);
        fm_tensor *xt = fm_transpose(base, 0, 1); /* [4, 1003] non-contiguous */
        check_norm(rms, xt, 1, NULL, NULL, 1e-5, tol, "transposed [4,1003]");
        /* a large common offset: the variance must not cancel */
        fm_tensor *off = fm_add_scalar(xt, 1000.0);
        if (!rms) check_norm(rms, off, 1, NULL, NULL, 1e-5, d ? 1e-9 : 5e-4, "offset 1000");
        if (!rms) { /* two normalized dims */
            fm_tensor *x3 = op_randn(3, (int64_t[]){2, 3, 5}, dt, 5);
            fm_tensor *w2 = op_randn(2, (int64_t[]){3, 5}, dt, 6), *b2 = op_randn(2, (int64_t[]){3, 5}, dt, 7);
            check_norm(rms, x3, 2, w2, b2, 1e-5, tol, "[2,3,5] over 2 dims");
            check_norm(rms, x3, 3, NULL, NULL, 1e-5, tol, "[2,3,5] over all dims");
            fm_tensor_release_n(3, x3, w2, b2);
        }
        /* thread-count independence, bitwise */
        fm_tensor *big = op_randn(2, (int64_t[]){300, 129}, dt, 8), *wb = op_randn(1, (int64_t[]){129}, dt, 9);
        int nt = fm_num_threads();
        fm_set_num_threads(1);
        fm_tensor *y1 = rms ? fm_rms_norm(big, wb, 1e-5) : fm_layer_norm(big, 1, wb, NULL, 1e-5);
        fm_set_num_threads(nt > 1 ? nt : 2);
        fm_tensor *y2 = rms ? fm_rms_norm(big, wb, 1e-5) : fm_layer_norm(big, 1, wb, NULL, 1e-5);
        fm_set_num_threads(nt);
        CHECK(op_bitwise_equal(y1, y2));
        fm_tensor_release_n(10, x, w, b, base, xt, off, big, wb, y1, y2);
    }
    check_stream_path(rms);
    /* bad input */
    const char *op = rms ? "rms_norm" : "layer_norm";
    fm_tensor *x = op_randn(2, (int64_t[]){2, 4}, FM_F32, 10), *w5 = op_randn(1, (int64_t[]){5}, FM_F32, 11);
    fm_tensor *w64 = op_randn(1, (int64_t[]){4}, FM_F64, 12), *xi = fm_tensor_zeros(2, (int64_t[]){2, 4}, FM_I32, FM_CPU);
    CHECK((rms ? fm_rms_norm(x, w5, 1e-5) : fm_layer_norm(x, 1, w5, NULL, 1e-5)) == NULL);
    CHECK_ERR_CONTAINS(rms ? "rms_norm: weight shape [5] does not match normalized shape [4] of input [2, 4]"
                           : "layer_norm: weight shape [5] does not match normalized shape [4] of input [2, 4]");
    CHECK((rms ? fm_rms_norm(x, w64, 1e-5) : fm_layer_norm(x, 1, w64, NULL, 1e-5)) == NULL);
    CHECK_ERR_CONTAINS("dtype");
    CHECK((rms ? fm_rms_norm(xi, NULL, 1e-5) : fm_layer_norm(xi, 1, NULL, NULL, 1e-5)) == NULL);
    CHECK_ERR_CONTAINS(op);
    if (!rms) {
        CHECK(fm_layer_norm(x, 0, NULL, NULL, 1e-5) == NULL);
        CHECK_ERR_CONTAINS("layer_norm: cannot normalize over the last 0 dims");
        CHECK(fm_layer_norm(x, 3, NULL, NULL, 1e-5) == NULL);
        CHECK_ERR_CONTAINS("[2, 4]");
        CHECK(fm_layer_norm(x, 1, NULL, w5, 1e-5) == NULL);
        CHECK_ERR_CONTAINS("bias shape [5]");
    }
    CHECK((rms ? fm_rms_norm(x, NULL, -1.0) : fm_layer_norm(x, 1, NULL, NULL, -1.0)) == NULL);
    CHECK_ERR_CONTAINS("eps");
    fm_tensor_release_n(4, x, w5, w64, xi);
    OP_END;
}
static int layer_norm_forward(void) { return norm_forward(0); }
static int rms_norm_forward(void) { return norm_forward(1); }

typedef struct nm_gc { int rms, k, has_w, has_b; } nm_gc;
static fm_tensor *nm_fn(fm_tensor **in, void *ctx) {
    nm_gc *c = ctx;
    if (c->rms) return fm_rms_norm(in[0], c->has_w ? in[1] : NULL, 1e-5);
    return fm_layer_norm(in[0], c->k, c->has_w ? in[1] : NULL, c->has_b ? in[2] : NULL, 1e-5);
}

static int norm_grad(int rms) {
    OP_BEGIN;
    fm_tensor *base = op_randn(2, (int64_t[]){7, 3}, FM_F64, 21);
    fm_tensor *x = fm_transpose(base, 0, 1); /* [3, 7] non-contiguous leaf */
    fm_tensor *w = op_randn(1, (int64_t[]){7}, FM_F64, 22), *b = op_randn(1, (int64_t[]){7}, FM_F64, 23);
    fm_tensor_requires_grad_(x, true);
    fm_tensor_requires_grad_(w, true);
    fm_tensor_requires_grad_(b, true);
    fm_tensor *xs[3] = {x, w, b};
    nm_gc full = {rms, 1, 1, !rms}, none = {rms, 1, 0, 0};
    CHECK(gradcheck(rms ? "rms_norm" : "layer_norm", nm_fn, rms ? 2 : 3, xs, &full, 1e-6, 1e-6));
    CHECK(gradcheck(rms ? "rms_norm no w" : "layer_norm no params", nm_fn, 1, xs, &none, 1e-6, 1e-6));
    if (!rms) {
        /* two normalized dims; weight is [2, 3] */
        fm_tensor *x3 = op_randn(3, (int64_t[]){2, 2, 3}, FM_F64, 24);
        fm_tensor *w2 = op_randn(2, (int64_t[]){2, 3}, FM_F64, 25), *b2 = op_randn(2, (int64_t[]){2, 3}, FM_F64, 26);
        fm_tensor_requires_grad_(x3, true);
        fm_tensor_requires_grad_(w2, true);
        fm_tensor_requires_grad_(b2, true);
        fm_tensor *xs3[3] = {x3, w2, b2};
        nm_gc two = {0, 2, 1, 1};
        CHECK(gradcheck("layer_norm 2 dims", nm_fn, 3, xs3, &two, 1e-6, 1e-6));
        fm_tensor_release_n(3, x3, w2, b2);
    }
    /* f32 backward (AVX2 rows, per-chunk weight/bias sums) vs f64 analytic; 300 rows span several chunks */
    int64_t R = 300, N = 1003;
    fm_tensor *x64 = op_randn(2, (int64_t[]){R, N}, FM_F64, 27), *w64 = op_randn(1, &N, FM_F64, 28);
    fm_tensor *b64 = op_randn(1, &N, FM_F64, 29), *g64 = op_randn(2, (int64_t[]){R, N}, FM_F64, 30);
    fm_tensor *x32 = fm_to_dtype(x64, FM_F32), *w32 = fm_to_dtype(w64, FM_F32), *b32 = fm_to_dtype(b64, FM_F32);
    fm_tensor *g32 = fm_to_dtype(g64, FM_F32);
    fm_tensor *all[6] = {x64, w64, b64, x32, w32, b32};
    for (int i = 0; i < 6; i++) fm_tensor_requires_grad_(all[i], true);
    fm_tensor *in64[3] = {x64, w64, b64}, *in32[3] = {x32, w32, b32};
    fm_tensor *y64 = nm_fn(in64, &full), *y32 = nm_fn(in32, &full);
    CHECK(y64 && y32 && fm_backward(y64, g64, false) == FM_OK && fm_backward(y32, g32, false) == FM_OK);
    for (int i = 0; i < (rms ? 2 : 3); i++) {
        if (!in64[i]->grad || !in32[i]->grad) { CHECK(0); continue; }
        double *ref = op_host(in64[i]->grad);
        double e = op_max_rel_err(in32[i]->grad, ref);
        CHECK_MSG(e <= (i ? 1e-4 : 2e-5), "%s f32 grad of input %d: err %g", rms ? "rms_norm" : "layer_norm", i, e);
        free(ref);
    }
    /* thread-count independence of the backward (weight gradient sums), bitwise */
    fm_tensor *gw1 = w32->grad ? fm_clone(w32->grad) : NULL;
    for (int i = 3; i < 6; i++) fm_tensor_zero_grad(all[i]);
    fm_tensor_release(y32);
    int nt = fm_num_threads();
    fm_set_num_threads(1);
    y32 = nm_fn(in32, &full);
    CHECK(y32 && fm_backward(y32, g32, false) == FM_OK);
    fm_set_num_threads(nt);
    CHECK(op_bitwise_equal(gw1, w32->grad));
    fm_tensor_release_n(10, base, x, w, b, x64, w64, b64, g64, x32, w32);
    fm_tensor_release_n(5, b32, g32, y64, y32, gw1);
    OP_END;
}
static int layer_norm_grad(void) { return norm_grad(0); }
static int rms_norm_grad(void) { return norm_grad(1); }

OP_TEST("layer_norm", layer_norm_forward, layer_norm_grad)
OP_TEST("rms_norm", rms_norm_forward, rms_norm_grad)

/* ---- embedding ---- */
static int embedding_forward(void) {
    OP_BEGIN;
    for (int d = 0; d < 2; d++) {
        fm_dtype dt = d ? FM_F64 : FM_F32;
        fm_tensor *w = op_randn(2, (int64_t[]){7, 5}, dt, 41);
        int64_t iv[6] = {6, 0, 3, 3, 1, 6};
        int32_t iv32[6] = {6, 0, 3, 3, 1, 6};
        fm_tensor *i64 = fm_tensor_from_data(iv, 2, (int64_t[]){2, 3}, FM_I64);
        fm_tensor *i32 = fm_tensor_from_data(iv32, 2, (int64_t[]){2, 3}, FM_I32);
        fm_tensor *i64t = fm_transpose(i64, 0, 1); /* [3, 2] view */
        fm_tensor *idx[3] = {i64, i32, i64t};
        for (int k = 0; k < 3; k++) {
            fm_tensor *y = fm_embedding(w, idx[k]);
            CHECK_MSG(y != NULL, "embedding: %s", fm_last_error());
            if (!y) continue;
            CHECK(y->ndim == 3 && y->shape[0] == idx[k]->shape[0] && y->shape[1] == idx[k]->shape[1] && y->shape[2] == 5);
            for (int64_t i = 0; i < 6; i++) {
                int64_t row = (int64_t)fm_tensor_get(idx[k], i);
                for (int64_t j = 0; j < 5; j++) CHECK(fm_tensor_get(y, i * 5 + j) == fm_tensor_get(w, row * 5 + j));
            }
            fm_tensor_release(y);
        }
        /* a 0-d index gives one row */
        int64_t one = 4;
        fm_tensor *i0 = fm_tensor_from_data(&one, 0, NULL, FM_I64), *y0 = fm_embedding(w, i0);
        CHECK(y0 && y0->ndim == 1 && y0->shape[0] == 5);
        if (y0) CHECK(fm_tensor_get(y0, 2) == fm_tensor_get(w, 4 * 5 + 2));
        fm_tensor_release_n(6, w, i64, i32, i64t, i0, y0);
    }
    fm_tensor *w = op_randn(2, (int64_t[]){7, 5}, FM_F32, 42);
    fm_tensor *bad_hi = fm_tensor_from_data((int64_t[]){0, 7}, 1, (int64_t[]){2}, FM_I64);
    fm_tensor *bad_lo = fm_tensor_from_data((int32_t[]){-1}, 1, (int64_t[]){1}, FM_I32);
    fm_tensor *fidx = fm_tensor_zeros(1, (int64_t[]){2}, FM_F32, FM_CPU), *w1 = op_randn(1, (int64_t[]){7}, FM_F32, 43);
    CHECK(fm_embedding(w, bad_hi) == NULL);
    CHECK_ERR_CONTAINS("embedding: index 7");
    CHECK(fm_embedding(w, bad_lo) == NULL);
    CHECK_ERR_CONTAINS("index -1");
    CHECK(fm_embedding(w, fidx) == NULL);
    CHECK_ERR_CONTAINS("i64 or i32");
    CHECK(fm_embedding(w1, bad_hi) == NULL);
    CHECK_ERR_CONTAINS("2-D");
    fm_tensor_release_n(5, w, bad_hi, bad_lo, fidx, w1);
    OP_END;
}

static fm_tensor *emb_fn(fm_tensor **in, void *ctx) { return fm_embedding(in[0], (fm_tensor *)ctx); }

static int embedding_grad(void) {
    OP_BEGIN;
    fm_tensor *base = op_randn(2, (int64_t[]){3, 6}, FM_F64, 51);
    fm_tensor *w = fm_transpose(base, 0, 1); /* [6, 3] non-contiguous leaf */
    fm_tensor_requires_grad_(w, true);
    fm_tensor *idx = fm_tensor_from_data((int64_t[]){5, 1, 5, 0, 5, 2, 1, 1}, 2, (int64_t[]){2, 4}, FM_I64);
    fm_tensor *xs[1] = {w};
    CHECK(gradcheck("embedding", emb_fn, 1, xs, idx, 1e-6, 1e-6));
    /* repeated rows accumulate: d/dw of sum(embedding) counts occurrences */
    fm_tensor *w2 = op_randn(2, (int64_t[]){6, 130}, FM_F32, 52);
    fm_tensor_requires_grad_(w2, true);
    fm_tensor *y = fm_embedding(w2, idx), *s = y ? fm_sum(y, 0, NULL, false) : NULL;
    CHECK(s && fm_backward(s, NULL, false) == FM_OK);
    if (w2->grad) {
        const double cnt[6] = {1, 3, 1, 0, 0, 3};
        for (int64_t r = 0; r < 6; r++) CHECK(fm_tensor_get(w2->grad, r * 130 + 129) == cnt[r]);
    }
    fm_tensor_release_n(6, base, w, idx, w2, y, s);
    OP_END;
}
OP_TEST("embedding", embedding_forward, embedding_grad)

/* ---- dropout ---- */
static int dropout_forward(void) {
    OP_BEGIN;
    int64_t n = 100003;
    for (int d = 0; d < 2; d++) {
        fm_dtype dt = d ? FM_F64 : FM_F32;
        fm_tensor *x = fm_tensor_full(1, &n, 2.0, dt, FM_CPU);
        fm_rng r;
        fm_rng_init(&r, 99);
        fm_tensor *y = fm_dropout(x, 0.3, true, &r);
        CHECK_MSG(y != NULL, "dropout: %s", fm_last_error());
        CHECK(r.offset == (uint64_t)((n + 3) / 4)); /* advanced past the Philox blocks it used */
        int64_t kept = 0;
        bool ok = true;
        for (int64_t i = 0; y && i < n; i++) {
            double v = fm_tensor_get(y, i);
            if (v != 0) { kept++; ok = ok && fabs(v - 2.0 / 0.7) < 1e-6; }
        }
        CHECK(ok);
        CHECK_MSG(fabs((double)kept / n - 0.7) < 0.01, "kept fraction %g", (double)kept / n);
        /* same (seed, offset) and any thread count: the same mask */
        fm_rng r2;
        fm_rng_init(&r2, 99);
        int nt = fm_num_threads();
        fm_set_num_threads(1);
        fm_tensor *y1 = fm_dropout(x, 0.3, true, &r2);
        fm_set_num_threads(nt);
        CHECK(op_bitwise_equal(y, y1));
        /* the advanced generator draws a different mask */
        fm_tensor *y2 = fm_dropout(x, 0.3, true, &r2);
        CHECK(y2 && !op_bitwise_equal(y1, y2));
        fm_tensor_release_n(4, x, y, y1, y2);
    }
    fm_tensor *x = op_randn(2, (int64_t[]){4, 5}, FM_F32, 61);
    fm_tensor *xt = fm_transpose(x, 0, 1);
    fm_tensor *e1 = fm_dropout(x, 0.5, false, NULL), *e2 = fm_dropout(x, 0.0, true, NULL);
    CHECK(e1 == x && e2 == x); /* eval mode and p = 0 return the input itself */
    fm_tensor *all = fm_dropout(xt, 1.0, true, NULL); /* p = 1: all zeros, on a view */
    CHECK(all && all->shape[0] == 5 && all->shape[1] == 4);
    if (all) {
        bool zeros = true;
        for (int64_t i = 0; i < 20; i++) zeros = zeros && fm_tensor_get(all, i) == 0.0;
        CHECK(zeros);
    }
    fm_tensor *half = fm_dropout(xt, 0.5, true, NULL); /* non-contiguous input keeps its logical layout */
    CHECK(half != NULL);
    for (int64_t i = 0; half && i < 20; i++) {
        double v = fm_tensor_get(half, i);
        CHECK(v == 0.0 || fabs(v - 2 * fm_tensor_get(xt, i)) < 1e-6);
    }
    CHECK(fm_dropout(x, 1.5, true, NULL) == NULL);
    CHECK_ERR_CONTAINS("dropout: probability p=1.5");
    CHECK(fm_dropout(x, -0.1, true, NULL) == NULL);
    CHECK_ERR_CONTAINS("[0, 1]");
    fm_tensor *xi = fm_tensor_zeros(1, (int64_t[]){3}, FM_I64, FM_CPU);
    CHECK(fm_dropout(xi, 0.5, true, NULL) == NULL);
    CHECK_ERR_CONTAINS("floating-point");
    fm_tensor_release_n(7, x, xt, e1, e2, all, half, xi);
    OP_END;
}

static fm_tensor *drop_fn(fm_tensor **in, void *ctx) {
    fm_rng r;
    fm_rng_init(&r, *(uint64_t *)ctx); /* same mask on every call */
    return fm_dropout(in[0], 0.4, true, &r);
}

static int dropout_grad(void) {
    OP_BEGIN;
    fm_tensor *base = op_randn(2, (int64_t[]){5, 4}, FM_F64, 71);
    fm_tensor *x = fm_transpose(base, 0, 1);
    fm_tensor_requires_grad_(x, true);
    fm_tensor *xs[1] = {x};
    uint64_t seed = 5;
    CHECK(gradcheck("dropout", drop_fn, 1, xs, &seed, 1e-6, 1e-6));
    fm_tensor_release_n(2, base, x);
    OP_END;
}
OP_TEST("dropout", dropout_forward, dropout_grad)
