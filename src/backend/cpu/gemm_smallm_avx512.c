/* The small-M product on AVX-512 (gemm_smallm.h). A tile is 4 consecutive
 * weight rows by up to 4 rows of A: 16 zmm accumulators, 4 + R loads for 4R
 * FMAs per 16 columns of K, so the FMA unit rather than the loads sets the pace,
 * and the 4 weight rows (4 K floats) stay in L1 while every group of A rows
 * passes over them. A zmm accumulator is the GEMV's two 8-lane ones side by side
 * (lanes 0-7 the even 8-wide chunks, 8-15 the odd), and the four outputs of a
 * row of A are reduced together in zmm lanes with the GEMV's pairing
 * ((s0 + s2) + (s1 + s3)), so each output is bitwise the GEMV's. */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/gemm_smallm.h"

/* The 4 outputs of one A row against 4 weight rows, in one xmm, with the
 * GEMV's tree for each: v = lanes 0-7 + lanes 8-15, s = v[0:4] + v[4:8],
 * (s0 + s2) + (s1 + s3); done on all four accumulators at once in zmm lanes. */
static inline __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    /* [v0.lo, v0.hi, v1.lo, v1.hi] (128-bit quarters) and the same for 2, 3 */
    __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
    __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
    /* [s0 | s1 | s2 | s3] */
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88), _mm512_shuffle_f32x4(u01, u23, 0xDD));
    __m512 t = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E)); /* lane 0: x0 + x2, lane 1: x1 + x3 */
    __m512 r = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1)); /* lane 0: (x0 + x2) + (x1 + x3) */
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12), r));
}

/* C[m0 .. m0+R, n0 .. n0+nv] with nv <= 4 valid weight rows (w[j] for j >= nv repeat a valid row) */
static inline __attribute__((always_inline)) void tile(int R, const float *const w[4], int nv, const float *A, int64_t lda,
                                                       int64_t K, float beta, float *C, int64_t ldc) {
    const int64_t k16 = K & ~(int64_t)15, k8 = K & ~(int64_t)7;
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k < k16; k += 16) {
        __m512 wv[4];
        for (int j = 0; j < 4; j++) wv[j] = _mm512_loadu_ps(w[j] + k);
        for (int r = 0; r < R; r++) {
            __m512 x = _mm512_loadu_ps(A + r * lda + k);
            for (int j = 0; j < 4; j++) acc[r][j] = _mm512_fmadd_ps(wv[j], x, acc[r][j]);
        }
    }
    if (k < k8) { /* one more even chunk: lanes 0-7 only */
        const __mmask16 lo = 0xFF;
        __m512 wv[4];
        for (int j = 0; j < 4; j++) wv[j] = _mm512_maskz_loadu_ps(lo, w[j] + k);
        for (int r = 0; r < R; r++) {
            __m512 x = _mm512_maskz_loadu_ps(lo, A + r * lda + k);
            for (int j = 0; j < 4; j++) acc[r][j] = _mm512_mask3_fmadd_ps(wv[j], x, acc[r][j], lo);
        }
    }
    for (int r = 0; r < R; r++) {
        __m128 s = reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        float *c = C + r * ldc;
        const float *x = A + r * lda;
        if (k8 == K && nv == 4) {
            _mm_storeu_ps(c, beta == 0.0f ? s : _mm_fmadd_ps(_mm_set1_ps(beta), _mm_loadu_ps(c), s));
            continue;
        }
        float out[4];
        _mm_storeu_ps(out, s);
        for (int j = 0; j < nv; j++) {
            float v = out[j];
            for (int64_t t = k8; t < K; t++) v = fmaf(w[j][t], x[t], v);
            c[j] = beta == 0.0f ? v : fmaf(beta, c[j], v);
        }
    }
}

void fm_gemm_smallm_f32_avx512(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *W,
                               int64_t ldw, float beta, float *C, int64_t ldc) {
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
        int nv = N - n0 < 4 ? (int)(N - n0) : 4;
        const float *w[4];
        for (int j = 0; j < 4; j++) w[j] = W + (n0 + (j < nv ? j : nv - 1)) * ldw;
        int64_t m = 0;
        for (; m + 4 <= M; m += 4) tile(4, w, nv, A + m * lda, lda, K, beta, C + m * ldc + n0, ldc);
        switch (M - m) {
        case 3: tile(3, w, nv, A + m * lda, lda, K, beta, C + m * ldc + n0, ldc); break;
        case 2: tile(2, w, nv, A + m * lda, lda, K, beta, C + m * ldc + n0, ldc); break;
        case 1: tile(1, w, nv, A + m * lda, lda, K, beta, C + m * ldc + n0, ldc); break;
        default: break;
        }
    }
}
