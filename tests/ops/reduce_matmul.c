/* Tests of reductions and matmul: values against direct loops, non-contiguous
 * inputs, several axis sets, gradient checks, and bad input. */
#include <math.h>

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "gradcheck.h"
#include "op_test.h"
#include "test_util.h"

/* x[2,3,4] = arange, reduced over axes {0,2}: hand-checked loops */
typedef fm_tensor *(*red_fn)(fm_tensor *, int, const int *, bool);
static fm_tensor *var1(fm_tensor *x, int n, const int *a, bool k) { return fm_var(x, n, a, 1, k); }
static fm_tensor *std1(fm_tensor *x, int n, const int *a, bool k) { return fm_std(x, n, a, 1, k); }

static double ref_reduce(const char *name, const double *v, int n) {
    double s = 0, m = -INFINITY, mn = INFINITY;
    for (int i = 0; i < n; i++) { s += v[i]; if (v[i] > m) m = v[i]; if (v[i] < mn) mn = v[i]; }
    if (!strcmp(name, "sum")) return s;
    if (!strcmp(name, "mean")) return s / n;
    if (!strcmp(name, "amax")) return m;
    if (!strcmp(name, "amin")) return mn;
    double mu = s / n, q = 0, e = 0;
    for (int i = 0; i < n; i++) { q += (v[i] - mu) * (v[i] - mu); e += exp(v[i] - m); }
    if (!strcmp(name, "var")) return q / (n - 1);
    if (!strcmp(name, "std")) return sqrt(q / (n - 1));
    if (!strcmp(name, "prod")) {
        double pr = 1;
        for (int i = 0; i < n; i++) pr *= v[i];
        return pr;
    }
    return m + log(e); /* logsumexp */
}

static red_fn red_of(const char *n) {
    if (!strcmp(n, "sum")) return fm_sum;
    if (!strcmp(n, "mean")) return fm_mean;
    if (!strcmp(n, "amax")) return fm_amax;
    if (!strcmp(n, "amin")) return fm_amin;
    if (!strcmp(n, "var")) return var1;
    if (!strcmp(n, "std")) return std1;
    if (!strcmp(n, "prod")) return fm_prod;
    return fm_logsumexp;
}

static int red_forward(const char *name) {
    OP_BEGIN;
    red_fn f = red_of(name);
    int64_t sh[3] = {2, 3, 4};
    fm_rng r;
    fm_rng_init(&r, 2);
    fm_dtype dts[2] = {FM_F32, FM_F64};
    for (int d = 0; d < 2; d++) {
        fm_tensor *x = fm_tensor_randn(3, sh, dts[d], &r);
        /* axes {0, 2}: not one block, exercises the permuted path; keepdim both ways */
        int axes[2] = {0, -1};
        for (int keep = 0; keep < 2; keep++) {
            fm_tensor *y = f(x, 2, axes, keep);
            CHECK_MSG(y != NULL, "%s: %s", name, fm_last_error());
            if (!y) continue;
            CHECK(y->ndim == (keep ? 3 : 1) && fm_tensor_numel(y) == 3);
            for (int j = 0; j < 3; j++) {
                double v[8];
                int k = 0;
                for (int i = 0; i < 2; i++) for (int l = 0; l < 4; l++) v[k++] = fm_tensor_get(x, (i * 3 + j) * 4 + l);
                CHECK_NEAR(fm_tensor_get(y, j), ref_reduce(name, v, 8), dts[d] == FM_F32 ? 1e-5 : 1e-12);
            }
            fm_tensor_release(y);
        }
        /* all axes; and the last axis of a transposed (non-contiguous) view */
        fm_tensor *all = f(x, 0, NULL, false);
        double v[24];
        for (int i = 0; i < 24; i++) v[i] = fm_tensor_get(x, i);
        CHECK(all && all->ndim == 0);
        if (all) CHECK_NEAR(fm_tensor_item(all), ref_reduce(name, v, 24), dts[d] == FM_F32 ? 1e-5 : 1e-12);
        fm_tensor *t = fm_transpose(x, 1, 2); /* [2,4,3] */
        int last = -1;
        fm_tensor *yt = f(t, 1, &last, false);
        CHECK(yt && yt->ndim == 2 && yt->shape[1] == 4);
        for (int i = 0; yt && i < 2; i++) for (int l = 0; l < 4; l++) {
            double w[3];
            for (int j = 0; j < 3; j++) w[j] = fm_tensor_get(x, (i * 3 + j) * 4 + l);
            CHECK_NEAR(fm_tensor_get(yt, i * 4 + l), ref_reduce(name, w, 3), dts[d] == FM_F32 ? 1e-5 : 1e-12);
        }
        fm_tensor_release_n(4, x, all, t, yt);
    }
    /* a large sum goes through the blocked parallel path */
    int64_t nbig = 1000003;
    fm_tensor *ones = fm_tensor_ones(1, &nbig, FM_F32, FM_CPU);
    if (!strcmp(name, "sum")) {
        fm_tensor *s = fm_sum(ones, 0, NULL, false);
        CHECK(s && fm_tensor_item(s) == (double)nbig);
        fm_tensor_release(s);
    }
    fm_tensor_release(ones);
    /* bad axes */
    int64_t s2[2] = {2, 2};
    fm_tensor *z = fm_tensor_zeros(2, s2, FM_F32, FM_CPU);
    int bad = 2, dup[2] = {0, -2};
    CHECK(f(z, 1, &bad, false) == NULL);
    CHECK_ERR_CONTAINS("axis 2 is out of range");
    CHECK(f(z, 2, dup, false) == NULL);
    CHECK_ERR_CONTAINS("listed twice");
    fm_tensor_release(z);
    OP_END;
}

