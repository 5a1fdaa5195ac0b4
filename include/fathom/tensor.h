/* fathom/tensor.h: n-dimensional strided tensors with refcounted storage.
 *
 * A tensor is a view (shape, strides in elements, offset) onto a storage, which
 * owns the bytes and knows its device. Views share storage and bump its
 * refcount; fm_tensor_release() drops a reference. Every function that returns
 * an fm_tensor* returns a NEW reference (or NULL with fm_last_error() set). */
#ifndef FATHOM_TENSOR_H
#define FATHOM_TENSOR_H
#include "fathom/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fathom/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FM_MAX_DIMS 8

typedef enum fm_dtype {
    FM_F32 = 0, FM_F64, FM_F16, FM_BF16, FM_I8, FM_U8, FM_I32, FM_I64, FM_BOOL,
    FM_DTYPE_COUNT
} fm_dtype;

/* FM_DEV_CHECK, "check": the checked test device (src/backend/check): the CPU's
 * kernels on memory the host cannot touch, so that CI runs the device path
 * without a GPU and any host access to device memory fails loudly.
 * FM_DEV_META, "meta": the shape-only device (src/backend/meta): tensors have
 * shapes and dtypes but no data, kernels only account the scratch the CPU's
 * would take, and its allocator counts what the CPU's would hold (the planner
 * runs a model's real step on it; docs/DEVICES.md). */
typedef enum fm_device_type {
    FM_DEV_CPU = 0, FM_DEV_CUDA = 1, FM_DEV_CHECK = 2, FM_DEV_META = 3,
    FM_DEV_COUNT /* not a device: the number of types */
} fm_device_type;
typedef struct fm_device { fm_device_type type; int index; } fm_device;
#define FM_CPU ((fm_device){FM_DEV_CPU, 0})

struct fm_allocator;
struct fm_node;

/* Bytes plus the allocator that owns them. */
typedef struct fm_storage {
    int refcount;
    void *data;
    size_t nbytes;
    fm_device device;
    struct fm_allocator *alloc; /* NULL: memory is borrowed (fm_tensor_from_buffer) */
    void (*deleter)(void *ctx, void *data);
    void *deleter_ctx;
} fm_storage;

typedef struct fm_hook {
    /* Called with the gradient flowing into the tensor during backward.
     * May return a replacement gradient (a new reference) or NULL to keep it. */
    struct fm_tensor *(*fn)(struct fm_tensor *grad, void *ctx);
    void *ctx;
    struct fm_hook *next;
} fm_hook;

typedef struct fm_tensor {
    int refcount;
    int ndim;
    int64_t shape[FM_MAX_DIMS];
    int64_t strides[FM_MAX_DIMS]; /* in elements */
    int64_t offset;               /* in elements, into storage */
    fm_dtype dtype;
    fm_storage *storage;
    /* autograd */
    bool requires_grad;
    struct fm_tensor *grad;     /* accumulated gradient (leaves, or retained non-leaves) */
    struct fm_node *grad_fn;    /* producer in the tape; NULL for leaves */
    int output_nr;              /* which output of grad_fn this is */
    fm_hook *hooks;             /* gradient hooks, run before accumulation */
    struct fm_post_hook *post_hooks; /* run after a leaf's .grad is updated */
    bool retains_grad;
    char *name;                 /* optional, for printing and errors */
} fm_tensor;

/* ---- dtypes ---- */
FM_API size_t fm_dtype_size(fm_dtype dt);
FM_API const char *fm_dtype_name(fm_dtype dt);
FM_API bool fm_dtype_is_float(fm_dtype dt);
FM_API fm_status fm_dtype_from_name(const char *name, fm_dtype *out);
/* Scalar conversions, round to nearest even. */
FM_API uint16_t fm_f32_to_f16(float f);
FM_API float fm_f16_to_f32(uint16_t h);
FM_API uint16_t fm_f32_to_bf16(float f);
FM_API float fm_bf16_to_f32(uint16_t h);
/* Bulk conversions (F16C/AVX2 when the CPU has them). */
FM_API void fm_convert_f32_to_f16(const float *src, uint16_t *dst, size_t n);
FM_API void fm_convert_f16_to_f32(const uint16_t *src, float *dst, size_t n);
FM_API void fm_convert_f32_to_bf16(const float *src, uint16_t *dst, size_t n);
FM_API void fm_convert_bf16_to_f32(const uint16_t *src, float *dst, size_t n);

