/* The small-M product on AVX2/FMA (gemm_smallm.h). Every output is bitwise the
 * GEMV's (gemv_avx2.c): 8 lanes of partial sums over the even 8-wide chunks of
 * K and 8 over the odd ones, each lane an fmadd chain in K order, then
 * even + odd, the fm_hsum256 tree ((s0 + s2) + (s1 + s3) with s_i = v_i +
 * v_{i+4}), the K % 8 tail with fmaf, then beta.
 *
 * A tile is 4 weight rows by 2 rows of A: 8 outputs. Their 16 accumulators do
 * not fit in 16 ymm registers beside the operands, so the even chunks run in a
 * first pass (8 accumulators, kept on the stack) and the odd chunks in a
 * second; per chunk 4 weight loads and 2 of A feed 8 FMAs (the previous 2 x 2
 * tiles: 4 + 4 per 8). The eight outputs' reductions then run together in
 * vector shuffles (reduce8: about 30 instructions where eight fm_hsum256 took
 * about 60, against the tile's 128 FMAs at K = 128).
 *
 * Measured against the 2 x 2 tiles, one thread, AMD EPYC Zen 3 (AVX2) under
 * load from other processes: see docs/SERVING.md ("The decode step's cost"). */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/gemm_smallm.h"

/* keeps a loaded weight chunk in a register: without it gcc folds the load into
 * both FMAs that use it (10 loads per 8 FMAs instead of 6) */
#define REG(v) __asm__("" : "+x"(v))

/* lanes [a c e g | b d f h] of the tree sums of y[0..7] = a b c d e f g h:
 * a 4-lane half holds s_i = v_i + v_{i+4} of two outputs, then
 * (s0 + s2) + (s1 + s3) as fm_hsum256 adds them */
static inline __attribute__((always_inline)) __m256 reduce8(const __m256 y[8]) {
    __m256 s[4];
    for (int i = 0; i < 4; i++)
        s[i] = _mm256_add_ps(_mm256_permute2f128_ps(y[2 * i], y[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(y[2 * i], y[2 * i + 1], 0x31));
    __m256 u0 = _mm256_add_ps(_mm256_shuffle_ps(s[0], s[1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(s[0], s[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 u1 = _mm256_add_ps(_mm256_shuffle_ps(s[2], s[3], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(s[2], s[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_shuffle_ps(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Outputs C[r * ldc + col[j]] = W row w[j] . A row x[r] for j < nv, r < nr
 * (x[1] may repeat x[0] and w[j] a row: only nv columns and nr rows are
 * stored). */
static inline __attribute__((always_inline)) void tile(const float *const w[4], const int64_t col[4], const float *const x[2],
                                                       int nv, int nr, int64_t K, float beta, float *C, int64_t ldc) {
    const int64_t k16 = K & ~(int64_t)15, k8 = K & ~(int64_t)7;
    __m256 ev[8], od[8]; /* [r * 4 + j] */
    for (int i = 0; i < 8; i++) ev[i] = od[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < k8; k += 16) { /* even chunks (the last may be the K % 16 >= 8 one) */
        __m256 x0 = _mm256_loadu_ps(x[0] + k), x1 = _mm256_loadu_ps(x[1] + k);
        for (int j = 0; j < 4; j++) {
            __m256 wv = _mm256_loadu_ps(w[j] + k);
            REG(wv);
            ev[j] = _mm256_fmadd_ps(wv, x0, ev[j]);
            ev[4 + j] = _mm256_fmadd_ps(wv, x1, ev[4 + j]);
        }
    }
    for (int64_t k = 8; k < k16; k += 16) { /* odd chunks */
        __m256 x0 = _mm256_loadu_ps(x[0] + k), x1 = _mm256_loadu_ps(x[1] + k);
        for (int j = 0; j < 4; j++) {
            __m256 wv = _mm256_loadu_ps(w[j] + k);
            REG(wv);
            od[j] = _mm256_fmadd_ps(wv, x0, od[j]);
            od[4 + j] = _mm256_fmadd_ps(wv, x1, od[4 + j]);
        }
    }
    /* y in the order a..h = (r0,j0) (r1,j0) (r0,j1) (r1,j1) ... so that reduce8's
     * lanes come out as row 0's four columns, then row 1's */
    __m256 y[8];
    for (int j = 0; j < 4; j++) {
        y[2 * j] = _mm256_add_ps(ev[j], od[j]);
        y[2 * j + 1] = _mm256_add_ps(ev[4 + j], od[4 + j]);
    }
    float v[8];
    _mm256_storeu_ps(v, reduce8(y));
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nv; j++) {
            float s = v[4 * i + j];
            for (int64_t t = k8; t < K; t++) s = fmaf(w[j][t], x[i][t], s);
            float *c = C + i * ldc + col[j];
            *c = beta == 0.0f ? s : fmaf(beta, *c, s);
        }
}

/* The weight rows in four contiguous quarters walked side by side, as the GEMV
 * does (gemv_avx2.c): four long sequential streams, each in its own pages,
 * which the hardware prefetcher follows; four adjacent rows at a time (a first
 * version) put four interleaved streams into one page, and in a decode step,
 * where the weights come from L3 or memory, three quarters of the GEMM's time
 * went to waiting for the first row pair's loads. */
void fm_gemm_smallm_f32_avx2(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *W, int64_t ldw,
                             float beta, float *C, int64_t ldc) {
    const int64_t q = N / 4;
    for (int64_t n0 = 0; n0 < N; n0 = n0 + 1 < q ? n0 + 1 : (n0 < 4 * q ? 4 * q : n0 + 4)) {
        /* tiles: rows n0 + j q for n0 < q, then the N % 4 rows left at 4q */
        int nv;
        int64_t col[4];
        if (n0 < q) {
            nv = 4;
            for (int j = 0; j < 4; j++) col[j] = n0 + j * q;
        } else {
            nv = (int)(N - n0);
            for (int j = 0; j < 4; j++) col[j] = n0 + (j < nv ? j : nv - 1);
        }
        const float *w[4];
        for (int j = 0; j < 4; j++) w[j] = W + col[j] * ldw;
        for (int64_t m = 0; m < M; m += 2) {
            const int nr = M - m < 2 ? 1 : 2;
            const float *x[2] = {A + m * lda, A + (m + nr - 1) * lda};
            tile(w, col, x, nv, nr, K, beta, C + m * ldc, ldc);
        }
    }
}
