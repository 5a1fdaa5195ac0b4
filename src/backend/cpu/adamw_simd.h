/* The AdamW and SGD f32 updates of optim_cpu.c as SIMD kernels (adamw_avx512.c, adamw_avx2.c). */
#ifndef FATHOM_ADAMW_SIMD_H
#define FATHOM_ADAMW_SIMD_H
#include <stdbool.h>
#include <stdint.h>

typedef struct fm_adamw_args {
    float *p, *m1, *m2;
    const float *g;
    float b1, b2, ob1, ob2, eps, step_size, rbc2, decay;
    bool adam;  /* Adam's L2 form: g + wd p in place of g, and no decay */
    float wd;   /* with adam */
} fm_adamw_args;
/* elements [begin, end): m1 = b1 m1 + ob1 g; m2 = b2 m2 + ob2 g g;
 * p = p decay - step_size m1 / (sqrt(m2) rbc2 + eps); with adam, g + wd p for g and
 * p - step_size m1 / (...). Call only when fm_cpu_use_avx512() (fm_cpu_use_avx2() for
 * the AVX2 one). Both are bitwise the scalar loops. */
void fm_adamw_f32_avx512(const fm_adamw_args *a, int64_t begin, int64_t end);
void fm_adamw_f32_avx2(const fm_adamw_args *a, int64_t begin, int64_t end);

typedef struct fm_sgd_args {
    float *p, *m1; /* m1 NULL: no momentum buffer */
    const float *g;
    float lr, wd, mom, damp; /* damp: 1 - dampening */
    bool first, nesterov;    /* first: the buffer's first step (m1 = d) */
} fm_sgd_args;
/* elements [begin, end), d = g + wd p: without m1, p -= lr d; on the first step
 * m1 = d and p -= lr (nesterov ? d + mom d : d); after it b = mom m1 + damp d,
 * m1 = b and p -= lr (nesterov ? d + mom b : b). Bitwise the scalar loops; the same
 * calling rules as the AdamW kernels. */
void fm_sgd_f32_avx512(const fm_sgd_args *a, int64_t begin, int64_t end);
void fm_sgd_f32_avx2(const fm_sgd_args *a, int64_t begin, int64_t end);
#endif
