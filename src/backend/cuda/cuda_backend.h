/* The CUDA backend's entry points beyond the generic backend vtable: device
 * discovery, allocator configuration and statistics, the fused AdamW step.
 * Plain C; every function exists in every build (a build without CUDA answers
 * with FM_ERR_UNSUPPORTED and says so), so callers need no #if. */
#ifndef FATHOM_CUDA_BACKEND_H
#define FATHOM_CUDA_BACKEND_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_pool.h"
#include "fathom/memory.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable devices (0 when none); *reason (may be NULL) says why none. */
int fm_cuda_device_count(const char **reason);
/* Configure the caching allocator of a device before its first allocation
 * (afterwards only the limit can change: FM_ERR_STATE). Also read from the
 * environment at first use: FATHOM_CUDA_MEMORY_MODE=grow|preallocate,
 * FATHOM_CUDA_MEMORY_LIMIT=<size>, FATHOM_CUDA_MEMORY_FRACTION=<0..1>,
 * FATHOM_CUDA_MAX_SPLIT_SIZE=<size>. */
fm_status fm_cuda_allocator_configure(int device, const fm_pool_config *cfg);
/* The device's allocator (creates the pool); NULL with the error set when unavailable. */
fm_allocator *fm_cuda_allocator(int device);
fm_status fm_cuda_allocator_extra_stats(int device, fm_pool_extra_stats *out);

/* Fused AdamW over a list of parameters in one launch per dtype (decoupled
 * weight decay, PyTorch's torch.optim.AdamW formula). params, grads, exp_avg,
 * exp_avg_sq are contiguous CUDA tensors of matching shapes; params f32/bf16/f16
 * with f32 moments, grads in the parameter dtype. `step` counts from 1. */
typedef struct fm_adamw_hparams {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step;
    double grad_scale; /* gradients are multiplied by this first (1/loss_scale); 0 = 1 */
} fm_adamw_hparams;
fm_status fm_cuda_adamw_step(int n, fm_tensor *const *params, fm_tensor *const *grads, fm_tensor *const *exp_avg,
                             fm_tensor *const *exp_avg_sq, const fm_adamw_hparams *hp);

#ifdef __cplusplus
}
#endif
#endif
