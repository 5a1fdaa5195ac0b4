/* Build facts for `fathom info`, and the CUDA query for builds without CUDA
 * (the CUDA backend provides the real one, src/backend/cuda). */
#include <string.h>

#include "fathom/fathom.h"

void fm_get_build_info(fm_build_info *out) {
    out->version = FATHOM_VERSION;
    out->build_type = FATHOM_BUILD_TYPE;
    out->sanitized = FATHOM_SANITIZED;
    out->cuda_built = FATHOM_HAVE_CUDA;
    out->cuda_switched_off = FATHOM_CUDA_SWITCHED_OFF;
}

#if !FATHOM_HAVE_CUDA
void fm_cuda_query(fm_cuda_info *out) {
    memset(out, 0, sizeof *out);
    strcpy(out->reason, "this build has no CUDA backend (the CUDA toolkit was not found when fathom was built)");
}
#endif
