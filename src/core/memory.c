/* The CPU caching allocator.
 *
 * Why not plain malloc: glibc serves large blocks with mmap and returns them
 * with munmap, so every big temporary costs page faults on first touch. A
 * training step allocates the same sizes over and over; keeping freed blocks
 * makes the steady state free of system calls and page faults (the same idea as
 * PyTorch's CUDA caching allocator).
 *
 * Every block carries a 64-byte header (size, category, links), so a free knows
 * the block's true size and category without trusting the caller, and the stats
 * stay exact: allocated = sum of the sizes of blocks in use; reserved = bytes
 * obtained from the system, headers included.
 *
 * grow mode: requests round up to 64 B below 4 KiB and to 1/8 of their power of
 * two above (<= 12.5% waste). A freed block returns to its class's list; an
 * allocation takes an exact-class block or asks the system. When the system
 * refuses or the limit would be passed, the cache is emptied and the request
 * retried once before reporting out-of-memory with the statistics.
 *
 * preallocate mode (TensorFlow's default behaviour): one arena is reserved up
 * front; requests (rounded to 512 B) are served best-fit from its free chunks,
 * split with PyTorch's limits (remainder >= 512 B for requests <= 1 MiB, > 1 MiB
 * for larger ones), and freed chunks coalesce with free physical neighbours. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/memory_internal.h"
#include "fathom/memory.h"

#define N_CLASSES 512
#define ALIGN 64
#define HDR 64
#define MAGIC 0xFA7B10C5u
#define SMALL_REQ ((size_t)1 << 20)
#define HUGE_ALIGN ((size_t)2 << 20) /* x86-64 transparent huge page */
#define HUGE_MIN ((size_t)4 << 20)   /* blocks at least this big are advised to use them */

typedef struct hdr {
    size_t size;                 /* usable bytes after the header */
    size_t requested;            /* bytes asked for (0 while free) */
    struct hdr *next, *prev;     /* free lists */
    struct hdr *phys_prev;       /* arena: the chunk just before this one */
    uint32_t magic;
    uint8_t cat, in_use, arena;
} hdr;
_Static_assert(sizeof(hdr) <= HDR, "block header must fit in 64 bytes");

typedef struct cpu_cache {
    pthread_mutex_t mu;
    hdr *lists[N_CLASSES];
    size_t class_size[N_CLASSES]; /* size of blocks in list i */
    fm_memory_stats st;
    size_t cached_bytes;          /* grow-mode blocks sitting in the lists (payload) */
    int initialized;
    char *arena;                  /* preallocate: base of the reserve */
    size_t arena_total;           /* bytes of the reserve (headers included) */
    hdr *arena_free;              /* free chunks (unordered, doubly linked) */
    size_t arena_in_use;          /* chunks in use */
} cpu_cache;

static cpu_cache g_cpu = {.mu = PTHREAD_MUTEX_INITIALIZER};
static _Thread_local uint8_t t_cat = FM_MEM_OTHER;

fm_mem_category fm_memory_tag_push(fm_mem_category c) {
    fm_mem_category prev = (fm_mem_category)t_cat;
    t_cat = (uint8_t)((unsigned)c < FM_MEM_CAT_COUNT ? c : FM_MEM_OTHER);
    return prev;
}
void fm_memory_tag_pop(fm_mem_category previous) { fm_memory_tag_push(previous); }

const char *fm_mem_category_name(fm_mem_category c) {
    static const char *names[FM_MEM_CAT_COUNT] = {"other", "weights", "gradients", "optimizer_state", "activations"};
    return (unsigned)c < FM_MEM_CAT_COUNT ? names[c] : "?";
}

