/* Helpers shared by the convolution-family kernels (conv2d_cpu.c, pool_cpu.c,
 * batchnorm_cpu.c). */
#ifndef FATHOM_CONV_SHARED_H
#define FATHOM_CONV_SHARED_H
#include <stdint.h>

#include "fathom/tensor.h"

/* fm_parallel_for grain: items per task so that a task holds about 2^14
 * elements of work. `items` is unused (the grain does not depend on it). */
static inline int64_t grain_for(int64_t items, int64_t work_per_item) {
    int64_t g = ((int64_t)1 << 14) / (work_per_item > 0 ? work_per_item : 1);
    (void)items;
    return g < 1 ? 1 : g;
}

/* A 1-D CPU scratch tensor of n elements (at least one); NULL on failure. */
static inline fm_tensor *scratch(int64_t n, fm_dtype dt) {
    int64_t shape[1] = {n > 0 ? n : 1};
    return fm_tensor_empty(1, shape, dt, FM_CPU);
}
#endif
