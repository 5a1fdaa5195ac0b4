/* qconv2d_int8's output pass with AVX-512 (qconv_cpu.c, out_rows): the GEMM's
 * [positions, O] block into NCHW, pooled and capped, in tiles of 16 positions x 16
 * channels: each position's 16 channels are one vector (the window's max over its
 * rows, then the cap), and the 16 x 16 tile is transposed in registers so that each
 * channel's 16 positions leave in one store. The generic loop (out_block) moved each
 * float through a staging block with a strided read per element: 29% of an int8
 * fashion-cnn batch of 256 (perf, Intel Xeon model 167). The same compares and
 * selects as out_block (NaN wins in the max, then min(y, hi)): the same bits. */
#include <immintrin.h>
#include <stdint.h>

#include "backend/cpu/qconv.h"

/* in place: r[i] lane j -> r[j] lane i */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* 64-bit pairs */
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* now r[4a + b] holds, in each 128-bit lane L, rows 4a..4a+3's element 4L + b' in some
     * order: two passes of 128-bit shuffles gather the lanes */
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);      /* lanes 0, 2 of each */
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);  /* lanes 1, 3 */
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

void fm_qconv_out_avx512(const fm_qconv_out *a, const float *src, float *dst, int64_t q0, int64_t q1) {
    const int64_t O = a->O, Wo = a->Wo, k = a->pool, Wp = a->Wp, Pp = a->Pp;
    const __m512 hi = _mm512_set1_ps(a->hi);
    for (int64_t qb = q0; qb < q1; qb += 16) {
        const int nq = q1 - qb < 16 ? (int)(q1 - qb) : 16;
        const __mmask16 qm = (__mmask16)((1u << nq) - 1);
        for (int64_t o0 = 0; o0 < O; o0 += 16) {
            const int no = O - o0 < 16 ? (int)(O - o0) : 16;
            const __mmask16 om = (__mmask16)((1u << no) - 1);
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                if (i >= nq) { r[i] = _mm512_setzero_ps(); continue; }
                const int64_t q = qb + i, py = q / Wp, px = q % Wp;
                const float *base = src + ((py * k) * Wo + px * k) * O + o0;
                __m512 m = _mm512_maskz_loadu_ps(om, base);
                for (int64_t dy = 0; dy < k; dy++)
                    for (int64_t dx = dy ? 0 : 1; dx < k; dx++) {
                        const __m512 v = _mm512_maskz_loadu_ps(om, base + (dy * Wo + dx) * O);
                        const __mmask16 take = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
                        m = _mm512_mask_blend_ps(take, m, v);
                    }
                r[i] = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m, hi, _CMP_GT_OQ), m, hi);
            }
            transpose16(r);
            for (int o = 0; o < no; o++) _mm512_mask_storeu_ps(dst + (o0 + o) * Pp + qb, qm, r[o]);
        }
    }
}

/* in place: r[i] byte j -> r[j] byte i (16 x 16 bytes; SSE unpacks, four stages) */
static inline void transpose16x16_u8(__m128i r[16]) {
    __m128i a[16], b[16], c[16];
    for (int i = 0; i < 8; i++) { /* 16-bit units: rows (2i, 2i + 1) of one column */
        a[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
    }
    for (int k = 0; k < 4; k++) { /* 32-bit units: rows 4k..4k+3; b[4k + g]: columns 4g..4g+3 */
        b[4 * k] = _mm_unpacklo_epi16(a[4 * k], a[4 * k + 2]);
        b[4 * k + 1] = _mm_unpackhi_epi16(a[4 * k], a[4 * k + 2]);
        b[4 * k + 2] = _mm_unpacklo_epi16(a[4 * k + 1], a[4 * k + 3]);
        b[4 * k + 3] = _mm_unpackhi_epi16(a[4 * k + 1], a[4 * k + 3]);
    }
    for (int m = 0; m < 2; m++) /* 64-bit units: rows 8m..8m+7; c[8m + 2g]: columns 4g, 4g+1; c[8m + 2g + 1]: 4g+2, 4g+3 */
        for (int g = 0; g < 4; g++) {
            c[8 * m + 2 * g] = _mm_unpacklo_epi32(b[8 * m + g], b[8 * m + 4 + g]);
            c[8 * m + 2 * g + 1] = _mm_unpackhi_epi32(b[8 * m + g], b[8 * m + 4 + g]);
        }
    for (int p = 0; p < 8; p++) { /* c[p] holds columns 2p (low half) and 2p + 1 (high half) of rows 0..7 */
        r[2 * p] = _mm_unpacklo_epi64(c[p], c[8 + p]);
        r[2 * p + 1] = _mm_unpackhi_epi64(c[p], c[8 + p]);
    }
}

void fm_qconv_codes_nhwc_avx512(const float *x, int64_t C, int64_t H, int64_t W, int64_t h0, int64_t h1, float inv_scale, int32_t zero,
                                uint8_t *dst, int64_t Wpad, int64_t ph, int64_t pw) {
    const __m512 inv = _mm512_set1_ps(inv_scale), z = _mm512_set1_ps((float)zero), lo = _mm512_setzero_ps(), hi = _mm512_set1_ps(255.0f);
    for (int64_t h = h0; h < h1; h++) {
        uint8_t *row = dst + ((h + ph) * Wpad + pw) * C;
        for (int64_t c0 = 0; c0 < C; c0 += 16) {
            const int nc = C - c0 < 16 ? (int)(C - c0) : 16;
            const __mmask16 cm = (__mmask16)((1u << nc) - 1);
            for (int64_t w0 = 0; w0 < W; w0 += 16) {
                const int nw = W - w0 < 16 ? (int)(W - w0) : 16;
                const __mmask16 wm = (__mmask16)((1u << nw) - 1);
                __m128i r[16];
                for (int i = 0; i < 16; i++) {
                    if (i >= nc) { r[i] = _mm_setzero_si128(); continue; }
                    /* fm_q8_quantize_avx512's codes: rint(x / s) + z clamped to [0, 255] */
                    __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(wm, x + ((c0 + i) * H + h) * W + w0), inv),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    v = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(v, z), lo), hi);
                    r[i] = _mm512_cvtusepi32_epi8(_mm512_cvttps_epu32(v));
                }
                transpose16x16_u8(r);
                for (int w = 0; w < nw; w++) _mm_mask_storeu_epi8(row + (w0 + w) * C + c0, cm, r[w]);
            }
        }
    }
}
