/* Deferred index checks for the CUDA kernels whose bad indices are harmless to the
 * launch itself (cross-entropy targets, embedding indices: the kernels skip them),
 * so the op need not wait for the device to learn whether one was bad.
 *
 * An op takes a slot (fm_cuda_defer_index_check): a device word set to ~0, which its
 * kernel lowers with atomicMin to 1 + the first bad position, and a host record of
 * the op, the bound and the index tensor (kept alive). The slots of a device are read
 * back together, with one copy, when the host next waits for that device anyway: a
 * device-to-host copy (reading the loss, once per step) or a synchronize. The first
 * bad slot becomes the error, naming the op, the value, its position and the range,
 * as the CPU's immediate check does; the step that contained it fails there. */
#include <pthread.h>
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"
#include "fathom/fathom.h" /* FM_MAX_CUDA_DEVICES */

#define DEFER_SLOTS 256

typedef struct {
    const char *op, *what;
    int64_t bound;
    fm_tensor *idx;
} defer_rec;

typedef struct {
    unsigned long long *flags; /* device: DEFER_SLOTS words */
    defer_rec rec[DEFER_SLOTS];
    int n;
} defer_dev;

static defer_dev g_defer[FM_MAX_CUDA_DEVICES];
static pthread_mutex_t g_defer_mu = PTHREAD_MUTEX_INITIALIZER;

/* The value at flat position pos of the index tensor (a one-element copy). */
static fm_status read_index(const fm_tensor *idx, int64_t pos, int64_t *out) {
    size_t es = fm_dtype_size(idx->dtype);
    int64_t v = 0;
    fm_status st = fm_cuda_check(cudaMemcpy(&v, (const char *)fm_tensor_data(idx) + pos * (int64_t)es, es, cudaMemcpyDeviceToHost),
                                 "reading a bad index back");
    *out = es == 4 ? (int64_t)(int32_t)v : v;
    return st;
}

/* Reads every pending slot of device dev (one copy, one wait), releases the records,
 * and returns the first bad one as the error. Caller holds g_defer_mu. */
static fm_status check_locked(int dev, cudaStream_t s) {
    defer_dev *d = &g_defer[dev];
    if (!d->n) return FM_OK;
    unsigned long long h[DEFER_SLOTS];
    fm_status st = fm_cuda_check(cudaMemcpyAsync(h, d->flags, (size_t)d->n * sizeof *h, cudaMemcpyDeviceToHost, s),
                                 "deferred index checks");
    if (!st) st = fm_cuda_check(cudaStreamSynchronize(s), "deferred index checks");
    for (int i = 0; i < d->n; i++) {
        defer_rec *r = &d->rec[i];
        if (!st && h[i] != ~0ULL) {
            int64_t pos = (int64_t)h[i] - 1, v = 0;
            st = read_index(r->idx, pos, &v);
            if (!st)
                st = fm_set_error(FM_ERR_INVALID, "%s: %s %lld at position %lld is out of range [0, %lld) (found at the next "
                                                  "wait for cuda:%d; FATHOM_CUDA_SYNC=1 reports it at the op)",
                                  r->op, r->what, (long long)v, (long long)pos, (long long)r->bound, dev);
        }
        fm_tensor_release(r->idx);
        r->idx = NULL;
    }
    d->n = 0;
    return st;
}

extern "C" fm_status fm_cuda_deferred_check(int dev, cudaStream_t s) {
    if (dev < 0 || dev >= FM_MAX_CUDA_DEVICES) return FM_OK;
    pthread_mutex_lock(&g_defer_mu);
    fm_status st = check_locked(dev, s);
    pthread_mutex_unlock(&g_defer_mu);
    return st;
}

unsigned long long *fm_cuda_defer_index_check(const char *op, const char *what, const fm_tensor *idx, int64_t bound) {
    const int dev = fm_cuda_current_device();
    if (dev < 0 || dev >= FM_MAX_CUDA_DEVICES) {
        fm_set_error(FM_ERR_INTERNAL, "%s: current CUDA device %d is out of range", op, dev);
        return NULL;
    }
    cudaStream_t s = fm_cuda_stream();
    pthread_mutex_lock(&g_defer_mu);
    defer_dev *d = &g_defer[dev];
    fm_status st = d->n == DEFER_SLOTS ? check_locked(dev, s) : FM_OK; /* full: the one early wait */
    if (!st && !d->flags) st = fm_cuda_check(cudaMalloc((void **)&d->flags, DEFER_SLOTS * sizeof *d->flags), op);
    unsigned long long *slot = NULL;
    if (!st) {
        slot = d->flags + d->n;
        st = fm_cuda_check(cudaMemsetAsync(slot, 0xff, sizeof *slot, s), op);
    }
    if (!st) {
        d->rec[d->n] = (defer_rec){op, what, bound, fm_tensor_retain((fm_tensor *)idx)};
        d->n++;
    }
    pthread_mutex_unlock(&g_defer_mu);
    return st ? NULL : slot;
}
