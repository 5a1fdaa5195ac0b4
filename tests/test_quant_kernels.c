/* The quantized kernels against their scalar references (quant_kernels.h):
 * the int8 product is integer arithmetic, so every implementation must give
 * the reference's integers exactly, including inputs where vpmaddubsw's 16-bit
 * pair sums would saturate (255 x -128 twice); activation quantization must
 * match bit for bit; the int4 rows accumulate in f32 in another order, so they
 * are held to a relative bound. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/quant_kernels.h"
#include "core/cpu_features.h"
#include "fathom/tensor.h"
#include "test_util.h"

static uint64_t g_seed = 88172645463325252ull;
static uint32_t rnd(void) { g_seed ^= g_seed << 13; g_seed ^= g_seed >> 7; g_seed ^= g_seed << 17; return (uint32_t)g_seed; }

typedef enum { FILL_RANDOM, FILL_SATURATE, FILL_EXTREMES } fill_kind;

static void fill8(uint8_t *a, int8_t *b, int64_t na, int64_t nb, fill_kind f) {
    for (int64_t i = 0; i < na; i++) a[i] = f == FILL_RANDOM ? (uint8_t)rnd() : f == FILL_SATURATE ? 255 : (rnd() & 1 ? 255 : 0);
    for (int64_t i = 0; i < nb; i++) b[i] = f == FILL_RANDOM ? (int8_t)rnd() : f == FILL_SATURATE ? -128 : (rnd() & 1 ? 127 : -128);
}

static int64_t q8_case(int64_t M, int64_t N, int64_t K, fill_kind f, fm_q8_impl impl, bool epi) {
    uint8_t *A = malloc((size_t)(M * K + 1));
    int8_t *B = malloc((size_t)(N * K + 1));
    int32_t *C0 = calloc((size_t)(M * N + 1), 4), *C1 = calloc((size_t)(M * N + 1), 4), *ws = malloc(4 * (size_t)N);
    float *sc = malloc(4 * (size_t)N), *bias = malloc(4 * (size_t)N), *y0 = calloc((size_t)(M * N + 1), 4), *y1 = calloc((size_t)(M * N + 1), 4);
    fill8(A, B, M * K, N * K, f);
    for (int64_t n = 0; n < N; n++) {
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) s += B[n * K + k];
        ws[n] = s;
        sc[n] = 0.001f * (float)(1 + n % 7);
        bias[n] = 0.5f - (float)(n % 3);
    }
    fm_q8_epilogue ep0 = {0.02f, 37, sc, ws, bias, y0, N, FM_QACT_NONE, NULL, NULL}, ep1 = ep0;
    ep1.y = y1;
    fm_q8_gemm g0 = {M, N, K, A, K, B, K, C0, N, epi ? &ep0 : NULL}, g1 = g0;
    g1.C = C1;
    g1.ep = epi ? &ep1 : NULL;
    fm_q8_gemm_run(&g0, FM_Q8_REF);
    fm_q8_gemm_run(&g1, impl);
    int64_t bad = 0;
    for (int64_t i = 0; i < M * N; i++) bad += epi ? y0[i] != y1[i] : C0[i] != C1[i];
    if (f == FILL_SATURATE && !epi) bad += C0[0] != 255 * -128 * (int32_t)K; /* the reference itself */
    free(A); free(B); free(C0); free(C1); free(ws); free(sc); free(bias); free(y0); free(y1);
    return bad;
}

static void test_q8(void) {
    const fm_cpu_features *cf = fm_cpu_get_features();
    fm_q8_impl impls[2] = {FM_Q8_AVX2, FM_Q8_VNNI};
    bool have[2] = {cf->avx2 && cf->fma && cf->f16c, cf->avx512f && cf->avx512bw && cf->avx512vl && cf->avx512_vnni};
    const int64_t shapes[][3] = {{1, 1, 1}, {4, 4, 64}, {5, 7, 63}, {3, 9, 65}, {17, 33, 200}, {128, 40, 784}, {2, 19, 1024}, {9, 5, 31}};
    for (int i = 0; i < 2; i++) {
        if (!have[i]) { TEST_SKIP("int8 %s kernel: this CPU lacks it", fm_q8_impl_name(impls[i])); continue; }
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int f = 0; f < 3; f++)
                for (int epi = 0; epi < 2; epi++) {
                    int64_t bad = q8_case(shapes[s][0], shapes[s][1], shapes[s][2], (fill_kind)f, impls[i], epi);
                    CHECK_MSG(bad == 0, "%s M %lld N %lld K %lld fill %d epilogue %d: %lld elements differ from the scalar reference",
                              fm_q8_impl_name(impls[i]), (long long)shapes[s][0], (long long)shapes[s][1], (long long)shapes[s][2], f, epi, (long long)bad);
                }
    }
}

