/* The CPU caching allocator.
 *
 * Why not plain malloc: glibc serves large blocks with mmap and returns them
 * with munmap, so every big temporary costs page faults on first touch. A
 * training step allocates the same sizes over and over; keeping freed blocks in
 * size-class free lists makes the steady state free of system calls and page
 * faults (the same idea as PyTorch's CUDA caching allocator).
 *
 * Size classes: requests round up to 64 B below 4 KiB, and to 1/8 of their
 * power of two above (<= 12.5% waste). A freed block returns to its class's
 * list; an allocation takes an exact-class block or asks the system. When the
 * system refuses or the limit would be passed, the cache is emptied and the
 * request retried once before reporting out-of-memory with the statistics. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/memory.h"

#define N_CLASSES 512
#define ALIGN 64

typedef struct free_block { struct free_block *next; } free_block;

typedef struct cpu_cache {
    pthread_mutex_t mu;
    free_block *lists[N_CLASSES];
    size_t class_size[N_CLASSES]; /* size of blocks in list i */
    int n_classes;
    fm_memory_stats st;
    size_t cached_bytes;
    int initialized;
} cpu_cache;

static cpu_cache g_cpu = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t round_size(size_t n) {
    if (n == 0) n = 1;
    if (n <= 4096) return (n + 63) & ~(size_t)63;
    size_t p = 1;
    while (p < n) p <<= 1;
    size_t step = (p >> 1) / 8; /* eighths of the lower power of two */
    return (n + step - 1) / step * step;
}

/* Each distinct rounded size gets a slot; linear probe of a small table. */
static int class_of(cpu_cache *c, size_t sz, bool create) {
    size_t h = (sz / 64) * 2654435761u;
    for (int k = 0; k < N_CLASSES; k++) {
        int i = (int)((h + (size_t)k) % N_CLASSES);
        if (c->class_size[i] == sz) return i;
        if (c->class_size[i] == 0) {
            if (!create) return -1;
            c->class_size[i] = sz;
            return i;
        }
    }
    return -1; /* table full: the block is not cached */
}

static void drop_cache_locked(cpu_cache *c) {
    for (int i = 0; i < N_CLASSES; i++) {
        free_block *b = c->lists[i];
        while (b) {
            free_block *nx = b->next;
            free(b);
            c->st.reserved -= c->class_size[i];
            c->st.n_system_frees++;
            c->cached_bytes -= c->class_size[i];
            b = nx;
        }
        c->lists[i] = NULL;
    }
}

static void bump_peaks(fm_memory_stats *s) {
    if (s->allocated > s->allocated_peak) s->allocated_peak = s->allocated;
    if (s->requested > s->requested_peak) s->requested_peak = s->requested;
    if (s->reserved > s->reserved_peak) s->reserved_peak = s->reserved;
    s->active = s->allocated;
    if (s->active > s->active_peak) s->active_peak = s->active;
}

static void init_limit_locked(cpu_cache *c) {
    if (c->initialized) return;
    c->initialized = 1;
    const char *env = getenv("FATHOM_MEMORY_LIMIT");
    size_t lim;
    if (env && *env && fm_parse_size(env, &lim) == FM_OK) c->st.limit = lim;
}

static void *cpu_alloc(fm_allocator *a, size_t n) {
    cpu_cache *c = a->impl;
    size_t sz = round_size(n);
    pthread_mutex_lock(&c->mu);
    init_limit_locked(c);
    c->st.n_allocs++;
    int cls = class_of(c, sz, true);
    if (cls >= 0 && c->lists[cls]) {
        free_block *b = c->lists[cls];
        c->lists[cls] = b->next;
        c->cached_bytes -= sz;
        c->st.allocated += sz;
        c->st.requested += n;
        c->st.n_cache_hits++;
        bump_peaks(&c->st);
        pthread_mutex_unlock(&c->mu);
        return b;
    }
    void *p = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (c->st.limit && c->st.reserved + sz > c->st.limit) {
            if (attempt == 0 && c->cached_bytes) { drop_cache_locked(c); continue; }
            break;
        }
        if (posix_memalign(&p, ALIGN, sz) == 0) break;
        p = NULL;
        if (attempt == 0) drop_cache_locked(c);
    }
    if (!p) {
        c->st.n_ooms++;
        char rq[32], al[32], rs[32], lm[32];
        fm_set_error(FM_ERR_OOM,
                     "out of memory on cpu: requested %s with %s allocated, %s reserved, limit %s "
                     "(try a smaller --batch, --checkpointing blocks, --precision bf16, or a larger --memory-limit)",
                     fm_format_bytes(n, rq, sizeof rq), fm_format_bytes(c->st.allocated, al, sizeof al),
                     fm_format_bytes(c->st.reserved, rs, sizeof rs),
                     c->st.limit ? fm_format_bytes(c->st.limit, lm, sizeof lm) : "none");
        pthread_mutex_unlock(&c->mu);
        return NULL;
    }
    c->st.reserved += sz;
    c->st.allocated += sz;
    c->st.requested += n;
    c->st.n_system_allocs++;
    bump_peaks(&c->st);
    pthread_mutex_unlock(&c->mu);
    return p;
}

