/* AVX-512 rows of lstm_cell and gru_cell (rnn_cell_cpu.c): 16 hidden units at a time, the four gates read from
 * their blocks of the row, with the elementwise kernels' fm_sigmoid512 and fm_tanh512 (so a
 * gate's value is what fathom's own sigmoid and tanh ops give); the tail masked. */
#include <stdint.h>

#include "backend/cpu/simd_avx512.h"

void fm_lstm_row_f32_avx512(const float *xg, const float *hg, const float *c, float *h, float *cn, int64_t H);
void fm_gru_row_f32_avx512(const float *xg, const float *hg, const float *h, float *hn, int64_t H);

void fm_lstm_row_f32_avx512(const float *xg, const float *hg, const float *c, float *h, float *cn, int64_t H) {
    for (int64_t k = 0; k < H; k += 16) {
        const __mmask16 m = H - k >= 16 ? (__mmask16)0xffff : fm_tail16(H - k);
#define GATE(q) _mm512_add_ps(_mm512_maskz_loadu_ps(m, xg + (q) * H + k), _mm512_maskz_loadu_ps(m, hg + (q) * H + k))
        const __m512 i = fm_sigmoid512(GATE(0)), o = fm_sigmoid512(GATE(1)), f = fm_sigmoid512(GATE(2)), g = fm_tanh512(GATE(3));
#undef GATE
        const __m512 cv = _mm512_fmadd_ps(f, _mm512_maskz_loadu_ps(m, c + k), _mm512_mul_ps(i, g));
        _mm512_mask_storeu_ps(cn + k, m, cv);
        _mm512_mask_storeu_ps(h + k, m, _mm512_mul_ps(o, fm_tanh512(cv)));
    }
}

void fm_gru_row_f32_avx512(const float *xg, const float *hg, const float *h, float *hn, int64_t H) {
    for (int64_t k = 0; k < H; k += 16) {
        const __mmask16 m = H - k >= 16 ? (__mmask16)0xffff : fm_tail16(H - k);
#define LD(p, q) _mm512_maskz_loadu_ps(m, (p) + (q) * H + k)
        const __m512 z = fm_sigmoid512(_mm512_add_ps(LD(xg, 0), LD(hg, 0))), r = fm_sigmoid512(_mm512_add_ps(LD(xg, 1), LD(hg, 1)));
        const __m512 n = fm_tanh512(_mm512_fmadd_ps(r, LD(hg, 2), LD(xg, 2)));
#undef LD
        /* (1 - z) n + z h = n + z (h - n) */
        _mm512_mask_storeu_ps(hn + k, m, _mm512_fmadd_ps(z, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, h + k), n), n));
    }
}
