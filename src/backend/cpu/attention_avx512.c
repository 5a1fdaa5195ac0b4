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
#define SDPA_FORWARD fm_sdpa_f32_avx512_forward
#define SDPA_BACKWARD fm_sdpa_f32_avx512_backward
#include "backend/cpu/attention_simd.h"
