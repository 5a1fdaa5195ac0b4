/* The paged attention head on AVX2/FMA (gpt_paged_attn.h). Scores: 8 positions
 * of a block's transposed keys per vector, D broadcast-FMAs in four chains (a
 * masked load for the last positions); the softmax's exp 8 scores at a time
 * (fm_exp256). Values: the output is
 * accumulated in registers, 32 columns (4 ymm) at a time, as sum_t e_t v_t,
 * scaled by 1 / sum once at the end; D % 8 columns go through scalar loops.
 * Positions walk the blocks in order, with no division per position (an
 * integer division per key and value row took half the time). The f16 version
 * (an f16 cache) runs the same loops on halves widened as they are loaded. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>

#include "backend/cpu/simd_avx2.h"
#include "gpt/gpt_paged_attn.h"

/* lanes 0..r-1 set: the positions a masked load reads */
static inline __m256i live8(int r) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }

/* 8 halves from p as f32; only the first cnt are read (the rest 0) */
static inline __m256 ld8h(const uint16_t *p, int cnt) {
    if (cnt == 8) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    uint16_t t[8] = {0};
    for (int i = 0; i < cnt; i++) t[i] = p[i];
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t));
}

/* block b's keys from element off, cnt positions (live: their lanes); its values from off */
static inline __m256 key8(const fm_paged_head *a, const bool half, int64_t b, int64_t off, int cnt, __m256i live) {
    return half ? ld8h(a->kh[b] + off, cnt) : _mm256_maskload_ps(a->k[b] + off, live);
}
static inline __m256 val8(const fm_paged_head *a, const bool half, int64_t b, int64_t off) {
    return half ? ld8h(a->vh[b] + off, 8) : _mm256_loadu_ps(a->v[b] + off);
}
static inline float val1(const fm_paged_head *a, const bool half, int64_t b, int64_t off) {
    return half ? _cvtsh_ss(a->vh[b][off]) : a->v[b][off];
}

/* the head over f32 blocks (half false) or f16 blocks (half true: the same loops on
 * halves widened as they are loaded; a block's last positions read only theirs) */
static inline __attribute__((always_inline)) void head(const fm_paged_head *a, const bool half) {
    const int D = a->D, BT = a->BT, d8 = D & ~7;
    const int64_t n = a->n;
    float *sc = a->scores;
    /* scores, 8 positions of a block per vector: four chains over e (e mod 4) */
    for (int64_t b = 0, t0 = 0; t0 < n; b++, t0 += BT) {
        const int m = n - t0 < BT ? (int)(n - t0) : BT;
        for (int u0 = 0; u0 < m; u0 += 8) {
            const int cnt = m - u0 < 8 ? m - u0 : 8;
            const __m256i live = live8(cnt);
            int64_t kp = u0;
            __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            int e = 0;
            for (; e + 4 <= D; e += 4, kp += 4 * BT) {
                s0 = _mm256_fmadd_ps(_mm256_set1_ps(a->q[e]), key8(a, half, b, kp, cnt, live), s0);
                s1 = _mm256_fmadd_ps(_mm256_set1_ps(a->q[e + 1]), key8(a, half, b, kp + BT, cnt, live), s1);
                s2 = _mm256_fmadd_ps(_mm256_set1_ps(a->q[e + 2]), key8(a, half, b, kp + 2 * BT, cnt, live), s2);
                s3 = _mm256_fmadd_ps(_mm256_set1_ps(a->q[e + 3]), key8(a, half, b, kp + 3 * BT, cnt, live), s3);
            }
            for (; e < D; e++, kp += BT) s0 = _mm256_fmadd_ps(_mm256_set1_ps(a->q[e]), key8(a, half, b, kp, cnt, live), s0);
            const __m256 sv = _mm256_mul_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)), _mm256_set1_ps(a->scale));
            _mm256_maskstore_ps(sc + t0 + u0, live, sv);
        }
    }
    int64_t t;
    float mx = -INFINITY, sum = 0;
    for (t = 0; t < n; t++) mx = sc[t] > mx ? sc[t] : mx;
    __m256 vsum = _mm256_setzero_ps();
    for (t = 0; t + 8 <= n; t += 8) {
        __m256 e = fm_exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + t), _mm256_set1_ps(mx)));
        _mm256_storeu_ps(sc + t, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    sum = fm_hsum256(vsum);
    for (; t < n; t++) sum += sc[t] = expf(sc[t] - mx);
    const float inv = 1.0f / sum;
    for (int e0 = 0; e0 < d8; e0 += 32) {
        int nv = (d8 - e0 < 32 ? d8 - e0 : 32) / 8;
        __m256 o[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t b = 0, t0 = 0; t0 < n; b++, t0 += BT) {
            for (int64_t u = 0; u < BT && t0 + u < n; u++) {
                __m256 p = _mm256_set1_ps(sc[t0 + u]);
                for (int j = 0; j < nv; j++) o[j] = _mm256_fmadd_ps(p, val8(a, half, b, e0 + u * D + 8 * j), o[j]);
            }
        }
        for (int j = 0; j < nv; j++) _mm256_storeu_ps(a->out + e0 + 8 * j, _mm256_mul_ps(o[j], _mm256_set1_ps(inv)));
    }
    for (int e = d8; e < D; e++) {
        float o = 0;
        for (t = 0; t < n; t++) o = fmaf(sc[t], val1(a, half, t / BT, (t % BT) * D + e), o);
        a->out[e] = o * inv;
    }
}

void fm_paged_head_f32_avx2(const fm_paged_head *a) { head(a, false); }

void fm_paged_head_f16_avx2(const fm_paged_head *a) { head(a, true); }