static fm_tensor *gc_red(fm_tensor **in, void *ctx) {
    int axes[1] = {1};
    return red_of((const char *)ctx)(in[0], 1, axes, false);
}
static int red_grad(const char *name) {
    OP_BEGIN;
    int64_t sh[3] = {2, 3, 4};
    fm_rng r;
    fm_rng_init(&r, 4);
    fm_tensor *x = fm_tensor_randn(3, sh, FM_F64, &r), *xt = fm_transpose(x, 0, 2), *leaf = fm_detach(xt);
    fm_tensor_requires_grad_(leaf, true);
    fm_tensor *ins[1] = {leaf};
    CHECK_MSG(gradcheck(name, gc_red, 1, ins, (void *)name, 1e-6, 1e-6), "%s gradcheck", name);
    fm_tensor_release_n(3, x, xt, leaf);
    OP_END;
}
#define RED_TESTS(nm, id)                                   \
    static int id##_f(void) { return red_forward(nm); }     \
    static int id##_g(void) { return red_grad(nm); }        \
    OP_TEST(nm, id##_f, id##_g)
RED_TESTS("sum", sum)
RED_TESTS("mean", mean)
RED_TESTS("amax", amax)
RED_TESTS("amin", amin)
RED_TESTS("var", var)
RED_TESTS("std", std)
RED_TESTS("logsumexp", logsumexp)
RED_TESTS("prod", prod)

/* prod's gradient where slices hold one zero and two zeros; integer products keep their dtype */
static int prod_zeros(void) {
    OP_BEGIN;
    fm_tensor *x = fm_tensor_from_data((double[]){2, 0, 3, 0, 0, 5, 1.5, -2, 4}, 2, (int64_t[]){3, 3}, FM_F64);
    fm_tensor_requires_grad_(x, true);
    int ax = 1;
    fm_tensor *y = fm_prod(x, 1, &ax, false), *s = y ? fm_sum(y, 0, NULL, false) : NULL;
    CHECK(s && fm_backward(s, NULL, false) == FM_OK && x->grad);
    const double want[9] = {0, 6, 0, 0, 0, 0, -8, 6, -3}; /* one zero: the others' product there; two: 0 */
    for (int i = 0; x->grad && i < 9; i++) CHECK_NEAR(fm_tensor_get(x->grad, i), want[i], 1e-12);
    fm_tensor *xi = fm_tensor_from_data((int32_t[]){3, -4, 5, 7}, 1, (int64_t[]){4}, FM_I32), *pi = fm_prod(xi, 0, NULL, false);
    CHECK(pi && pi->dtype == FM_I32 && fm_tensor_item(pi) == -420);
    int64_t z = 0;
    fm_tensor *e = fm_tensor_zeros(1, &z, FM_F32, FM_CPU), *pe = fm_prod(e, 0, NULL, false);
    CHECK(pe && fm_tensor_item(pe) == 1); /* the empty product */
    fm_tensor_release_n(7, x, y, s, xi, pi, e, pe);
    OP_END;
}
OP_TEST("prod", prod_zeros, NULL)

static int maxdim_fwd_impl(bool is_max) {
    OP_BEGIN;
    double v[6] = {1, 5, 3, 7, 2, 7};
    int64_t sh[2] = {2, 3};
    fm_tensor *x = fm_tensor_from_data((float[]){1, 5, 3, 7, 2, 7}, 2, sh, FM_F32);
    fm_tensor *idx = NULL;
    fm_tensor *y = is_max ? fm_max_dim(x, 1, false, &idx) : fm_min_dim(x, 1, false, &idx);
    CHECK(y && idx && y->ndim == 1 && idx->dtype == FM_I64);
    if (y && idx) {
        CHECK(fm_tensor_get(y, 0) == (is_max ? 5 : 1) && fm_tensor_get(idx, 0) == (is_max ? 1 : 0));
        CHECK(fm_tensor_get(y, 1) == (is_max ? 7 : 2) && fm_tensor_get(idx, 1) == (is_max ? 0 : 1)); /* first of ties */
    }
    fm_tensor *am = fm_argmax(x, 0, true);
    CHECK(am && am->ndim == 2 && fm_tensor_get(am, 0) == 1 && fm_tensor_get(am, 1) == 0 && fm_tensor_get(am, 2) == 1);
    CHECK(fm_max_dim(x, 3, false, NULL) == NULL);
    CHECK_ERR_CONTAINS("out of range");
    (void)v;
    fm_tensor_release_n(4, x, idx, y, am);
    OP_END;
}
static int maxdim_fwd(void) { return maxdim_fwd_impl(true); }
static int mindim_fwd(void) { return maxdim_fwd_impl(false); }
static fm_tensor *gc_maxdim(fm_tensor **in, void *ctx) {
    return ctx ? fm_max_dim(in[0], 0, true, NULL) : fm_min_dim(in[0], 1, false, NULL);
}
static int maxdim_grad_impl(bool is_max) {
    OP_BEGIN;
    int64_t sh[2] = {3, 4};
    fm_rng r;
    fm_rng_init(&r, 8);
    fm_tensor *x = fm_tensor_randn(2, sh, FM_F64, &r);
    fm_tensor_requires_grad_(x, true);
    fm_tensor *ins[1] = {x};
    CHECK(gradcheck(is_max ? "max_dim" : "min_dim", gc_maxdim, 1, ins, is_max ? (void *)1 : NULL, 1e-6, 1e-6));
    fm_tensor_release(x);
    OP_END;
}
static int maxdim_grad(void) { return maxdim_grad_impl(true); }
static int mindim_grad(void) { return maxdim_grad_impl(false); }
OP_TEST("max_dim", maxdim_fwd, maxdim_grad)
OP_TEST("min_dim", mindim_fwd, mindim_grad)
static int argmax_fwd(void) { return maxdim_fwd_impl(true); }
OP_TEST("argmax", argmax_fwd, NULL)

/* ---- cumsum: every axis of a [3, 4, 5] tensor (outer, middle, last), inclusive or
 * exclusive, forward or reversed, against a plain loop, in f32/f64/f16/bf16/i64/i32/i8;
 * a transposed input; integer wrapping; bool refused ---- */
static double cumsum_ref(const double *v, const int64_t *sh, int axis, bool excl, bool rev, int64_t i) {
    int64_t st[3] = {sh[1] * sh[2], sh[2], 1}, pos = i / st[axis] % sh[axis];
    double acc = 0;
    for (int64_t k = 0; k < sh[axis]; k++) {
        bool in = rev ? (excl ? k > pos : k >= pos) : (excl ? k < pos : k <= pos);
        if (in) acc += v[i + (k - pos) * st[axis]];
    }
    return acc;
}

static int cumsum_fwd(void) {
    OP_BEGIN;
    const int64_t sh[3] = {3, 4, 5}, n = 60;
    double v[60];
    for (int i = 0; i < n; i++) v[i] = (double)((i * 37) % 19) - 9 + 0.25 * (i % 3);
    const fm_dtype dts[7] = {FM_F32, FM_F64, FM_F16, FM_BF16, FM_I64, FM_I32, FM_I8};
    for (int d = 0; d < 7; d++) {
        fm_tensor *x = fm_tensor_empty(3, sh, dts[d], FM_CPU);
        for (int i = 0; i < n; i++) fm_tensor_set(x, i, v[i]);
        double xv[60];
        for (int i = 0; i < n; i++) xv[i] = fm_tensor_get(x, i); /* the values as stored (integers truncated) */
        const double tol = dts[d] == FM_F16 ? 0.1 : dts[d] == FM_BF16 ? 0.5 : dts[d] == FM_F32 ? 1e-5 : 0;
        for (int axis = -1; axis < 3; axis++)
            for (int m = 0; m < 4; m++) {
                bool excl = m & 1, rev = m & 2;
                fm_tensor *y = fm_cumsum(x, axis, excl, rev);
                CHECK_MSG(y && y->dtype == dts[d], "cumsum %s axis %d: %s", fm_dtype_name(dts[d]), axis, fm_last_error());
                int ax = axis < 0 ? axis + 3 : axis;
                for (int64_t i = 0; y && i < n; i++) {
                    double want = cumsum_ref(xv, sh, ax, excl, rev, i), got = fm_tensor_get(y, i);
                    CHECK_MSG(fabs(got - want) <= tol, "cumsum %s axis %d excl %d rev %d [%lld]: %g want %g",
                              fm_dtype_name(dts[d]), axis, excl, rev, (long long)i, got, want);
                }
                fm_tensor_release(y);
            }
        fm_tensor_release(x);
    }
    /* a transposed (non-contiguous) input: the sum runs along the view's axis */
    fm_tensor *m = fm_tensor_from_data((float[]){1, 2, 3, 4, 5, 6}, 2, (int64_t[]){2, 3}, FM_F32);
    fm_tensor *t = fm_transpose(m, 0, 1), *y = fm_cumsum(t, 1, false, false); /* [[1, 5], [2, 7], [3, 9]] */
    const float want[6] = {1, 5, 2, 7, 3, 9};
    for (int i = 0; y && i < 6; i++) CHECK(fm_tensor_get(y, i) == want[i]);
    CHECK(y != NULL);
    fm_tensor_release_n(3, m, t, y);
    /* integers wrap as two's complement (numpy, ONNX Runtime) */
    fm_tensor *b = fm_tensor_from_data((int8_t[]){100, 100, -56}, 1, (int64_t[]){3}, FM_I8), *by = fm_cumsum(b, 0, false, false);
    CHECK(by && fm_tensor_get(by, 0) == 100 && fm_tensor_get(by, 1) == -56 && fm_tensor_get(by, 2) == -112);
    fm_tensor_release_n(2, b, by);
    /* bad input */
    fm_tensor *bo = fm_tensor_zeros(1, (int64_t[]){3}, FM_BOOL, FM_CPU);
    CHECK(fm_cumsum(bo, 0, false, false) == NULL);
    CHECK_ERR_CONTAINS("bool");
    fm_tensor *f = fm_tensor_zeros(1, (int64_t[]){3}, FM_F32, FM_CPU);
    CHECK(fm_cumsum(f, 1, false, false) == NULL);
    CHECK_ERR_CONTAINS("out of range");
    CHECK(fm_cumsum(NULL, 0, false, false) == NULL);
    fm_tensor_release_n(2, bo, f);
    OP_END;
}

static fm_tensor *gc_cumsum(fm_tensor **in, void *ctx) {
    int m = (int)(intptr_t)ctx;
    return fm_cumsum(in[0], m >> 2 ? 0 : -1, m & 1, m & 2);
}
static int cumsum_grad(void) {
    OP_BEGIN;
    fm_rng r;
    fm_rng_init(&r, 12);
    fm_tensor *x = fm_tensor_randn(2, (int64_t[]){3, 4}, FM_F64, &r);
    fm_tensor_requires_grad_(x, true);
    fm_tensor *ins[1] = {x};
    for (int m = 0; m < 8; m++) CHECK_MSG(gradcheck("cumsum", gc_cumsum, 1, ins, (void *)(intptr_t)m, 1e-6, 1e-6), "cumsum mode %d", m);
    fm_tensor_release(x);
    OP_END;
}
OP_TEST("cumsum", cumsum_fwd, cumsum_grad)

/* ---- matmul ---- */
static void ref_mm(const fm_tensor *a, const fm_tensor *b, int64_t M, int64_t K, int64_t N, int64_t ao, int64_t bo, double *out) {
    for (int64_t i = 0; i < M; i++) for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) s += fm_tensor_get(a, ao + i * K + k) * fm_tensor_get(b, bo + k * N + j);
        out[i * N + j] = s;
    }
}

