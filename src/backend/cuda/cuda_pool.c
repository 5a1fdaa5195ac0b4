/* The device caching allocator's bookkeeping (see cuda_pool.h for the design).
 *
 * Free blocks of each pool sit in one list sorted by (stream, size, address),
 * so the first block of the right stream that is large enough is the best fit.
 * That is a linear walk; a training step caches hundreds of blocks, not
 * millions, and the walk is cheaper than the cudaMalloc it replaces. Blocks in
 * use are found again on free through a small pointer hash. Every block knows
 * its neighbours inside its segment, so a freed block merges with free
 * neighbours and splitting never fragments a segment for good. */
#include "backend/cuda/cuda_pool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K_ROUND 512
#define K_SMALL_SIZE ((size_t)1 << 20)       /* requests up to 1 MiB use the small pool */
#define K_SMALL_BUFFER ((size_t)2 << 20)     /* small-pool segments are 2 MiB */
#define K_LARGE_BUFFER ((size_t)20 << 20)    /* 1-10 MiB requests share 20 MiB segments */
#define K_MIN_LARGE_ALLOC ((size_t)10 << 20) /* from here on, a segment per request */
#define K_ROUND_LARGE ((size_t)2 << 20)
#define N_HASH 4096

typedef struct seg seg;
typedef struct blk {
    char *ptr;
    size_t size, requested;
    uintptr_t stream;
    int allocated, pool; /* pool: 0 small, 1 large */
    struct blk *prev, *next;   /* address neighbours inside the segment */
    struct blk *fprev, *fnext; /* free list */
    struct blk *hnext;         /* hash chain while allocated */
    seg *segment;
} blk;

struct seg {
    char *base;
    size_t size;
    int arena; /* the PREALLOCATE arena: never released by empty_cache */
    blk *head;
    seg *prev, *next;
};

struct fm_pool {
    pthread_mutex_t mu;
    char name[32];
    fm_pool_config cfg;
    fm_pool_segment_ops ops;
    blk *free_list[2];
    blk *hash[N_HASH];
    seg *segments;
    fm_memory_stats st;
    fm_pool_extra_stats ex;
};

size_t fm_pool_round_size(size_t n) {
    if (n < K_ROUND) return K_ROUND;
    return (n + K_ROUND - 1) / K_ROUND * K_ROUND;
}
int fm_pool_is_small(size_t rounded) { return rounded <= K_SMALL_SIZE; }
size_t fm_pool_segment_size(size_t rounded) {
    if (rounded <= K_SMALL_SIZE) return K_SMALL_BUFFER;
    if (rounded < K_MIN_LARGE_ALLOC) return K_LARGE_BUFFER;
    return (rounded + K_ROUND_LARGE - 1) / K_ROUND_LARGE * K_ROUND_LARGE;
}

static size_t hash_of(const void *p) { return ((uintptr_t)p >> 9) % N_HASH; }

static void hash_put(fm_pool *p, blk *b) {
    size_t h = hash_of(b->ptr);
    b->hnext = p->hash[h];
    p->hash[h] = b;
}
static blk *hash_take(fm_pool *p, const void *ptr) {
    blk **pp = &p->hash[hash_of(ptr)];
    for (; *pp; pp = &(*pp)->hnext)
        if ((*pp)->ptr == ptr) {
            blk *b = *pp;
            *pp = b->hnext;
            b->hnext = NULL;
            return b;
        }
    return NULL;
}
static blk *hash_find(fm_pool *p, const void *ptr) {
    for (blk *b = p->hash[hash_of(ptr)]; b; b = b->hnext)
        if (b->ptr == ptr) return b;
    return NULL;
}

