/* The CUDA backend's entry points beyond the generic backend vtable: device
 * discovery, allocator configuration and statistics, the fused AdamW step.
 * Plain C; every function exists in every build (a build without CUDA answers
 * with FM_ERR_UNSUPPORTED and says so), so callers need no #if. */
#ifndef FATHOM_CUDA_BACKEND_H
#define FATHOM_CUDA_BACKEND_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_pinned.h"
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

/* Fused AdamW over a list of parameters in one launch (decoupled weight decay,
 * the optimizer's AdamW expressions: src/optim, optim_cpu.c). params, grads,
 * exp_avg, exp_avg_sq are contiguous CUDA tensors of matching shapes; params
 * f32/bf16/f16 with f32 moments, grads in the parameter dtype. master (NULL, or
 * NULL entries, for none) gives a bf16/f16 parameter its f32 master copy: the
 * update runs on it and the parameter is written as it rounded to nearest even;
 * without one a 16-bit parameter is updated in place (small steps round away).
 * `step` counts from 1. */
typedef struct fm_adamw_hparams {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step;
    double grad_scale; /* gradients are multiplied by this first (1/loss_scale); 0 = 1 */
} fm_adamw_hparams;
fm_status fm_cuda_adamw_step(int n, fm_tensor *const *params, fm_tensor *const *grads, fm_tensor *const *exp_avg,
                             fm_tensor *const *exp_avg_sq, fm_tensor *const *master, const fm_adamw_hparams *hp);

/* The device's compute stream (a cudaStream_t; every kernel and copy of the device is
 * queued on it), made on first use; NULL with the error set when unavailable. For a
 * library above the backend that queues its own CUDA work in order with fathom's
 * (NCCL collectives on gradient buckets: src/dist/nccl.c). */
void *fm_cuda_compute_stream(int device);

/* Batch staging. fm_cuda_pinned_empty makes a CPU tensor in page-locked memory from a
 * caching host allocator (cuda_pinned.h). fm_tensor_to(t, cuda) of such a tensor goes
 * through fm_cuda_copy_h2d_async: the copy runs on the device's copy stream, after the
 * compute work queued before the last device-memory free (a reused destination block may
 * still be read by it) and before any compute queued afterwards (an event orders it), so
 * it overlaps compute the host queues in between. Sources that are not pinned are copied
 * on the compute stream (the driver stages pageable memory before returning). A pinned
 * buffer must not be overwritten by the host before its copy is done: fm_cuda_pinned_wait
 * waits for that (the cache itself reuses a released block only after its copy). */
fm_tensor *fm_cuda_pinned_empty(int ndim, const int64_t *shape, fm_dtype dt);
bool fm_cuda_is_pinned(const fm_tensor *t);
fm_status fm_cuda_copy_h2d_async(int device, void *dst, const void *src, size_t n);
fm_status fm_cuda_pinned_wait(const fm_tensor *t);
fm_status fm_cuda_pinned_stats(fm_pinned_stats *out);
size_t fm_cuda_pinned_empty_cache(void);

/* Attention kernels (attention.cu): 2 tensor cores where they fit (bf16/f16 with head
 * dimension 32, 64, 96 or 128 on sm_80+, attention_mma.cu; not yet run on a GPU), the
 * tiled ones elsewhere; 1 the tiled ones on CUDA cores (the default; f32/f16/bf16 with
 * head dimension <= 128); 0 the warp-per-row reference. For tests and comparisons;
 * FATHOM_CUDA_ATTENTION=reference|tiled|mma sets the default. No-op without CUDA. */
void fm_cuda_attention_set_tiled(int mode);

#ifdef __cplusplus
}
#endif
#endif
