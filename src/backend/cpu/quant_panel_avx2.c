/* The int8 product on packed panels with AVX2 (quant_kernels.h): a panel's
 * 64-byte slice is two ymm halves of 8 columns x 4 k.
 *
 * vpmaddubsw multiplies u8 by s8 and adds pairs into a saturating 16-bit
 * lane, and 255 x -128 x 2 does not fit. Instead of splitting the activation
 * byte (twice the multiplies), the codes are moved to s8, a' = a - 128 (an
 * xor with 0x80), and the sign is carried over to the weight:
 *   a' w = |a'| (sign(a') w),  |a'| <= 128 (as u8),  |sign(a') w| <= 127,
 * so a pair sums to at most 2 x 128 x 127 = 32512 and never saturates. That
 * needs the weights in [-127, 127], which fm_quantize_weight_int8 writes and
 * fm_pack_weight_int8 checks (a -128 would flip to -128 instead of +128).
 * The 128 taken off every activation comes back through the row sums:
 *   sum a w = sum a' w + 128 sum w,  so  acc - zero sum w = acc' + (128 - zero) sum w.
 * The xor is done once per code by fm_q8_pgemm_run, so the tile reads s8 a'.
 * Per row and step of 4 k: one broadcast, abs, and per 8-column half
 * vpsignb, vpmaddubsw, vpmaddwd (by 1, to 32 bits) and an add: 2 multiplies
 * per 32 multiply-adds where the split needed 4 (measured 1.4-1.9x OpenBLAS
 * fp32 per core on a Zen 3, docs/QUANTIZE.md). Register block: 4 rows x 1
 * panel (8 accumulators).
 *
 * Narrow weights (every code in [-64, 64], what `fathom quantize --reduce-range`
 * writes, ONNX Runtime's reduce_range): u8 x s8 pairs sum to at most
 * 2 x 255 x 64 = 32640, so the tile multiplies the codes as they are, with no
 * xor, abs or sign: per row and step of 4 k, per half vpmaddubsw, vpmaddwd and
 * an add, 4 multiply-pipe operations per 64 multiply-adds where the sign trick
 * takes 7 (Zen 3 runs vpmaddubsw, vpmaddwd, vpabsb, vpsignb and the FMAs on the
 * same two pipes: docs/QUANTIZE.md, bench_q8_ports). The drivers (quant_panel.c)
 * scan the panels once per call (fm_q8_panels_narrow_avx2) and set g->narrow;
 * the integers are the same either way. The epilogue is on vectors with fm_q8_store's
 * arithmetic, (a_scale * w_scale) * f32(v), + bias, max(., 0), no FMA, so its
 * floats are the reference's. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/simd_avx2.h"

/* sum_k B[n, k] of the panel's 16 columns (the integer output needs them) */
static void panel_sums(const int8_t *b, int64_t Kq, int32_t s[16]) {
    const __m256i one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int64_t k = 0; k < Kq; k++) {
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(one8, _mm256_loadu_si256((const __m256i *)(b + k * 64))), one16));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(one8, _mm256_loadu_si256((const __m256i *)(b + k * 64 + 32))), one16));
    }
    _mm256_storeu_si256((__m256i *)s, s0);
    _mm256_storeu_si256((__m256i *)(s + 8), s1);
}

/* The epilogue of a full panel: per 8-column half, the zero-point correction
 * (128 - zero) w_sum and the scale a_scale * w_scale, shared by the block's rows. */
typedef struct { __m256i corr[2], ws[2]; __m256 scale[2], bias[2], wsc[2]; } panel_ep;