static int free_before(const blk *a, const blk *b) {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return (uintptr_t)a->ptr < (uintptr_t)b->ptr;
}
static void free_insert(fm_pool *p, blk *b) {
    blk **head = &p->free_list[b->pool], *prev = NULL, *cur = *head;
    while (cur && free_before(cur, b)) { prev = cur; cur = cur->fnext; }
    b->fprev = prev;
    b->fnext = cur;
    if (cur) cur->fprev = b;
    if (prev) prev->fnext = b; else *head = b;
    p->ex.n_free_blocks++;
}
static void free_remove(fm_pool *p, blk *b) {
    if (b->fprev) b->fprev->fnext = b->fnext; else p->free_list[b->pool] = b->fnext;
    if (b->fnext) b->fnext->fprev = b->fprev;
    b->fprev = b->fnext = NULL;
    p->ex.n_free_blocks--;
}

static size_t effective_limit(const fm_pool *p) {
    size_t lim = p->cfg.limit;
    if (p->cfg.fraction > 0 && p->cfg.total_bytes) {
        size_t f = (size_t)(p->cfg.fraction * (double)p->cfg.total_bytes);
        if (!lim || f < lim) lim = f;
    }
    return lim;
}

static void bump_peaks(fm_memory_stats *s) {
    s->active = s->allocated;
    if (s->allocated > s->allocated_peak) s->allocated_peak = s->allocated;
    if (s->requested > s->requested_peak) s->requested_peak = s->requested;
    if (s->reserved > s->reserved_peak) s->reserved_peak = s->reserved;
    if (s->active > s->active_peak) s->active_peak = s->active;
}

/* Best fit among free blocks of this pool and stream, honouring max_split_size:
 * an oversize block (never split) serves only requests that nearly fill it. */
static blk *find_free(fm_pool *p, int pool, size_t size, uintptr_t stream) {
    size_t ms = p->cfg.max_split_size;
    for (blk *b = p->free_list[pool]; b; b = b->fnext) {
        if (b->stream != stream || b->size < size) continue;
        if (ms && size < ms && b->size >= ms) continue;
        if (ms && size >= ms && b->size >= size + K_LARGE_BUFFER) continue;
        return b;
    }
    return NULL;
}

static int should_split(const fm_pool *p, const blk *b, size_t size) {
    size_t rem = b->size - size;
    if (p->cfg.max_split_size && b->size >= p->cfg.max_split_size) return 0;
    if (b->pool == 0 || p->cfg.mode == FM_MEMORY_PREALLOCATE) return rem >= K_ROUND;
    return rem > K_SMALL_SIZE;
}

static seg *new_segment(fm_pool *p, size_t size, int pool, uintptr_t stream, int arena) {
    seg *s = calloc(1, sizeof *s);
    blk *b = calloc(1, sizeof *b);
    if (!s || !b) { free(s); free(b); return NULL; }
    void *mem = p->ops.seg_alloc(p->ops.ctx, size);
    if (!mem) { free(s); free(b); return NULL; }
    s->base = mem;
    s->size = size;
    s->arena = arena;
    s->head = b;
    s->next = p->segments;
    if (p->segments) p->segments->prev = s;
    p->segments = s;
    b->ptr = mem;
    b->size = size;
    b->stream = stream;
    b->pool = pool;
    b->segment = s;
    p->st.reserved += size;
    p->st.n_system_allocs++;
    p->ex.n_segments++;
    return s;
}

static void release_segment(fm_pool *p, seg *s) {
    p->ops.seg_free(p->ops.ctx, s->base, s->size);
    p->st.reserved -= s->size;
    p->st.n_system_frees++;
    p->ex.n_segments--;
    if (s->prev) s->prev->next = s->next; else p->segments = s->next;
    if (s->next) s->next->prev = s->prev;
    free(s->head);
    free(s);
}

/* Whole free segments go back to the device. Returns the bytes released. */
static size_t release_free_segments(fm_pool *p) {
    size_t released = 0;
    for (seg *s = p->segments; s;) {
        seg *nx = s->next;
        blk *h = s->head;
        if (!s->arena && !h->allocated && !h->next) {
            free_remove(p, h);
            released += s->size;
            release_segment(p, s);
        }
        s = nx;
    }
    return released;
}

