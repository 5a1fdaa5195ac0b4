/* ScatterND's index tuples to output offsets, shared by the CPU and CUDA kernels (the
 * CUDA one copies the indices to the host for it): each of the m tuples of k indices
 * (negative from the end) is checked against t's leading dims before anything is
 * written, and becomes the offset of its slice's first element. */
#ifndef FATHOM_BACKEND_SCATTER_ND_H
#define FATHOM_BACKEND_SCATTER_ND_H
#include <inttypes.h>

#include "fathom/error.h"
#include "fathom/tensor.h"

static inline fm_status fm_scatter_nd_offsets(const void *ip, fm_dtype idt, int64_t m, int k, const int64_t *shape, int64_t slice,
                                              int64_t *off) {
    for (int64_t i = 0; i < m; i++) {
        int64_t o = 0;
        for (int d = 0; d < k; d++) {
            int64_t at = i * k + d, v = idt == FM_I64 ? ((const int64_t *)ip)[at] : (int64_t)((const int32_t *)ip)[at];
            int64_t n = shape[d], w = v < 0 ? v + n : v;
            if (w < 0 || w >= n)
                return fm_set_error(FM_ERR_INVALID, "scatter_nd: index %" PRId64 " (update %" PRId64 ") is out of range for dim %d with size %" PRId64
                                    " (valid: %" PRId64 "..%" PRId64 ")", v, i, d, n, -n, n - 1);
            o = o * n + w;
        }
        off[i] = o * slice;
    }
    return FM_OK;
}
#endif