/* The panel layout (vnni16x4): B packed as fm_pack_weight_int8 does, A rows
 * padded to 4 ceil(K/4) bytes with zeros. Every implementation against the
 * scalar reference on the rows (an independent check of the packing), in
 * integers and through the epilogue, with and without bias and fused ReLU. */
static int64_t q8p_case(int64_t M, int64_t N, int64_t K, fill_kind f, fm_q8_impl impl, int epi, bool narrow) {
    const int64_t Kq = (K + 3) / 4, lda = 4 * Kq, Np = (N + 15) / 16;
    uint8_t *A = malloc((size_t)(M * K + 1)), *Ap = calloc((size_t)(M * lda + 1), 1);
    int8_t *B = malloc((size_t)(N * K + 1)), *P = calloc((size_t)(Np * Kq * 64), 1);
    int32_t *C0 = calloc((size_t)(M * N + 1), 4), *C1 = calloc((size_t)(M * N + 1), 4), *ws = malloc(4 * (size_t)N);
    float *sc = malloc(4 * (size_t)N), *bias = malloc(4 * (size_t)N), *y0 = calloc((size_t)(M * N + 1), 4), *y1 = calloc((size_t)(M * N + 1), 4);
    fill8(A, B, M * K, N * K, f);
    for (int64_t i = 0; i < N * K; i++) B[i] = B[i] == -128 ? -127 : B[i]; /* the panels' range (fm_pack_weight_int8) */
    if (narrow) /* 7-bit weights: [-64, 64], the extremes kept (255 x 64 x 2 = 32640, vpmaddubsw's edge) */
        for (int64_t i = 0; i < N * K; i++) B[i] = B[i] > 64 ? 64 : B[i] < -64 ? -64 : B[i];
    for (int64_t m = 0; m < M; m++) memcpy(Ap + m * lda, A + m * K, (size_t)K);
    for (int64_t n = 0; n < N; n++) {
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) { s += B[n * K + k]; P[fm_q8_panel_index(Kq, n, k)] = B[n * K + k]; }
        ws[n] = s;
        sc[n] = 0.001f * (float)(1 + n % 7);
        bias[n] = 0.5f - (float)(n % 3);
    }
    /* epi: 0 integers, 1 epilogue with bias, 2 bias + relu, 3 relu without bias, 4 bias + tanh GELU, 5 bias + exact GELU
     * (the vector kernels' GELU against the reference's double one: within 2e-6 relative or 1e-7, not bitwise;
     * test_quant holds the fused GELU bitwise to the separate bias + GELU op), 6 bias with a scale and zero point per row */
    static const int act_of[7] = {FM_QACT_NONE, FM_QACT_NONE, FM_QACT_RELU, FM_QACT_RELU, FM_QACT_GELU_TANH, FM_QACT_GELU, FM_QACT_NONE};
    float *rs = malloc(4 * (size_t)M);
    int32_t *rz = malloc(4 * (size_t)M);
    for (int64_t m = 0; m < M; m++) { rs[m] = 0.01f + 0.003f * (float)(m % 5); rz[m] = (int32_t)(m * 37 % 256); }
    fm_q8_epilogue ep0 = {0.02f, 37, sc, ws, epi == 3 ? NULL : bias, y0, N, act_of[epi], epi == 6 ? rs : NULL, epi == 6 ? rz : NULL}, ep1 = ep0;
    ep1.y = y1;
    fm_q8_gemm g0 = {M, N, K, A, K, B, K, C0, N, epi ? &ep0 : NULL};
    fm_q8_pgemm g1 = {M, N, K, Ap, lda, P, C1, N, epi ? &ep1 : NULL, false};
    fm_q8_gemm_run(&g0, FM_Q8_REF);
    fm_q8_pgemm_run(&g1, impl);
    int64_t bad = 0, neg = 0;
    if (impl == FM_Q8_AVX2) { /* the AVX2 tile's two forms called directly, every M: the drivers pick the narrow one only from
                               * FM_Q8_NARROW_MIN_M rows, after a scan of the panels that must agree with the weights */
        bool scan = fm_q8_panels_narrow_avx2(P, Np * Kq * 64), want = true;
        for (int64_t i = 0; i < N * K; i++) want &= B[i] >= -64 && B[i] <= 64;
        bad += scan != want;
        if (want) {
            int32_t *C2 = calloc((size_t)(M * N + 1), 4);
            float *y2 = calloc((size_t)(M * N + 1), 4);
            fm_q8_epilogue ep2 = ep0;
            ep2.y = y2;
            fm_q8_pgemm g2 = {M, N, K, Ap, lda, P, C2, N, epi ? &ep2 : NULL, true};
            fm_q8_pgemm_tile_avx2(&g2, 0, M, 0, Np);
            for (int64_t i = 0; i < M * N; i++) {
                if (epi >= 4 && epi <= 5) bad += !(fabsf(y0[i] - y2[i]) <= 2e-6f * fabsf(y0[i]) + 1e-7f);
                else bad += epi ? memcmp(&y0[i], &y2[i], 4) != 0 : C0[i] != C2[i];
            }
            free(C2);
            free(y2);
        }
    }
    for (int64_t i = 0; i < M * N; i++) {
        if (epi >= 4 && epi <= 5) bad += !(fabsf(y0[i] - y1[i]) <= 2e-6f * fabsf(y0[i]) + 1e-7f);
        else bad += epi ? memcmp(&y0[i], &y1[i], 4) != 0 : C0[i] != C1[i];
        neg += (epi == 2 || epi == 3) && y1[i] < 0;
    }
    free(A); free(Ap); free(B); free(P); free(C0); free(C1); free(ws); free(sc); free(bias); free(y0); free(y1); free(rs); free(rz);
    return bad + neg;
}

