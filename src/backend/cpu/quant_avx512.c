/* AVX-512 quantized kernels (quant_kernels.h): the int8 product with VNNI
 * (vpdpbusd: four u8 x s8 products summed straight into 32 bits, so no
 * saturation), activation quantization, and the int4 rows (vpdpbusd on the
 * nibbles, bitwise the AVX2 rows' results). The VNNI functions
 * carry their own target attribute; the driver calls them only when cpuid
 * reports avx512_vnni. */
#include <immintrin.h>

#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/quant_q4_rows.h"

#define VNNI __attribute__((target("avx512vnni")))

static inline __mmask64 kmask(int64_t left) { return left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1); }

/* The four horizontal sums of a, b, c, d at once (interleave and add, then
 * the four 128-bit lanes): about a third of four separate reductions, which
 * matters when K is small and a tile does few steps. Integer sums: exact. */
static inline __m128i hsum4(__m512i a, __m512i b, __m512i c, __m512i d) {
    __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* 4 rows x 4 columns: 16 accumulators of 16 lanes, 64 bytes of K a step. */
VNNI static void tile44(const fm_q8_gemm *g, int64_t m, int64_t n) {
    __m512i acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_si512();
    const uint8_t *a0 = g->A + m * g->lda;
    const int8_t *b0 = g->B + n * g->ldb;
    for (int64_t k = 0; k < g->K; k += 64) {
        __mmask64 mk = kmask(g->K - k);
        __m512i a[4], b[4];
        for (int i = 0; i < 4; i++) a[i] = _mm512_maskz_loadu_epi8(mk, a0 + i * g->lda + k);
        for (int j = 0; j < 4; j++) b[j] = _mm512_maskz_loadu_epi8(mk, b0 + j * g->ldb + k);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], a[i], b[j]);
    }
    for (int i = 0; i < 4; i++) {
        int32_t s[4];
        _mm_storeu_si128((__m128i *)s, hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        for (int j = 0; j < 4; j++) fm_q8_store(g, m + i, n + j, s[j]);
    }
}

VNNI static void tile11(const fm_q8_gemm *g, int64_t m, int64_t n) {
    __m512i acc = _mm512_setzero_si512();
    const uint8_t *a = g->A + m * g->lda;
    const int8_t *b = g->B + n * g->ldb;
    for (int64_t k = 0; k < g->K; k += 64) {
        __mmask64 mk = kmask(g->K - k);
        acc = _mm512_dpbusd_epi32(acc, _mm512_maskz_loadu_epi8(mk, a + k), _mm512_maskz_loadu_epi8(mk, b + k));
    }
    fm_q8_store(g, m, n, _mm512_reduce_add_epi32(acc));
}

VNNI void fm_q8_gemm_tile_vnni(const fm_q8_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    int64_t me = m0 + (m1 - m0) / 4 * 4, ne = n0 + (n1 - n0) / 4 * 4;
    for (int64_t n = n0; n < ne; n += 4) {
        for (int64_t m = m0; m < me; m += 4) tile44(g, m, n);
        for (int64_t m = me; m < m1; m++)
            for (int j = 0; j < 4; j++) tile11(g, m, n + j);
    }
    for (int64_t n = ne; n < n1; n++)
        for (int64_t m = m0; m < m1; m++) tile11(g, m, n);
}

void fm_q8_range_avx512(const float *x, int64_t n, float *mn, float *mx) {
    /* four running minima and maxima: one chain waited on min's latency (4 cycles a
     * vector, measured as the dynamic int8 prefill's range pass); min and max are exact,
     * so the order does not change the result */
    __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
    __m512 lo1 = lo, hi1 = hi, lo2 = lo, hi2 = hi, lo3 = lo, hi3 = hi;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
        __m512 v2 = _mm512_loadu_ps(x + i + 32), v3 = _mm512_loadu_ps(x + i + 48);
        lo = _mm512_min_ps(v0, lo); /* a NaN lane keeps lo, as the scalar loop does */
        hi = _mm512_max_ps(v0, hi);
        lo1 = _mm512_min_ps(v1, lo1);
        hi1 = _mm512_max_ps(v1, hi1);
        lo2 = _mm512_min_ps(v2, lo2);
        hi2 = _mm512_max_ps(v2, hi2);
        lo3 = _mm512_min_ps(v3, lo3);
        hi3 = _mm512_max_ps(v3, hi3);
    }
    lo = _mm512_min_ps(_mm512_min_ps(lo, lo1), _mm512_min_ps(lo2, lo3));
    hi = _mm512_max_ps(_mm512_max_ps(hi, hi1), _mm512_max_ps(hi2, hi3));
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        lo = _mm512_min_ps(v, lo);
        hi = _mm512_max_ps(v, hi);
    }
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i); /* masked lanes read 0: inside the range anyway */
        lo = _mm512_min_ps(lo, v);
        hi = _mm512_max_ps(hi, v);
    }
    *mn = _mm512_reduce_min_ps(lo);
    *mx = _mm512_reduce_max_ps(hi);
}