/* shift: what the tile took off each code (128 for a - 128, 0 for narrow panels' u8 codes) */
static inline __attribute__((always_inline)) void panel_ep_load(const fm_q8_epilogue *e, int64_t n, int shift, panel_ep *pe) {
    for (int h = 0; h < 2; h++) {
        pe->ws[h] = _mm256_loadu_si256((const __m256i *)(e->w_sum + n + 8 * h));
        pe->wsc[h] = _mm256_loadu_ps(e->w_scale + n + 8 * h);
        pe->corr[h] = _mm256_mullo_epi32(_mm256_set1_epi32(shift - e->a_zero), pe->ws[h]);
        pe->scale[h] = _mm256_mul_ps(_mm256_set1_ps(e->a_scale), pe->wsc[h]);
        pe->bias[h] = e->bias ? _mm256_loadu_ps(e->bias + n + 8 * h) : _mm256_setzero_ps();
    }
}

/* 8 outputs of row m from column n (half h of the panel); acc holds sum (a - shift) w */
static inline __attribute__((always_inline)) void store8(const fm_q8_epilogue *e, const panel_ep *pe, int h, int64_t m, int64_t n, int shift,
                                                         __m256i acc) {
    __m256 y;
    if (e->row_scale) /* row m's scale and zero point */
        y = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(e->row_scale[m]), pe->wsc[h]),
                          _mm256_cvtepi32_ps(_mm256_add_epi32(acc, _mm256_mullo_epi32(_mm256_set1_epi32(shift - e->row_zero[m]), pe->ws[h]))));
    else y = _mm256_mul_ps(pe->scale[h], _mm256_cvtepi32_ps(_mm256_add_epi32(acc, pe->corr[h])));
    if (e->bias) y = _mm256_add_ps(y, pe->bias[h]);
    if (e->act == FM_QACT_RELU) y = _mm256_max_ps(y, _mm256_setzero_ps());
    else if (e->act == FM_QACT_GELU_TANH) y = fm_gelu_tanh256(y);
    else if (e->act == FM_QACT_GELU) y = fm_gelu256(y);
    _mm256_storeu_ps(e->y + m * e->ldy + n, y);
}

/* Integer output, or a panel cut short by N: element by element. */
static __attribute__((noinline)) void store_slow(const fm_q8_pgemm *g, int64_t m, int64_t p, int mr, const __m256i *acc) {
    const int64_t Kq = (g->K + 3) / 4, n0 = 16 * p, left = g->N - n0 < 16 ? g->N - n0 : 16;
    const int32_t shift = g->narrow ? 0 : 128;
    int32_t sums[16];
    if (!g->ep) panel_sums(g->P + p * Kq * 64, Kq, sums);
    for (int i = 0; i < mr; i++) {
        int32_t s[16];
        _mm256_storeu_si256((__m256i *)s, acc[2 * i]);
        _mm256_storeu_si256((__m256i *)(s + 8), acc[2 * i + 1]);
        if (!g->ep) {
            for (int64_t j = 0; j < left; j++) g->C[(m + i) * g->ldc + n0 + j] = s[j] + shift * sums[j];
            continue;
        }
        /* the scalar epilogue without the GELU, then the vector GELU: the floats of the
         * full panels' path and of the separate bias + GELU (fused_avx2.c) */
        fm_q8_epilogue e = *g->ep;
        const bool gelu = e.act == FM_QACT_GELU_TANH || e.act == FM_QACT_GELU;
        if (gelu) e.act = FM_QACT_NONE;
        fm_q8_gemm q = {g->M, g->N, g->K, NULL, 0, NULL, 0, NULL, 0, &e};
        for (int64_t j = 0; j < left; j++) fm_q8_store(&q, m + i, n0 + j, s[j] + shift * g->ep->w_sum[n0 + j]);
        if (gelu) {
            float *yr = e.y + (m + i) * e.ldy + n0;
            for (int64_t h = 0; h < left; h += 8) {
                __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left - h)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                __m256 v = _mm256_maskload_ps(yr + h, k);
                _mm256_maskstore_ps(yr + h, k, g->ep->act == FM_QACT_GELU_TANH ? fm_gelu_tanh256(v) : fm_gelu256(v));
            }
        }
    }
}