static void test_q8_panels(void) {
    const fm_cpu_features *cf = fm_cpu_get_features();
    fm_q8_impl impls[4] = {FM_Q8_REF, FM_Q8_AVX2, FM_Q8_VNNI, FM_Q8_AMX};
    bool have[4] = {true, cf->avx2 && cf->fma && cf->f16c, cf->avx512f && cf->avx512bw && cf->avx512vl && cf->avx512_vnni,
                    fm_cpu_use_amx() && cf->amx_int8 && cf->avx512_vnni};
    /* M past the 6-row block, the 32-row tile block and the 96-row task, N past 16-column panels,
     * pairs of them and 4-panel blocks, K tails 1..3 and K multiples of 64 (the tiles' step) */
    const int64_t shapes[][3] = {{1, 1, 1}, {6, 64, 64}, {7, 17, 63}, {13, 70, 65}, {1, 129, 130}, {200, 40, 784},
                                 {97, 16, 3}, {5, 33, 1024}, {32, 32, 64}, {70, 100, 128}, {200, 40, 768}, {35, 96, 1024}};
    for (int i = 0; i < 4; i++) {
        if (!have[i]) { TEST_SKIP("int8 panels %s: this CPU lacks it", fm_q8_impl_name(impls[i])); continue; }
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int f = 0; f < 6; f++) /* fills 3..5: the same with 7-bit weights (narrow panels) */
                for (int epi = 0; epi < 7; epi++) {
                    int64_t bad = q8p_case(shapes[s][0], shapes[s][1], shapes[s][2], (fill_kind)(f % 3), impls[i], epi, f >= 3);
                    CHECK_MSG(bad == 0, "panels %s M %lld N %lld K %lld fill %d epilogue %d: %lld elements differ from the scalar reference",
                              fm_q8_impl_name(impls[i]), (long long)shapes[s][0], (long long)shapes[s][1], (long long)shapes[s][2], f, epi,
                              (long long)bad);
                }
    }
}

