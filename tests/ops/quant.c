/* Forward tests of the quantized ops. Each op is checked two ways:
 *  - against an independent f64 evaluation of its own formula (the activation
 *    codes and zero point recomputed here), relative 1e-5 (int4: of the sum of
 *    the terms' magnitudes, the scale of f32 rounding; where the AVX2 kernel
 *    runs, plus its rounding of x to int8 per block of 32: sum_k |w_k| amax_b / 254);
 *  - against the f32 op it replaces, within the error bound the format allows:
 *    int8: |y - y_f32| <= sum_k (|x_k| w_scale/2 + |w_k| a_scale/2 + a_scale w_scale/4);
 *    int4: |y - y_f32| <= sum_k |x_k| e_k, e_k = |d| (symmetric: the top code is
 *          clamped) or |d|/2 + f16 rounding (with min) per weight's group.
 * and with bad input (dtype, shape, group, index). qconv2d_int8 here against the f32
 * convolution within the int8 bound (per output channel o, with |x| at its max over the
 * input: K (max|x| w_scale_o / 2 + a_scale w_scale_o / 4) + sum |w_o| a_scale / 2); its exact
 * integer formula, each kernel path and its bad input are tests/test_qconv.c. */
#include "test_util.h"
#include "op_test.h"
#include "backend/cpu/quant_kernels.h" /* which int4 kernel runs: the AVX2 one rounds x to int8 */
#include "fathom/ops.h"
#include "fathom/quant.h"

static double *host(const fm_tensor *t) { return op_host(t); }

/* x [M, K] and w [N, K]: y = x w^T + b in f64 */
static double lin(const double *x, const double *w, const double *b, int64_t m, int64_t n, int64_t K) {
    double s = b ? b[n] : 0;
    for (int64_t k = 0; k < K; k++) s += x[m * K + k] * w[n * K + k];
    return s;
}

static int qlinear8_forward(void) {
    OP_BEGIN;
    const int64_t M = 15, K = 70, N = 24;
    fm_tensor *x = op_randn(3, (int64_t[]){3, 5, K}, FM_F32, 1), *w = op_randn(2, (int64_t[]){N, K}, FM_F32, 2);
    fm_tensor *b = op_randn(1, &N, FM_F32, 3), *wq = NULL, *ws = NULL;
    CHECK(fm_quantize_weight_int8(w, &wq, &ws) == FM_OK);
    double *hx = host(x), *hw = host(w), *hb = host(b), *hq = host(wq), *hs = host(ws);
    for (int dyn = 0; dyn < 2; dyn++) {
        double mn = 0, mx = 0;
        for (int64_t i = 0; i < M * K; i++) { mn = fmin(mn, hx[i]); mx = fmax(mx, hx[i]); }
        float s = dyn ? (float)((float)mx - (float)mn) / 255.0f : 0.03f;
        int z = dyn ? (int)nearbyintf((float)-mn / s) : 100;
        fm_tensor *y = fm_qlinear_int8(x, wq, ws, b, dyn ? 0.0 : s, z);
        CHECK(y && y->ndim == 3 && y->shape[2] == N && y->dtype == FM_F32);
        double *hy = y ? host(y) : NULL, e_formula = 0, e_f32 = 0;
        for (int64_t m = 0; hy && m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = 0, bound = 0;
                for (int64_t k = 0; k < K; k++) {
                    double q = fmin(255, fmax(0, nearbyint((float)hx[m * K + k] * (1.0f / s)) + z));
                    acc += (q - z) * hq[n * K + k];
                    bound += fabs(hx[m * K + k]) * hs[n] / 2 + fabs(hw[n * K + k]) * s / 2 + s * hs[n] / 4;
                }
                double ref = s * hs[n] * acc + hb[n], y32 = lin(hx, hw, hb, m, n, K);
                e_formula = fmax(e_formula, fabs(hy[m * N + n] - ref) / (1 + fabs(ref)));
                /* static scale 0.03 with zero 100 covers [-3, 4.65]: N(0,1) inputs fit */
                e_f32 = fmax(e_f32, fabs(hy[m * N + n] - y32) / bound);
            }
        CHECK_MSG(e_formula < 1e-5, "qlinear_int8 (%s) vs its integer formula: %g", dyn ? "dynamic" : "static", e_formula);
        CHECK_MSG(e_f32 <= 1.0, "qlinear_int8 (%s) vs f32 linear: %g of the bound", dyn ? "dynamic" : "static", e_f32);
        free(hy);
        fm_tensor_release(y);
    }
    /* bad input */
    fm_tensor *xk = fm_tensor_zeros(2, (int64_t[]){2, K + 1}, FM_F32, FM_CPU), *sN = fm_tensor_zeros(1, (int64_t[]){N + 1}, FM_F32, FM_CPU);
    CHECK(!fm_qlinear_int8(xk, wq, ws, NULL, 0, 0));
    CHECK_ERR_CONTAINS("must end in the weight's 70 input features");
    CHECK(!fm_qlinear_int8(x, w, ws, NULL, 0, 0));
    CHECK_ERR_CONTAINS("weight must be a 2-D i8 tensor");
    CHECK(!fm_qlinear_int8(x, wq, sN, NULL, 0, 0));
    CHECK_ERR_CONTAINS("weight scale has shape [25], expected [24]");
    CHECK(!fm_qlinear_int8(x, wq, ws, NULL, 0.1, 300));
    CHECK_ERR_CONTAINS("zero point 300");
    free(hx); free(hw); free(hb); free(hq); free(hs);
    fm_tensor_release_n(7, x, w, b, wq, ws, xk, sN);
    OP_END;
}

