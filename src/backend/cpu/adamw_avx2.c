/* The AdamW and SGD updates (f32) in 8 lanes, for optim_cpu.c when fm_cpu_use_avx2()
 * and not avx512: the same operations in the same order as optim_cpu.c's
 * scalar loop (ISO C, no contraction into FMAs, and none here: every product
 * and sum is its own intrinsic), so each element is bitwise the scalar result
 * (tests/test_isa_kernels.c). Only the tail uses masked loads and stores: a
 * masked store (vmaskmovps) in every step made the loop 2.5-3x slower than the
 * compiler's SSE loop on AMD EPYC Zen 3, where it is microcoded. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/adamw_simd.h"

static inline void step8(const fm_adamw_args *a, int64_t i, __m256i t, bool tail) {
    const __m256 b1 = _mm256_set1_ps(a->b1), b2 = _mm256_set1_ps(a->b2), ob1 = _mm256_set1_ps(a->ob1);
    const __m256 ob2 = _mm256_set1_ps(a->ob2), eps = _mm256_set1_ps(a->eps), ss = _mm256_set1_ps(a->step_size);
    const __m256 rbc2 = _mm256_set1_ps(a->rbc2), decay = _mm256_set1_ps(a->decay);
#define LD(p) (tail ? _mm256_maskload_ps(p, t) : _mm256_loadu_ps(p))
#define ST(p, v) (tail ? _mm256_maskstore_ps(p, t, v) : _mm256_storeu_ps(p, v))
    __m256 p0 = LD(a->p + i), g = LD(a->g + i);
    if (a->adam) g = _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(a->wd), p0));
    __m256 m = _mm256_add_ps(_mm256_mul_ps(b1, LD(a->m1 + i)), _mm256_mul_ps(ob1, g));
    __m256 v = _mm256_add_ps(_mm256_mul_ps(b2, LD(a->m2 + i)), _mm256_mul_ps(_mm256_mul_ps(ob2, g), g));
    ST(a->m1 + i, m);
    ST(a->m2 + i, v);
    __m256 den = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), rbc2), eps);
    __m256 p = _mm256_sub_ps(a->adam ? p0 : _mm256_mul_ps(p0, decay), _mm256_div_ps(_mm256_mul_ps(ss, m), den));
    ST(a->p + i, p);
#undef LD
#undef ST
}

void fm_adamw_f32_avx2(const fm_adamw_args *a, int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) step8(a, i, _mm256_setzero_si256(), false);
    if (i < end)
        step8(a, i, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(end - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
              true);
}

typedef struct sgd8 {
    float *P, *M;
    const float *G;
    __m256 lr, wd, mom, damp;
    bool first, nesterov;
} sgd8;

static inline void sgd_step8(const sgd8 *a, int64_t i, __m256i t, bool tail) {
#define LD(p) (tail ? _mm256_maskload_ps(p, t) : _mm256_loadu_ps(p))
#define ST(p, v) (tail ? _mm256_maskstore_ps(p, t, v) : _mm256_storeu_ps(p, v))
    __m256 p = LD(a->P + i);
    __m256 d = _mm256_add_ps(LD(a->G + i), _mm256_mul_ps(a->wd, p));
    __m256 step = d;
    if (a->M) {
        __m256 b = a->first ? d : _mm256_add_ps(_mm256_mul_ps(a->mom, LD(a->M + i)), _mm256_mul_ps(a->damp, d));
        ST(a->M + i, b);
        step = a->nesterov ? _mm256_add_ps(d, _mm256_mul_ps(a->mom, b)) : b;
    }
    ST(a->P + i, _mm256_sub_ps(p, _mm256_mul_ps(a->lr, step)));
#undef LD
#undef ST
}

/* a local copy of the arguments (its address does not escape), so the stores
 * through P do not make the compiler reload them (-fno-strict-aliasing) */
void fm_sgd_f32_avx2(const fm_sgd_args *a, int64_t begin, int64_t end) {
    const sgd8 x = {a->p, a->m1, a->g, _mm256_set1_ps(a->lr), _mm256_set1_ps(a->wd), _mm256_set1_ps(a->mom),
                    _mm256_set1_ps(a->damp), a->first, a->nesterov};
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) sgd_step8(&x, i, _mm256_setzero_si256(), false);
    if (i < end)
        sgd_step8(&x, i, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(end - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                  true);
}
