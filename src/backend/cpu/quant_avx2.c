/* AVX2 quantized kernels (quant_kernels.h): the int8 product with vpmaddubsw
 * + vpmaddwd, each activation byte split into 7 low bits and the top bit so
 * that no 16-bit sum saturates (the header gives the bounds), and the int4
 * rows. */
#include <immintrin.h>

#include "backend/cpu/quant_kernels.h"

static inline int32_t hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* rows m, m+1 x columns n..n+3; lo and hi products summed apart (hi weighs 128) */
static void tile24(const fm_q8_gemm *g, int64_t m, int64_t n, int64_t nm) {
    const __m256i ones = _mm256_set1_epi16(1), low7 = _mm256_set1_epi8(0x7F), bit = _mm256_set1_epi8(1);
    __m256i lo[2][4], hi[2][4];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) lo[i][j] = hi[i][j] = _mm256_setzero_si256();
    int64_t k = 0;
    for (; k + 32 <= g->K; k += 32) {
        __m256i b[4];
        for (int j = 0; j < 4; j++) b[j] = _mm256_loadu_si256((const __m256i *)(g->B + (n + j) * g->ldb + k));
        for (int i = 0; i < nm; i++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(g->A + (m + i) * g->lda + k));
            __m256i al = _mm256_and_si256(a, low7), ah = _mm256_and_si256(_mm256_srli_epi16(a, 7), bit);
            for (int j = 0; j < 4; j++) {
                lo[i][j] = _mm256_add_epi32(lo[i][j], _mm256_madd_epi16(_mm256_maddubs_epi16(al, b[j]), ones));
                hi[i][j] = _mm256_add_epi32(hi[i][j], _mm256_madd_epi16(_mm256_maddubs_epi16(ah, b[j]), ones));
            }
        }
    }
    for (int i = 0; i < nm; i++) {
        const uint8_t *a = g->A + (m + i) * g->lda;
        for (int j = 0; j < 4; j++) {
            const int8_t *bb = g->B + (n + j) * g->ldb;
            int32_t acc = hsum8(lo[i][j]) + 128 * hsum8(hi[i][j]);
            for (int64_t kk = k; kk < g->K; kk++) acc += (int32_t)a[kk] * (int32_t)bb[kk];
            fm_q8_store(g, m + i, n + j, acc);
        }
    }
}

void fm_q8_gemm_tile_avx2(const fm_q8_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    int64_t ne = n0 + (n1 - n0) / 4 * 4;
    for (int64_t n = n0; n < ne; n += 4)
        for (int64_t m = m0; m < m1; m += 2) tile24(g, m, n, m + 2 <= m1 ? 2 : 1);
    if (ne < n1) fm_q8_gemm_tile_ref(g, m0, m1, ne, n1);
}

/* ---- int4 ---- */

static inline void unpack32(const uint8_t *p, __m256 q[4]) {
    __m128i b = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

static inline float hsum8f(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void fm_q4_rows_avx2(const fm_q4_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const int64_t ng = g->K / g->G, nr = m1 - m0;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *w = g->w + n * (g->K / 2);
        const uint16_t *sc = g->scale + n * ng, *mi = g->min ? g->min + n * ng : NULL;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        float off[4] = {0, 0, 0, 0};
        for (int64_t gi = 0; gi < ng; gi++) {
            __m256 dot[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int64_t k = gi * g->G; k < (gi + 1) * g->G; k += 32) {
                __m256 q[4];
                unpack32(w + k / 2, q);
                for (int64_t r = 0; r < nr; r++) {
                    const float *x = g->x + (m0 + r) * g->ldx + k;
                    for (int c = 0; c < 4; c++) dot[r] = _mm256_fmadd_ps(q[c], _mm256_loadu_ps(x + 8 * c), dot[r]);
                }
            }
            float d = _cvtsh_ss(sc[gi]), mn = mi ? _cvtsh_ss(mi[gi]) : -8.0f * d;
            __m256 vd = _mm256_set1_ps(d);
            for (int64_t r = 0; r < nr; r++) {
                acc[r] = _mm256_fmadd_ps(vd, dot[r], acc[r]);
                off[r] += mn * g->xsum[(m0 + r) * ng + gi];
            }
        }
        for (int64_t r = 0; r < nr; r++) {
            float y = hsum8f(acc[r]) + off[r];
            g->y[(m0 + r) * g->ldy + n] = g->bias ? y + g->bias[n] : y;
        }
    }
}
