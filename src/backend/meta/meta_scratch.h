/* The scratch CPU kernels take from the caching allocator, replayed on the
 * meta device (meta_scratch.c). */
#ifndef FATHOM_META_SCRATCH_H
#define FATHOM_META_SCRATCH_H
#include "backend/kernel.h"

/* Allocates and frees on `dev` what the CPU kernel of c->op would allocate and
 * free through fathom's allocator (not malloc) for this call, in the same order
 * and at the same sizes, so meta's peak is the CPU's. */
fm_status fm_meta_kernel_scratch(const fm_op_call *c, fm_device dev);
/* Off: kernels take no scratch (tests show that the replay is what makes meta
 * equal the CPU). On by default. */
void fm_meta_count_scratch(bool on);
#endif