/* The saturating case spelled out: vpmaddubsw alone would clip 255*-128*2 to -32768. */
static void test_q8_saturation_value(void) {
    uint8_t A[64];
    int8_t B[64];
    for (int i = 0; i < 64; i++) { A[i] = 255; B[i] = -128; }
    int32_t c[3] = {0, 0, 0};
    fm_q8_gemm g = {1, 1, 64, A, 64, B, 64, c, 1, NULL};
    fm_q8_gemm_tile_ref(&g, 0, 1, 0, 1);
    CHECK(c[0] == -2088960);
    const fm_cpu_features *cf = fm_cpu_get_features();
    if (cf->avx2) { g.C = c + 1; fm_q8_gemm_tile_avx2(&g, 0, 1, 0, 1); CHECK(c[1] == -2088960); }
    if (cf->avx512_vnni && cf->avx512bw) { g.C = c + 2; fm_q8_gemm_tile_vnni(&g, 0, 1, 0, 1); CHECK(c[2] == -2088960); }
}

static void test_q8_activations(void) {
    const int64_t n = 1000;
    float *x = malloc(4 * n);
    uint8_t *q0 = malloc(n), *q1 = malloc(n);
    for (int64_t i = 0; i < n; i++) x[i] = ((float)(rnd() % 20001) - 7000.0f) / 1000.0f;
    x[5] = 0.5f * 0.0f; /* an exact zero must map to the zero point */
    float mn, mx, s;
    int32_t z;
    fm_q8_range(x, n, &mn, &mx);
    fm_q8_params(mn, mx, &s, &z);
    fm_q8_quantize(x, n, s, z, q0);
    CHECK(q0[5] == z);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(((double)q0[i] - z) * s - x[i]));
    CHECK_MSG(worst <= 0.5001 * s, "round trip error %g > scale/2 %g", worst, 0.5 * s);
    x[7] = -7.0f; /* the range's ends inside the vector part and the tail */
    x[n - 1] = 13.5f;
    if (fm_cpu_get_features()->avx2) {
        for (int64_t len = 1; len <= n; len += 13) {
            float mn2, mx2;
            fm_q8_range(x, len, &mn, &mx);
            fm_q8_range_avx2(x, len, &mn2, &mx2);
            CHECK(mn == mn2 && mx == mx2);
            fm_q8_params(mn, mx, &s, &z);
            fm_q8_quantize(x, len, s, z, q0);
            fm_q8_quantize_avx2(x, len, s, z, q1);
            CHECK_MSG(!memcmp(q0, q1, (size_t)len), "avx2 activation codes differ at length %lld", (long long)len);
        }
        float *t = malloc(4 * n); /* ties (x.5 at scale 1) round to even alike; past [0, 255] clamps alike */
        for (int64_t i = 0; i < n; i++) t[i] = 0.5f * (float)i - 300.0f;
        fm_q8_quantize(t, n, 1.0f, 128, q0);
        fm_q8_quantize_avx2(t, n, 1.0f, 128, q1);
        CHECK_MSG(!memcmp(q0, q1, (size_t)n), "avx2 activation codes differ on ties or clamped values");
        CHECK(q0[2 * 300 + 1] == 128 && q0[2 * 300 + 3] == 130 && q0[0] == 0 && q0[n - 1] == 255); /* rint(0.5) = 0, rint(1.5) = 2 */
        free(t);
        fm_q8_range(x, n, &mn, &mx);
        fm_q8_params(mn, mx, &s, &z);
    } else {
        TEST_SKIP("avx2 activation quantization: this CPU lacks AVX2");
    }
    if (fm_cpu_get_features()->avx512bw && fm_cpu_get_features()->avx512vl) {
        for (int64_t len = 1; len <= n; len += 37) {
            float mn2, mx2;
            fm_q8_range(x, len, &mn, &mx);
            fm_q8_range_avx512(x, len, &mn2, &mx2);
            CHECK(mn == mn2 && mx == mx2);
            fm_q8_quantize(x, len, s, z, q0);
            fm_q8_quantize_avx512(x, len, 1.0f / s, z, q1);
            CHECK_MSG(!memcmp(q0, q1, (size_t)len), "avx512 activation codes differ at length %lld", (long long)len);
        }
    } else {
        TEST_SKIP("avx512 activation quantization: this CPU lacks AVX-512");
    }
    free(x); free(q0); free(q1);
}

