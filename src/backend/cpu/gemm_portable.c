/* GEMM without OpenBLAS: the announced fallback when no OpenBLAS can be loaded
 * (openblas_load.c). Plain loops, row-major, alpha = 1: correct everywhere and
 * many times slower than a tuned library. Each C element is one dot product
 * over k in order, so results do not depend on how fm_cpu_gemm splits C. */
#include "backend/cpu/openblas_load.h"

#define GEMM_PORTABLE(NAME, T)                                                                          \
    void NAME(bool ta, bool tb, int m, int n, int k, const T *a, int lda, const T *b, int ldb, T beta, T *c, \
              int ldc) {                                                                                \
        for (int i = 0; i < m; i++)                                                                     \
            for (int j = 0; j < n; j++) {                                                               \
                T s = 0;                                                                                \
                for (int p = 0; p < k; p++)                                                             \
                    s += (ta ? a[(long)p * lda + i] : a[(long)i * lda + p]) *                           \
                         (tb ? b[(long)j * ldb + p] : b[(long)p * ldb + j]);                            \
                T *cij = &c[(long)i * ldc + j];                                                         \
                *cij = beta == 0 ? s : s + beta * *cij; /* beta = 0 ignores what C held (NaN too) */     \
            }                                                                                           \
    }
GEMM_PORTABLE(fm_gemm_portable_f32, float)
GEMM_PORTABLE(fm_gemm_portable_f64, double)
