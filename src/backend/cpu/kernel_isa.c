/* The ISA table of the CPU kernel families (kernel_isa.h). */
#include "backend/cpu/kernel_isa.h"

static const fm_kernel_family families[] = {
    {"elementwise+gelu", FM_ISA_AVX512},
    {"softmax/log-softmax/cross-entropy", FM_ISA_AVX512},
    {"layer/rms norm", FM_ISA_AVX512},
    {"fused bias+gelu", FM_ISA_AVX512},
    {"fused add+norm", FM_ISA_AVX2},
    {"attention", FM_ISA_AVX512},
    {"conv", FM_ISA_AVX2},
    {"conv direct + ReLU/pool epilogue (conv2d_fused)", FM_ISA_AVX512},
    {"gemv (one-row linear)", FM_ISA_AVX512},
    {"small-M linear (2-16 rows)", FM_ISA_AVX512},
    {"packed linear + bias/ReLU epilogue (linear_fused)", FM_ISA_AVX512},
    {"dtype conversion", FM_ISA_AVX512},
    {"reductions", FM_ISA_SCALAR},
    {"column sums of f32 (a linear's bias gradient)", FM_ISA_AVX512},
    {"embedding/index", FM_ISA_SCALAR},
    {"int8 linear (vnni when present), int4 linear", FM_ISA_AVX512},
    {"adamw (f32)", FM_ISA_AVX512},
    {"sgd, adam", FM_ISA_SCALAR},
};

const fm_kernel_family *fm_kernel_families(int *count) {
    *count = (int)(sizeof families / sizeof families[0]);
    return families;
}

fm_isa fm_kernel_family_isa(const fm_kernel_family *f) {
    fm_isa now = fm_cpu_isa();
    return now < f->top ? now : f->top;
}
