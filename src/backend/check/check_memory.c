/* The checked test device's memory: the reason the device exists.
 *
 * One address range is reserved at first use (PROT_NONE, not backed; 4 GiB or
 * FATHOM_CHECK_RESERVE) and blocks are carved from it in whole pages. A block is
 * PROT_NONE except while something the backend does needs it: its copies, and a
 * kernel call for that call's tensors (fm_check_open/close, nested by count). So
 * a host read or write of device memory anywhere else in the library (the bug a
 * real GPU turns into garbage or a crash far away) faults at once, and the
 * SIGSEGV handler names it: "host access to check-device memory at ADDR".
 * Freed blocks stay PROT_NONE in a per-device cache (use after free faults too)
 * and are reused by size class, so a training step makes no new mappings.
 * Per-page metadata (which block a page belongs to) lives outside the range,
 * in host memory, so the backend reads it without opening anything. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/check/check_memory.h"

typedef struct cblock {
    char *p;
    size_t size;         /* bytes: whole pages, rounded to the size class */
    size_t req;          /* bytes asked for */
    int opens;           /* > 0: read/write */
    uint32_t gen;        /* bumped at each allocation (stale kernel-scope entries are skipped) */
    uint8_t cat;         /* fm_mem_category */
    bool in_use, resident;
    struct cblock *next; /* the device's cache of free blocks */
} cblock;

typedef struct check_dev {
    fm_allocator alloc;
    fm_memory_stats st;
    cblock *cache;
} check_dev;

static struct {
    pthread_mutex_t mu;
    char *base;
    size_t reserve, used, page;
    cblock **meta; /* one entry per page of the range: its block */
    struct sigaction old_segv;
    check_dev dev[FM_CHECK_DEVICES];
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---------------- the fault handler ---------------- */

static size_t put_str(char *o, const char *s) { size_t n = strlen(s); memcpy(o, s, n); return n; }
static size_t put_num(char *o, uintptr_t v, unsigned base) {
    char tmp[24];
    size_t n = 0, k = 0;
    do { tmp[n++] = "0123456789abcdef"[v % base]; v /= base; } while (v);
    if (base == 16) { o[k++] = '0'; o[k++] = 'x'; }
    while (n) o[k++] = tmp[--n];
    return k;
}

/* Async-signal-safe: formats by hand and writes once. */
static void on_segv(int sig, siginfo_t *si, void *uc) {
    const char *a = si->si_addr;
    /* si_code > 0: raised by the kernel for an access (not sent by kill/raise) */
    if (si->si_code > 0 && g.base && a >= g.base && a < g.base + g.reserve) {
        char msg[400];
        size_t n = put_str(msg, "fathom: host access to check-device memory at ");
        n += put_num(msg + n, (uintptr_t)a, 16);
        const cblock *b = g.meta[(size_t)(a - g.base) / g.page];
        if (b) {
            n += put_str(msg + n, " (byte ");
            n += put_num(msg + n, (uintptr_t)(a - b->p), 10);
            n += put_str(msg + n, b->in_use ? " of a block of " : " of a FREED block of ");
            n += put_num(msg + n, b->req, 10);
            n += put_str(msg + n, " bytes)");
        }
        n += put_str(msg + n, ": device memory is touched only by its backend's copies and kernels; "
                              "read a device tensor with fm_tensor_to or fm_tensor_copy_to_host\n");
        if (write(2, msg, n) < 0) { /* nothing more to do: aborting anyway */ }
        abort();
    }
    /* Not ours: hand the fault to the handler that was there before. */
    if ((g.old_segv.sa_flags & SA_SIGINFO) && g.old_segv.sa_sigaction) { g.old_segv.sa_sigaction(sig, si, uc); return; }
    if (!(g.old_segv.sa_flags & SA_SIGINFO) && g.old_segv.sa_handler != SIG_DFL && g.old_segv.sa_handler != SIG_IGN) {
        g.old_segv.sa_handler(sig);
        return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, NULL);
    raise(sig); /* delivered when this returns: ends the process as usual (a fault, or one sent by kill) */
}

/* ---------------- the reserve ---------------- */

static fm_status reserve_locked(void) {
    if (g.base) return FM_OK;
    size_t reserve = (size_t)4 << 30;
    const char *env = getenv("FATHOM_CHECK_RESERVE");
    if (env && *env && fm_parse_size(env, &reserve) != FM_OK)
        return fm_set_error(FM_ERR_INVALID, "FATHOM_CHECK_RESERVE='%s' is not a size (e.g. 4G)", env);
    g.page = (size_t)sysconf(_SC_PAGESIZE);
    reserve = (reserve + g.page - 1) / g.page * g.page;
    if (!reserve) return fm_set_error(FM_ERR_INVALID, "FATHOM_CHECK_RESERVE must be above 0");
    g.meta = calloc(reserve / g.page, sizeof *g.meta);
    if (!g.meta) return fm_set_error(FM_ERR_OOM, "check device: no host memory for the page table of a %zu-byte reserve", reserve);
    void *p = mmap(NULL, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        free(g.meta);
        g.meta = NULL;
        return fm_set_error(FM_ERR_OOM, "check device: cannot reserve %zu bytes of address space (set FATHOM_CHECK_RESERVE lower)", reserve);
    }
    g.reserve = reserve;
    g.base = p; /* published before the handler that reads it */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g.old_segv);
    return FM_OK;
}

