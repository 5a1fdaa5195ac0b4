/* The one-row GEMM path (batch-1 decoding): fm_cpu_gemm with M == 1 against a
 * double reference over shapes that hit every tail of the AVX2 kernel (rows not
 * a multiple of four, K not a multiple of 16 or 8, padded rows, beta != 0), and
 * the property the model's tests rely on: a row's result is bitwise the same
 * whatever the split (thread count, a sub-range of rows, a group of four or the
 * remainder loop). */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemv_avx2.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "fathom/tensor.h"
#include "test_util.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24) - 0.5);
}

/* y = W x + beta y0 with W [N, K] (row stride ldw) through fm_cpu_gemm, as fm_linear calls it */
static void gemv(int64_t N, int64_t K, const float *W, int64_t ldw, const float *x, double beta, float *y) {
    fm_cpu_gemm(&(fm_cpu_gemm_args){FM_F32, false, true, 1, N, K, x, K, W, ldw, beta, y, N});
}

static void check_shape(int64_t N, int64_t K, int64_t pad, double beta, uint64_t seed) {
    const int64_t ldw = K + pad;
    float *W = malloc(sizeof(float) * (size_t)(N * ldw)), *x = malloc(sizeof(float) * (size_t)K);
    float *y = malloc(sizeof(float) * (size_t)N), *y0 = malloc(sizeof(float) * (size_t)N);
    if (!W || !x || !y || !y0) { CHECK(!"out of memory"); goto done; }
    for (int64_t i = 0; i < N * ldw; i++) W[i] = frand(&seed);
    for (int64_t i = 0; i < K; i++) x[i] = frand(&seed);
    for (int64_t i = 0; i < N; i++) y0[i] = y[i] = frand(&seed);
    gemv(N, K, W, ldw, x, beta, y);
    double worst = 0;
    for (int64_t n = 0; n < N; n++) {
        double s = beta * y0[n], mag = fabs(beta * y0[n]);
        for (int64_t k = 0; k < K; k++) { s += (double)W[n * ldw + k] * x[k]; mag += fabs((double)W[n * ldw + k] * x[k]); }
        double e = fabs(y[n] - s) / (mag + 1e-30);
        if (e > worst) worst = e;
    }
    CHECK_MSG(worst < 1e-6, "N %lld K %lld ldw %lld beta %g: relative error %g", (long long)N, (long long)K,
              (long long)ldw, beta, worst);
done:
    free(W); free(x); free(y); free(y0);
}

/* each row of a split equals the same row of the whole: threads 1 vs 2, and the
 * kernel on row ranges that move rows between groups of four and the remainder */
static void check_split(int64_t N, int64_t K) {
    uint64_t seed = 77;
    float *W = malloc(sizeof(float) * (size_t)(N * K)), *x = malloc(sizeof(float) * (size_t)K);
    float *y1 = calloc((size_t)N, sizeof(float)), *y2 = calloc((size_t)N, sizeof(float));
    if (!W || !x || !y1 || !y2) { CHECK(!"out of memory"); goto done; }
    for (int64_t i = 0; i < N * K; i++) W[i] = frand(&seed);
    for (int64_t i = 0; i < K; i++) x[i] = frand(&seed);
    fm_set_num_threads(1);
    gemv(N, K, W, K, x, 0.0, y1);
    fm_set_num_threads(2);
    gemv(N, K, W, K, x, 0.0, y2);
    CHECK_MSG(!memcmp(y1, y2, sizeof(float) * (size_t)N), "N %lld K %lld: 1 and 2 threads differ", (long long)N,
              (long long)K);
    if (fm_cpu_use_avx2()) {
        const int64_t cuts[][2] = {{0, 1}, {1, 4}, {3, N - 3}, {5, 12}, {N - 7, 7}};
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            int64_t r0 = cuts[c][0], n = cuts[c][1];
            if (r0 < 0 || n < 1 || r0 + n > N) continue;
            memset(y2, 0, sizeof(float) * (size_t)N);
            fm_gemv_rows_f32_avx2(n, K, W + r0 * K, K, x, 0.0f, y2 + r0);
            CHECK_MSG(!memcmp(y1 + r0, y2 + r0, sizeof(float) * (size_t)n), "N %lld K %lld: rows %lld..%lld alone differ",
                      (long long)N, (long long)K, (long long)r0, (long long)(r0 + n));
        }
    }
done:
    free(W); free(x); free(y1); free(y2);
}

/* bf16 weights (a `--precision bf16` decode step): fm_cpu_gemv_bf16 with M rows of
 * bf16 x, against a double reference on the widened values; AVX2 and AVX-512 the
 * same bits; 1 and 2 threads the same bits; each row of an M-row call the same
 * bits as that row alone; the bias added */
