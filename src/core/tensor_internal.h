/* Helpers shared inside the library (not public API). */
#ifndef FATHOM_TENSOR_INTERNAL_H
#define FATHOM_TENSOR_INTERNAL_H
#include "fathom/tensor.h"

typedef struct fm_post_hook { void (*fn)(fm_tensor *, void *); void *ctx; struct fm_post_hook *next; } fm_post_hook;

fm_storage *fm_storage_new(size_t nbytes, fm_device dev);
void fm_storage_release(fm_storage *s);
/* Planned placement (the graph runner's arena, src/graph/graph_arena.c): while a
 * list of slots is set on the calling thread, the first storage that thread asks
 * for on a slot's device with exactly the slot's byte count gets the slot's memory
 * (borrowed: the storage calls deleter(ctx, data) when it dies) instead of an
 * allocation; the slot is then taken and *live set to 1. Sizes that match no slot
 * allocate as usual, so an op's scratch of another size is unaffected. */
typedef struct fm_storage_slot {
    fm_device dev;
    void *data;
    size_t nbytes;
    void (*deleter)(void *ctx, void *data);
    void *ctx;
    unsigned char *live;
    bool taken;
} fm_storage_slot;
/* Sets the calling thread's slot list (NULL, 0: none); returns the previous list's length via *prev_n. */
fm_storage_slot *fm_storage_slots_set(fm_storage_slot *slots, int n, int *prev_n);
fm_tensor *fm_tensor_alloc_header(void);
void fm_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
fm_status fm_check_shape(const char *op, int ndim, const int64_t *shape);
/* A view of t's storage with this geometry, bounds-checked, no autograd. */
fm_tensor *fm_view_raw(const fm_tensor *t, int ndim, const int64_t *shape, const int64_t *strides, int64_t offset);
/* Same geometry as t, fresh header, no autograd (a detached alias). */
fm_tensor *fm_alias(const fm_tensor *t);
/* Storage element offset of logical flat index `flat`. */
int64_t fm_tensor_elem_offset(const fm_tensor *t, int64_t flat);
/* numpy broadcasting of two shapes; error names op and both shapes. */
fm_status fm_broadcast_shapes(const char *op, int na, const int64_t *a, int nb, const int64_t *b, int *nout, int64_t *out);
/* An error "op: expected same device, got cpu and cuda:0" if not. */
fm_status fm_check_same_device(const char *op, const fm_tensor *a, const fm_tensor *b);
fm_status fm_check_same_dtype(const char *op, const fm_tensor *a, const fm_tensor *b);
/* Autograd registers what releasing a tensor that has a grad_fn must do (core
 * holds the pointer and never names autograd). */
void fm_tensor_set_grad_fn_release(void (*fn)(fm_tensor *t));
#endif