static int matmul_fwd(void) {
    OP_BEGIN;
    fm_rng r;
    fm_rng_init(&r, 12);
    fm_dtype dts[4] = {FM_F32, FM_F64, FM_F16, FM_BF16};
    double tols[4] = {1e-5, 1e-12, 3e-3, 3e-2};
    for (int d = 0; d < 4; d++) {
        /* broadcast batch: [2,1,3,5] @ [4,5,6] -> [2,4,3,6] */
        int64_t sa[4] = {2, 1, 3, 5}, sb[3] = {4, 5, 6};
        fm_tensor *a32 = fm_tensor_randn(4, sa, FM_F32, &r), *b32 = fm_tensor_randn(3, sb, FM_F32, &r);
        fm_tensor *a = fm_to_dtype(a32, dts[d]), *b = fm_to_dtype(b32, dts[d]);
        fm_tensor *y = fm_matmul(a, b);
        CHECK_MSG(y && y->ndim == 4 && y->shape[0] == 2 && y->shape[1] == 4 && y->shape[2] == 3 && y->shape[3] == 6,
                  "%s: %s", fm_dtype_name(dts[d]), fm_last_error());
        for (int i = 0; y && i < 2; i++) for (int j = 0; j < 4; j++) {
            double ref[18];
            ref_mm(a, b, 3, 5, 6, i * 15, j * 30, ref);
            for (int k = 0; k < 18; k++) CHECK_NEAR(fm_tensor_get(y, (i * 4 + j) * 18 + k), ref[k], tols[d] * 5);
        }
        fm_tensor_release_n(5, a32, b32, a, b, y);
    }
    /* transposed operands go to BLAS without copies; a sliced one is packed */
    int64_t s1[2] = {7, 5}, s2[2] = {6, 10};
    fm_tensor *a = fm_tensor_randn(2, s1, FM_F32, &r), *at = fm_transpose(a, 0, 1);          /* [5,7] */
    fm_tensor *b = fm_tensor_randn(2, s2, FM_F32, &r), *bs = fm_slice(b, 1, 0, 10, 2);      /* [6,5] strided */
    fm_tensor *bst = fm_transpose(bs, 0, 1);                                                 /* [5,6] */
    fm_tensor *bsv = fm_transpose(bst, 0, 1);
    fm_tensor *y = fm_matmul(bsv, at);                                                       /* [6,7] */
    CHECK(y && y->shape[0] == 6 && y->shape[1] == 7);
    for (int i = 0; y && i < 6; i++) for (int j = 0; j < 7; j++) {
        double s = 0;
        for (int k = 0; k < 5; k++) s += fm_tensor_get(bs, i * 5 + k) * fm_tensor_get(a, j * 5 + k);
        CHECK_NEAR(fm_tensor_get(y, i * 7 + j), s, 1e-5);
    }
    /* f16/bf16 operands are widened to f32 before the GEMM: row-contiguous, column-contiguous
     * (transposed view) and strided (sliced) operands each take their own path */
    for (int d = 2; d < 4; d++) {
        fm_tensor *al = fm_to_dtype(a, dts[d]), *bl = fm_to_dtype(b, dts[d]);
        fm_tensor *alt = fm_transpose(al, 0, 1);                           /* [5,7], columns contiguous */
        fm_tensor *bls = fm_slice(bl, 1, 0, 10, 2);                        /* [6,5], strided */
        fm_tensor *blst = fm_transpose(bls, 0, 1);                         /* [5,6] */
        fm_tensor *y1 = fm_matmul(bls, alt), *y2 = fm_matmul(al, blst);    /* [6,7], [7,6] */
        CHECK_MSG(y1 && y2 && y1->shape[0] == 6 && y1->shape[1] == 7 && y2->shape[0] == 7 && y2->shape[1] == 6,
                  "%s: %s", fm_dtype_name(dts[d]), fm_last_error());
        for (int i = 0; y1 && y2 && i < 6; i++) for (int j = 0; j < 7; j++) {
            double q = 0;
            for (int k = 0; k < 5; k++) q += fm_tensor_get(bls, i * 5 + k) * fm_tensor_get(al, j * 5 + k);
            CHECK_NEAR(fm_tensor_get(y1, i * 7 + j), q, tols[d] * 5);
            CHECK_NEAR(fm_tensor_get(y2, j * 6 + i), q, tols[d] * 5);
        }
        fm_tensor_release_n(7, al, bl, alt, bls, blst, y1, y2);
    }
    /* one row (batch-1 decoding) takes the GEMV path, split over threads when large:
     * x [1,300] against a weight used transposed ([500,300]^T) and a plain [300,500] */
    {
        fm_tensor *x1 = fm_tensor_randn(2, (int64_t[]){1, 300}, FM_F32, &r);
        fm_tensor *wl = fm_tensor_randn(2, (int64_t[]){500, 300}, FM_F32, &r);
        fm_tensor *bp = fm_tensor_randn(2, (int64_t[]){300, 500}, FM_F32, &r);
        fm_tensor *wlt = fm_transpose(wl, 0, 1);
        fm_tensor *y1 = fm_matmul(x1, wlt), *y2 = fm_matmul(x1, bp);
        CHECK(y1 && y2 && y1->shape[1] == 500 && y2->shape[1] == 500);
        double e1 = 0, e2 = 0;
        for (int64_t jn = 0; y1 && y2 && jn < 500; jn++) {
            double q1 = 0, q2 = 0, m1 = 0, m2 = 0;
            for (int64_t k = 0; k < 300; k++) {
                double xv = fm_tensor_get(x1, k), a1 = xv * fm_tensor_get(wl, jn * 300 + k), a2 = xv * fm_tensor_get(bp, k * 500 + jn);
                q1 += a1; q2 += a2; m1 += fabs(a1); m2 += fabs(a2);
            }
            double d1 = fabs(fm_tensor_get(y1, jn) - q1) / (m1 + 1e-30), d2 = fabs(fm_tensor_get(y2, jn) - q2) / (m2 + 1e-30);
            if (d1 > e1) e1 = d1;
            if (d2 > e2) e2 = d2;
        }
        CHECK_MSG(e1 < 1e-6 && e2 < 1e-6, "gemv: relative error %g (transposed weight), %g (plain)", e1, e2);
        fm_tensor_release_n(6, x1, wl, bp, wlt, y1, y2);
    }
    /* 1-D operands */
    int64_t n5 = 5;
    fm_tensor *v = fm_tensor_ones(1, &n5, FM_F32, FM_CPU), *mv = fm_matmul(a, v), *dot = fm_matmul(v, v);
    CHECK(mv && mv->ndim == 1 && mv->shape[0] == 7);
    CHECK(dot && dot->ndim == 0 && fm_tensor_item(dot) == 5);
    /* bad shapes */
    CHECK(fm_matmul(a, a) == NULL);
    CHECK_ERR_CONTAINS("[7, 5] @ [7, 5]");
    fm_tensor *yl = fm_linear(at, a, NULL); /* [5,7] x [7,5]^T -> mismatch */
    CHECK(yl == NULL);
    CHECK_ERR_CONTAINS("linear");
    fm_tensor_release_n(10, a, at, b, bs, bst, bsv, v, mv, dot, y);
    OP_END;
}