fm_pool *fm_pool_create(const char *name, const fm_pool_config *cfg, fm_pool_segment_ops ops) {
    fm_pool *p = calloc(1, sizeof *p);
    if (!p) { fm_set_error(FM_ERR_OOM, "device allocator: out of host memory"); return NULL; }
    pthread_mutex_init(&p->mu, NULL);
    snprintf(p->name, sizeof p->name, "%s", name ? name : "device");
    if (cfg) p->cfg = *cfg;
    p->ops = ops;
    p->st.limit = effective_limit(p);
    if (p->cfg.mode == FM_MEMORY_PREALLOCATE) {
        size_t sz = p->cfg.prealloc_bytes ? p->cfg.prealloc_bytes : p->st.limit;
        if (!sz) {
            fm_set_error(FM_ERR_INVALID, "%s allocator: preallocate mode needs a size, a limit or a memory fraction", p->name);
            pthread_mutex_destroy(&p->mu);
            free(p);
            return NULL;
        }
        sz = (sz + K_ROUND_LARGE - 1) / K_ROUND_LARGE * K_ROUND_LARGE;
        seg *s = new_segment(p, sz, 1, 0, 1);
        if (!s) {
            char b[32];
            fm_set_error(FM_ERR_OOM, "%s allocator: could not preallocate %s", p->name, fm_format_bytes(sz, b, sizeof b));
            pthread_mutex_destroy(&p->mu);
            free(p);
            return NULL;
        }
        free_insert(p, s->head);
        bump_peaks(&p->st);
    }
    return p;
}

int fm_pool_destroy(fm_pool *p) {
    if (!p) return 0;
    int leaked = 0;
    for (int h = 0; h < N_HASH; h++)
        for (blk *b = p->hash[h]; b; b = b->hnext) leaked++;
    /* Free every block header, then every segment's memory. */
    for (seg *s = p->segments; s;) {
        seg *nx = s->next;
        for (blk *b = s->head->next; b;) { blk *bn = b->next; free(b); b = bn; }
        s->head->next = NULL;
        p->ops.seg_free(p->ops.ctx, s->base, s->size);
        free(s->head);
        free(s);
        s = nx;
    }
    pthread_mutex_destroy(&p->mu);
    free(p);
    return leaked;
}

static void oom_error(fm_pool *p, size_t n, size_t rounded) {
    char rq[32], rd[32], al[32], rs[32], lm[32];
    p->st.n_ooms++;
    size_t lim = effective_limit(p);
    fm_set_error(FM_ERR_OOM,
                 "out of memory on %s: requested %s (rounded to %s) with %s allocated, %s reserved by fathom, "
                 "limit %s%s (try a smaller batch, bf16, activation checkpointing, or a larger memory limit)",
                 p->name, fm_format_bytes(n, rq, sizeof rq), fm_format_bytes(rounded, rd, sizeof rd),
                 fm_format_bytes(p->st.allocated, al, sizeof al), fm_format_bytes(p->st.reserved, rs, sizeof rs),
                 lim ? fm_format_bytes(lim, lm, sizeof lm) : "none",
                 p->cfg.mode == FM_MEMORY_PREALLOCATE ? " (preallocated arena is full)" : "");
}

