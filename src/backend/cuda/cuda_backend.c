/* The CUDA entry points for builds without the CUDA toolkit: each says why it
 * cannot run, so callers need no #if (the real ones are in the .cu files). */
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "fathom/fathom.h"

#if !FATHOM_HAVE_CUDA
#define NO_CUDA "this build has no CUDA backend (the CUDA toolkit was not found when fathom was built)"

int fm_cuda_device_count(const char **reason) {
    if (reason) *reason = NO_CUDA;
    return 0;
}
fm_status fm_cuda_allocator_configure(int device, const fm_pool_config *cfg) {
    (void)device; (void)cfg;
    return fm_set_error(FM_ERR_UNSUPPORTED, "cuda allocator: %s", NO_CUDA);
}
fm_allocator *fm_cuda_allocator(int device) {
    (void)device;
    fm_set_error(FM_ERR_UNSUPPORTED, "cuda allocator: %s", NO_CUDA);
    return NULL;
}
fm_status fm_cuda_allocator_extra_stats(int device, fm_pool_extra_stats *out) {
    (void)device;
    memset(out, 0, sizeof *out);
    return fm_set_error(FM_ERR_UNSUPPORTED, "cuda allocator: %s", NO_CUDA);
}
fm_status fm_cuda_adamw_step(int n, fm_tensor *const *params, fm_tensor *const *grads, fm_tensor *const *exp_avg,
                             fm_tensor *const *exp_avg_sq, fm_tensor *const *master, const fm_adamw_hparams *hp) {
    (void)n; (void)params; (void)grads; (void)exp_avg; (void)exp_avg_sq; (void)master; (void)hp;
    return fm_set_error(FM_ERR_UNSUPPORTED, "adamw (fused, cuda): %s", NO_CUDA);
}
void *fm_cuda_compute_stream(int device) {
    (void)device;
    fm_set_error(FM_ERR_UNSUPPORTED, "cuda stream: %s", NO_CUDA);
    return NULL;
}
fm_tensor *fm_cuda_pinned_empty(int ndim, const int64_t *shape, fm_dtype dt) {
    (void)ndim; (void)shape; (void)dt;
    fm_set_error(FM_ERR_UNSUPPORTED, "pinned memory: %s", NO_CUDA);
    return NULL;
}
bool fm_cuda_is_pinned(const fm_tensor *t) { (void)t; return false; }
fm_status fm_cuda_copy_h2d_async(int device, void *dst, const void *src, size_t n) {
    (void)device; (void)dst; (void)src; (void)n;
    return fm_set_error(FM_ERR_UNSUPPORTED, "copy to cuda: %s", NO_CUDA);
}
fm_status fm_cuda_pinned_wait(const fm_tensor *t) { (void)t; return FM_OK; }
fm_status fm_cuda_pinned_stats(fm_pinned_stats *out) {
    memset(out, 0, sizeof *out);
    return FM_OK;
}
size_t fm_cuda_pinned_empty_cache(void) { return 0; }
void fm_cuda_attention_set_tiled(int tiled) { (void)tiled; }
#endif
