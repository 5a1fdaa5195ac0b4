/* The meta device's allocator: the CPU caching allocator's bookkeeping without
 * its memory.
 *
 * Every block is counted at the size the CPU allocator would hand out for the
 * same request (fm_cpu_block_size), by the calling thread's category, with
 * current and peak figures, so a step run on meta reports what the same step
 * reports on the CPU. Freed blocks are cached by size as the CPU's are (the
 * `reserved` figure follows them; system headers are not counted).
 *
 * Addresses: each block gets its own range of address space that is mapped
 * PROT_NONE and never backed, so blocks never overlap (views and in-place
 * checks compare addresses) and any host read or write of a meta tensor faults
 * at once instead of reading something. Freed ranges are reused by size, so a
 * training step maps nothing new after its first pass. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/meta/meta_memory.h"
#include "core/memory_internal.h"

typedef struct mblock {
    char *p;
    size_t size, req;   /* counted bytes (the CPU's block size), bytes asked for */
    size_t map;         /* bytes of address space mapped for it */
    uint8_t cat, in_use;
    struct mblock *next; /* hash chain (live and cached) */
    struct mblock *free_next;
} mblock;

#define NBUCKET 4096
static struct {
    pthread_mutex_t mu;
    fm_allocator alloc;
    fm_memory_stats st;
    mblock *bucket[NBUCKET]; /* every block, by address */
    mblock *cache;           /* freed blocks */
    size_t at_peak[FM_MEM_CAT_COUNT]; /* by_category when allocated last reached its peak */
    bool ready;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t hash_of(const void *p) { return ((uintptr_t)p >> 12) * 2654435761u % NBUCKET; }

static mblock *find_locked(const void *p) {
    for (mblock *b = g.bucket[hash_of(p)]; b; b = b->next)
        if (b->p == p) return b;
    return NULL;
}

static void bump_peaks(fm_memory_stats *s) {
    if (s->allocated > s->allocated_peak) {
        s->allocated_peak = s->allocated;
        memcpy(g.at_peak, s->by_category, sizeof g.at_peak);
    }
    if (s->requested > s->requested_peak) s->requested_peak = s->requested;
    if (s->reserved > s->reserved_peak) s->reserved_peak = s->reserved;
    s->active = s->allocated;
    if (s->active > s->active_peak) s->active_peak = s->active;
}

static mblock *take_cached_locked(size_t sz) {
    for (mblock **pp = &g.cache; *pp; pp = &(*pp)->free_next)
        if ((*pp)->size == sz) {
            mblock *b = *pp;
            *pp = b->free_next;
            g.st.n_cache_hits++;
            return b;
        }
    return NULL;
}

static mblock *new_block_locked(size_t sz) {
    size_t map = (sz + 4095) & ~(size_t)4095;
    void *p = mmap(NULL, map, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    mblock *b = calloc(1, sizeof *b);
    if (!b) { munmap(p, map); return NULL; }
    b->p = p;
    b->size = sz;
    b->map = map;
    size_t h = hash_of(p);
    b->next = g.bucket[h];
    g.bucket[h] = b;
    g.st.reserved += sz;
    g.st.n_system_allocs++;
    return b;
}

static void *m_alloc(fm_allocator *a, size_t n) {
    (void)a;
    fm_mem_category cat = fm_memory_tag_push(FM_MEM_OTHER); /* read the caller's category */
    fm_memory_tag_pop(cat);
    size_t sz = fm_cpu_block_size(n);
    pthread_mutex_lock(&g.mu);
    fm_memory_stats *s = &g.st;
    if (s->limit && s->allocated + sz > s->limit) {
        s->n_ooms++;
        size_t al = s->allocated, lim = s->limit;
        pthread_mutex_unlock(&g.mu);
        fm_set_error(FM_ERR_OOM, "meta device: out of memory: %zu bytes requested, %zu allocated, limit %zu", n, al, lim);
        return NULL;
    }
    mblock *b = take_cached_locked(sz);
    if (!b) b = new_block_locked(sz);
    if (!b) {
        s->n_ooms++;
        pthread_mutex_unlock(&g.mu);
        fm_set_error(FM_ERR_OOM, "meta device: no address space left for a %zu-byte block (nothing is allocated, "
                     "but each block takes a range of addresses)", n);
        return NULL;
    }
    b->in_use = 1;
    b->req = n;
    b->cat = (uint8_t)cat;
    s->allocated += sz;
    s->requested += n;
    s->n_allocs++;
    s->by_category[cat] += sz;
    if (s->by_category[cat] > s->by_category_peak[cat]) s->by_category_peak[cat] = s->by_category[cat];
    bump_peaks(s);
    pthread_mutex_unlock(&g.mu);
    return b->p;
}

static void m_free(fm_allocator *a, void *p, size_t n) {
    (void)a;
    (void)n;
    pthread_mutex_lock(&g.mu);
    mblock *b = find_locked(p);
    if (!b || !b->in_use) {
        pthread_mutex_unlock(&g.mu);
        return; /* not ours or freed twice: nothing was ever there to corrupt */
    }
    b->in_use = 0;
    g.st.allocated -= b->size;
    g.st.requested -= b->req;
    g.st.by_category[b->cat] -= b->size;
    g.st.active = g.st.allocated;
    b->free_next = g.cache;
    g.cache = b;
    pthread_mutex_unlock(&g.mu);
}

static fm_status m_stats(fm_allocator *a, fm_memory_stats *out) {
    (void)a;
    pthread_mutex_lock(&g.mu);
    *out = g.st;
    pthread_mutex_unlock(&g.mu);
    return FM_OK;
}

static void m_reset_peak(fm_allocator *a) {
    (void)a;
    pthread_mutex_lock(&g.mu);
    fm_memory_stats *s = &g.st;
    s->allocated_peak = s->allocated; s->requested_peak = s->requested;
    s->reserved_peak = s->reserved; s->active_peak = s->active;
    for (int i = 0; i < FM_MEM_CAT_COUNT; i++) s->by_category_peak[i] = s->by_category[i];
    memcpy(g.at_peak, s->by_category, sizeof g.at_peak);
    pthread_mutex_unlock(&g.mu);
}

void fm_meta_peak_breakdown(size_t out[FM_MEM_CAT_COUNT]) {
    pthread_mutex_lock(&g.mu);
    memcpy(out, g.at_peak, sizeof g.at_peak);
    pthread_mutex_unlock(&g.mu);
}

static void unlink_locked(mblock *b) {
    for (mblock **pp = &g.bucket[hash_of(b->p)]; *pp; pp = &(*pp)->next)
        if (*pp == b) { *pp = b->next; return; }
}

/* Unmaps the cached blocks' address ranges. */
static void m_empty_cache(fm_allocator *a) {
    (void)a;
    pthread_mutex_lock(&g.mu);
    while (g.cache) {
        mblock *b = g.cache;
        g.cache = b->free_next;
        unlink_locked(b);
        g.st.reserved -= b->size;
        g.st.n_system_frees++;
        munmap(b->p, b->map);
        free(b);
    }
    pthread_mutex_unlock(&g.mu);
}

static fm_status m_set_limit(fm_allocator *a, size_t limit) {
    (void)a;
    pthread_mutex_lock(&g.mu);
    g.st.limit = limit;
    pthread_mutex_unlock(&g.mu);
    return FM_OK;
}

static void m_retag(fm_allocator *a, void *p, fm_mem_category c) {
    (void)a;
    pthread_mutex_lock(&g.mu);
    mblock *b = find_locked(p);
    if (b && b->in_use && (unsigned)c < FM_MEM_CAT_COUNT) {
        g.st.by_category[b->cat] -= b->size;
        b->cat = (uint8_t)c;
        g.st.by_category[c] += b->size;
        if (g.st.by_category[c] > g.st.by_category_peak[c]) g.st.by_category_peak[c] = g.st.by_category[c];
    }
    pthread_mutex_unlock(&g.mu);
}

fm_allocator *fm_meta_allocator(int idx) {
    if (idx != 0) {
        fm_set_error(FM_ERR_INVALID, "device meta:%d does not exist: there is one meta device (meta)", idx);
        return NULL;
    }
    pthread_mutex_lock(&g.mu);
    if (!g.ready) {
        g.alloc = (fm_allocator){.name = "meta", .alloc = m_alloc, .free = m_free, .get_stats = m_stats,
                                 .reset_peak = m_reset_peak, .empty_cache = m_empty_cache, .set_limit = m_set_limit,
                                 .retag = m_retag};
        g.ready = true;
    }
    pthread_mutex_unlock(&g.mu);
    return &g.alloc;
}

/* Unmap everything at exit so leak checkers see only real leaks (a live block
 * here is a tensor the program never released, reported by its own header). */
__attribute__((destructor)) static void meta_at_exit(void) {
    if (g.ready) m_empty_cache(&g.alloc);
}
