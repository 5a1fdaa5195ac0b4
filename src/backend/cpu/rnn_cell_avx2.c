/* AVX2 rows of lstm_cell and gru_cell (rnn_cell_cpu.c): rnn_cell_avx512.c's loops 8 units at a
 * time with fm_sigmoid256 and fm_tanh256; the tail through a zero-padded block. */
#include <stdint.h>
#include <string.h>

#include "backend/cpu/simd_avx2.h"

void fm_lstm_row_f32_avx2(const float *xg, const float *hg, const float *c, float *h, float *cn, int64_t H);
void fm_gru_row_f32_avx2(const float *xg, const float *hg, const float *h, float *hn, int64_t H);

static void lstm8(const float *xg, const float *hg, const float *c, float *h, float *cn, int64_t H, int64_t k) {
#define GATE(q) _mm256_add_ps(_mm256_loadu_ps(xg + (q) * H + k), _mm256_loadu_ps(hg + (q) * H + k))
    const __m256 i = fm_sigmoid256(GATE(0)), o = fm_sigmoid256(GATE(1)), f = fm_sigmoid256(GATE(2)), g = fm_tanh256(GATE(3));
#undef GATE
    const __m256 cv = _mm256_fmadd_ps(f, _mm256_loadu_ps(c + k), _mm256_mul_ps(i, g));
    _mm256_storeu_ps(cn + k, cv);
    _mm256_storeu_ps(h + k, _mm256_mul_ps(o, fm_tanh256(cv)));
}

void fm_lstm_row_f32_avx2(const float *xg, const float *hg, const float *c, float *h, float *cn, int64_t H) {
    int64_t k = 0;
    for (; k + 8 <= H; k += 8) lstm8(xg, hg, c, h, cn, H, k);
    if (k == H) return;
    /* the last H - k units: copied into 8-wide blocks (gate q at q * 8), computed, copied back */
    float bx[32] = {0}, bh[32] = {0}, bc[8] = {0}, oh[8], oc[8];
    const int64_t r = H - k;
    for (int q = 0; q < 4; q++) {
        memcpy(bx + q * 8, xg + q * H + k, (size_t)r * sizeof(float));
        memcpy(bh + q * 8, hg + q * H + k, (size_t)r * sizeof(float));
    }
    memcpy(bc, c + k, (size_t)r * sizeof(float));
    lstm8(bx, bh, bc, oh, oc, 8, 0);
    memcpy(h + k, oh, (size_t)r * sizeof(float));
    memcpy(cn + k, oc, (size_t)r * sizeof(float));
}

static void gru8(const float *xg, const float *hg, const float *h, float *hn, int64_t H, int64_t k) {
#define LD(p, q) _mm256_loadu_ps((p) + (q) * H + k)
    const __m256 z = fm_sigmoid256(_mm256_add_ps(LD(xg, 0), LD(hg, 0))), r = fm_sigmoid256(_mm256_add_ps(LD(xg, 1), LD(hg, 1)));
    const __m256 n = fm_tanh256(_mm256_fmadd_ps(r, LD(hg, 2), LD(xg, 2)));
#undef LD
    _mm256_storeu_ps(hn + k, _mm256_fmadd_ps(z, _mm256_sub_ps(_mm256_loadu_ps(h + k), n), n));
}

void fm_gru_row_f32_avx2(const float *xg, const float *hg, const float *h, float *hn, int64_t H) {
    int64_t k = 0;
    for (; k + 8 <= H; k += 8) gru8(xg, hg, h, hn, H, k);
    if (k == H) return;
    float bx[24] = {0}, bh[24] = {0}, bp[8] = {0}, o[8];
    const int64_t r = H - k;
    for (int q = 0; q < 3; q++) {
        memcpy(bx + q * 8, xg + q * H + k, (size_t)r * sizeof(float));
        memcpy(bh + q * 8, hg + q * H + k, (size_t)r * sizeof(float));
    }
    memcpy(bp, h + k, (size_t)r * sizeof(float));
    gru8(bx, bh, bp, o, 8, 0);
    memcpy(hn + k, o, (size_t)r * sizeof(float));
}