static void check_bf16(int64_t M, int64_t N, int64_t K, uint64_t seed) {
    uint16_t *W = malloc(sizeof(uint16_t) * (size_t)(N * K)), *xb = malloc(sizeof(uint16_t) * (size_t)(M * K));
    float *Wf = malloc(sizeof(float) * (size_t)(N * K)), *xf = malloc(sizeof(float) * (size_t)(M * K));
    float *bias = malloc(sizeof(float) * (size_t)N), *y1 = malloc(sizeof(float) * (size_t)(M * N));
    float *y2 = malloc(sizeof(float) * (size_t)(M * N)), *yr = malloc(sizeof(float) * (size_t)N);
    if (!W || !xb || !Wf || !xf || !bias || !y1 || !y2 || !yr) { CHECK(!"out of memory"); goto done; }
    for (int64_t i = 0; i < N * K; i++) Wf[i] = frand(&seed);
    for (int64_t i = 0; i < M * K; i++) xf[i] = frand(&seed);
    for (int64_t i = 0; i < N; i++) bias[i] = frand(&seed);
    fm_convert_f32_to_bf16(Wf, W, (size_t)(N * K));
    fm_convert_f32_to_bf16(xf, xb, (size_t)(M * K));
    fm_convert_bf16_to_f32(W, Wf, (size_t)(N * K)); /* the values the kernel multiplies */
    fm_convert_bf16_to_f32(xb, xf, (size_t)(M * K));
    fm_cpu_gemm_args g = {FM_BF16, false, true, M, N, K, xb, K, W, K, 0.0, y1, N};
    fm_set_num_threads(1);
    CHECK(fm_cpu_gemv_bf16(&g, bias));
    double worst = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = bias[n], mag = fabs(bias[n]);
            for (int64_t k = 0; k < K; k++) {
                s += (double)Wf[n * K + k] * xf[m * K + k];
                mag += fabs((double)Wf[n * K + k] * xf[m * K + k]);
            }
            worst = fmax(worst, fabs(y1[m * N + n] - s) / (mag + 1e-30));
        }
    CHECK_MSG(worst < 1e-6, "bf16 gemv M %lld N %lld K %lld: relative error %g", (long long)M, (long long)N, (long long)K, worst);
    fm_set_num_threads(2);
    g.C = y2;
    CHECK(fm_cpu_gemv_bf16(&g, bias));
    CHECK_MSG(!memcmp(y1, y2, sizeof(float) * (size_t)(M * N)), "bf16 gemv M %lld N %lld K %lld: 1 and 2 threads differ",
              (long long)M, (long long)N, (long long)K);
    for (int64_t m = 0; m < M; m++) { /* row m alone */
        fm_cpu_gemm_args g1 = {FM_BF16, false, true, 1, N, K, xb + m * K, K, W, K, 0.0, yr, N};
        CHECK(fm_cpu_gemv_bf16(&g1, bias));
        CHECK_MSG(!memcmp(yr, y1 + m * N, sizeof(float) * (size_t)N), "bf16 gemv M %lld: row %lld alone differs",
                  (long long)M, (long long)m);
    }
    if (fm_cpu_use_avx512()) { /* the AVX2 kernel on the same rows: the same bits */
        memset(yr, 0, sizeof(float) * (size_t)N);
        fm_gemv_rows_bf16_avx2(N, K, W, K, xf, 0.0f, yr);
        fm_gemv_rows_bf16_avx512(N, K, W, K, xf, 0.0f, y2);
        CHECK_MSG(!memcmp(yr, y2, sizeof(float) * (size_t)N), "bf16 gemv N %lld K %lld: AVX2 and AVX-512 differ",
                  (long long)N, (long long)K);
    }
    fm_cpu_gemm_args big = {FM_BF16, false, true, 5, N, K, xb, K, W, K, 0.0, y1, N};
    CHECK(M > 1 || !fm_cpu_gemv_bf16(&big, bias)); /* five rows: not this path */
done:
    free(W); free(xb); free(Wf); free(xf); free(bias); free(y1); free(y2); free(yr);
}

int main(void) {
    const int64_t Ns[] = {1, 3, 4, 5, 9, 64, 130, 500, 1152};
    const int64_t Ks[] = {1, 7, 8, 15, 16, 17, 24, 64, 300, 384};
    uint64_t seed = 1;
    for (size_t i = 0; i < sizeof Ns / sizeof Ns[0]; i++)
        for (size_t j = 0; j < sizeof Ks / sizeof Ks[0]; j++) check_shape(Ns[i], Ks[j], 0, 0.0, seed++);
    check_shape(37, 300, 5, 0.0, seed++);   /* padded rows (ldw > K) */
    check_shape(37, 300, 5, 0.5, seed++);   /* beta: C = W x + beta C */
    check_shape(1152, 384, 0, -1.0, seed++);
    check_split(1152, 384);
    check_split(383, 1536);
    check_split(45, 19);
    const int64_t bN[] = {1, 5, 9, 130, 1152}, bK[] = {1, 7, 8, 17, 64, 300};
    for (size_t i = 0; i < sizeof bN / sizeof bN[0]; i++)
        for (size_t j = 0; j < sizeof bK / sizeof bK[0]; j++) check_bf16(1 + (int64_t)((i + j) % 4), bN[i], bK[j], seed++);
    fm_parallel_shutdown();
    TEST_DONE();
}
