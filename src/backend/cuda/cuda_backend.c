/* The CUDA entry points for builds without the CUDA toolkit: each says why it
 * cannot run, so callers need no #if (the real ones are in the .cu files). */
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "core/backend.h"
#include "fathom/fathom.h"

#if !FATHOM_HAVE_CUDA
#define NO_CUDA "this build has no CUDA backend (the CUDA toolkit was not found when fathom was built)"

const fm_backend *fm_cuda_backend(void) { return NULL; }
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
                             fm_tensor *const *exp_avg_sq, const fm_adamw_hparams *hp) {
    (void)n; (void)params; (void)grads; (void)exp_avg; (void)exp_avg_sq; (void)hp;
    return fm_set_error(FM_ERR_UNSUPPORTED, "adamw (fused, cuda): %s", NO_CUDA);
}
#endif
