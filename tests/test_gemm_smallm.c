/* The small-M product (gemm_smallm.h, batched decoding's linear layers): the
 * scalar, AVX2 and AVX-512 kernels against a double reference over shapes that
 * hit every tail (M and N not multiples of the tiles, K not a multiple of 16 or
 * 8, padded rows, beta != 0); the three bitwise equal to each other and to the
 * one-row GEMV; and through fm_cpu_gemm (as fm_linear calls it), each row of an
 * M-row product bitwise the product of that row alone, with 1 and 2 threads:
 * a sequence's logits do not depend on which others share its decode step. */
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_smallm.h"
#include "backend/cpu/gemv_avx2.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "fathom/tensor.h"
#include "test_util.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24) - 0.5);
}

typedef void (*smallm_fn)(int64_t, int64_t, int64_t, const float *, int64_t, const float *, int64_t, float, float *,
                          int64_t);

typedef struct shape {
    int64_t M, N, K, pad;
    float beta;
} shape;

static float *filled(int64_t n, uint64_t *seed) {
    float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (p)
        for (int64_t i = 0; i < n; i++) p[i] = frand(seed);
    return p;
}

/* worst |C - ref| / (sum |terms|) over C against the double product */
static double rel_error(const shape *s, const float *A, const float *W, const float *C0, const float *C) {
    const int64_t ld = s->K + s->pad, ldc = s->N + s->pad;
    double worst = 0;
    for (int64_t m = 0; m < s->M; m++)
        for (int64_t n = 0; n < s->N; n++) {
            double r = (double)s->beta * C0[m * ldc + n], mag = fabs(r);
            for (int64_t k = 0; k < s->K; k++) {
                double t = (double)A[m * ld + k] * W[n * ld + k];
                r += t;
                mag += fabs(t);
            }
            double e = fabs(C[m * ldc + n] - r) / (mag + 1e-30);
            if (e > worst) worst = e;
        }
    return worst;
}

static void check_kernels(const shape *s, uint64_t seed) {
    const int64_t ld = s->K + s->pad, ldc = s->N + s->pad;
    const smallm_fn fns[] = {fm_gemm_smallm_f32_scalar, fm_gemm_smallm_f32_avx2, fm_gemm_smallm_f32_avx512};
    const bool have[] = {true, fm_cpu_use_avx2(), fm_cpu_use_avx512()};
    const char *names[] = {"scalar", "avx2", "avx512"};
    float *A = filled(s->M * ld, &seed), *W = filled(s->N * ld, &seed), *C0 = filled(s->M * ldc, &seed);
    float *C[3] = {filled(s->M * ldc, &seed), filled(s->M * ldc, &seed), filled(s->M * ldc, &seed)};
    float *g = filled(s->N, &seed);
    if (!A || !W || !C0 || !C[0] || !C[1] || !C[2] || !g) { CHECK(!"out of memory"); goto done; }
    for (int i = 0; i < 3; i++) {
        if (!have[i]) continue;
        memcpy(C[i], C0, sizeof(float) * (size_t)(s->M * ldc));
        fns[i](s->M, s->N, s->K, A, ld, W, ld, s->beta, C[i], ldc);
        double e = rel_error(s, A, W, C0, C[i]);
        CHECK_MSG(e < 1e-6, "%s M %lld N %lld K %lld pad %lld beta %g: relative error %g", names[i], (long long)s->M,
                  (long long)s->N, (long long)s->K, (long long)s->pad, s->beta, e);
        CHECK_MSG(!memcmp(C[i], C[0], sizeof(float) * (size_t)(s->M * ldc)),
                  "%s differs from the scalar reference: M %lld N %lld K %lld", names[i], (long long)s->M,
                  (long long)s->N, (long long)s->K);
    }
    if (have[1]) /* each row bitwise the one-row GEMV's */
        for (int64_t m = 0; m < s->M; m++) {
            memcpy(g, C0 + m * ldc, sizeof(float) * (size_t)s->N);
            fm_gemv_rows_f32_avx2(s->N, s->K, W, ld, A + m * ld, s->beta, g);
            CHECK_MSG(!memcmp(g, C[0] + m * ldc, sizeof(float) * (size_t)s->N),
                      "row %lld differs from the GEMV: M %lld N %lld K %lld", (long long)m, (long long)s->M,
                      (long long)s->N, (long long)s->K);
        }
done:
    free(A); free(W); free(C0); free(C[0]); free(C[1]); free(C[2]); free(g);
}

/* fm_cpu_gemm with bias, as fm_linear: rows of an M-row product == each row alone */
static void check_batch_invariance(int64_t N, int64_t K, int threads) {
    uint64_t seed = 99;
    const int64_t M = 16;
    float *A = filled(M * K, &seed), *W = filled(N * K, &seed), *b = filled(N, &seed);
    float *C = calloc((size_t)(M * N), sizeof(float)), *one = calloc((size_t)N, sizeof(float));
    if (!A || !W || !b || !C || !one) { CHECK(!"out of memory"); goto done; }
    fm_set_num_threads(threads);
    for (int64_t rows = 2; rows <= M; rows++) {
        fm_cpu_gemm_bias(&(fm_cpu_gemm_args){FM_F32, false, true, rows, N, K, A, K, W, K, 0.0, C, N}, b);
        for (int64_t m = 0; m < rows; m++) {
            fm_cpu_gemm_bias(&(fm_cpu_gemm_args){FM_F32, false, true, 1, N, K, A + m * K, K, W, K, 0.0, one, N}, b);
            CHECK_MSG(!memcmp(one, C + m * N, sizeof(float) * (size_t)N),
                      "N %lld K %lld, %d threads: row %lld of a %lld-row product differs from the row alone",
                      (long long)N, (long long)K, threads, (long long)m, (long long)rows);
        }
    }
done:
    free(A); free(W); free(b); free(C); free(one);
}

int main(void) {
    const int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17};
    const int64_t Ns[] = {1, 2, 3, 4, 5, 7, 64, 130};
    const int64_t Ks[] = {1, 7, 8, 15, 16, 17, 24, 64, 300};
    uint64_t seed = 1;
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++)
        for (size_t j = 0; j < sizeof Ns / sizeof Ns[0]; j++)
            for (size_t k = 0; k < sizeof Ks / sizeof Ks[0]; k++)
                check_kernels(&(shape){Ms[i], Ns[j], Ks[k], 0, 0.0f}, seed++);
    check_kernels(&(shape){6, 37, 300, 5, 0.0f}, seed++); /* padded rows of A, W and C */
    check_kernels(&(shape){6, 37, 300, 5, 0.5f}, seed++); /* beta: C = A W^T + beta C */
    check_kernels(&(shape){11, 130, 384, 3, -1.0f}, seed++);
    if (fm_cpu_use_avx2()) {
        check_batch_invariance(384, 128, 1);
        check_batch_invariance(384, 128, 2);
        check_batch_invariance(517, 300, 2);
    } else {
        TEST_SKIP("batch invariance: the small-M path needs AVX2 (FATHOM_ISA=scalar uses OpenBLAS)");
    }
    fm_parallel_shutdown();
    TEST_DONE();
}