void *fm_pool_alloc(fm_pool *p, size_t n, uintptr_t stream) {
    size_t size = fm_pool_round_size(n);
    pthread_mutex_lock(&p->mu);
    p->st.n_allocs++;
    int arena = p->cfg.mode == FM_MEMORY_PREALLOCATE;
    int pool = (!arena && fm_pool_is_small(size)) ? 0 : 1;
    if (arena) stream = 0; /* one arena shared by every stream: the caller orders its streams */
    blk *b = find_free(p, pool, size, stream);
    if (b) {
        free_remove(p, b);
        p->st.n_cache_hits++;
    } else if (!arena) {
        size_t segsz = fm_pool_segment_size(size);
        seg *s = NULL;
        for (int attempt = 0; attempt < 2 && !s; attempt++) {
            size_t lim = effective_limit(p);
            if (!lim || p->st.reserved + segsz <= lim) s = new_segment(p, segsz, pool, stream, 0);
            if (!s && attempt == 0) {
                p->ex.n_alloc_retries++;
                if (!release_free_segments(p)) break;
            }
        }
        if (s) b = s->head;
    }
    if (!b) {
        oom_error(p, n, size);
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    if (b->size > size && should_split(p, b, size)) {
        blk *r = calloc(1, sizeof *r);
        if (r) { /* without a header for the remainder the block is simply used whole */
            r->ptr = b->ptr + size;
            r->size = b->size - size;
            r->stream = b->stream;
            r->pool = b->pool;
            r->segment = b->segment;
            r->prev = b;
            r->next = b->next;
            if (b->next) b->next->prev = r;
            b->next = r;
            b->size = size;
            free_insert(p, r);
        }
    }
    b->allocated = 1;
    b->requested = n;
    hash_put(p, b);
    p->st.allocated += b->size;
    p->st.requested += n;
    bump_peaks(&p->st);
    void *ptr = b->ptr;
    pthread_mutex_unlock(&p->mu);
    return ptr;
}

fm_status fm_pool_free(fm_pool *p, void *ptr) {
    if (!ptr) return FM_OK;
    pthread_mutex_lock(&p->mu);
    blk *b = hash_take(p, ptr);
    if (!b) {
        pthread_mutex_unlock(&p->mu);
        return fm_set_error(FM_ERR_INVALID, "%s allocator: free of %p, which is not an allocated block (double free?)",
                            p->name, ptr);
    }
    b->allocated = 0;
    p->st.allocated -= b->size;
    p->st.requested -= b->requested;
    p->st.active = p->st.allocated;
    b->requested = 0;
    blk *pv = b->prev, *nx = b->next;
    if (nx && !nx->allocated) { /* absorb the next block */
        free_remove(p, nx);
        b->size += nx->size;
        b->next = nx->next;
        if (nx->next) nx->next->prev = b;
        free(nx);
    }
    if (pv && !pv->allocated) { /* fold into the previous block */
        free_remove(p, pv);
        pv->size += b->size;
        pv->next = b->next;
        if (b->next) b->next->prev = pv;
        free(b);
        b = pv;
    }
    free_insert(p, b);
    pthread_mutex_unlock(&p->mu);
    return FM_OK;
}

size_t fm_pool_block_size(fm_pool *p, void *ptr) {
    pthread_mutex_lock(&p->mu);
    blk *b = hash_find(p, ptr);
    size_t s = b ? b->size : 0;
    pthread_mutex_unlock(&p->mu);
    return s;
}

void fm_pool_empty_cache(fm_pool *p) {
    pthread_mutex_lock(&p->mu);
    release_free_segments(p);
    pthread_mutex_unlock(&p->mu);
}

fm_status fm_pool_set_limit(fm_pool *p, size_t limit) {
    pthread_mutex_lock(&p->mu);
    p->cfg.limit = limit;
    p->st.limit = effective_limit(p);
    pthread_mutex_unlock(&p->mu);
    return FM_OK;
}

void fm_pool_get_stats(fm_pool *p, fm_memory_stats *out) {
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    pthread_mutex_unlock(&p->mu);
}

void fm_pool_get_extra_stats(fm_pool *p, fm_pool_extra_stats *out) {
    pthread_mutex_lock(&p->mu);
    *out = p->ex;
    out->cached_bytes = p->st.reserved - p->st.allocated;
    out->largest_free_block = 0;
    for (int k = 0; k < 2; k++)
        for (blk *b = p->free_list[k]; b; b = b->fnext)
            if (b->size > out->largest_free_block) out->largest_free_block = b->size;
    pthread_mutex_unlock(&p->mu);
}

void fm_pool_reset_peak(fm_pool *p) {
    pthread_mutex_lock(&p->mu);
    p->st.allocated_peak = p->st.allocated;
    p->st.requested_peak = p->st.requested;
    p->st.reserved_peak = p->st.reserved;
    p->st.active_peak = p->st.active;
    pthread_mutex_unlock(&p->mu);
}
