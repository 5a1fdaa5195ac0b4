/* The mixed linear (src/ops/ops_internal.h: bf16 GEMMs on f32 activations, f32
 * accumulation and outputs), run by test_ops at every FATHOM_ISA level: on an
 * AVX512-BF16 CPU with oneDNN the larger shape takes the bf16 hardware at the
 * avx512 level, and the widening path below it. Reference: double products of
 * the bf16-rounded operands (the rounding the op promises, no other), so a
 * kernel that skipped the rounding or rounded its accumulator would fail. */
#include <math.h>

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "ops/ops_internal.h"
#include "op_test.h"
#include "test_util.h"

/* t as the bf16 values it rounds to, as doubles (free it) */
static double *bf16_vals(fm_tensor *t) {
    fm_tensor *b = fm_to_dtype(t, FM_BF16);
    double *v = b ? op_host(b) : NULL;
    fm_tensor_release(b);
    return v;
}

/* C[M,N] = sum_k A(i,k) B(k,j) with A row stride ra/col stride ca, B likewise */
static void ref_gemm(const double *A, int64_t ra, int64_t ca, const double *B, int64_t rb, int64_t cb, int64_t M,
                     int64_t N, int64_t K, double *C) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += A[i * ra + k * ca] * B[k * rb + j * cb];
            C[i * N + j] = s;
        }
}

static double max_rel(const fm_tensor *t, const double *ref, int64_t n) {
    double *a = t ? op_host(t) : NULL, worst = a ? 0 : INFINITY;
    for (int64_t i = 0; a && i < n; i++) {
        double e = fabs(a[i] - ref[i]) / (1.0 + fabs(ref[i]));
        if (!(e <= worst)) worst = e;
    }
    free(a);
    return worst;
}

/* x [B, T, in] @ w[out, in]^T + b, forward and backward, against the reference */
static void check_shape(int64_t B, int64_t T, int64_t in, int64_t out, bool bias, uint64_t seed) {
    const int64_t R = B * T;
    fm_tensor *x = op_randn(3, (int64_t[]){B, T, in}, FM_F32, seed), *w = op_randn(2, (int64_t[]){out, in}, FM_F32, seed + 1);
    fm_tensor *b = bias ? op_randn(1, (int64_t[]){out}, FM_F32, seed + 2) : NULL;
    fm_tensor *gy = op_randn(3, (int64_t[]){B, T, out}, FM_F32, seed + 3);
    fm_tensor_requires_grad_(x, true);
    fm_tensor_requires_grad_(w, true);
    if (b) fm_tensor_requires_grad_(b, true);
    fm_tensor *y = fm_linear_mixed(x, w, b, FM_BF16);
    CHECK_MSG(y && y->dtype == FM_F32 && y->ndim == 3 && y->shape[2] == out, "mixed linear: %s", y ? fm_dtype_name(y->dtype) : fm_last_error());
    double *xv = bf16_vals(x), *wv = bf16_vals(w), *gv = bf16_vals(gy), *bv = b ? op_host(b) : NULL, *g32 = op_host(gy);
    double *ry = malloc(sizeof(double) * (size_t)(R * out)), *rgx = malloc(sizeof(double) * (size_t)(R * in));
    double *rgw = malloc(sizeof(double) * (size_t)(out * in)), *rgb = calloc((size_t)out, sizeof(double));
    if (y && xv && wv && gv && g32 && ry && rgx && rgw && rgb && (!b || bv)) {
        ref_gemm(xv, in, 1, wv, 1, in, R, out, in, ry); /* x w^T */
        for (int64_t i = 0; i < R * out; i++) ry[i] += bv ? bv[i % out] : 0;
        /* f32 accumulation over `in` terms of products of bf16 values */
        CHECK_MSG(max_rel(y, ry, R * out) < 2e-5, "y [%lld,%lld,%lld]: %g", (long long)R, (long long)in, (long long)out,
                  max_rel(y, ry, R * out));
        CHECK(fm_backward(y, gy, false) == FM_OK);
        ref_gemm(gv, out, 1, wv, in, 1, R, in, out, rgx);  /* bf16(g) w */
        ref_gemm(gv, 1, out, xv, in, 1, out, in, R, rgw);  /* bf16(g)^T x */
        for (int64_t i = 0; i < R * out; i++) rgb[i % out] += g32[i]; /* the f32 gradient's sum */
        CHECK(x->grad && x->grad->dtype == FM_F32 && w->grad && w->grad->dtype == FM_F32);
        CHECK_MSG(x->grad && max_rel(x->grad, rgx, R * in) < 2e-5, "dx: %g", x->grad ? max_rel(x->grad, rgx, R * in) : 1.0);
        CHECK_MSG(w->grad && max_rel(w->grad, rgw, out * in) < 1e-4, "dw: %g", w->grad ? max_rel(w->grad, rgw, out * in) : 1.0);
        if (b) CHECK_MSG(b->grad && max_rel(b->grad, rgb, out) < 1e-4, "db: %g", b->grad ? max_rel(b->grad, rgb, out) : 1.0);
    } else {
        CHECK_MSG(false, "mixed linear: %s", fm_last_error());
    }
    free(xv); free(wv); free(gv); free(bv); free(g32); free(ry); free(rgx); free(rgw); free(rgb);
    fm_tensor_release_n(5, x, w, b, gy, y);
}

static int linear_mixed_fwd(void) {
    OP_BEGIN;
    check_shape(3, 37, 40, 70, true, 31);    /* below the bf16 hardware's size floor: widened */
    check_shape(2, 150, 96, 100, true, 41);  /* 2.9M multiply-adds: oneDNN where it is loaded */
    check_shape(2, 150, 128, 384, false, 51); /* a kjv-gpt-like QKV product without bias */
    /* not its case: f64 input is fm_linear's, the same bits */
    fm_tensor *x = op_randn(2, (int64_t[]){5, 8}, FM_F64, 61), *w = op_randn(2, (int64_t[]){3, 8}, FM_F64, 62);
    fm_tensor *a = fm_linear_mixed(x, w, NULL, FM_BF16), *e = fm_linear(x, w, NULL);
    CHECK(a && e && a->dtype == FM_F64 && op_bitwise_equal(a, e));
    /* a shape error is fm_linear's message */
    fm_tensor *w2 = op_randn(2, (int64_t[]){3, 7}, FM_F32, 63), *x2 = op_randn(2, (int64_t[]){5, 8}, FM_F32, 64);
    CHECK(!fm_linear_mixed(x2, w2, NULL, FM_BF16));
    CHECK_ERR_CONTAINS("does not match weight");
    fm_tensor_release_n(6, x, w, a, e, w2, x2);
    OP_END;
}

/* the gradients are checked against their reference in linear_mixed_fwd; the
 * f64 gradient check of linear is matmul_grad's */
OP_TEST("matmul", linear_mixed_fwd, NULL)