/* rint(x * inv) + zero, clamped to [0, 255]: the scalar reference's arithmetic
 * (round to nearest even, then the f32 add) lane by lane. */
static inline __m512i q8_codes16(const float *x, __m512 inv, __m512 z, __m512 lo, __m512 hi) {
    __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvttps_epu32(_mm512_min_ps(_mm512_max_ps(_mm512_add_ps(v, z), lo), hi));
}

void fm_q8_quantize_avx512(const float *x, int64_t n, float inv_scale, int32_t zero, uint8_t *q) {
    const __m512 inv = _mm512_set1_ps(inv_scale), z = _mm512_set1_ps((float)zero);
    const __m512 lo = _mm512_setzero_ps(), hi = _mm512_set1_ps(255.0f);
    /* 64 codes a step, narrowed with two saturating packs (the values are in [0, 255]
     * already, so the saturation never acts) and one lane permutation, one 64-byte store:
     * the masked narrowing store (vpmovusdb to memory) of 16 codes took half of a small
     * product's quantization (perf). The packs interleave the 128-bit lanes of their
     * inputs; the permutation puts dword lane L of pack(ab, cd) at L's input order. */
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i a = q8_codes16(x + i, inv, z, lo, hi), b = q8_codes16(x + i + 16, inv, z, lo, hi);
        __m512i c = q8_codes16(x + i + 32, inv, z, lo, hi), d = q8_codes16(x + i + 48, inv, z, lo, hi);
        __m512i w = _mm512_packus_epi16(_mm512_packus_epi32(a, b), _mm512_packus_epi32(c, d));
        _mm512_storeu_si512((void *)(q + i), _mm512_permutexvar_epi32(order, w));
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(v, z), lo), hi);
        _mm_mask_storeu_epi8(q + i, k, _mm512_cvtusepi32_epi8(_mm512_cvttps_epu32(v)));
    }
}

/* ---- int4 on int8 x (quant_q4_rows.h): the AVX2 rows with vpdpbusd ---- */

/* The 64 weights' low nibbles against the pair's first 32 codes and the high
 * nibbles against the next 32, as two 256-bit vpdpbusd into the same lanes: lane j
 * is then exactly the AVX2 dot64's lane j (the same products, summed as integers),
 * so the rows give its bits. (One 512-bit vpdpbusd over both halves and an add of
 * its halves, as before, took two more instructions per 64 weights.) */
VNNI static inline __m256i dot64_vnni(__m256i acc, const uint8_t *w, const int8_t *qx) {
    const __m256i W = _mm256_loadu_si256((const __m256i *)w), m4 = _mm256_set1_epi8(15);
    const __m256i d = _mm256_dpbusd_epi32(acc, _mm256_and_si256(W, m4), _mm256_loadu_si256((const __m256i *)qx));
    return _mm256_dpbusd_epi32(d, _mm256_and_si256(_mm256_srli_epi16(W, 4), m4), _mm256_loadu_si256((const __m256i *)(qx + 32)));
}

VNNI static inline __m256i dot64n_vnni(__m256i acc, __m256i lo, __m256i hi, const int8_t *qx) {
    const __m256i d = _mm256_dpbusd_epi32(acc, lo, _mm256_loadu_si256((const __m256i *)qx));
    return _mm256_dpbusd_epi32(d, hi, _mm256_loadu_si256((const __m256i *)(qx + 32)));
}

VNNI void fm_q4_rows_avx512(const fm_q4_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    q4_rows(g, m0, m1, n0, n1, dot64_vnni, dot64n_vnni);
}


/* 16 codes = four 4-byte steps of the panel, widened, converted and scaled */
void fm_q8_table_row_avx512(const int8_t *panel_row, int64_t D, float s, float *y) {
    const __m512 vs = _mm512_set1_ps(s);
    const __m128i steps = _mm_setr_epi32(0, 64, 128, 192), lane = _mm_setr_epi32(0, 1, 2, 3);
    for (int64_t k = 0; k < D; k += 16) {
        /* the steps that exist (a row's last ones end its panel, and the table) */
        __m128i live = _mm_cmpgt_epi32(_mm_set1_epi32((int)((D - k + 3) / 4)), lane);
        __m128i c = _mm_mask_i32gather_epi32(_mm_setzero_si128(), (const int *)(const void *)(panel_row + 16 * k), steps, live, 1);
        __m512 v = _mm512_mul_ps(vs, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c)));
        if (D - k >= 16) _mm512_storeu_ps(y + k, v);
        else _mm512_mask_storeu_ps(y + k, (__mmask16)((1u << (D - k)) - 1), v);
    }
}
