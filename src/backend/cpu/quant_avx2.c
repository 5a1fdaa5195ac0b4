/* AVX2 quantized kernels (quant_kernels.h): the int8 product on rows (the
 * layout from before the panels) with vpmaddubsw + vpmaddwd, each activation
 * byte split into 7 low bits and the top bit so that no 16-bit sum saturates
 * (the header gives the bounds); activation quantization; and the int4 rows,
 * which round x to int8 at one scale per weight group and multiply the unpacked
 * nibbles with vpmaddubsw (u4 x s8 pairs cannot saturate), one f32 scale product
 * per block of 32 (groups of 32) or per group (64, 128: integer sums across it). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/quant_q4_rows.h"

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

/* ---- activation quantization (the scalar loops' results, bit for bit) ---- */

static inline float hmin8(__m256 v) {
    __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_min_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_min_ss(s, _mm_movehdup_ps(s)));
}

static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

void fm_q8_range_avx2(const float *x, int64_t n, float *mn, float *mx) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps(); /* the range always holds 0 */
    __m256 lo1 = lo, hi1 = hi, lo2 = lo, hi2 = hi, lo3 = lo, hi3 = hi;
    int64_t i = 0;
    /* four chains, as in quant_avx512.c (one waited on min's latency); exact either way */
    for (; i + 32 <= n; i += 32) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
        lo = _mm256_min_ps(v0, lo); /* a NaN lane keeps lo, as the scalar loop does */
        hi = _mm256_max_ps(v0, hi);
        lo1 = _mm256_min_ps(v1, lo1);
        hi1 = _mm256_max_ps(v1, hi1);
        lo2 = _mm256_min_ps(v2, lo2);
        hi2 = _mm256_max_ps(v2, hi2);
        lo3 = _mm256_min_ps(v3, lo3);
        hi3 = _mm256_max_ps(v3, hi3);
    }
    lo = _mm256_min_ps(_mm256_min_ps(lo, lo1), _mm256_min_ps(lo2, lo3));
    hi = _mm256_max_ps(_mm256_max_ps(hi, hi1), _mm256_max_ps(hi2, hi3));
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        lo = _mm256_min_ps(v, lo); /* a NaN lane keeps lo, as the scalar loop does */
        hi = _mm256_max_ps(v, hi);
    }
    float l = hmin8(lo), h = hmax8(hi), tl, th;
    fm_q8_range(x + i, n - i, &tl, &th);
    *mn = tl < l ? tl : l;
    *mx = th > h ? th : h;
}

/* 8 codes: rint(x * inv) + zero clamped to [0, 255] (a NaN lane gives 0) */
static inline __m256i code8(const float *x, __m256 inv, __m256 z) {
    const __m256 lo = _mm256_setzero_ps(), hi = _mm256_set1_ps(255.0f);
    __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_add_ps(v, z), lo), hi));
}

void fm_q8_quantize_avx2(const float *x, int64_t n, float scale, int32_t zero, uint8_t *q) {
    const __m256 inv = _mm256_set1_ps(1.0f / scale), z = _mm256_set1_ps((float)zero);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) { /* the packs interleave 128-bit lanes; the permute puts them back */
        __m256i a = _mm256_packs_epi32(code8(x + i, inv, z), code8(x + i + 8, inv, z));
        __m256i b = _mm256_packs_epi32(code8(x + i + 16, inv, z), code8(x + i + 24, inv, z));
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), order));
    }
    fm_q8_quantize(x + i, n - i, scale, zero, q + i);
}

/* ---- int4 (quant_kernels.h: x as int8 per block of 32, the pair layout) ---- */

/* 32 codes of x rounded at one block's scale: rint(x * inv) clamped to
 * [-127, 127] (a NaN lane: -127, as the scalar fm_q4_quantize_x). Back in
 * order k = 0..31 after the packs (which interleave 128-bit lanes). */
static inline __m256i xcodes32(const float *x, __m256 inv) {
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i c[4];
    for (int i = 0; i < 4; i++) {
        __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        c[i] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
    }
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void fm_q4_quantize_x_avx2(const float *x, int64_t K, int64_t xb, int8_t *qx, float *dxv) {
    const int64_t nb = K / 32, bpx = xb / 32; /* 32-blocks per x scale */
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t b0 = 0; b0 < nb; b0 += bpx) {
        const float *xs = x + 32 * b0;
        __m256 mx = _mm256_setzero_ps(), un = _mm256_setzero_ps();
        for (int64_t i = 0; i < 4 * bpx; i++) {
            __m256 a = _mm256_and_ps(_mm256_loadu_ps(xs + 8 * i), absmask);
            un = _mm256_or_ps(un, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
            mx = _mm256_max_ps(a, mx); /* a NaN lane keeps mx, as the scalar a > amax */
        }
        float amax = _mm256_movemask_ps(un) ? NAN : hmax8(mx);
        float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        for (int64_t b = b0; b < b0 + bpx; b++) {
            __m256i q = xcodes32(x + 32 * b, _mm256_set1_ps(inv));
            const int64_t p = b / 2;
            if (b == nb - 1 && nb % 2) { /* an odd last block: in order */
                _mm256_storeu_si256((__m256i *)(qx + 64 * p), q);
                _mm_storeu_ps(dxv + 8 * p, _mm_set1_ps(d));
                continue;
            }
            const int64_t h = b % 2;
            _mm_storeu_si128((__m128i *)(qx + 64 * p + 16 * h), _mm256_castsi256_si128(q));
            _mm_storeu_si128((__m128i *)(qx + 64 * p + 32 + 16 * h), _mm256_extracti128_si256(q, 1));
            _mm_storeu_ps(dxv + 8 * p + 4 * h, _mm_set1_ps(d));
        }
    }
}

/* The 16-bit pair sums of 64 weights (one 32-byte load: two blocks' nibbles)
 * against their int8 x codes, widened to 8 int32 lanes (0-3 the first block,
 * 4-7 the second) and added to acc. |lo + hi| <= 4 x 15 x 127 fits in 16 bits. */
static inline __m256i dot64(__m256i acc, const uint8_t *w, const int8_t *qx) {
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256i W = _mm256_loadu_si256((const __m256i *)w);
    __m256i lo = _mm256_and_si256(W, m4), hi = _mm256_and_si256(_mm256_srli_epi16(W, 4), m4);
    __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)qx)),
                                 _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(qx + 32))));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(s, ones));
}

/* dot64 on nibbles already split (q4_tile32) */
static inline __m256i dot64n(__m256i acc, __m256i lo, __m256i hi, const int8_t *qx) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)qx)),
                                 _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(qx + 32))));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(s, ones));
}

void fm_q4_rows_avx2(const fm_q4_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) { q4_rows(g, m0, m1, n0, n1, dot64, dot64n); }

/* 8 codes = two 4-byte steps of the panel, widened, converted and scaled */
void fm_q8_table_row_avx2(const int8_t *panel_row, int64_t D, float s, float *y) {
    const __m256 vs = _mm256_set1_ps(s);
    int64_t k = 0;
    for (; k + 8 <= D; k += 8) {
        int32_t a, b;
        memcpy(&a, panel_row + 16 * k, 4);
        memcpy(&b, panel_row + 16 * k + 64, 4);
        _mm256_storeu_ps(y + k, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_setr_epi32(a, b, 0, 0)))));
    }
    for (; k < D; k++) y[k] = s * (float)panel_row[(k >> 2) * 64 + (k & 3)];
}
