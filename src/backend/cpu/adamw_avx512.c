/* The AdamW and SGD updates (f32) in 16 lanes, for optim_cpu.c when fm_cpu_use_avx512():
 * the same operations in the same order as optim_cpu.c's scalar loop, which is
 * compiled as ISO C (no contraction into FMAs), so each element is bitwise the
 * scalar result (tests/test_isa_kernels.c). Tails are masked. */
#include <immintrin.h>
#include <stdint.h>

#include "backend/cpu/adamw_simd.h"

void fm_adamw_f32_avx512(const fm_adamw_args *a, int64_t begin, int64_t end) {
    const __m512 b1 = _mm512_set1_ps(a->b1), b2 = _mm512_set1_ps(a->b2), ob1 = _mm512_set1_ps(a->ob1);
    const __m512 ob2 = _mm512_set1_ps(a->ob2), eps = _mm512_set1_ps(a->eps), ss = _mm512_set1_ps(a->step_size);
    const __m512 rbc2 = _mm512_set1_ps(a->rbc2), decay = _mm512_set1_ps(a->decay), wd = _mm512_set1_ps(a->wd);
    float *P = a->p, *M1 = a->m1, *M2 = a->m2; /* locals: not reloaded after each store */
    const float *G = a->g;
    const bool adam = a->adam;
    for (int64_t i = begin; i < end; i += 16) {
        __mmask16 t = end - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (end - i)) - 1u);
        __m512 p0 = _mm512_maskz_loadu_ps(t, P + i), g = _mm512_maskz_loadu_ps(t, G + i);
        if (adam) g = _mm512_add_ps(g, _mm512_mul_ps(wd, p0));
        __m512 m = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_maskz_loadu_ps(t, M1 + i)), _mm512_mul_ps(ob1, g));
        __m512 v = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_maskz_loadu_ps(t, M2 + i)),
                                 _mm512_mul_ps(_mm512_mul_ps(ob2, g), g));
        _mm512_mask_storeu_ps(M1 + i, t, m);
        _mm512_mask_storeu_ps(M2 + i, t, v);
        __m512 den = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(v), rbc2), eps);
        __m512 p = _mm512_sub_ps(adam ? p0 : _mm512_mul_ps(p0, decay), _mm512_div_ps(_mm512_mul_ps(ss, m), den));
        _mm512_mask_storeu_ps(P + i, t, p);
    }
}

/* The pointers and scalars are read into locals first: fathom builds with
 * -fno-strict-aliasing, so a store through p would otherwise make the compiler
 * load them from *a again in every step. */
void fm_sgd_f32_avx512(const fm_sgd_args *a, int64_t begin, int64_t end) {
    float *P = a->p, *M = a->m1;
    const float *G = a->g;
    const __m512 lr = _mm512_set1_ps(a->lr), wd = _mm512_set1_ps(a->wd), mom = _mm512_set1_ps(a->mom),
                 damp = _mm512_set1_ps(a->damp);
    const bool first = a->first, nesterov = a->nesterov;
    for (int64_t i = begin; i < end; i += 16) {
        __mmask16 t = end - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (end - i)) - 1u);
        __m512 p = _mm512_maskz_loadu_ps(t, P + i);
        __m512 d = _mm512_add_ps(_mm512_maskz_loadu_ps(t, G + i), _mm512_mul_ps(wd, p));
        __m512 step = d;
        if (M) {
            __m512 b = first ? d : _mm512_add_ps(_mm512_mul_ps(mom, _mm512_maskz_loadu_ps(t, M + i)), _mm512_mul_ps(damp, d));
            _mm512_mask_storeu_ps(M + i, t, b);
            step = nesterov ? _mm512_add_ps(d, _mm512_mul_ps(mom, b)) : b;
        }
        _mm512_mask_storeu_ps(P + i, t, _mm512_sub_ps(p, _mm512_mul_ps(lr, step)));
    }
}
