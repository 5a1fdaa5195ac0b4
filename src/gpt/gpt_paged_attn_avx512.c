/* The paged attention head on AVX-512 (gpt_paged_attn.h), for head sizes that
 * are a multiple of 16 up to 256 (others: the AVX2 version).
 *
 * Scores: the keys are stored transposed per block (D x BT), so 16 positions of
 * a block are the lanes of one vector: D broadcast-FMAs, in four chains (e mod
 * 4) added at the end, give their 16 scores, with a masked load for a block's
 * or the sequence's last positions.
 * Softmax: max and exp (fm_exp512) 16 scores at a time.
 * Values: out = sum_t e_t v_t, 16 columns per zmm, with 2-4 sets of accumulators
 * taking alternate positions so that at least 8 FMA chains are in flight (D = 32
 * has only 2 zmm per row), added together at the end and scaled by 1 / sum.
 * The sums run in another order than the AVX2 and scalar versions' (the tests
 * hold all three to a double reference); every sequence of a batched step runs
 * the same code, so its result does not depend on the others in the step. */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/simd_avx512.h"
#include "gpt/gpt_paged_attn.h"

#define ND_MAX 16 /* zmm per row: D <= 256 */

/* out[e0 : e0 + 16 G] = inv * sum_t sc[t] v_t[e0 : ...], S sets of accumulators */
static inline __attribute__((always_inline)) void values(const int G, const int S, const fm_paged_head *a, int e0, float inv) {
    const int D = a->D, BT = a->BT;
    const int64_t n = a->n;
    const float *sc = a->scores;
    __m512 o[4][4];
    for (int s = 0; s < S; s++)
        for (int g = 0; g < G; g++) o[s][g] = _mm512_setzero_ps();
    for (int64_t b = 0, t0 = 0; t0 < n; b++, t0 += BT) {
        const float *vb = a->v[b] + e0;
        const int64_t m = n - t0 < BT ? n - t0 : BT;
        int64_t u = 0;
        for (; u + S <= m; u += S)
            for (int s = 0; s < S; s++) {
                const __m512 p = _mm512_set1_ps(sc[t0 + u + s]);
                for (int g = 0; g < G; g++) o[s][g] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vb + (u + s) * D + 16 * g), o[s][g]);
            }
        for (; u < m; u++) {
            const __m512 p = _mm512_set1_ps(sc[t0 + u]);
            for (int g = 0; g < G; g++) o[0][g] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vb + u * D + 16 * g), o[0][g]);
        }
    }
    for (int g = 0; g < G; g++) {
        __m512 r = o[0][g];
        for (int s = 1; s < S; s++) r = _mm512_add_ps(r, o[s][g]);
        _mm512_storeu_ps(a->out + e0 + 16 * g, _mm512_mul_ps(r, _mm512_set1_ps(inv)));
    }
}

void fm_paged_head_f32_avx512(const fm_paged_head *a) {
    const int D = a->D, BT = a->BT, nd = D / 16;
    if (D % 16 || nd > ND_MAX) {
        fm_paged_head_f32_avx2(a);
        return;
    }
    const int64_t n = a->n;
    float *sc = a->scores;
    const __m512 scale = _mm512_set1_ps(a->scale);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    /* scores, 16 positions of a block per vector: four chains over e (e mod 4) */
    for (int64_t b = 0, t0 = 0; t0 < n; b++, t0 += BT) {
        const float *kt = a->k[b];
        const int m = n - t0 < BT ? (int)(n - t0) : BT;
        for (int u0 = 0; u0 < m; u0 += 16) {
            const __mmask16 live = fm_tail16(m - u0 < 16 ? m - u0 : 16);
            const float *kp = kt + u0;
            __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            int e = 0;
            for (; e + 4 <= D; e += 4, kp += 4 * BT) {
                s0 = _mm512_fmadd_ps(_mm512_set1_ps(a->q[e]), _mm512_maskz_loadu_ps(live, kp), s0);
                s1 = _mm512_fmadd_ps(_mm512_set1_ps(a->q[e + 1]), _mm512_maskz_loadu_ps(live, kp + BT), s1);
                s2 = _mm512_fmadd_ps(_mm512_set1_ps(a->q[e + 2]), _mm512_maskz_loadu_ps(live, kp + 2 * BT), s2);
                s3 = _mm512_fmadd_ps(_mm512_set1_ps(a->q[e + 3]), _mm512_maskz_loadu_ps(live, kp + 3 * BT), s3);
            }
            for (; e < D; e++, kp += BT) s0 = _mm512_fmadd_ps(_mm512_set1_ps(a->q[e]), _mm512_maskz_loadu_ps(live, kp), s0);
            const __m512 sv = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)), scale);
            _mm512_mask_storeu_ps(sc + t0 + u0, live, sv);
            vmax = _mm512_mask_max_ps(vmax, live, vmax, sv);
        }
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t += 16) {
        const __mmask16 live = fm_tail16(n - t < 16 ? n - t : 16);
        const __m512 e = fm_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, sc + t), mx));
        _mm512_mask_storeu_ps(sc + t, live, e);
        vsum = _mm512_mask_add_ps(vsum, live, vsum, e);
    }
    const float inv = 1.0f / _mm512_reduce_add_ps(vsum);
    for (int e0 = 0; e0 < D;) {
        switch ((D - e0) / 16) {
        case 1: values(1, 4, a, e0, inv); e0 += 16; break;
        case 2: values(2, 4, a, e0, inv); e0 += 32; break;
        case 3: values(3, 2, a, e0, inv); e0 += 48; break;
        default: values(4, 2, a, e0, inv); e0 += 64; break;
        }
    }
}