/* ---- devices ---- */
FM_API const char *fm_device_name(fm_device d, char *buf, size_t n);
FM_API fm_status fm_device_parse(const char *s, fm_device *out);
FM_API bool fm_device_eq(fm_device a, fm_device b);
/* How many devices of a type this build and machine have (0 when none; *reason,
 * which may be NULL, then says why: built without it, no driver, no device). */
FM_API int fm_device_count(fm_device_type type, const char **reason);
/* FM_OK when d exists here; otherwise an error saying why (this build has no such
 * backend, no driver, no device, or the index is out of range). Never falls back. */
FM_API fm_status fm_device_validate(fm_device d);

/* ---- lifetime ---- */
FM_API fm_tensor *fm_tensor_retain(fm_tensor *t);
FM_API void fm_tensor_release(fm_tensor *t);
/* Release several (NULLs allowed). */
FM_API void fm_tensor_release_n(int n, ...);

/* ---- creation ---- */
FM_API fm_tensor *fm_tensor_empty(int ndim, const int64_t *shape, fm_dtype dt, fm_device dev);
FM_API fm_tensor *fm_tensor_zeros(int ndim, const int64_t *shape, fm_dtype dt, fm_device dev);
FM_API fm_tensor *fm_tensor_ones(int ndim, const int64_t *shape, fm_dtype dt, fm_device dev);
FM_API fm_tensor *fm_tensor_full(int ndim, const int64_t *shape, double value, fm_dtype dt, fm_device dev);
FM_API fm_tensor *fm_tensor_scalar(double value, fm_dtype dt);
FM_API fm_tensor *fm_tensor_arange(double start, double end, double step, fm_dtype dt);
/* Copies `data` (host memory, row-major, of dtype dt). */
FM_API fm_tensor *fm_tensor_from_data(const void *data, int ndim, const int64_t *shape, fm_dtype dt);
/* Wraps an existing host buffer without copying; `deleter` (may be NULL) runs when
 * the last view is released. The caller keeps the buffer alive until then. */
FM_API fm_tensor *fm_tensor_from_buffer(void *data, int ndim, const int64_t *shape, fm_dtype dt,
                                 void (*deleter)(void *ctx, void *data), void *ctx);
FM_API fm_tensor *fm_tensor_empty_like(const fm_tensor *t);
FM_API fm_tensor *fm_tensor_zeros_like(const fm_tensor *t);

/* ---- random numbers: counter-based (Philox4x32-10), so the value at element i
 * depends only on (seed, offset, i): identical for any thread count. ---- */
typedef struct fm_rng { uint64_t seed; uint64_t offset; } fm_rng;
FM_API void fm_rng_init(fm_rng *r, uint64_t seed);
/* Global generator used when an op is given rng == NULL. */
FM_API fm_rng *fm_rng_global(void);
FM_API void fm_manual_seed(uint64_t seed);
FM_API fm_tensor *fm_tensor_rand(int ndim, const int64_t *shape, fm_dtype dt, fm_rng *rng);  /* U[0,1) */
FM_API fm_tensor *fm_tensor_randn(int ndim, const int64_t *shape, fm_dtype dt, fm_rng *rng); /* N(0,1) */
FM_API fm_status fm_tensor_uniform_(fm_tensor *t, double lo, double hi, fm_rng *rng);
FM_API fm_status fm_tensor_normal_(fm_tensor *t, double mean, double std, fm_rng *rng);
/* Raw Philox block: 4 uint32 for counter `ctr` under `key`. */
FM_API void fm_philox4x32(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]);

