/* The backend interface: a C vtable per device type (CPU, CUDA), as in ggml.
 *
 * Ops never call kernels directly: the front end (src/ops) builds an fm_op_call
 * and fm_dispatch() finds the kernel for (op, device). A missing kernel is an
 * error naming the op and the device, never a silent fallback. */
#ifndef FATHOM_BACKEND_H
#define FATHOM_BACKEND_H
#include "fathom/ops.h"
#include "fathom/tensor.h"

#define FM_CALL_MAX_IN 8
#define FM_CALL_MAX_OUT 4

typedef struct fm_op_call {
    fm_op_id op;
    int n_in, n_out;
    fm_tensor *in[FM_CALL_MAX_IN];  /* an optional input may be NULL */
    fm_tensor *out[FM_CALL_MAX_OUT]; /* preallocated by the front end, contiguous */
    fm_tensor **var_in;             /* variadic ops (CAT): n_in tensors */
    const void *attrs;              /* src/ops/op_attrs.h */
} fm_op_call;

typedef fm_status (*fm_kernel_fn)(const fm_op_call *call);

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
    fm_kernel_fn kernels[FM_OP_COUNT];
} fm_backend;

/* Registered backends (CPU always; CUDA if built and a device exists). */
const fm_backend *fm_backend_get(fm_device_type type);
void fm_backend_register(const fm_backend *b);
/* Run a call; inputs must already be on one device. Handles contiguity for ops
 * without FM_OPF_STRIDED and reports missing kernels. */
fm_status fm_dispatch(fm_op_call *call);
/* CPU backend constructor (src/backend/cpu/cpu_backend.c). */
const fm_backend *fm_cpu_backend(void);
/* CUDA backend (src/backend/cuda): registers itself on first call when a device
 * exists; NULL otherwise (and in builds without CUDA). */
const fm_backend *fm_cuda_backend(void);
#endif
