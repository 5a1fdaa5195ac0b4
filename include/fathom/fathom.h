/* fathom/fathom.h: the whole public API in one include, plus build and
 * device information. */
#ifndef FATHOM_FATHOM_H
#define FATHOM_FATHOM_H
#include "fathom/export.h"
#include "fathom/autograd.h"
#include "fathom/error.h"
#include "fathom/memory.h"
#include "fathom/ops.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fm_build_info {
    const char *version, *build_type;
    bool sanitized, cuda_built;
    bool cuda_switched_off; /* -DFATHOM_CUDA=OFF: not built on purpose (else: no toolkit was found) */
} fm_build_info;
FM_API void fm_get_build_info(fm_build_info *out);

#define FM_MAX_CUDA_DEVICES 16
typedef struct fm_cuda_device_info {
    char name[256];
    size_t memory_bytes;
    int cc_major, cc_minor, sm_count;
    bool bf16;
} fm_cuda_device_info;
typedef struct fm_cuda_info {
    int n_devices;
    int runtime_version, driver_version;
    char reason[256]; /* why there are no devices ("" when there are) */
    fm_cuda_device_info devices[FM_MAX_CUDA_DEVICES];
} fm_cuda_info;
/* Never fails: with no GPU, n_devices = 0 and reason says why (not built with
 * CUDA, no driver, no device). */
FM_API void fm_cuda_query(fm_cuda_info *out);

#ifdef __cplusplus
}
#endif
#endif
