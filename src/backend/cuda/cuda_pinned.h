/* Pinned (page-locked) host memory for batch staging: a caching host allocator's
 * bookkeeping, in plain C so it is unit-tested without a GPU (tests/test_cuda.c
 * drives it with malloc and fake events).
 *
 * Why a cache: cudaHostAlloc is slow (it maps pages for the device), and a data
 * loader asks for the same batch sizes every step. Why events: a host-to-device
 * copy from pinned memory is asynchronous, so a block may still be read by a
 * queued copy after the host has released it; a released block is reused only
 * once the event of its last copy has completed (PyTorch's CachingHostAllocator
 * follows the same rule). Sizes round up to a power of two (>= 4 KiB) so that
 * batches of slightly different sizes share blocks. */
#ifndef FATHOM_CUDA_PINNED_H
#define FATHOM_CUDA_PINNED_H
#include <stddef.h>
#include <stdint.h>

#include "fathom/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fm_pinned_ops {
    void *(*host_alloc)(void *ctx, size_t n); /* cudaHostAlloc; NULL when it fails */
    void (*host_free)(void *ctx, void *p);
    int (*event_done)(void *ctx, void *ev);   /* 1 when the copy that recorded ev has finished */
    void (*event_release)(void *ctx, void *ev);
    void *ctx;
} fm_pinned_ops;

typedef struct fm_pinned_stats {
    size_t reserved;          /* bytes obtained from host_alloc and not yet returned */
    size_t in_use;            /* bytes of blocks handed out */
    uint64_t n_allocs, n_cache_hits, n_host_allocs, n_host_frees;
    uint64_t n_busy_skips;    /* cached blocks passed over because a copy still read them */
    uint64_t n_copies;        /* events recorded */
} fm_pinned_stats;

typedef struct fm_pinned_cache fm_pinned_cache;

size_t fm_pinned_round_size(size_t n);
fm_pinned_cache *fm_pinned_create(fm_pinned_ops ops);
/* Returns every block to the host (callers make sure no copy still runs); the count of blocks still in use. */
int fm_pinned_destroy(fm_pinned_cache *c);
/* NULL with FM_ERR_OOM when the host refuses. */
void *fm_pinned_alloc(fm_pinned_cache *c, size_t n);
/* Back to the cache (not reusable until its last copy has finished). FM_ERR_INVALID for
 * pointers the cache did not hand out, or double frees. */
fm_status fm_pinned_free(fm_pinned_cache *c, void *p);
/* Start of the live block containing [p, p + n), or NULL (not pinned memory of this cache). */
void *fm_pinned_find(fm_pinned_cache *c, const void *p, size_t n);
/* A copy reading block `base` was queued with event ev (ownership passes to the cache;
 * the block's previous event is released: copies on one stream finish in order). */
fm_status fm_pinned_record(fm_pinned_cache *c, void *base, void *ev);
/* The block's pending event (NULL when none or finished), for hosts that want to wait before writing. */
void *fm_pinned_pending(fm_pinned_cache *c, const void *base);
/* Returns cached blocks whose copies have finished to the host; bytes released. */
size_t fm_pinned_empty_cache(fm_pinned_cache *c);
void fm_pinned_get_stats(fm_pinned_cache *c, fm_pinned_stats *out);

#ifdef __cplusplus
}
#endif
#endif
