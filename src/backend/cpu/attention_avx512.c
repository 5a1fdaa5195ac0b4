/* Flash-style scaled-dot-product attention for f32 with AVX-512 (compiled with
 * the *_avx512.c flags; entered only when fm_cpu_use_avx512() says the CPU and
 * FATHOM_ISA allow it): the loops are attention_simd.h at 16 floats a vector,
 * so a 6 x 32 register tile per micro-kernel step (12 of the 32 zmm registers). */
#include <immintrin.h>

#include "backend/cpu/simd_avx512.h" /* fm_exp2_neg512 */

#define VEC __m512
#define VW 16
#define V_LOADU(p) _mm512_loadu_ps(p)
#define V_STOREU(p, v) _mm512_storeu_ps(p, v)
#define V_FMADD(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_BCAST(p) _mm512_set1_ps(*(p))
#define V_SET1(x) _mm512_set1_ps(x)
#define V_ZERO() _mm512_setzero_ps()
#define V_MAX(a, b) _mm512_max_ps(a, b)
#define V_SUB(a, b) _mm512_sub_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_EXP2_NEG(x) fm_exp2_neg512(x)
/* The query block packed transposed (attention_simd.h's pack_qt) 16 queries x 16
 * dimensions at a time: rows past bq and dimensions past D load as zeros, and
 * only the D rows of QT are stored (bqmax = BQ, a multiple of 16). */
static void pack_qt_avx512(const float *Q, int64_t qst, int64_t bq, int64_t D, float sc2, float *QT, int64_t bqmax) {
    const __m512 k = _mm512_set1_ps(sc2);
    for (int64_t i0 = 0; i0 < bqmax; i0 += 16)
        for (int64_t d0 = 0; d0 < D; d0 += 16) {
            const __mmask16 dm = D - d0 >= 16 ? (__mmask16)0xFFFF : fm_tail16(D - d0);
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i0 + i < bq ? _mm512_castps_si512(_mm512_maskz_loadu_ps(dm, Q + (i0 + i) * qst + d0)) : _mm512_setzero_si512();
            fm_transpose16_epi32(r);
            const int64_t dn = D - d0 < 16 ? D - d0 : 16;
            for (int64_t t = 0; t < dn; t++) _mm512_storeu_ps(QT + (d0 + t) * bqmax + i0, _mm512_mul_ps(_mm512_castsi512_ps(r[t]), k));
        }
}
#define V_PACK_QT(Q, qst, bq, D, sc2, QT) pack_qt_avx512(Q, qst, bq, D, sc2, QT, BQ)
#define SDPA_FORWARD fm_sdpa_f32_avx512_forward
#define SDPA_BACKWARD fm_sdpa_f32_avx512_backward
#include "backend/cpu/attention_simd.h"