/* narrow: A holds the u8 codes and every weight is in [-64, 64] (the header) */
static inline __attribute__((always_inline)) void micro(const fm_q8_pgemm *g, int64_t m, int64_t p, const int mr, const bool narrow) {
    const int64_t Kq = (g->K + 3) / 4;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[4][2]; /* the loops over i fully unrolled, or GCC keeps acc in memory */
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    const int8_t *b = g->P + p * Kq * 64;
    const uint8_t *a = g->A + m * g->lda;
    for (int64_t s = 0; s < Kq; s++) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)(b + s * 64)), b1 = _mm256_loadu_si256((const __m256i *)(b + s * 64 + 32));
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            int32_t a4;
            memcpy(&a4, a + i * g->lda + 4 * s, 4);
            __m256i as = _mm256_set1_epi32(a4);
            if (narrow) {
                acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(as, b0), ones));
                acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(as, b1), ones));
                continue;
            }
            __m256i aa = _mm256_abs_epi8(as);
            acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(aa, _mm256_sign_epi8(b0, as)), ones));
            acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(aa, _mm256_sign_epi8(b1, as)), ones));
        }
    }
    const int64_t n0 = 16 * p;
    if (g->ep && g->N - n0 >= 16) {
        /* a local copy: under -fno-strict-aliasing each store through the shared
         * struct would load its fields again (quant_epilogue_avx512.h) */
        const fm_q8_epilogue e = *g->ep;
        panel_ep pe;
        const int shift = narrow ? 0 : 128;
        panel_ep_load(&e, n0, shift, &pe);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            store8(&e, &pe, 0, m + i, n0, shift, acc[i][0]);
            store8(&e, &pe, 1, m + i, n0 + 8, shift, acc[i][1]);
        }
        return;
    }
    __m256i out[8];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) out[2 * i] = acc[i][0], out[2 * i + 1] = acc[i][1];
    store_slow(g, m, p, mr, out);
}

static void micro1(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 1, false); }
static void micro2(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 2, false); }
static void micro3(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 3, false); }
static void micro4(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 4, false); }
static void narrow1(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 1, true); }
static void narrow2(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 2, true); }
static void narrow3(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 3, true); }
static void narrow4(const fm_q8_pgemm *g, int64_t m, int64_t p) { micro(g, m, p, 4, true); }

bool fm_q8_panels_narrow_avx2(const int8_t *P, int64_t n) {
    const __m256i lim = _mm256_set1_epi8(64);
    int64_t i = 0;
    /* |code| as u8 (abs(-128) is 0x80, 128 unsigned: above the limit, as it should be),
     * the largest of 1 KiB at a time, then one test */
    for (; i + 1024 <= n; i += 1024) {
        __m256i mx = _mm256_setzero_si256();
        for (int j = 0; j < 1024; j += 32) mx = _mm256_max_epu8(mx, _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(P + i + j))));
        /* every byte <= 64 exactly when max(mx, 64) is 64 everywhere */
        if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_max_epu8(mx, lim), lim)) != -1) return false;
    }
    for (; i < n; i++)
        if (P[i] < -64 || P[i] > 64) return false;
    return true;
}

void fm_q8_pgemm_tile_avx2(const fm_q8_pgemm *g, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
    void (*const wide[4])(const fm_q8_pgemm *, int64_t, int64_t) = {micro1, micro2, micro3, micro4};
    void (*const thin[4])(const fm_q8_pgemm *, int64_t, int64_t) = {narrow1, narrow2, narrow3, narrow4};
    void (*const *fn)(const fm_q8_pgemm *, int64_t, int64_t) = g->narrow ? thin : wide;
    for (int64_t p = p0; p < p1; p++)
        for (int64_t m = m0; m < m1; m += 4) fn[(m1 - m < 4 ? m1 - m : 4) - 1](g, m, p);
}