static fm_tensor *gc_mm(fm_tensor **in, void *ctx) { (void)ctx; return fm_matmul(in[0], in[1]); }
static fm_tensor *gc_lin(fm_tensor **in, void *ctx) { (void)ctx; return fm_linear(in[0], in[1], in[2]); }
static int matmul_grad(void) {
    OP_BEGIN;
    fm_rng r;
    fm_rng_init(&r, 13);
    int64_t sa[3] = {2, 3, 4}, sb[2] = {5, 4};
    fm_tensor *a = fm_tensor_randn(3, sa, FM_F64, &r), *bb = fm_tensor_randn(2, sb, FM_F64, &r);
    fm_tensor *bt = fm_transpose(bb, 0, 1), *b = fm_detach(bt); /* non-contiguous [4,5], broadcast over batch */
    fm_tensor_requires_grad_(a, true);
    fm_tensor_requires_grad_(b, true);
    fm_tensor *ins[2] = {a, b};
    CHECK(gradcheck("matmul", gc_mm, 2, ins, NULL, 1e-6, 1e-6));
    int64_t sbias[1] = {5};
    fm_tensor *bias = fm_tensor_randn(1, sbias, FM_F64, &r);
    fm_tensor_requires_grad_(bias, true);
    fm_tensor_requires_grad_(bb, true);
    fm_tensor *ins3[3] = {a, bb, bias};
    CHECK(gradcheck("linear", gc_lin, 3, ins3, NULL, 1e-6, 1e-6));
    fm_tensor_release_n(5, a, bb, bt, b, bias);
    OP_END;
}
OP_TEST("matmul", matmul_fwd, matmul_grad)
