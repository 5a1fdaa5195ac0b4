/* Which instruction set each CPU kernel family runs with, for `fathom info`:
 * the level in use (fm_cpu_isa) capped at the highest level the family has
 * kernels for. Raise a family's `top` in kernel_isa.c when it gains a level. */
#ifndef FATHOM_KERNEL_ISA_H
#define FATHOM_KERNEL_ISA_H
#include "core/cpu_features.h"

typedef struct fm_kernel_family {
    const char *name;
    fm_isa top; /* highest level with kernels of its own */
} fm_kernel_family;

/* The families (not GEMM: that is the provider's, fm_gemm_provider_info_get). */
const fm_kernel_family *fm_kernel_families(int *count);
/* The level a family runs at now. */
fm_isa fm_kernel_family_isa(const fm_kernel_family *f);
#endif
