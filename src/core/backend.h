/* The backend registry: a C vtable per device type (CPU, CUDA), as in ggml.
 *
 * Core keeps only the table and the vtable's shape. Each backend registers
 * itself (fm_backend_<name>_reg(), called from the generated list in
 * src/dispatch/backends.c.in); the dispatcher (src/dispatch) finds kernels in
 * it; the kernel call itself (fm_op_call, attrs) is src/backend/kernel.h. */
#ifndef FATHOM_BACKEND_H
#define FATHOM_BACKEND_H
#include "fathom/tensor.h"

/* Kernel slots: one per ops.def line, counted here so that core needs no op
 * API (src/backend/kernel.h checks it equals FM_OP_COUNT). */
enum {
    FM_BACKEND_OP_SLOTS = 0
#define X(id, ...) +1
#include "fathom/ops.def"
#undef X
};

struct fm_op_call; /* src/backend/kernel.h */
typedef fm_status (*fm_kernel_fn)(const struct fm_op_call *call);

struct fm_allocator;

typedef struct fm_backend {
    const char *name;
    fm_device_type type;
    struct fm_allocator *(*allocator)(int device_index);
    /* Copies between host and this device (n bytes). */
    fm_status (*copy_h2d)(int device_index, void *dst, const void *src, size_t n);
    fm_status (*copy_d2h)(int device_index, void *dst, const void *src, size_t n);
    fm_status (*copy_d2d)(int device_index, void *dst, const void *src, size_t n);
    fm_status (*synchronize)(int device_index);
    /* Optional (NULL: the backend has none): batches uploaded one step ahead
     * (fm_batch_stage, src/efficiency/stage.c). host_alloc/host_free: host memory
     * that copy_h2d_ahead reads asynchronously (CUDA: page-locked, from a cache that
     * reuses a freed block only once its copy is done, so it may be freed as soon as
     * the copy is queued). copy_h2d_ahead: queues the copy on a copy stream, after the
     * compute work queued before the device's last free (dst may be a reused block),
     * without making compute wait for it; *ticket names it (NULL: already done).
     * ticket_wait: compute queued from now on runs after that copy (the host does
     * not wait); it releases the ticket. */
    void *(*host_alloc)(int device_index, size_t n);
    void (*host_free)(void *p);
    fm_status (*copy_h2d_ahead)(int device_index, void *dst, const void *src, size_t n, void **ticket);
    fm_status (*ticket_wait)(int device_index, void *ticket);
    fm_kernel_fn kernels[FM_BACKEND_OP_SLOTS];
    /* rows_strided[op]: the kernel takes inputs whose last dim has unit stride and
     * whose other strides are any non-negative values (a view with spare capacity
     * along a middle axis, as the graph's in-place KV cache is); the dispatcher
     * then copies only inputs that are not so. False: every input contiguous. */
    bool rows_strided[FM_BACKEND_OP_SLOTS];
} fm_backend;

/* A backend's constructor: builds it on first call; NULL when the device is
 * absent (the CUDA one probes for a GPU), and then it is asked again next time. */
typedef const fm_backend *(*fm_backend_get_fn)(void);

/* Records the constructor for a device type (one per type; a later one
 * replaces it). Cheap: nothing is built until fm_backend_get asks. */
void fm_backend_register(fm_device_type type, fm_backend_get_fn get);
/* The backend for a device type, or NULL (not built, not registered, or no device). */
const fm_backend *fm_backend_get(fm_device_type type);

/* How many devices of the type exist (0 when none, and then *reason says why:
 * no driver, no device). Registered beside the constructor; it may probe, but
 * builds nothing. fm_device_count / fm_device_validate (tensor.h) answer with it. */
typedef int (*fm_backend_count_fn)(const char **reason);
void fm_backend_register_count(fm_device_type type, fm_backend_count_fn count);
#endif
