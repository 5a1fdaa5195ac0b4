/* The runner's arena: a run's intermediates live at planned offsets in one block.
 *
 * The memory plan (graph_compile.c) gives every intermediate an offset, at the
 * run's dim values, such that two values alive at the same node never overlap.
 * A run takes one block of the plan's size from the device's allocator; while a
 * node runs, its planned outputs are offered to the allocator as storage slots
 * (core/tensor_internal.h): the op's allocation of exactly a slot's size gets the
 * slot's memory instead of an allocation of its own. A run with the arena so makes
 * one allocation for all its intermediates, and its peak is the plan's arena.
 *
 * A shape whose outputs pile up over the run (a GPT prompt's present caches) would
 * peak higher with a block held throughout than allocating each value: such a
 * shape runs without (fm_memory_plan.run_uses_arena says which).
 *
 * The plan is not trusted for safety: a slot is offered only when no storage
 * placed earlier in the block that overlaps it is still alive. Each placed storage
 * clears its live flag when it dies, so a value kept alive past its planned last
 * reader (a view of it that an op returned, a cache that holds it) only costs its
 * region's later values their places: they allocate as they would without an arena.
 * The block outlives the run while any storage in it does (each holds a reference).
 *
 * Plans are kept per graph, by dim values: a shape is planned the second time it
 * runs (a decode loop, whose past length grows each step, would otherwise plan
 * every step for nothing), and up to G_PLANS shapes are kept until the graph
 * changes. Graph outputs are left out (they outlive the run); one that is a view of
 * an intermediate is copied out by the runner. CPU graphs only; FATHOM_GRAPH_ARENA=0
 * or fm_graph_run_options.no_arena runs without (for comparison), and
 * FATHOM_GRAPH_ARENA=1 plans a shape at its first run. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor_internal.h"
#include "graph/graph_internal.h"

#define G_PLANS 8
#define G_SEEN 8

typedef struct g_plan {
    int64_t key[G_MAX_SYMS];
    int64_t arena;
    int64_t *off, *bytes; /* per value index: offset (< 0: not placed) and exact bytes */
} g_plan;

struct g_plan_cache {
    pthread_mutex_t mu;
    int n_plans, n_seen, next_seen;
    g_plan *plans[G_PLANS];
    int64_t seen[G_SEEN][G_MAX_SYMS];
};

typedef struct g_arena g_arena;
typedef struct g_place { g_arena *a; int v; } g_place;

/* The block and what lives in it; shared by the run and the storages placed in it. */
struct g_arena {
    int refs;
    fm_storage *mem;
    unsigned char *live; /* per value: a storage at its place is alive */
    g_place *place;      /* per value: the deleter's context */
};

struct g_arena_run {
    const fm_graph *g;
    const g_plan *plan;
    g_arena *a;
    int *placed, n_placed; /* values given a place this run (their storages may be alive) */
    fm_storage_slot slots[FM_GRAPH_MAX_NODE_IO];
    int slot_v[FM_GRAPH_MAX_NODE_IO], n_slots;
    fm_storage_slot *prev_slots;
    int prev_n;
};

g_plan_cache *g_plan_cache_new(void) {
    g_plan_cache *c = calloc(1, sizeof *c);
    if (c && pthread_mutex_init(&c->mu, NULL)) { free(c); return NULL; }
    return c;
}

static void plan_free(g_plan *p) {
    if (!p) return;
    free(p->off);
    free(p->bytes);
    free(p);
}

void g_plan_cache_free(g_plan_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n_plans; i++) plan_free(c->plans[i]);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Whether another output of v's node that has no place has v's byte count: slots are
 * matched by size, so the node's allocation for that output (a graph output, such as
 * attention_kv's present caches beside its [B, T, C] result) could take v's place and
 * pin the block. Such a v gets none. (Two placed outputs of one size may trade places:
 * each storage keeps the live flag of the place it took, so that is still safe.) */
