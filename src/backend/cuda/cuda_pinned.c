/* The pinned host cache's bookkeeping (see cuda_pinned.h). A short list of
 * blocks is enough: a data loader holds a handful of batch buffers, so lookups
 * are linear scans under one mutex. */
#include "backend/cuda/cuda_pinned.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct pblock {
    char *p;
    size_t size;
    int in_use;
    void *ev; /* last copy reading the block, or NULL */
    struct pblock *next;
} pblock;

struct fm_pinned_cache {
    fm_pinned_ops ops;
    pthread_mutex_t mu;
    pblock *blocks;
    fm_pinned_stats st;
};

size_t fm_pinned_round_size(size_t n) {
    size_t r = 4096;
    while (r < n && r < ((size_t)1 << 62)) r <<= 1;
    return r;
}

fm_pinned_cache *fm_pinned_create(fm_pinned_ops ops) {
    fm_pinned_cache *c = calloc(1, sizeof *c);
    if (!c) { fm_set_error(FM_ERR_OOM, "pinned memory: out of host memory for the cache"); return NULL; }
    c->ops = ops;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

/* The block's event has finished (and is released then). */
static int block_idle(fm_pinned_cache *c, pblock *b) {
    if (!b->ev) return 1;
    if (!c->ops.event_done(c->ops.ctx, b->ev)) return 0;
    c->ops.event_release(c->ops.ctx, b->ev);
    b->ev = NULL;
    return 1;
}

int fm_pinned_destroy(fm_pinned_cache *c) {
    if (!c) return 0;
    int live = 0;
    for (pblock *b = c->blocks, *nx; b; b = nx) {
        nx = b->next;
        live += b->in_use;
        if (b->ev) c->ops.event_release(c->ops.ctx, b->ev);
        c->ops.host_free(c->ops.ctx, b->p);
        free(b);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
    return live;
}

void *fm_pinned_alloc(fm_pinned_cache *c, size_t n) {
    size_t r = fm_pinned_round_size(n);
    pthread_mutex_lock(&c->mu);
    c->st.n_allocs++;
    for (pblock *b = c->blocks; b; b = b->next) {
        if (b->in_use || b->size != r) continue;
        if (!block_idle(c, b)) { c->st.n_busy_skips++; continue; }
        b->in_use = 1;
        c->st.n_cache_hits++;
        c->st.in_use += r;
        pthread_mutex_unlock(&c->mu);
        return b->p;
    }
    pblock *b = calloc(1, sizeof *b);
    void *p = b ? c->ops.host_alloc(c->ops.ctx, r) : NULL;
    if (!p) {
        /* release idle cached blocks and retry once, as the device pool does */
        pthread_mutex_unlock(&c->mu);
        fm_pinned_empty_cache(c);
        pthread_mutex_lock(&c->mu);
        p = b ? c->ops.host_alloc(c->ops.ctx, r) : NULL;
    }
    if (!p) {
        free(b);
        size_t reserved = c->st.reserved;
        pthread_mutex_unlock(&c->mu);
        fm_set_error(FM_ERR_OOM, "pinned memory: cannot page-lock %zu bytes (requested %zu, %zu already pinned)", r, n, reserved);
        return NULL;
    }
    b->p = p;
    b->size = r;
    b->in_use = 1;
    b->next = c->blocks;
    c->blocks = b;
    c->st.n_host_allocs++;
    c->st.reserved += r;
    c->st.in_use += r;
    pthread_mutex_unlock(&c->mu);
    return p;
}

fm_status fm_pinned_free(fm_pinned_cache *c, void *p) {
    pthread_mutex_lock(&c->mu);
    for (pblock *b = c->blocks; b; b = b->next) {
        if (b->p != p) continue;
        if (!b->in_use) break;
        b->in_use = 0;
        c->st.in_use -= b->size;
        pthread_mutex_unlock(&c->mu);
        return FM_OK;
    }
    pthread_mutex_unlock(&c->mu);
    return fm_set_error(FM_ERR_INVALID, "pinned memory: %p is not an allocated pinned block (double free?)", p);
}

void *fm_pinned_find(fm_pinned_cache *c, const void *p, size_t n) {
    if (!c || !p) return NULL;
    const char *q = p;
    void *r = NULL;
    pthread_mutex_lock(&c->mu);
    for (pblock *b = c->blocks; b; b = b->next)
        if (b->in_use && q >= b->p && q + n <= b->p + b->size) { r = b->p; break; }
    pthread_mutex_unlock(&c->mu);
    return r;
}

fm_status fm_pinned_record(fm_pinned_cache *c, void *base, void *ev) {
    pthread_mutex_lock(&c->mu);
    for (pblock *b = c->blocks; b; b = b->next) {
        if (b->p != base) continue;
        if (b->ev) c->ops.event_release(c->ops.ctx, b->ev);
        b->ev = ev;
        c->st.n_copies++;
        pthread_mutex_unlock(&c->mu);
        return FM_OK;
    }
    pthread_mutex_unlock(&c->mu);
    c->ops.event_release(c->ops.ctx, ev);
    return fm_set_error(FM_ERR_INVALID, "pinned memory: %p is not a pinned block", base);
}

void *fm_pinned_pending(fm_pinned_cache *c, const void *base) {
    void *ev = NULL;
    pthread_mutex_lock(&c->mu);
    for (pblock *b = c->blocks; b; b = b->next)
        if (b->p == base) { ev = block_idle(c, b) ? NULL : b->ev; break; }
    pthread_mutex_unlock(&c->mu);
    return ev;
}

size_t fm_pinned_empty_cache(fm_pinned_cache *c) {
    size_t freed = 0;
    pthread_mutex_lock(&c->mu);
    for (pblock **pp = &c->blocks; *pp;) {
        pblock *b = *pp;
        if (!b->in_use && block_idle(c, b)) {
            *pp = b->next;
            c->ops.host_free(c->ops.ctx, b->p);
            c->st.reserved -= b->size;
            c->st.n_host_frees++;
            freed += b->size;
            free(b);
        } else {
            pp = &b->next;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return freed;
}

void fm_pinned_get_stats(fm_pinned_cache *c, fm_pinned_stats *out) {
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}
