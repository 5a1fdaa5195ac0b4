/* The paged attention head on AVX2/FMA (gpt_paged_attn.h). Scores: each key
 * row dotted with q in 8-lane FMAs, four positions reduced together (hadd);
 * the softmax's exp 8 scores at a time (fm_exp256). Values: the output is
 * accumulated in registers, 32 columns (4 ymm) at a time, as sum_t e_t v_t,
 * scaled by 1 / sum once at the end; D % 8 columns go through scalar loops.
 * Positions walk the blocks in order, with no division per position (an
 * integer division per key and value row took half the time). */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/simd_avx2.h"
#include "gpt/gpt_paged_attn.h"

static inline __m256 qk(const float *q, const float *k, int d8) {
    __m256 acc = _mm256_setzero_ps();
    for (int e = 0; e < d8; e += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), _mm256_loadu_ps(k + e), acc);
    return acc;
}

static inline float tail(const float *q, const float *k, int d8, int D, float s) {
    for (int e = d8; e < D; e++) s = fmaf(q[e], k[e], s);
    return s;
}

static inline void prefetch_row(const float *p, int D) {
    for (int e = 0; e < D; e += 16) _mm_prefetch((const char *)(p + e), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + D - 1), _MM_HINT_T0);
}

void fm_paged_head_f32_avx2(const fm_paged_head *a) {
    const int D = a->D, BT = a->BT, d8 = D & ~7;
    const int64_t n = a->n;
    float *sc = a->scores;
    const int64_t nb = (n + BT - 1) / BT;
    int64_t kblk = 0;
    int off = 0;
    /* the next key row; meanwhile the value row of the same position (read after
     * the softmax) and the key row one block on are fetched, so that the cache
     * misses of a sequence's scattered blocks overlap instead of following one
     * another (a batched step's cache does not stay in L2 between steps) */
#define NEXT_K(kp)                                                                          \
    do {                                                                                    \
        if (off == BT) off = 0, kblk++;                                                     \
        prefetch_row(a->v[kblk] + (size_t)off * D, D);                                      \
        if (kblk + 1 < nb) prefetch_row(a->k[kblk + 1] + (size_t)off * D, D);               \
        (kp) = a->k[kblk] + (size_t)off++ * D;                                              \
    } while (0)
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        const float *k[4];
        for (int j = 0; j < 4; j++) NEXT_K(k[j]);
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(qk(a->q, k[0], d8), qk(a->q, k[1], d8)),
                                  _mm256_hadd_ps(qk(a->q, k[2], d8), qk(a->q, k[3], d8)));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        float v[4];
        _mm_storeu_ps(v, s);
        for (int j = 0; j < 4; j++) sc[t + j] = tail(a->q, k[j], d8, D, v[j]) * a->scale;
    }
    for (; t < n; t++) {
        const float *k;
        NEXT_K(k);
        sc[t] = tail(a->q, k, d8, D, fm_hsum256(qk(a->q, k, d8))) * a->scale;
    }
#undef NEXT_K
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
            const float *vb = a->v[b] + e0;
            for (int64_t u = 0; u < BT && t0 + u < n; u++) {
                __m256 p = _mm256_set1_ps(sc[t0 + u]);
                for (int j = 0; j < nv; j++) o[j] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vb + u * D + 8 * j), o[j]);
            }
        }
        for (int j = 0; j < nv; j++) _mm256_storeu_ps(a->out + e0 + 8 * j, _mm256_mul_ps(o[j], _mm256_set1_ps(inv)));
    }
    for (int e = d8; e < D; e++) {
        float o = 0;
        for (t = 0; t < n; t++) o = fmaf(sc[t], a->v[t / BT][(t % BT) * D + e], o);
        a->out[e] = o * inv;
    }
}