static bool unplaced_sibling(const fm_graph *g, const g_plan *p, int v) {
    const gnode *nd = &g->nodes[g->values[v].producer];
    for (int k = 0; k < nd->n_out; k++)
        if (nd->out[k] != v && p->off[nd->out[k]] < 0 && p->bytes[nd->out[k]] == p->bytes[v]) return true;
    return false;
}

static g_plan *plan_make(const fm_graph *g, const int64_t *syms) {
    const size_t nv = (size_t)g->n_values + 1;
    fm_memory_plan mp;
    if (g_plan_memory_at(g, syms, &mp)) return NULL;
    g_plan *p = calloc(1, sizeof *p);
    if (p && !mp.run_uses_arena) { /* kept, so that this shape is not planned again: runs without */
        memcpy(p->key, syms, sizeof p->key);
        return p;
    }
    g_span *sp = calloc(nv, sizeof *sp);
    if (p) {
        p->off = malloc(nv * sizeof *p->off);
        p->bytes = calloc(nv, sizeof *p->bytes);
    }
    int n = p && sp && p->off && p->bytes ? g_plan_spans(g, syms, false, sp, p->bytes) : -1;
    int64_t arena = n >= 0 ? g_plan_place(sp, n) : -1;
    if (arena < 0) {
        free(sp);
        plan_free(p);
        return NULL;
    }
    for (size_t v = 0; v < nv; v++) p->off[v] = -1;
    for (int k = 0; k < n; k++)
        if (sp[k].bytes > 0) p->off[sp[k].v] = sp[k].off;
    for (int k = 0; k < n; k++)
        if (p->off[sp[k].v] >= 0 && unplaced_sibling(g, p, sp[k].v)) p->off[sp[k].v] = -1;
    memcpy(p->key, syms, sizeof p->key);
    p->arena = arena;
    free(sp);
    return p;
}

/* FATHOM_GRAPH_ARENA: 0 runs without the arena, 1 plans a shape the first time
 * it runs (the tests' way to put every run through it); unset: the second time. */
