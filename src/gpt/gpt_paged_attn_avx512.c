/* The paged attention head on AVX-512 (gpt_paged_attn.h), for head sizes that
 * are a multiple of 16 up to 256 (others: the AVX2 version).
 *
 * Scores, 16 positions at a time: each key row is multiplied with q in whole
 * zmm (D/16 FMAs, lane-wise partial sums), and the 16 rows' partial sums are
 * reduced together by a transpose tree (hsum16: 31 shuffles and 15 adds for 16
 * scores) whose lanes come out in position order because the rows go in
 * permuted. The AVX2 version reduces four positions at a time with hadd, and
 * its dot products run a loop over D with one accumulator: FMA latency, not
 * throughput, set its pace (perf annotate on kjv-gpt's D = 32).
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

static inline __m512 halves(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}

static inline __m512 quarters(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

/* Lane 4L+m of the result: the sum of the 16 lanes of a[4m+L]. */
static inline __m512 hsum16(const __m512 a[16]) {
    __m512 b[8], c[4];
    for (int i = 0; i < 8; i++) b[i] = halves(a[2 * i], a[2 * i + 1]); /* 128-bit quarters: a[2i] twice, a[2i+1] twice */
    for (int i = 0; i < 4; i++) c[i] = quarters(b[2 * i], b[2 * i + 1]); /* quarter L: 4 partial sums of a[4i+L] */
    __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
    __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(c[2], c[3]), _mm512_unpackhi_ps(c[2], c[3]));
    return _mm512_add_ps(_mm512_shuffle_ps(s01, s23, 0x44), _mm512_shuffle_ps(s01, s23, 0xEE));
}

static inline void prefetch_row(const float *p, int D) {
    for (int e = 0; e < D; e += 16) _mm_prefetch((const char *)(p + e), _MM_HINT_T0);
}

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
    const int64_t n = a->n, nb = (n + BT - 1) / BT;
    float *sc = a->scores;
    __m512 q[ND_MAX];
    for (int c = 0; c < nd; c++) q[c] = _mm512_loadu_ps(a->q + 16 * c);
    const __m512 scale = _mm512_set1_ps(a->scale);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    int64_t kblk = 0;
    int off = 0;
    for (int64_t t = 0; t < n; t += 16) {
        const int cnt = n - t < 16 ? (int)(n - t) : 16;
        const float *kp[16];
        for (int j = 0; j < cnt; j++) {
            if (off == BT) off = 0, kblk++;
            /* the value row of this position (read after the softmax) and the key row
             * one block on: a sequence's blocks are scattered, so their misses overlap */
            prefetch_row(a->v[kblk] + (size_t)off * D, D);
            if (kblk + 1 < nb) prefetch_row(a->k[kblk + 1] + (size_t)off * D, D);
            kp[j] = a->k[kblk] + (size_t)off++ * D;
        }
        for (int j = cnt; j < 16; j++) kp[j] = kp[0]; /* lanes past n: computed, not stored */
        __m512 acc[16];
        for (int j = 0; j < 16; j++) {
            const float *k = kp[4 * (j % 4) + j / 4]; /* so that hsum16's lane t is position t */
            __m512 s = _mm512_mul_ps(q[0], _mm512_loadu_ps(k));
            for (int c = 1; c < nd; c++) s = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(k + 16 * c), s);
            acc[j] = s;
        }
        const __mmask16 live = fm_tail16(cnt);
        const __m512 s = _mm512_mul_ps(hsum16(acc), scale);
        _mm512_mask_storeu_ps(sc + t, live, s);
        vmax = _mm512_mask_max_ps(vmax, live, vmax, s);
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