/* One f16 value of a [N, K/G] table. */
static double f16at(const fm_tensor *t, int64_t i) { return fm_f16_to_f32(((const uint16_t *)fm_tensor_data(t))[i]); }

static int qlinear4_forward(void) {
    OP_BEGIN;
    const int64_t K = 256, N = 12, M = 6;
    fm_tensor *x = op_randn(2, (int64_t[]){M, K}, FM_F32, 4), *w = op_randn(2, (int64_t[]){N, K}, FM_F32, 5), *b = op_randn(1, &N, FM_F32, 6);
    double *hx = host(x), *hw = host(w), *hb = host(b);
    const int groups[3] = {32, 64, 128};
    const bool x8 = fm_q4_impl_best() != FM_Q4_REF; /* AVX2 and AVX-512 VNNI round x to int8 per block */
    double *amax = calloc((size_t)(M * K / 32), sizeof(double)); /* per row and block of 32 */
    for (int64_t i = 0; i < M * K; i++) amax[i / 32] = fmax(amax[i / 32], fabs(hx[i]));
    for (int gi = 0; gi < 3; gi++)
        for (int wm = 0; wm < 2; wm++) {
            const int G = groups[gi];
            fm_tensor *p = NULL, *sc = NULL, *mi = NULL;
            CHECK(fm_quantize_weight_int4(w, G, wm, &p, &sc, &mi) == FM_OK);
            fm_tensor *y = p ? fm_qlinear_int4(x, p, sc, mi, b, G) : NULL;
            CHECK(y && y->shape[0] == M && y->shape[1] == N);
            double *hy = y ? host(y) : NULL, e_formula = 0, e_f32 = 0;
            const uint8_t *pp = p ? fm_tensor_data(p) : NULL;
            for (int64_t n = 0; hy && n < N; n++)
                for (int64_t m = 0; m < M; m++) {
                    double acc = hb[n], acc32 = hb[n], bound = 1e-6, mag = 1 + fabs(hb[n]), xr = 0;
                    for (int64_t k = 0; k < K; k++) {
                        int64_t c = k / 32, j = k % 32, gidx = n * (K / G) + k / G;
                        int q = j < 16 ? pp[n * K / 2 + c * 16 + j] & 15 : pp[n * K / 2 + c * 16 + j - 16] >> 4;
                        double d = f16at(sc, gidx), mn = mi ? f16at(mi, gidx) : -8 * d;
                        acc += (q * d + mn) * hx[m * K + k];
                        mag += (fabs(q * d) + fabs(mn)) * fabs(hx[m * K + k]); /* f32 rounding scales with this */
                        xr += x8 ? fabs(q * d) * amax[(m * K + k) / 32] / 254 : 0; /* the offset term keeps f32 x */
                        acc32 += hw[n * K + k] * hx[m * K + k];
                        bound += fabs(hx[m * K + k]) * (mi ? fabs(d) * 0.51 + fabs(mn) * 1e-3 : fabs(d) * 1.01);
                    }
                    e_formula = fmax(e_formula, fmax(0, fabs(hy[m * N + n] - acc) - xr * 1.0001) / mag);
                    e_f32 = fmax(e_f32, fabs(hy[m * N + n] - acc32) / (bound + xr * 1.0001));
                }
            CHECK_MSG(e_formula < 1e-5, "qlinear_int4 g%d min %d vs its formula: %g", G, wm, e_formula);
            CHECK_MSG(e_f32 <= 1.0, "qlinear_int4 g%d min %d vs f32: %g of the bound", G, wm, e_f32);
            free(hy);
            fm_tensor_release_n(4, p, sc, mi, y);
        }
    /* bad input: a group that does not divide K, a wrong scale table */
    fm_tensor *w40 = op_randn(2, (int64_t[]){3, 40}, FM_F32, 7), *p = NULL, *sc = NULL, *mi = NULL;
    CHECK(fm_quantize_weight_int4(w40, 32, false, &p, &sc, &mi) != FM_OK);
    CHECK_ERR_CONTAINS("group 32 does not divide the 40 input features");
    CHECK(fm_quantize_weight_int4(w, 48, false, &p, &sc, &mi) != FM_OK);
    CHECK_ERR_CONTAINS("group 48 must be 32, 64 or 128");
    CHECK(fm_quantize_weight_int4(w, 64, false, &p, &sc, &mi) == FM_OK);
    CHECK(!fm_qlinear_int4(x, p, sc, NULL, NULL, 32));
    CHECK_ERR_CONTAINS("scale has shape [12, 4], expected [12, 8]");
    CHECK(!fm_qlinear_int4(x, p, sc, NULL, NULL, 16));
    CHECK_ERR_CONTAINS("group 16 must be 32, 64 or 128");
    free(hx); free(hw); free(hb); free(amax);
    fm_tensor_release_n(6, x, w, b, w40, p, sc);
    OP_END;
}