static void test_q4(void) {
    const fm_cpu_features *cf = fm_cpu_get_features();
    /* odd block counts (K 32, 96, 160, 224), rows past the 4-row block (N 5, 7, 9, 3), G 32/64/128;
     * the last 1-3 groups after whole fours of them (g64/g128: 768/128, 448/64, 320/64) and
     * the last 1-3 pairs after whole fours (g32: 384, 224, 160) */
    const int64_t shapes[][4] = {{1, 5, 32, 32},  {3, 7, 128, 64},  {4, 9, 256, 128}, {6, 3, 384, 32},  {1, 64, 512, 128}, {2, 6, 96, 32},
                                 {1, 13, 768, 64}, {2, 5, 768, 128}, {1, 6, 448, 64}, {3, 4, 320, 64}, {2, 9, 224, 32},  {1, 7, 160, 32},
                                 /* g32 with 2+ rows: the 4-row tiles (q4_tile32), whole and with 1-3 rows left */
                                 {5, 11, 96, 32}, {8, 9, 256, 32}, {9, 17, 352, 32}, {7, 3, 800, 32}, {16, 8, 768, 32},
                                 /* g64/g128 with 2+ rows (q4_tileg): whole fours of groups and 1-3 left, rows left over */
                                 {5, 7, 448, 64}, {9, 6, 384, 128}, {8, 3, 1024, 64}, {6, 5, 320, 64}, {2, 9, 128, 64}, {7, 4, 640, 128}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int with_min = 0; with_min < 2; with_min++) {
            int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], G = shapes[s][3], ng = K / G;
            float *x = malloc(4 * (size_t)(M * K)), *xs = calloc((size_t)(M * ng), 4), *bias = malloc(4 * (size_t)N);
            float *y[3] = {malloc(4 * (size_t)(M * N)), malloc(4 * (size_t)(M * N)), malloc(4 * (size_t)(M * N))};
            uint8_t *w = malloc((size_t)(N * K / 2));
            uint16_t *sc = malloc(2 * (size_t)(N * ng)), *mi = malloc(2 * (size_t)(N * ng));
            for (int64_t i = 0; i < M * K; i++) x[i] = ((float)(rnd() % 2001) - 1000.0f) / 1000.0f;
            for (int64_t m = 0; m < M; m++)
                for (int64_t k = 0; k < K; k++) xs[m * ng + k / G] += x[m * K + k];
            for (int64_t i = 0; i < N * K / 2; i++) w[i] = (uint8_t)rnd();
            for (int64_t i = 0; i < N * ng; i++) { sc[i] = fm_f32_to_f16(0.01f + 0.001f * (float)(i % 5)); mi[i] = fm_f32_to_f16(-0.07f); }
            for (int64_t n = 0; n < N; n++) bias[n] = 0.1f * (float)n;
            fm_q4_gemm g = {M, N, K, G, x, K, w, sc, with_min ? mi : NULL, bias, xs, y[0], N, NULL, NULL, NULL, false};
            fm_q4_gemm_run(&g, FM_Q4_REF);
            /* the reference against a dequantized f64 product */
            float *row = malloc(4 * (size_t)K);
            double worst = 0;
            for (int64_t n = 0; n < N; n++) {
                fm_q4_dequant_row(w + n * K / 2, sc + n * ng, with_min ? mi + n * ng : NULL, K, G, row);
                for (int64_t m = 0; m < M; m++) {
                    double acc = bias[n], mag = fabs(bias[n]);
                    for (int64_t k = 0; k < K; k++) { acc += (double)row[k] * x[m * K + k]; mag += fabs((double)row[k] * x[m * K + k]); }
                    worst = fmax(worst, fabs(y[0][m * N + n] - acc) / (mag + 1e-30));
                }
            }
            CHECK_MSG(worst < 1e-5, "int4 reference vs dequantized product: %g", worst);
            /* AVX2: x as int8 per group of G, held to the scalar model of that
             * arithmetic at rounding, and to the f32 reference at the x rounding's
             * bound. AVX-512 VNNI: the same rows with vpdpbusd, bitwise the AVX2 ones. */
            if (cf->avx2 && cf->fma && cf->f16c) {
                int8_t *qx = malloc((size_t)(M * K)), *qx2 = malloc((size_t)(M * K));
                float *dxv = malloc(4 * (size_t)(M * K / 8)), *dxv2 = malloc(4 * (size_t)(M * K / 8));
                for (int64_t m = 0; m < M; m++) {
                    fm_q4_quantize_x(x + m * K, K, G, qx + m * K, dxv + m * K / 8);
                    fm_q4_quantize_x_avx2(x + m * K, K, G, qx2 + m * K, dxv2 + m * K / 8);
                }
                CHECK_MSG(!memcmp(qx, qx2, (size_t)(M * K)) && !memcmp(dxv, dxv2, 4 * (size_t)(M * K / 8)), "int4: avx2 x codes differ from the scalar ones (K %lld)",
                          (long long)K);
                fm_q4_gemm gm = g;
                gm.qx = qx;
                gm.dxv = dxv;
                gm.y = y[2];
                fm_q4_rows_q8_ref(&gm, 0, M, 0, N);
                g.y = y[1];
                fm_q4_gemm_run(&g, FM_Q4_AVX2);
                double e = 0, ex = 0, ymax = 0;
                for (int64_t j = 0; j < M * N; j++) {
                    e = fmax(e, fabs(y[1][j] - y[2][j]) / (1.0 + fabs(y[2][j])));
                    ex = fmax(ex, fabs(y[2][j] - y[0][j]));
                    ymax = fmax(ymax, fabs(y[0][j]));
                }
                CHECK_MSG(e < 2e-5, "int4 avx2 M %lld K %lld G %lld min %d: rel err %g vs the scalar model", (long long)M, (long long)K, (long long)G,
                          with_min, e);
                /* a row's values do not depend on the rows beside it (a batched decode
                 * step gives each sequence what it gets alone): each row on its own */
                bool alone_same = true;
                for (int64_t m = 0; m < M; m++) {
                    float *y1 = malloc(4 * (size_t)N);
                    fm_q4_gemm g1 = g;
                    g1.M = 1;
                    g1.x = x + m * K;
                    g1.xsum = xs + m * ng;
                    g1.y = y1;
                    fm_q4_gemm_run(&g1, FM_Q4_AVX2);
                    alone_same &= !memcmp(y1, y[1] + m * N, 4 * (size_t)N);
                    free(y1);
                }
                CHECK_MSG(alone_same, "int4 avx2 M %lld K %lld G %lld min %d: a row alone differs from the same row in the batch", (long long)M,
                          (long long)K, (long long)G, with_min);
                /* x rounding: each code is off by <= amax/254 of its x block (G values)
                 * and multiplies q d <= 15 x 0.014 here (the offset term keeps f32 x) */
                double bound = 0;
                for (int64_t m = 0; m < M; m++) {
                    double b = 0;
                    for (int64_t k = 0; k < K; k += G) {
                        double am = 0;
                        for (int64_t i = 0; i < G; i++) am = fmax(am, fabs(x[m * K + k + i]));
                        b += (double)G * 15 * 0.014 * am / 254;
                    }
                    bound = fmax(bound, b);
                }
                CHECK_MSG(ex <= bound, "int4 x rounding M %lld K %lld G %lld: |model - f32| %g > bound %g", (long long)M, (long long)K, (long long)G, ex, bound);
                if (cf->avx512f && cf->avx512bw && cf->avx512vl && cf->avx512_vnni && fm_cpu_use_avx512()) {
                    g.y = y[2];
                    fm_q4_gemm_run(&g, FM_Q4_AVX512);
                    CHECK_MSG(!memcmp(y[1], y[2], sizeof(float) * (size_t)(M * N)), "int4 avx512 (vnni) M %lld K %lld G %lld min %d: not bitwise the avx2 rows",
                              (long long)M, (long long)K, (long long)G, with_min);
                } else {
                    TEST_SKIP("int4 avx512 (vnni): this CPU lacks it or FATHOM_ISA is below avx512");
                }
                free(qx); free(qx2); free(dxv); free(dxv2);
            } else {
                TEST_SKIP("int4 avx2: this CPU lacks it");
            }
            free(x); free(xs); free(bias); free(y[0]); free(y[1]); free(y[2]); free(w); free(sc); free(mi); free(row);
        }
}

int main(void) {
    test_q8_saturation_value();
    test_q8();
    test_q8_panels();
    test_q8_activations();
    test_q4();
    TEST_DONE();
}