static int arena_env(void) {
    static int mode = -1;
    int v = __atomic_load_n(&mode, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("FATHOM_GRAPH_ARENA");
        v = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 1 : 2;
        __atomic_store_n(&mode, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* The plan for these dim values: kept, made now (second sighting), or NULL. */
static const g_plan *plan_for(const fm_graph *g, const int64_t *syms) {
    g_plan_cache *c = g->plans;
    const size_t kb = (size_t)g->n_syms * sizeof *syms;
    pthread_mutex_lock(&c->mu);
    const g_plan *found = NULL;
    for (int i = 0; i < c->n_plans && !found; i++)
        if (!memcmp(c->plans[i]->key, syms, kb)) found = c->plans[i];
    bool again = arena_env() == 1;
    for (int i = 0; i < c->n_seen && !found && !again; i++) again = !memcmp(c->seen[i], syms, kb);
    if (!found && again && c->n_plans < G_PLANS) {
        fm_status prev = fm_last_status();
        g_plan *p = plan_make(g, syms);
        if (p) found = c->plans[c->n_plans++] = p;
        else if (prev == FM_OK) fm_clear_error(); /* the run goes on without an arena */
    } else if (!found && !again) {
        memset(c->seen[c->next_seen], 0, sizeof c->seen[0]);
        memcpy(c->seen[c->next_seen], syms, kb);
        c->next_seen = (c->next_seen + 1) % G_SEEN;
        if (c->n_seen < G_SEEN) c->n_seen++;
    }
    pthread_mutex_unlock(&c->mu);
    return found;
}

static void arena_unref(g_arena *a) {
    if (__atomic_sub_fetch(&a->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    fm_storage_release(a->mem);
    free(a->live);
    free(a->place);
    free(a);
}

/* A placed storage died: its region is free again. */
static void place_free(void *ctx, void *data) {
    (void)data;
    g_place *pl = ctx;
    __atomic_store_n(&pl->a->live[pl->v], 0, __ATOMIC_RELEASE);
    arena_unref(pl->a);
}

bool g_arena_owns(const fm_storage *s) { return s && s->deleter == place_free; }

g_arena_run *g_arena_begin(const fm_graph *g, const int64_t *syms) {
    if (!g->plans || g->device.type != FM_DEV_CPU || !arena_env()) return NULL;
    int64_t key[G_MAX_SYMS] = {0};
    memcpy(key, syms, (size_t)g->n_syms * sizeof *syms);
    const g_plan *p = plan_for(g, key);
    if (!p || p->arena <= 0) return NULL;
    g_arena_run *r = calloc(1, sizeof *r);
    g_arena *a = calloc(1, sizeof *a);
    if (r) r->placed = malloc(((size_t)g->n_values + 1) * sizeof *r->placed);
    if (a) {
        a->live = calloc((size_t)g->n_values + 1, 1);
        a->place = calloc((size_t)g->n_values + 1, sizeof *a->place);
    }
    fm_status prev = fm_last_status();
    if (a && a->live && a->place) a->mem = fm_storage_new((size_t)p->arena, g->device);
    if (!r || !r->placed || !a || !a->mem) { /* without an arena: the run allocates as it would */
        if (prev == FM_OK) fm_clear_error();
        if (a) { free(a->live); free(a->place); free(a); }
        if (r) free(r->placed);
        free(r);
        return NULL;
    }
    a->refs = 1;
    for (int v = 0; v < g->n_values; v++) a->place[v] = (g_place){a, v};
    r->g = g;
    r->plan = p;
    r->a = a;
    return r;
}

/* Whether [off, off + bytes) of the block is clear of every placed storage still alive. */
static bool region_free(g_arena_run *r, int64_t off, int64_t bytes) {
    bool clear = true;
    int m = 0;
    for (int k = 0; k < r->n_placed; k++) {
        int w = r->placed[k];
        if (!__atomic_load_n(&r->a->live[w], __ATOMIC_ACQUIRE)) continue; /* dead: forgotten */
        r->placed[m++] = w;
        if (r->plan->off[w] < off + bytes && off < r->plan->off[w] + r->plan->bytes[w]) clear = false;
    }
    r->n_placed = m;
    return clear;
}

void g_arena_node_begin(g_arena_run *r, const gnode *n) {
    if (!r) return;
    r->n_slots = 0;
    for (int k = 0; k < n->n_out && r->n_slots < FM_GRAPH_MAX_NODE_IO; k++) {
        int v = n->out[k];
        int64_t off = r->plan->off[v], bytes = r->plan->bytes[v];
        if (off < 0 || bytes <= 0 || !region_free(r, off, bytes)) continue;
        __atomic_add_fetch(&r->a->refs, 1, __ATOMIC_ACQ_REL); /* the placed storage's, given back if not taken */
        r->slots[r->n_slots] = (fm_storage_slot){r->g->device, (char *)r->a->mem->data + off, (size_t)bytes, place_free, &r->a->place[v],
                                                 &r->a->live[v], false};
        r->slot_v[r->n_slots++] = v;
    }
    r->prev_slots = fm_storage_slots_set(r->slots, r->n_slots, &r->prev_n);
}

void g_arena_node_end(g_arena_run *r) {
    if (!r) return;
    fm_storage_slots_set(r->prev_slots, r->prev_n, NULL);
    for (int k = 0; k < r->n_slots; k++) {
        if (r->slots[k].taken) r->placed[r->n_placed++] = r->slot_v[k];
        else arena_unref(r->a);
    }
    r->n_slots = 0;
}

void g_arena_end(g_arena_run *r) {
    if (!r) return;
    arena_unref(r->a);
    free(r->placed);
    free(r);
}