static int qembedding4_forward(void) {
    OP_BEGIN;
    const int64_t V = 10, D = 64;
    fm_tensor *w = op_randn(2, (int64_t[]){V, D}, FM_F32, 8), *p = NULL, *sc = NULL, *mi = NULL;
    CHECK(fm_quantize_weight_int4(w, 32, true, &p, &sc, &mi) == FM_OK);
    fm_tensor *idx = fm_tensor_from_data((int64_t[]){3, 0, 9, 3}, 2, (int64_t[]){2, 2}, FM_I64);
    fm_tensor *y = fm_qembedding_int4(p, sc, mi, idx, 32), *wd = NULL;
    CHECK(y && y->ndim == 3 && y->shape[2] == D);
    /* the same rows through qlinear_int4 with one-hot inputs: one dequantization */
    fm_tensor *oh = fm_tensor_zeros(2, (int64_t[]){4, V}, FM_F32, FM_CPU);
    double *hy = y ? host(y) : NULL, *hw = host(w), worst = 0;
    const int64_t rows[4] = {3, 0, 9, 3};
    for (int i = 0; hy && i < 4; i++)
        for (int64_t d = 0; d < D; d++) {
            int64_t g = rows[i] * 2 + d / 32;
            worst = fmax(worst, fabs(hy[i * D + d] - hw[rows[i] * D + d]) / (fabs(f16at(sc, g)) * 0.51 + fabs(f16at(mi, g)) * 1e-3));
        }
    CHECK_MSG(worst <= 1.0, "qembedding_int4 vs f32 rows: %g of the bound", worst);
    fm_tensor *bad = fm_tensor_from_data((int64_t[]){10}, 1, (int64_t[]){1}, FM_I64);
    CHECK(!fm_qembedding_int4(p, sc, mi, bad, 32));
    CHECK_ERR_CONTAINS("index 10 at position 0 is outside the table's 10 rows");
    free(hy); free(hw);
    fm_tensor_release_n(9, w, p, sc, mi, idx, y, wd, oh, bad);
    OP_END;
}

/* the int8 table on the panels: each row scale * code, the codes fm_quantize_weight_int8's
 * (so within half a step of the f32 row), at a width not a multiple of 4; bad input refused */