/* ---- inspection ---- */
FM_API int64_t fm_tensor_numel(const fm_tensor *t);
FM_API size_t fm_tensor_nbytes(const fm_tensor *t);
FM_API bool fm_tensor_is_contiguous(const fm_tensor *t);
FM_API fm_device fm_tensor_device(const fm_tensor *t);
/* Pointer to element 0 of the view (host tensors). */
FM_API void *fm_tensor_data(const fm_tensor *t);
/* Element access by flat row-major logical index, converted to/from double. */
FM_API double fm_tensor_get(const fm_tensor *t, int64_t flat_index);
FM_API fm_status fm_tensor_set(fm_tensor *t, int64_t flat_index, double v);
/* Single-element tensors. */
FM_API double fm_tensor_item(const fm_tensor *t);
/* Copy the view, row-major, into host memory of dtype dt (conversion allowed). */
FM_API fm_status fm_tensor_copy_to_host(const fm_tensor *t, void *dst, fm_dtype dt);
/* "[2, 3]" */
FM_API const char *fm_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);
FM_API fm_status fm_tensor_print(const fm_tensor *t, FILE *f);
FM_API void fm_tensor_set_name(fm_tensor *t, const char *name);

/* ---- views (share storage; differentiable) ---- */
FM_API fm_tensor *fm_reshape(fm_tensor *t, int ndim, const int64_t *shape); /* -1 allowed once; copies only if needed */
FM_API fm_tensor *fm_view(fm_tensor *t, int ndim, const int64_t *shape);    /* never copies; error if impossible */
FM_API fm_tensor *fm_permute(fm_tensor *t, const int *perm);
FM_API fm_tensor *fm_transpose(fm_tensor *t, int d0, int d1);
FM_API fm_tensor *fm_narrow(fm_tensor *t, int dim, int64_t start, int64_t length);
FM_API fm_tensor *fm_slice(fm_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
FM_API fm_tensor *fm_select(fm_tensor *t, int dim, int64_t index); /* drops dim */
FM_API fm_tensor *fm_expand(fm_tensor *t, int ndim, const int64_t *shape);
FM_API fm_tensor *fm_squeeze(fm_tensor *t, int dim); /* dim = -100: all size-1 dims */
FM_API fm_tensor *fm_unsqueeze(fm_tensor *t, int dim);
FM_API fm_tensor *fm_flatten(fm_tensor *t, int start_dim, int end_dim);
FM_API fm_tensor *fm_contiguous(fm_tensor *t); /* new ref to t itself if already contiguous */
/* A view with explicit geometry; checked against the storage bounds. */
FM_API fm_tensor *fm_as_strided(fm_tensor *t, int ndim, const int64_t *shape, const int64_t *strides, int64_t offset);
FM_API fm_tensor *fm_clone(fm_tensor *t);
FM_API fm_tensor *fm_to_dtype(fm_tensor *t, fm_dtype dt);
FM_API fm_tensor *fm_tensor_to(fm_tensor *t, fm_device dev);
/* Moves a leaf tensor to dev in place, as PyTorch's module.to() moves param.data:
 * the same fm_tensor (so pointers held elsewhere stay valid) gets a contiguous
 * copy of its values on dev, and its .grad moves with it. Other views of the old
 * storage keep the old storage. Not recorded; FM_ERR_INVALID for a non-leaf. */
FM_API fm_status fm_tensor_move_(fm_tensor *t, fm_device dev);
/* In-place copy of src into dst (broadcast, dtype conversion). Not recorded. */
FM_API fm_status fm_copy_(fm_tensor *dst, const fm_tensor *src);
FM_API fm_status fm_fill_(fm_tensor *t, double v);
FM_API fm_status fm_zero_(fm_tensor *t);

/* Normalize a possibly negative axis; error names the op. */
FM_API fm_status fm_norm_axis(const char *op, int axis, int ndim, int *out);

#ifdef __cplusplus
}
#endif
#endif