static void cpu_free(fm_allocator *a, void *p, size_t n) {
    if (!p) return;
    cpu_cache *c = a->impl;
    size_t sz = round_size(n);
    pthread_mutex_lock(&c->mu);
    c->st.allocated -= sz;
    c->st.requested -= n;
    c->st.active = c->st.allocated;
    int cls = class_of(c, sz, true);
    if (cls >= 0) {
        free_block *b = p;
        b->next = c->lists[cls];
        c->lists[cls] = b;
        c->cached_bytes += sz;
    } else {
        free(p);
        c->st.reserved -= sz;
        c->st.n_system_frees++;
    }
    pthread_mutex_unlock(&c->mu);
}

static fm_status cpu_stats(fm_allocator *a, fm_memory_stats *out) {
    cpu_cache *c = a->impl;
    pthread_mutex_lock(&c->mu);
    init_limit_locked(c);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
    return FM_OK;
}

static void cpu_reset_peak(fm_allocator *a) {
    cpu_cache *c = a->impl;
    pthread_mutex_lock(&c->mu);
    c->st.allocated_peak = c->st.allocated;
    c->st.requested_peak = c->st.requested;
    c->st.reserved_peak = c->st.reserved;
    c->st.active_peak = c->st.active;
    pthread_mutex_unlock(&c->mu);
}

static void cpu_empty_cache(fm_allocator *a) {
    cpu_cache *c = a->impl;
    pthread_mutex_lock(&c->mu);
    drop_cache_locked(c);
    pthread_mutex_unlock(&c->mu);
}

static fm_status cpu_set_limit(fm_allocator *a, size_t limit) {
    cpu_cache *c = a->impl;
    pthread_mutex_lock(&c->mu);
    c->initialized = 1;
    c->st.limit = limit;
    pthread_mutex_unlock(&c->mu);
    return FM_OK;
}

static fm_allocator g_cpu_alloc = {"cpu-caching", cpu_alloc, cpu_free, cpu_stats, cpu_reset_peak,
                                   cpu_empty_cache, cpu_set_limit, &g_cpu};

fm_allocator *fm_cpu_allocator(void) { return &g_cpu_alloc; }

/* Release cached blocks at exit so leak checkers see only real leaks. */
__attribute__((destructor)) static void cpu_cache_at_exit(void) { cpu_empty_cache(&g_cpu_alloc); }

fm_status fm_memory_stats_get(fm_device dev, fm_memory_stats *out) {
    if (dev.type == FM_DEV_CPU) return cpu_stats(&g_cpu_alloc, out);
    return fm_set_error(FM_ERR_UNSUPPORTED, "memory stats: device has no allocator in this build");
}
void fm_memory_reset_peak(fm_device dev) { if (dev.type == FM_DEV_CPU) cpu_reset_peak(&g_cpu_alloc); }
void fm_memory_empty_cache(fm_device dev) { if (dev.type == FM_DEV_CPU) cpu_empty_cache(&g_cpu_alloc); }
fm_status fm_memory_set_limit(fm_device dev, size_t limit) {
    if (dev.type == FM_DEV_CPU) return cpu_set_limit(&g_cpu_alloc, limit);
    return fm_set_error(FM_ERR_UNSUPPORTED, "memory limit: device has no allocator in this build");
}

fm_status fm_parse_size(const char *s, size_t *out) {
    if (!s || !*s) return fm_set_error(FM_ERR_INVALID, "empty size (expected e.g. 2G, 512M, 1073741824)");
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || v != v)
        return fm_set_error(FM_ERR_INVALID, "invalid size '%s' (expected e.g. 2G, 512M, 1073741824)", s);
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mul > 1 && (*end == 'i' || *end == 'I')) end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return fm_set_error(FM_ERR_INVALID, "invalid size '%s' (expected e.g. 2G, 512M, 1073741824)", s);
    double bytes = v * mul;
    if (bytes > 1.8e19) return fm_set_error(FM_ERR_INVALID, "size '%s' is too large", s);
    *out = (size_t)bytes;
    return FM_OK;
}

const char *fm_format_bytes(size_t n, char *buf, size_t len) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int i = 0;
    while (v >= 1024 && i < 4) { v /= 1024; i++; }
    if (i == 0) snprintf(buf, len, "%zu B", n);
    else snprintf(buf, len, "%.2f %s", v, u[i]);
    return buf;
}