static int qembedding8_forward(void) {
    OP_BEGIN;
    const int64_t V = 21, D = 37;
    fm_tensor *w = op_randn(2, (int64_t[]){V, D}, FM_F32, 9), *q = NULL, *sc = NULL, *p = NULL, *u = NULL;
    CHECK(fm_quantize_weight_int8(w, &q, &sc) == FM_OK && fm_pack_weight_int8(q, &p, &u) == FM_OK);
    fm_tensor *idx = fm_tensor_from_data((int32_t[]){20, 0, 7, 20, 16, 15}, 2, (int64_t[]){3, 2}, FM_I32);
    fm_tensor *y = p ? fm_qembedding_int8(p, sc, idx, D) : NULL;
    CHECK_MSG(y && y->ndim == 3 && y->shape[2] == D, "%s", fm_last_error());
    const int rows[6] = {20, 0, 7, 20, 16, 15};
    int bad = 0, far = 0;
    for (int i = 0; y && i < 6; i++)
        for (int64_t d = 0; d < D; d++) {
            const float s = ((const float *)fm_tensor_data(sc))[rows[i]], got = ((const float *)fm_tensor_data(y))[i * D + d];
            bad += got != s * (float)((const int8_t *)fm_tensor_data(q))[rows[i] * D + d];
            far += fabsf(got - ((const float *)fm_tensor_data(w))[rows[i] * D + d]) > 0.5001f * s;
        }
    CHECK_MSG(bad == 0 && far == 0, "qembedding_int8: %d values differ from scale * code, %d beyond half a step of f32", bad, far);
    fm_tensor *oob = fm_tensor_from_data((int64_t[]){21}, 1, (int64_t[]){1}, FM_I64);
    CHECK(!fm_qembedding_int8(p, sc, oob, D));
    CHECK_ERR_CONTAINS("index 21 at position 0 is outside the table's 21 rows");
    CHECK(!fm_qembedding_int8(p, sc, idx, 41)); /* 40 would fit the same panels: they do not store the width */
    CHECK_ERR_CONTAINS("panels must be i8 [2, 11, 16, 4] for 21 rows of width 41");
    CHECK(!fm_qembedding_int8(p, sc, idx, 0));
    CHECK_ERR_CONTAINS("width 0 must be in [1, 32768]");
    fm_tensor_release_n(8, w, q, sc, p, u, idx, y, oob);
    OP_END;
}

static int qconv8_forward(void) {
    OP_BEGIN;
    const int64_t N = 2, C = 5, H = 9, W = 8, O = 19, kh = 3, kw = 3, K = C * kh * kw;
    fm_tensor *x = op_randn(4, (int64_t[]){N, C, H, W}, FM_F32, 4), *w = op_randn(4, (int64_t[]){O, C, kh, kw}, FM_F32, 5);
    fm_tensor *b = op_randn(1, &O, FM_F32, 6), *P = NULL, *ws = NULL, *u = NULL;
    CHECK(fm_quantize_conv_weight_int8(w, &P, &ws, &u) == FM_OK);
    fm_conv2d_params p = fm_conv2d_default_params();
    p.padding[0] = p.padding[1] = 1;
    p.stride[1] = 2;
    fm_tensor *yf = fm_conv2d(x, w, b, &p);
    double *hx = host(x), *hw = host(w), *hs = host(ws), amax = 0;
    for (int64_t i = 0; i < N * C * H * W; i++) amax = fmax(amax, fabs(hx[i]));
    for (int dyn = 0; dyn < 2; dyn++) {
        const double as = dyn ? 2 * amax / 255 : 0.02; /* dynamic: about the range of x */
        fm_tensor *y = fm_qconv2d_int8(x, P, ws, u, b, &p, kh, kw, dyn ? 0.0 : as, dyn ? 0 : 128, false, INFINITY, 0);
        CHECK(y && yf && y->ndim == 4 && fm_tensor_numel(y) == fm_tensor_numel(yf));
        double *hy = y ? host(y) : NULL, *hf = yf ? host(yf) : NULL, worst = 0;
        const int64_t P1 = yf ? yf->shape[2] * yf->shape[3] : 0;
        for (int64_t i = 0; hy && hf && i < N * O * P1; i++) {
            const int64_t o = (i / P1) % O;
            double wsum = 0;
            for (int64_t k = 0; k < K; k++) wsum += fabs(hw[o * K + k]);
            const double bound = K * (amax * hs[o] / 2 + as * hs[o] / 4) + wsum * as / 2;
            worst = fmax(worst, fabs(hy[i] - hf[i]) / bound);
        }
        CHECK_MSG(hy && worst <= 1.0, "qconv2d_int8 (%s) vs f32 conv2d: %g of the bound", dyn ? "dynamic" : "static", worst);
        free(hy);
        free(hf);
        fm_tensor_release(y);
    }
    free(hx); free(hw); free(hs);
    fm_tensor_release_n(7, x, w, b, P, ws, u, yf);
    OP_END;
}

OP_TEST("qlinear_int8", qlinear8_forward, NULL)
OP_TEST("qconv2d_int8", qconv8_forward, NULL)
OP_TEST("qlinear_int4", qlinear4_forward, NULL)
OP_TEST("qembedding_int4", qembedding4_forward, NULL)
OP_TEST("qembedding_int8", qembedding8_forward, NULL)