size_t fm_cpu_block_size(size_t n) {
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
        hdr *b = c->lists[i];
        while (b) {
            hdr *nx = b->next;
            c->st.reserved -= b->size + HDR;
            c->cached_bytes -= b->size;
            c->st.n_system_frees++;
            free(b);
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

static void account_alloc(cpu_cache *c, hdr *h, size_t n) {
    h->requested = n;
    h->in_use = 1;
    h->cat = t_cat;
    c->st.allocated += h->size;
    c->st.requested += n;
    c->st.by_category[h->cat] += h->size;
    if (c->st.by_category[h->cat] > c->st.by_category_peak[h->cat])
        c->st.by_category_peak[h->cat] = c->st.by_category[h->cat];
    bump_peaks(&c->st);
}

/* ---- arena (preallocate mode) ---- */

static hdr *phys_next(cpu_cache *c, hdr *h) {
    char *nx = (char *)h + HDR + h->size;
    return nx < c->arena + c->arena_total ? (hdr *)nx : NULL;
}
static void free_list_insert(cpu_cache *c, hdr *h) {
    h->prev = NULL;
    h->next = c->arena_free;
    if (c->arena_free) c->arena_free->prev = h;
    c->arena_free = h;
    c->st.arena_free_bytes += h->size;
}
static void free_list_remove(cpu_cache *c, hdr *h) {
    if (h->prev) h->prev->next = h->next;
    else c->arena_free = h->next;
    if (h->next) h->next->prev = h->prev;
    h->next = h->prev = NULL;
    c->st.arena_free_bytes -= h->size;
}

static hdr *arena_alloc_locked(cpu_cache *c, size_t n) {
    size_t sz = (n + 511) & ~(size_t)511;
    hdr *best = NULL;
    for (hdr *h = c->arena_free; h; h = h->next)
        if (h->size >= sz && (!best || h->size < best->size)) { best = h; if (h->size == sz) break; }
    if (!best) return NULL;
    free_list_remove(c, best);
    size_t rem = best->size - sz;
    bool split = rem >= HDR && (sz <= SMALL_REQ ? rem - HDR >= 512 : rem - HDR > SMALL_REQ);
    if (split) {
        hdr *r = (hdr *)((char *)best + HDR + sz);
        memset(r, 0, sizeof *r);
        r->magic = MAGIC;
        r->arena = 1;
        r->size = rem - HDR;
        r->phys_prev = best;
        best->size = sz;
        hdr *after = phys_next(c, r);
        if (after) after->phys_prev = r;
        free_list_insert(c, r);
        c->st.n_splits++;
    }
    c->arena_in_use++;
    return best;
}

static void arena_free_locked(cpu_cache *c, hdr *h) {
    h->in_use = 0;
    c->arena_in_use--;
    hdr *nx = phys_next(c, h);
    if (nx && !nx->in_use) { /* absorb the next chunk */
        free_list_remove(c, nx);
        h->size += HDR + nx->size;
        hdr *after = phys_next(c, h);
        if (after) after->phys_prev = h;
        c->st.n_merges++;
    }
    hdr *pv = h->phys_prev;
    if (pv && !pv->in_use) { /* fold into the previous chunk */
        free_list_remove(c, pv);
        pv->size += HDR + h->size;
        hdr *after = phys_next(c, pv);
        if (after) after->phys_prev = pv;
        c->st.n_merges++;
        h = pv;
    }
    free_list_insert(c, h);
}

static void arena_release_locked(cpu_cache *c) {
    if (!c->arena) return;
    free(c->arena);
    c->st.reserved -= c->arena_total;
    c->st.n_system_frees++;
    c->arena = NULL;
    c->arena_free = NULL;
    c->arena_total = 0;
    c->st.arena_bytes = c->st.arena_free_bytes = 0;
}

static fm_status arena_create_locked(cpu_cache *c, size_t bytes) {
    bytes = (bytes + 511) & ~(size_t)511;
    if (bytes < 2 * HDR) bytes = 2 * HDR;
    char lm[32], rq[32], rs[32];
    if (c->st.limit && c->st.reserved + bytes > c->st.limit)
        return fm_set_error(FM_ERR_OOM, "memory: cannot preallocate %s: the limit is %s and %s is already reserved",
                            fm_format_bytes(bytes, rq, sizeof rq), fm_format_bytes(c->st.limit, lm, sizeof lm),
                            fm_format_bytes(c->st.reserved, rs, sizeof rs));
    void *p = NULL;
    if (posix_memalign(&p, ALIGN, bytes) != 0)
        return fm_set_error(FM_ERR_OOM, "memory: the system refused to preallocate %s", fm_format_bytes(bytes, rq, sizeof rq));
    c->arena = p;
    c->arena_total = bytes;
    hdr *h = p;
    memset(h, 0, sizeof *h);
    h->magic = MAGIC;
    h->arena = 1;
    h->size = bytes - HDR;
    c->st.arena_free_bytes = 0;
    free_list_insert(c, h);
    c->st.arena_bytes = bytes;
    c->st.reserved += bytes;
    c->st.n_system_allocs++;
    bump_peaks(&c->st);
    c->st.mode = FM_MEMORY_PREALLOCATE;
    return FM_OK;
}

static size_t phys_mem_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
}

static fm_status configure_locked(cpu_cache *c, const fm_memory_config *cfg) {
    if (cfg->mode != FM_MEMORY_GROW && cfg->mode != FM_MEMORY_PREALLOCATE)
        return fm_set_error(FM_ERR_INVALID, "memory: unknown mode %d (expected grow or preallocate)", (int)cfg->mode);
    if (cfg->mode == FM_MEMORY_PREALLOCATE && !cfg->prealloc_bytes &&
        !(cfg->prealloc_fraction > 0 && cfg->prealloc_fraction <= 1))
        return fm_set_error(FM_ERR_INVALID, "memory: preallocate needs a size or a fraction in (0, 1] (got %g)",
                            cfg->prealloc_fraction);
    if (c->arena && c->arena_in_use)
        return fm_set_error(FM_ERR_STATE, "memory: cannot reconfigure while %zu preallocated blocks are in use",
                            c->arena_in_use);
    c->initialized = 1;
    c->st.limit = cfg->limit;
    arena_release_locked(c);
    c->st.mode = FM_MEMORY_GROW;
    if (cfg->mode == FM_MEMORY_GROW) return FM_OK;
    size_t bytes = cfg->prealloc_bytes;
    if (!bytes) {
        size_t base = cfg->limit ? cfg->limit : phys_mem_bytes();
        bytes = (size_t)((double)base * cfg->prealloc_fraction);
        if (cfg->limit && bytes + c->st.reserved > cfg->limit) bytes = cfg->limit > c->st.reserved ? cfg->limit - c->st.reserved : 0;
    }
    drop_cache_locked(c); /* the reserve replaces the grow-mode cache */
    return arena_create_locked(c, bytes);
}

/* The environment is read at the first allocation, where the library has no
 * caller to return an error to (the fathom command refuses bad values before
 * that, in cli/main.c): a value that does not parse is named on stderr with what
 * is used instead, never ignored silently. */
static void env_warn(const char *var, const char *val, const char *expected, const char *used) {
    fprintf(stderr, "fathom: warning: %s='%s' is not %s; using %s\n", var, val, expected, used);
}

static void init_locked(cpu_cache *c) {
    if (c->initialized) return;
    c->initialized = 1;
    fm_memory_config cfg = {FM_MEMORY_GROW, 0, 0, 0};
    const char *env = getenv("FATHOM_MEMORY_LIMIT");
    size_t v;
    if (env && *env) {
        if (fm_parse_size(env, &v) == FM_OK) cfg.limit = v;
        else env_warn("FATHOM_MEMORY_LIMIT", env, "a size (bytes, or 512M, 2G)", "no limit");
    }
    c->st.limit = cfg.limit;
    const char *mode = getenv("FATHOM_MEMORY_MODE");
    fm_memory_mode m = FM_MEMORY_GROW;
    if (mode && *mode && fm_memory_mode_parse(mode, &m) != FM_OK) {
        env_warn("FATHOM_MEMORY_MODE", mode, "grow or preallocate", "grow");
        return;
    }
    if (!mode || !*mode || m != FM_MEMORY_PREALLOCATE) return;
    cfg.mode = FM_MEMORY_PREALLOCATE;
    cfg.prealloc_fraction = 0.9; /* TensorFlow maps nearly everything by default */
    const char *pre = getenv("FATHOM_MEMORY_PREALLOCATE");
    if (pre && *pre) {
        char *end;
        double f = strtod(pre, &end);
        if (*end == 0 && f > 0 && f <= 1) cfg.prealloc_fraction = f;
        else if (fm_parse_size(pre, &v) == FM_OK) cfg.prealloc_bytes = v;
        else env_warn("FATHOM_MEMORY_PREALLOCATE", pre, "a fraction in (0, 1] or a size", "the default fraction");
    }
    if (!cfg.limit && !cfg.prealloc_bytes && cfg.prealloc_fraction > 0.5) cfg.prealloc_fraction = 0.5;
    if (configure_locked(c, &cfg) != FM_OK) fprintf(stderr, "fathom: %s (continuing in grow mode)\n", fm_last_error());
}

/* ---- the allocator interface ---- */

static void *oom_locked(cpu_cache *c, size_t n) {
    c->st.n_ooms++;
    char rq[32], al[32], rs[32], lm[32];
    fm_set_error(FM_ERR_OOM,
                 "out of memory on cpu: requested %s with %s allocated, %s reserved, limit %s "
                 "(try a smaller --batch, --checkpointing blocks, --precision bf16, or a larger --memory-limit)",
                 fm_format_bytes(n, rq, sizeof rq), fm_format_bytes(c->st.allocated, al, sizeof al),
                 fm_format_bytes(c->st.reserved, rs, sizeof rs),
                 c->st.limit ? fm_format_bytes(c->st.limit, lm, sizeof lm) : "none");
    return NULL;
}

/* Large blocks ask for transparent huge pages (the 2 MiB-aligned part of the
 * block; with THP in "madvise" mode nothing else gets them). Streaming kernels
 * over big tensors then run without a TLB miss every 4 KiB, and the hardware
 * prefetchers, which stop at page boundaries, keep running: the 4M-element
 * rows of bench_core and bench_ops_nn (add, GELU, softmax, norms) measured
 * 5-25% faster. A refusal is harmless, so the result is ignored. */
static void advise_huge(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    uintptr_t b = ((uintptr_t)p + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1);
    uintptr_t e = ((uintptr_t)p + bytes) & ~(uintptr_t)(HUGE_ALIGN - 1);
    if (e > b) (void)madvise((void *)b, e - b, MADV_HUGEPAGE);
#else
    (void)p; (void)bytes;
#endif
}

static void *cpu_alloc(fm_allocator *a, size_t n) {
    cpu_cache *c = a->impl;
    pthread_mutex_lock(&c->mu);
    init_locked(c);
    c->st.n_allocs++;
    if (c->arena) {
        hdr *h = arena_alloc_locked(c, n);
        if (h) {
            c->st.n_cache_hits++;
            account_alloc(c, h, n);
            pthread_mutex_unlock(&c->mu);
            return (char *)h + HDR;
        }
    }
    size_t sz = fm_cpu_block_size(n);
    int cls = class_of(c, sz, true);
    if (cls >= 0 && c->lists[cls]) {
        hdr *h = c->lists[cls];
        c->lists[cls] = h->next;
        h->next = NULL;
        c->cached_bytes -= sz;
        c->st.n_cache_hits++;
        account_alloc(c, h, n);
        pthread_mutex_unlock(&c->mu);
        return (char *)h + HDR;
    }
    void *p = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (c->st.limit && c->st.reserved + sz + HDR > c->st.limit) {
            if (attempt == 0 && c->cached_bytes) { drop_cache_locked(c); continue; }
            break;
        }
        if (posix_memalign(&p, ALIGN, sz + HDR) == 0) break;
        p = NULL;
        if (attempt == 0) drop_cache_locked(c);
    }
    if (p && sz >= HUGE_MIN) advise_huge(p, sz + HDR);
    if (!p) {
        oom_locked(c, n);
        pthread_mutex_unlock(&c->mu);
        return NULL;
    }
    hdr *h = p;
    memset(h, 0, sizeof *h);
    h->magic = MAGIC;
    h->size = sz;
    c->st.reserved += sz + HDR;
    c->st.n_system_allocs++;
    account_alloc(c, h, n);
    pthread_mutex_unlock(&c->mu);
    return (char *)h + HDR;
}