static void protect(cblock *b, int prot) {
    if (mprotect(b->p, b->size, prot) != 0) {
        /* Only a kernel limit (vm.max_map_count) or a bug gets here; the device's
         * guarantee cannot hold without it, and it is a test device: stop. */
        fprintf(stderr, "fathom: check device: mprotect of %zu bytes failed; aborting\n", b->size);
        abort();
    }
}

static cblock *lookup_locked(const void *p) {
    const char *a = p;
    if (!g.base || a < g.base || a >= g.base + g.used) return NULL;
    return g.meta[(size_t)(a - g.base) / g.page];
}

/* ---------------- kernel scopes ---------------- */

#define SCOPE_MAX 256
#define DEPTH_MAX 32
typedef struct { cblock *b; uint32_t gen; } scope_ent;
static _Thread_local scope_ent t_ents[SCOPE_MAX];
static _Thread_local int t_n, t_depth, t_marks[DEPTH_MAX];

void fm_check_kernel_enter(void) {
    if (t_depth < DEPTH_MAX) t_marks[t_depth] = t_n;
    t_depth++;
}

void fm_check_kernel_leave(void) {
    if (t_depth <= 0) return;
    t_depth--;
    int mark = t_depth < DEPTH_MAX ? t_marks[t_depth] : t_n;
    pthread_mutex_lock(&g.mu);
    for (int i = mark; i < t_n; i++) {
        cblock *b = t_ents[i].b;
        if (b->in_use && b->gen == t_ents[i].gen && b->opens > 0 && --b->opens == 0) protect(b, PROT_NONE);
    }
    pthread_mutex_unlock(&g.mu);
    t_n = mark;
}

void fm_check_open(const void *p) {
    pthread_mutex_lock(&g.mu);
    cblock *b = lookup_locked(p);
    if (b && b->in_use && b->opens++ == 0) protect(b, PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&g.mu);
}

void fm_check_close(const void *p) {
    pthread_mutex_lock(&g.mu);
    cblock *b = lookup_locked(p);
    if (b && b->in_use && b->opens > 0 && --b->opens == 0) protect(b, PROT_NONE);
    pthread_mutex_unlock(&g.mu);
}

/* ---------------- the allocator ---------------- */

/* Whole pages; above 16 pages, rounded up to an eighth of the power of two
 * below, so that cached blocks are reused across nearby sizes. */
static size_t class_bytes(size_t n) {
    size_t pages = (n + g.page - 1) / g.page;
    if (pages > 16) {
        size_t step = (size_t)1 << (63 - __builtin_clzll((unsigned long long)pages) - 3);
        pages = (pages + step - 1) / step * step;
    }
    return pages * g.page;
}

static void bump_peaks(fm_memory_stats *s) {
    if (s->allocated > s->allocated_peak) s->allocated_peak = s->allocated;
    if (s->requested > s->requested_peak) s->requested_peak = s->requested;
    if (s->reserved > s->reserved_peak) s->reserved_peak = s->reserved;
    if (s->active > s->active_peak) s->active_peak = s->active;
}

static cblock *carve_locked(check_dev *d, size_t sz) {
    for (cblock **pp = &d->cache; *pp; pp = &(*pp)->next)
        if ((*pp)->size == sz) {
            cblock *b = *pp;
            *pp = b->next;
            d->st.n_cache_hits++;
            return b;
        }
    if (sz > g.reserve - g.used) return NULL;
    cblock *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->p = g.base + g.used;
    b->size = sz;
    for (size_t i = 0; i < sz / g.page; i++) g.meta[g.used / g.page + i] = b;
    g.used += sz;
    return b;
}

