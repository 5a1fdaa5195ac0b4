/* The device caching allocator's bookkeeping, in plain C so it can be unit
 * tested on a machine without a GPU (tests/test_cuda.c drives it with malloc).
 *
 * The design follows PyTorch's CUDA caching allocator, the one users know:
 * sizes round up to 512 B; requests <= 1 MiB come from a small pool of 2 MiB
 * segments; 1-10 MiB requests get 20 MiB segments; larger requests get their
 * size rounded up to 2 MiB. A request takes the best-fitting cached block of
 * the same stream (so a block is reused only in the order its stream already
 * guarantees), splitting it when the remainder is worth keeping (>= 512 B in
 * the small pool, > 1 MiB in the large one). Freed blocks merge with free
 * neighbours of their segment. When the device refuses or the limit would be
 * passed, whole free segments are released and the request retried once; then
 * the allocation fails with FM_ERR_OOM and a message carrying the statistics.
 *
 * The pool never touches device memory itself: a segment allocator callback
 * (cudaMalloc on a GPU, malloc in a test) provides and releases segments. */
#ifndef FATHOM_CUDA_POOL_H
#define FATHOM_CUDA_POOL_H
#include <stddef.h>
#include <stdint.h>

#include "fathom/memory.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fm_pool_segment_ops {
    void *(*seg_alloc)(void *ctx, size_t nbytes); /* NULL when the device is out of memory */
    void (*seg_free)(void *ctx, void *p, size_t nbytes);
    void *ctx;
} fm_pool_segment_ops;

typedef struct fm_pool_config {
    fm_memory_mode mode;     /* GROW: segments on demand; PREALLOCATE: one arena, never grows */
    size_t prealloc_bytes;   /* PREALLOCATE: arena size (0: use limit or fraction) */
    size_t limit;            /* hard cap on reserved bytes, 0 = none */
    double fraction;         /* cap as a fraction of total_bytes, 0 = none (the smaller cap wins) */
    size_t total_bytes;      /* device memory, for `fraction` */
    size_t max_split_size;   /* blocks this big are never split (0 = no such limit) */
} fm_pool_config;

typedef struct fm_pool fm_pool;

/* Extra statistics PyTorch users look for, beyond fm_memory_stats. */
typedef struct fm_pool_extra_stats {
    uint64_t n_alloc_retries;  /* times the cache was flushed to satisfy a request */
    uint64_t n_segments;       /* live segments */
    uint64_t n_free_blocks;    /* cached blocks */
    size_t cached_bytes;       /* reserved - allocated */
    size_t largest_free_block;
} fm_pool_extra_stats;

/* The size a request is rounded to, the pool it comes from, the segment size it asks for. */
size_t fm_pool_round_size(size_t n);
int fm_pool_is_small(size_t rounded);
size_t fm_pool_segment_size(size_t rounded);

/* `name` appears in error messages ("cuda:0"). Returns NULL with the error set
 * (a PREALLOCATE arena the device cannot provide). */
fm_pool *fm_pool_create(const char *name, const fm_pool_config *cfg, fm_pool_segment_ops ops);
/* Releases every segment; blocks still in use are leaked to the device (reported count returned). */
int fm_pool_destroy(fm_pool *p);
/* NULL with FM_ERR_OOM (message: requested, allocated, reserved, limit) when impossible. */
void *fm_pool_alloc(fm_pool *p, size_t n, uintptr_t stream);
/* Returns the block to the cache of the stream it was allocated on. FM_ERR_INVALID for
 * a pointer the pool did not hand out (double free included). */
fm_status fm_pool_free(fm_pool *p, void *ptr);
/* Size the block was rounded to (0 if unknown). */
size_t fm_pool_block_size(fm_pool *p, void *ptr);
/* Releases every segment that is entirely free (never the PREALLOCATE arena). */
void fm_pool_empty_cache(fm_pool *p);
fm_status fm_pool_set_limit(fm_pool *p, size_t limit);
void fm_pool_get_stats(fm_pool *p, fm_memory_stats *out);
void fm_pool_get_extra_stats(fm_pool *p, fm_pool_extra_stats *out);
void fm_pool_reset_peak(fm_pool *p);

#ifdef __cplusplus
}
#endif
#endif