static void cpu_free(fm_allocator *a, void *p, size_t n) {
    (void)n; /* the header knows the size */
    if (!p) return;
    cpu_cache *c = a->impl;
    hdr *h = (hdr *)((char *)p - HDR);
    pthread_mutex_lock(&c->mu);
    if (h->magic != MAGIC || !h->in_use) {
        pthread_mutex_unlock(&c->mu);
        fprintf(stderr, "fathom: cpu allocator: free of a pointer it does not own or already freed (%p)\n", p);
        abort();
    }
    c->st.allocated -= h->size;
    c->st.requested -= h->requested;
    c->st.by_category[h->cat] -= h->size;
    c->st.active = c->st.allocated;
    h->requested = 0;
    if (h->arena) {
        arena_free_locked(c, h);
    } else {
        h->in_use = 0;
        int cls = class_of(c, h->size, true);
        if (cls >= 0) {
            h->next = c->lists[cls];
            c->lists[cls] = h;
            c->cached_bytes += h->size;
        } else {
            c->st.reserved -= h->size + HDR;
            c->st.n_system_frees++;
            free(h);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

static fm_status cpu_stats(fm_allocator *a, fm_memory_stats *out) {
    cpu_cache *c = a->impl;
    pthread_mutex_lock(&c->mu);
    init_locked(c);
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
    for (int i = 0; i < FM_MEM_CAT_COUNT; i++) c->st.by_category_peak[i] = c->st.by_category[i];
    pthread_mutex_unlock(&c->mu);
}

/* Returns cached grow-mode blocks to the system. The preallocated arena stays:
 * it was reserved on purpose (as TensorFlow keeps its pool). */
static void cpu_empty_cache(fm_allocator *a) {
    cpu_cache *c = a->impl;
    pthread_mutex_lock(&c->mu);
    drop_cache_locked(c);
    pthread_mutex_unlock(&c->mu);
}

static fm_status cpu_set_limit(fm_allocator *a, size_t limit) {
    cpu_cache *c = a->impl;
    pthread_mutex_lock(&c->mu);
    init_locked(c);
    c->st.limit = limit;
    pthread_mutex_unlock(&c->mu);
    return FM_OK;
}

static fm_allocator g_cpu_alloc = {"cpu-caching", cpu_alloc, cpu_free, cpu_stats, cpu_reset_peak,
                                   cpu_empty_cache, cpu_set_limit, &g_cpu, NULL};

fm_allocator *fm_cpu_allocator(void) { return &g_cpu_alloc; }

void fm_memory_retag(fm_storage *s, fm_mem_category cat) {
    if (!s || !s->alloc || !s->data || (unsigned)cat >= FM_MEM_CAT_COUNT) return;
    if (s->alloc != &g_cpu_alloc) {
        if (s->alloc->retag) s->alloc->retag(s->alloc, s->data, cat);
        return;
    }
    cpu_cache *c = &g_cpu;
    hdr *h = (hdr *)((char *)s->data - HDR);
    pthread_mutex_lock(&c->mu);
    if (h->magic == MAGIC && h->in_use && h->cat != cat) {
        c->st.by_category[h->cat] -= h->size;
        h->cat = (uint8_t)cat;
        c->st.by_category[cat] += h->size;
        if (c->st.by_category[cat] > c->st.by_category_peak[cat]) c->st.by_category_peak[cat] = c->st.by_category[cat];
    }
    pthread_mutex_unlock(&c->mu);
}

/* Release cached blocks (and an idle arena) at exit so leak checkers see only real leaks. */
__attribute__((destructor)) static void cpu_cache_at_exit(void) {
    cpu_empty_cache(&g_cpu_alloc);
    pthread_mutex_lock(&g_cpu.mu);
    if (!g_cpu.arena_in_use) arena_release_locked(&g_cpu);
    pthread_mutex_unlock(&g_cpu.mu);
}

/* The allocator of any device: the CPU's here, another's from its backend
 * (NULL with the error set when the build or machine has no such device). */
static fm_allocator *device_allocator(fm_device dev, const char *what) {
    if (dev.type == FM_DEV_CPU) return &g_cpu_alloc;
    const fm_backend *b = fm_backend_get(dev.type);
    fm_allocator *a = b && b->allocator ? b->allocator(dev.index) : NULL;
    if (!a) {
        char dn[32];
        if (!b) fm_set_error(FM_ERR_UNSUPPORTED, "%s: device %s is not available in this build or on this machine",
                             what, fm_device_name(dev, dn, sizeof dn));
        /* else the backend set the error (index out of range, ...) */
    }
    return a;
}

fm_status fm_memory_stats_get(fm_device dev, fm_memory_stats *out) {
    fm_allocator *a = device_allocator(dev, "memory stats");
    if (!a) return fm_last_status();
    if (!a->get_stats) return fm_set_error(FM_ERR_UNSUPPORTED, "memory stats: allocator %s keeps none", a->name);
    return a->get_stats(a, out);
}
void fm_memory_reset_peak(fm_device dev) {
    fm_allocator *a = device_allocator(dev, "memory reset_peak");
    if (a && a->reset_peak) a->reset_peak(a);
}
void fm_memory_empty_cache(fm_device dev) {
    fm_allocator *a = device_allocator(dev, "memory empty_cache");
    if (a && a->empty_cache) a->empty_cache(a);
}
fm_status fm_memory_set_limit(fm_device dev, size_t limit) {
    fm_allocator *a = device_allocator(dev, "memory limit");
    if (!a) return fm_last_status();
    if (!a->set_limit) return fm_set_error(FM_ERR_UNSUPPORTED, "memory limit: allocator %s has none", a->name);
    return a->set_limit(a, limit);
}

fm_status fm_memory_configure(fm_device dev, const fm_memory_config *cfg) {
    if (!cfg) return fm_set_error(FM_ERR_INVALID, "memory: configuration is NULL");
    if (dev.type != FM_DEV_CPU) return fm_set_error(FM_ERR_UNSUPPORTED, "memory: configuring this device's allocator is not supported");
    pthread_mutex_lock(&g_cpu.mu);
    g_cpu.initialized = 1;
    fm_status st = configure_locked(&g_cpu, cfg);
    pthread_mutex_unlock(&g_cpu.mu);
    return st;
}

fm_status fm_memory_mode_parse(const char *s, fm_memory_mode *out) {
    if (s && !strcmp(s, "grow")) { *out = FM_MEMORY_GROW; return FM_OK; }
    if (s && !strcmp(s, "preallocate")) { *out = FM_MEMORY_PREALLOCATE; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "unknown memory mode '%s' (expected grow or preallocate)", s ? s : "(null)");
}

fm_status fm_memory_report_get(fm_device dev, fm_memory_report *out) {
    fm_memory_stats s;
    fm_status st = fm_memory_stats_get(dev, &s);
    if (st != FM_OK) return st;
    memset(out, 0, sizeof *out);
    out->peak_allocated = s.allocated_peak;
    out->peak_reserved = s.reserved_peak;
    for (int i = 0; i < FM_MEM_CAT_COUNT; i++) out->peak[i] = s.by_category_peak[i];
    out->n_system_allocs = s.n_system_allocs;
    out->n_ooms = s.n_ooms;
    return FM_OK;
}

const char *fm_memory_report_format(const fm_memory_report *r, char *buf, size_t len) {
    char a[32], b[32], w[32], g[32], o[32], act[32];
    snprintf(buf, len,
             "memory: peak %s allocated, %s reserved; peak by category: weights %s, gradients %s, "
             "optimizer state %s, activations %s",
             fm_format_bytes(r->peak_allocated, a, sizeof a), fm_format_bytes(r->peak_reserved, b, sizeof b),
             fm_format_bytes(r->peak[FM_MEM_WEIGHTS], w, sizeof w), fm_format_bytes(r->peak[FM_MEM_GRADIENTS], g, sizeof g),
             fm_format_bytes(r->peak[FM_MEM_OPTIMIZER], o, sizeof o),
             fm_format_bytes(r->peak[FM_MEM_ACTIVATIONS], act, sizeof act));
    return buf;
}

const char *fm_memory_report_json(const fm_memory_report *r, char *buf, size_t len) {
    snprintf(buf, len,
             "{\"peak_allocated\": %zu, \"peak_reserved\": %zu, \"weights\": %zu, \"gradients\": %zu, "
             "\"optimizer_state\": %zu, \"activations\": %zu, \"other\": %zu, \"system_allocs\": %llu, \"ooms\": %llu}",
             r->peak_allocated, r->peak_reserved, r->peak[FM_MEM_WEIGHTS], r->peak[FM_MEM_GRADIENTS],
             r->peak[FM_MEM_OPTIMIZER], r->peak[FM_MEM_ACTIVATIONS], r->peak[FM_MEM_OTHER],
             (unsigned long long)r->n_system_allocs, (unsigned long long)r->n_ooms);
    return buf;
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