static void *c_alloc(fm_allocator *a, size_t n) {
    check_dev *d = a->impl;
    fm_mem_category cat = fm_memory_tag_push(FM_MEM_OTHER); /* read the caller's category */
    fm_memory_tag_pop(cat);
    pthread_mutex_lock(&g.mu);
    size_t sz = class_bytes(n);
    fm_memory_stats *s = &d->st;
    if (s->limit && s->allocated + sz > s->limit) {
        s->n_ooms++;
        pthread_mutex_unlock(&g.mu);
        fm_set_error(FM_ERR_OOM, "check device: out of memory: %zu bytes requested, %zu allocated, limit %zu",
                     n, s->allocated, s->limit);
        return NULL;
    }
    cblock *b = carve_locked(d, sz);
    if (!b) {
        s->n_ooms++;
        size_t used = g.used, reserve = g.reserve;
        pthread_mutex_unlock(&g.mu);
        fm_set_error(FM_ERR_OOM, "check device: %zu bytes requested, but %zu of its %zu-byte address reserve are carved "
                     "(raise FATHOM_CHECK_RESERVE)", n, used, reserve);
        return NULL;
    }
    if (!b->resident) { b->resident = true; s->reserved += sz; s->n_system_allocs++; }
    b->in_use = true;
    b->req = n;
    b->gen++;
    b->cat = (uint8_t)cat;
    b->opens = 0;
    s->allocated += sz; s->active += sz; s->requested += n; s->n_allocs++;
    s->by_category[cat] += sz;
    if (s->by_category[cat] > s->by_category_peak[cat]) s->by_category_peak[cat] = s->by_category[cat];
    bump_peaks(s);
    /* A kernel's own temporaries are its to use: open until its scope ends. */
    if (t_depth > 0) {
        b->opens = 1;
        protect(b, PROT_READ | PROT_WRITE);
        if (t_n < SCOPE_MAX) t_ents[t_n++] = (scope_ent){b, b->gen};
    }
    pthread_mutex_unlock(&g.mu);
    return b->p;
}

static void c_free(fm_allocator *a, void *p, size_t n) {
    (void)n;
    check_dev *d = a->impl;
    pthread_mutex_lock(&g.mu);
    cblock *b = lookup_locked(p);
    if (!b || b->p != p || !b->in_use) {
        pthread_mutex_unlock(&g.mu);
        fprintf(stderr, "fathom: check device: free of %p, which is not a live block (double free?)\n", p);
        abort();
    }
    if (b->opens) { b->opens = 0; protect(b, PROT_NONE); }
    b->in_use = false;
    fm_memory_stats *s = &d->st;
    s->allocated -= b->size; s->active -= b->size; s->requested -= b->req;
    s->by_category[b->cat] -= b->size;
    b->next = d->cache;
    d->cache = b;
    pthread_mutex_unlock(&g.mu);
}

static fm_status c_stats(fm_allocator *a, fm_memory_stats *out) {
    pthread_mutex_lock(&g.mu);
    *out = ((check_dev *)a->impl)->st;
    pthread_mutex_unlock(&g.mu);
    return FM_OK;
}

static void c_reset_peak(fm_allocator *a) {
    pthread_mutex_lock(&g.mu);
    fm_memory_stats *s = &((check_dev *)a->impl)->st;
    s->allocated_peak = s->allocated; s->requested_peak = s->requested;
    s->reserved_peak = s->reserved; s->active_peak = s->active;
    for (int i = 0; i < FM_MEM_CAT_COUNT; i++) s->by_category_peak[i] = s->by_category[i];
    pthread_mutex_unlock(&g.mu);
}

/* Gives the cached blocks' pages back (the address range stays carved). */
static void c_empty_cache(fm_allocator *a) {
    check_dev *d = a->impl;
    pthread_mutex_lock(&g.mu);
    for (cblock *b = d->cache; b; b = b->next)
        if (b->resident) {
            madvise(b->p, b->size, MADV_DONTNEED);
            b->resident = false;
            d->st.reserved -= b->size;
            d->st.n_system_frees++;
        }
    pthread_mutex_unlock(&g.mu);
}

static fm_status c_set_limit(fm_allocator *a, size_t limit) {
    pthread_mutex_lock(&g.mu);
    ((check_dev *)a->impl)->st.limit = limit;
    pthread_mutex_unlock(&g.mu);
    return FM_OK;
}

static void c_retag(fm_allocator *a, void *p, fm_mem_category cat) {
    check_dev *d = a->impl;
    pthread_mutex_lock(&g.mu);
    cblock *b = lookup_locked(p);
    if (b && b->p == p && b->in_use && b->cat != cat) {
        d->st.by_category[b->cat] -= b->size;
        b->cat = (uint8_t)cat;
        d->st.by_category[cat] += b->size;
        if (d->st.by_category[cat] > d->st.by_category_peak[cat]) d->st.by_category_peak[cat] = d->st.by_category[cat];
    }
    pthread_mutex_unlock(&g.mu);
}

fm_allocator *fm_check_allocator(int idx) {
    if (idx < 0 || idx >= FM_CHECK_DEVICES) {
        fm_set_error(FM_ERR_INVALID, "check device index %d is out of range (devices check:0 to check:%d)", idx, FM_CHECK_DEVICES - 1);
        return NULL;
    }
    pthread_mutex_lock(&g.mu);
    fm_status st = reserve_locked();
    check_dev *d = &g.dev[idx];
    if (st == FM_OK && !d->alloc.alloc)
        d->alloc = (fm_allocator){.name = "check-protected", .alloc = c_alloc, .free = c_free, .get_stats = c_stats,
                                  .reset_peak = c_reset_peak, .empty_cache = c_empty_cache, .set_limit = c_set_limit,
                                  .impl = d, .retag = c_retag};
    pthread_mutex_unlock(&g.mu);
    return st == FM_OK ? &d->alloc : NULL;
}
