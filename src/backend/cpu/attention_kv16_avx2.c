/* One query row over an f16 KV cache with AVX2, FMA and F16C (attention_cpu.h,
 * fm_kv16_io). A decode step reads the whole cache once per token and does
 * about two multiply-adds per element read, so the row is bound by the cache's
 * bytes: f16 halves them against f32 (GPT-2-small at a 128-token context: 9.4 MB
 * of f32 keys and values a token, 18% on top of its int4 weights). Scores four
 * keys at a time (four independent FMA chains over d; one chain per key waited on
 * the FMA's latency), then exp with fm_exp256 on 8 scores at once, then the
 * values 32 columns at a time, key after key (four accumulator chains). */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/attention_cpu.h"
#include "backend/cpu/simd_avx2.h" /* fm_exp256, fm_hsum256 */

static inline __m256 ld8h(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static inline float tail_dot(const float *q, const uint16_t *k, int64_t d0, int64_t D) {
    float s = 0.0f;
    for (int64_t d = d0; d < D; d++) s += q[d] * _cvtsh_ss(k[d]);
    return s;
}

void fm_sdpa_kv16_row_avx2(const fm_kv16_io *io, int64_t b, int64_t h, int64_t i, float *scratch) {
    const int64_t D = io->D, D8 = D / 8 * 8, n = io->L - io->T + i + 1, hk = h / (io->H / io->Hkv);
    const float *q = io->q + fm_sdpa_row(io->lq, b, h, i);
    const uint16_t *K = io->k + fm_sdpa_row(io->lk, b, hk, 0), *V = io->v + fm_sdpa_row(io->lv, b, hk, 0);
    const int64_t kst = io->lk.st, vst = io->lv.st;
    float *s = scratch, *qs = scratch + io->L, *acc = qs + D;
    for (int64_t d = 0; d < D; d++) qs[d] = q[d] * io->scale;
    float mx = -INFINITY;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const uint16_t *k0 = K + j * kst, *k1 = k0 + kst, *k2 = k1 + kst, *k3 = k2 + kst;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t d = 0; d < D8; d += 8) {
            const __m256 x = _mm256_loadu_ps(qs + d);
            a0 = _mm256_fmadd_ps(x, ld8h(k0 + d), a0);
            a1 = _mm256_fmadd_ps(x, ld8h(k1 + d), a1);
            a2 = _mm256_fmadd_ps(x, ld8h(k2 + d), a2);
            a3 = _mm256_fmadd_ps(x, ld8h(k3 + d), a3);
        }
        s[j] = fm_hsum256(a0) + tail_dot(qs, k0, D8, D);
        s[j + 1] = fm_hsum256(a1) + tail_dot(qs, k1, D8, D);
        s[j + 2] = fm_hsum256(a2) + tail_dot(qs, k2, D8, D);
        s[j + 3] = fm_hsum256(a3) + tail_dot(qs, k3, D8, D);
    }
    for (; j < n; j++) {
        const uint16_t *kj = K + j * kst;
        __m256 a = _mm256_setzero_ps();
        for (int64_t d = 0; d < D8; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(qs + d), ld8h(kj + d), a);
        s[j] = fm_hsum256(a) + tail_dot(qs, kj, D8, D);
    }
    for (j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 p = fm_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx));
        _mm256_storeu_ps(s + j, p);
        vsum = _mm256_add_ps(vsum, p);
    }
    float sum = fm_hsum256(vsum);
    for (; j < n; j++) sum += s[j] = expf(s[j] - mx);
    int64_t d = 0;
    for (; d + 32 <= D; d += 32) {
        __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
        for (j = 0; j < n; j++) {
            const uint16_t *vr = V + j * vst + d;
            const __m256 p = _mm256_broadcast_ss(s + j);
            o0 = _mm256_fmadd_ps(p, ld8h(vr), o0);
            o1 = _mm256_fmadd_ps(p, ld8h(vr + 8), o1);
            o2 = _mm256_fmadd_ps(p, ld8h(vr + 16), o2);
            o3 = _mm256_fmadd_ps(p, ld8h(vr + 24), o3);
        }
        _mm256_storeu_ps(acc + d, o0);
        _mm256_storeu_ps(acc + d + 8, o1);
        _mm256_storeu_ps(acc + d + 16, o2);
        _mm256_storeu_ps(acc + d + 24, o3);
    }
    for (; d + 8 <= D; d += 8) {
        __m256 o = _mm256_setzero_ps();
        for (j = 0; j < n; j++) o = _mm256_fmadd_ps(_mm256_broadcast_ss(s + j), ld8h(V + j * vst + d), o);
        _mm256_storeu_ps(acc + d, o);
    }
    for (; d < D; d++) {
        float o = 0.0f;
        for (j = 0; j < n; j++) o += s[j] * _cvtsh_ss(V[j * vst + d]);
        acc[d] = o;
    }
    float *out = io->o + fm_sdpa_row(io->lo, b, h, i);
    const float inv = 1.0f / sum;
    for (d = 0; d < D; d++) out[d] = acc[d] * inv;
}
