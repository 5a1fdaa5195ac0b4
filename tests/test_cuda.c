/* CUDA backend tests.
 *
 * Part 1 (always runs, no GPU needed): the device caching allocator's
 * bookkeeping (src/backend/cuda/cuda_pool.c) driven by a malloc-backed segment
 * allocator: size classes, best fit, splitting and merging, stream-aware reuse,
 * limits and fractions, OOM retry and messages, empty_cache, preallocate mode,
 * and a randomized stress run checking that live blocks never overlap.
 *
 * Part 2 (needs a CUDA build and a device; otherwise it is reported skipped with
 * the reason - exit 77, ctest's SKIP_RETURN_CODE - after checking that asking for
 * cuda fails with a clear error and running every case's CPU side): conformance of
 * every CUDA kernel against the CPU backend, op by op and dtype by dtype, by
 * normalized squared error (1e-6 f32, 1e-3 bf16/f16, the bound #15 sets), with NaN/inf checks,
 * guard regions around every output (out-of-bounds writes) and poisoned outputs
 * (unwritten elements). Kernels are called through fm_dispatch with the same
 * fm_op_call on both devices, so front-end logic cannot mask a kernel bug. The
 * elementwise and reduction cases iterate over ops.def's groups, and an op the
 * CUDA backend claims without a case fails the test (coverage_check). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_pool.h"
#include "dispatch/dispatch.h"
#include "core/tensor_internal.h"
#include "fathom/fathom.h"
#include "fathom/optim.h"
#include "fathom/quant.h"
#include "backend/kernel.h"
#include "test_util.h"

#define MiB ((size_t)1 << 20)

/* ------------------------------------------------------------------ part 1 */

typedef struct fake_dev {
    size_t budget, used;
    int n_alloc, n_free;
} fake_dev;

static void *fake_alloc(void *ctx, size_t n) {
    fake_dev *d = ctx;
    if (d->budget && d->used + n > d->budget) return NULL;
    void *p = malloc(n);
    if (p) { d->used += n; d->n_alloc++; }
    return p;
}
static void fake_free(void *ctx, void *p, size_t n) {
    fake_dev *d = ctx;
    d->used -= n;
    d->n_free++;
    free(p);
}
static fm_pool *make_pool(fake_dev *d, const fm_pool_config *cfg) {
    fm_pool_segment_ops ops = {fake_alloc, fake_free, d};
    fm_pool_config zero;
    memset(&zero, 0, sizeof zero);
    return fm_pool_create("cuda:test", cfg ? cfg : &zero, ops);
}

static void test_sizes(void) {
    CHECK(fm_pool_round_size(0) == 512);
    CHECK(fm_pool_round_size(1) == 512);
    CHECK(fm_pool_round_size(512) == 512);
    CHECK(fm_pool_round_size(513) == 1024);
    CHECK(fm_pool_is_small(MiB));
    CHECK(!fm_pool_is_small(MiB + 512));
    CHECK(fm_pool_segment_size(512) == 2 * MiB);
    CHECK(fm_pool_segment_size(MiB) == 2 * MiB);
    CHECK(fm_pool_segment_size(MiB + 512) == 20 * MiB);
    CHECK(fm_pool_segment_size(10 * MiB) == 10 * MiB);
    CHECK(fm_pool_segment_size(11 * MiB + 512) == 12 * MiB);
}

static void test_small_pool(void) {
    fake_dev d = {0};
    fm_pool *p = make_pool(&d, NULL);
    CHECK(p != NULL);
    void *a = fm_pool_alloc(p, 1000, 0), *b = fm_pool_alloc(p, 3000, 0), *c = fm_pool_alloc(p, 100, 0);
    CHECK(a && b && c);
    fm_memory_stats st;
    fm_pool_get_stats(p, &st);
    CHECK(st.n_system_allocs == 1);       /* all three from one 2 MiB segment */
    CHECK(st.reserved == 2 * MiB);
    CHECK(st.allocated == 1024 + 3072 + 512);
    CHECK(st.requested == 1000 + 3000 + 100);
    CHECK((char *)b == (char *)a + 1024); /* split in address order */
    CHECK(fm_pool_block_size(p, b) == 3072);
    /* free + same size: the cached block comes back */
    CHECK(fm_pool_free(p, b) == FM_OK);
    void *b2 = fm_pool_alloc(p, 2900, 0);
    CHECK(b2 == b);
    fm_pool_get_stats(p, &st);
    CHECK(st.n_cache_hits >= 1);
    /* merging: free a and b2 (neighbours) -> one 4 KiB block at a */
    fm_pool_free(p, a);
    fm_pool_free(p, b2);
    void *ab = fm_pool_alloc(p, 4096, 0);
    CHECK(ab == a);
    /* double free and foreign pointers are errors, not corruption */
    fm_pool_free(p, ab);
    CHECK(fm_pool_free(p, ab) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("not an allocated block");
    int x;
    CHECK(fm_pool_free(p, &x) == FM_ERR_INVALID);
    fm_pool_free(p, c);
    fm_pool_get_stats(p, &st);
    CHECK(st.allocated == 0 && st.requested == 0);
    CHECK(st.allocated_peak == 1024 + 3072 + 512);
    fm_pool_extra_stats ex;
    fm_pool_get_extra_stats(p, &ex);
    CHECK(ex.n_free_blocks == 1);         /* everything merged back into one block */
    CHECK(ex.largest_free_block == 2 * MiB);
    CHECK(fm_pool_destroy(p) == 0);
    CHECK(d.used == 0 && d.n_alloc == d.n_free);
}

static void test_streams(void) {
    fake_dev d = {0};
    fm_pool *p = make_pool(&d, NULL);
    void *a = fm_pool_alloc(p, 4096, 1);
    fm_pool_free(p, a);
    void *b = fm_pool_alloc(p, 4096, 2); /* stream 1's cache is not reused on stream 2 */
    CHECK(b != a);
    fm_memory_stats st;
    fm_pool_get_stats(p, &st);
    CHECK(st.n_system_allocs == 2);
    void *c = fm_pool_alloc(p, 4096, 1);
    CHECK(c == a);
    fm_pool_free(p, b);
    fm_pool_free(p, c);
    CHECK(fm_pool_destroy(p) == 0);
}

static void test_large_pool(void) {
    fake_dev d = {0};
    fm_pool *p = make_pool(&d, NULL);
    void *a = fm_pool_alloc(p, 2 * MiB, 0); /* 20 MiB segment, 18 MiB remainder split off */
    fm_memory_stats st;
    fm_pool_get_stats(p, &st);
    CHECK(st.reserved == 20 * MiB && st.allocated == 2 * MiB);
    void *b = fm_pool_alloc(p, 3 * MiB, 0); /* from the remainder */
    CHECK((char *)b == (char *)a + 2 * MiB);
    fm_pool_get_stats(p, &st);
    CHECK(st.n_system_allocs == 1);
    /* a remainder <= 1 MiB is not split off in the large pool */
    void *c = fm_pool_alloc(p, 15 * MiB - 512 * 1024, 0); /* leaves 0.5 MiB of the 15 MiB free */
    CHECK(c != NULL);
    CHECK(fm_pool_block_size(p, c) == 15 * MiB);
    /* >= 10 MiB: a segment of its own, rounded to 2 MiB */
    void *e = fm_pool_alloc(p, 11 * MiB, 0);
    fm_pool_get_stats(p, &st);
    CHECK(st.reserved == 20 * MiB + 12 * MiB);
    fm_pool_free(p, a); fm_pool_free(p, b); fm_pool_free(p, c); fm_pool_free(p, e);
    fm_pool_empty_cache(p);
    fm_pool_get_stats(p, &st);
    CHECK(st.reserved == 0 && st.n_system_frees == 2);
    CHECK(fm_pool_destroy(p) == 0);
}

static void test_limits_and_oom(void) {
    fake_dev d = {0};
    fm_pool *p = make_pool(&d, NULL);
    CHECK(fm_pool_set_limit(p, 4 * MiB) == FM_OK);
    void *a = fm_pool_alloc(p, 3 * MiB, 0); /* needs a 20 MiB segment: over the limit */
    CHECK(a == NULL);
    CHECK(fm_last_status() == FM_ERR_OOM);
    CHECK_ERR_CONTAINS("out of memory on cuda:test");
    CHECK_ERR_CONTAINS("limit 4.00 MiB");
    CHECK_ERR_CONTAINS("requested 3.00 MiB");
    fm_memory_stats st;
    fm_pool_get_stats(p, &st);
    CHECK(st.n_ooms == 1 && st.limit == 4 * MiB);
    void *s = fm_pool_alloc(p, 1000, 0); /* a 2 MiB small segment fits */
    CHECK(s != NULL);
    fm_pool_free(p, s);
    fm_pool_set_limit(p, 0);
    CHECK(fm_pool_destroy(p) == 0);

    /* the device refuses: cached free segments are released and the request retried */
    fake_dev d2 = {.budget = 21 * MiB};
    p = make_pool(&d2, NULL);
    void *small = fm_pool_alloc(p, 4096, 0);
    fm_pool_free(p, small); /* 2 MiB segment now cached and entirely free */
    void *big = fm_pool_alloc(p, 20 * MiB, 0);
    CHECK(big != NULL);
    fm_pool_extra_stats ex;
    fm_pool_get_extra_stats(p, &ex);
    CHECK(ex.n_alloc_retries == 1 && ex.n_segments == 1);
    fm_pool_get_stats(p, &st);
    CHECK(st.n_system_frees == 1);
    void *more = fm_pool_alloc(p, 4096, 0); /* nothing left to release: a clear OOM */
    CHECK(more == NULL);
    CHECK_ERR_CONTAINS("20.00 MiB allocated");
    fm_pool_free(p, big);
    CHECK(fm_pool_destroy(p) == 0);

    /* fraction of the device's memory */
    fake_dev d3 = {0};
    fm_pool_config cfg = {.fraction = 0.25, .total_bytes = 100 * MiB};
    p = make_pool(&d3, &cfg);
    fm_pool_get_stats(p, &st);
    CHECK(st.limit == 25 * MiB);
    CHECK(fm_pool_alloc(p, 30 * MiB, 0) == NULL);
    fm_pool_set_limit(p, 10 * MiB); /* the smaller cap wins */
    fm_pool_get_stats(p, &st);
    CHECK(st.limit == 10 * MiB);
    CHECK(fm_pool_destroy(p) == 0);
}

static void test_empty_cache_partial(void) {
    fake_dev d = {0};
    fm_pool *p = make_pool(&d, NULL);
    void *a = fm_pool_alloc(p, 4096, 0), *b = fm_pool_alloc(p, 4096, 0);
    void *big = fm_pool_alloc(p, 12 * MiB, 0);
    fm_pool_free(p, b);
    fm_pool_free(p, big);
    fm_pool_empty_cache(p); /* the small segment still holds `a`: only the big one goes */
    fm_memory_stats st;
    fm_pool_get_stats(p, &st);
    CHECK(st.reserved == 2 * MiB);
    fm_pool_free(p, a);
    fm_pool_reset_peak(p);
    fm_pool_get_stats(p, &st);
    CHECK(st.reserved_peak == 2 * MiB && st.allocated_peak == 0);
    CHECK(fm_pool_destroy(p) == 0);
}

static void test_max_split(void) {
    fake_dev d = {0};
    fm_pool_config cfg = {.max_split_size = 4 * MiB};
    fm_pool *p = make_pool(&d, &cfg);
    void *a = fm_pool_alloc(p, 12 * MiB, 0);
    fm_pool_free(p, a);
    void *b = fm_pool_alloc(p, 2 * MiB, 0); /* must not carve the oversize 12 MiB block */
    CHECK(b != a);
    fm_memory_stats st;
    fm_pool_get_stats(p, &st);
    CHECK(st.reserved == 12 * MiB + 20 * MiB);
    void *c = fm_pool_alloc(p, 11 * MiB, 0); /* an oversize request may use it, unsplit */
    CHECK(c == a && fm_pool_block_size(p, c) == 12 * MiB);
    fm_pool_free(p, b);
    fm_pool_free(p, c);
    CHECK(fm_pool_destroy(p) == 0);
}

static void test_preallocate(void) {
    fake_dev d = {0};
    fm_pool_config cfg = {.mode = FM_MEMORY_PREALLOCATE, .prealloc_bytes = 8 * MiB};
    fm_pool *p = make_pool(&d, &cfg);
    CHECK(p != NULL);
    void *blk[16];
    int n = 0;
    for (int i = 0; i < 15; i++) {
        blk[n] = fm_pool_alloc(p, (size_t)(i + 1) * 1000, (uintptr_t)i); /* streams share the arena */
        CHECK(blk[n] != NULL);
        n++;
    }
    fm_memory_stats st;
    fm_pool_get_stats(p, &st);
    CHECK(st.n_system_allocs == 1 && st.reserved == 8 * MiB);
    CHECK(fm_pool_alloc(p, 9 * MiB, 0) == NULL);
    CHECK_ERR_CONTAINS("preallocated arena is full");
    for (int i = 0; i < n; i++) fm_pool_free(p, blk[i]);
    fm_pool_empty_cache(p); /* the arena stays */
    fm_pool_get_stats(p, &st);
    CHECK(st.reserved == 8 * MiB);
    void *whole = fm_pool_alloc(p, 8 * MiB, 0); /* everything merged back */
    CHECK(whole != NULL);
    fm_pool_free(p, whole);
    CHECK(fm_pool_destroy(p) == 0);
    fm_pool_config bad = {.mode = FM_MEMORY_PREALLOCATE};
    fake_dev d2 = {0};
    CHECK(make_pool(&d2, &bad) == NULL);
    CHECK_ERR_CONTAINS("needs a size");
}

/* Random alloc/free: live blocks never overlap, stats always add up. */
static void test_stress(void) {
    fake_dev d = {0};
    fm_pool *p = make_pool(&d, NULL);
    enum { N = 200 };
    char *ptr[N] = {0};
    size_t sz[N] = {0};
    uint64_t s = 12345;
    for (int it = 0; it < 20000; it++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        int k = (int)((s >> 33) % N);
        if (ptr[k]) {
            CHECK(fm_pool_free(p, ptr[k]) == FM_OK);
            ptr[k] = NULL;
        } else {
            uint64_t r = s >> 40;
            size_t n = (r % 4 == 0) ? (size_t)(r % (24 * MiB)) : (size_t)(r % 300000);
            ptr[k] = fm_pool_alloc(p, n, (uintptr_t)(r % 3));
            CHECK(ptr[k] != NULL);
            sz[k] = fm_pool_block_size(p, ptr[k]);
            CHECK(sz[k] >= fm_pool_round_size(n));
            if (ptr[k] && n) { ptr[k][0] = (char)k; ptr[k][n - 1] = (char)k; }
        }
        if (it % 1000 == 0) {
            size_t total = 0;
            for (int i = 0; i < N; i++) {
                if (!ptr[i]) continue;
                total += sz[i];
                for (int j = i + 1; j < N; j++)
                    if (ptr[j]) CHECK(ptr[i] + sz[i] <= ptr[j] || ptr[j] + sz[j] <= ptr[i]);
            }
            fm_memory_stats st;
            fm_pool_get_stats(p, &st);
            CHECK(st.allocated == total);
            CHECK(st.reserved >= st.allocated);
            CHECK(st.reserved == d.used);
        }
    }
    for (int i = 0; i < N; i++) if (ptr[i]) fm_pool_free(p, ptr[i]);
    fm_pool_empty_cache(p);
    fm_memory_stats st;
    fm_pool_get_stats(p, &st);
    CHECK(st.reserved == 0 && st.allocated == 0);
    CHECK(fm_pool_destroy(p) == 0);
}

/* The pinned host cache: blocks are reused only after their last copy's event
 * completes; lookups find the block holding a range; empty_cache keeps busy blocks. */
typedef struct fake_host {
    int n_alloc, n_free, n_ev_released, refuse;
    int done[16]; /* event k completed? events are (void *)(k + 1) */
} fake_host;
static void *fh_alloc(void *ctx, size_t n) {
    fake_host *h = ctx;
    if (h->refuse) return NULL;
    h->n_alloc++;
    return malloc(n);
}
static void fh_free(void *ctx, void *p) { ((fake_host *)ctx)->n_free++; free(p); }
static int fh_done(void *ctx, void *ev) { return ((fake_host *)ctx)->done[(intptr_t)ev - 1]; }
static void fh_release(void *ctx, void *ev) { (void)ev; ((fake_host *)ctx)->n_ev_released++; }
#define EV(k) ((void *)(intptr_t)((k) + 1))

static void test_pinned_cache(void) {
    CHECK(fm_pinned_round_size(1) == 4096);
    CHECK(fm_pinned_round_size(4097) == 8192);
    CHECK(fm_pinned_round_size(1 << 20) == (size_t)1 << 20);
    fake_host h;
    memset(&h, 0, sizeof h);
    fm_pinned_cache *c = fm_pinned_create((fm_pinned_ops){fh_alloc, fh_free, fh_done, fh_release, &h});
    CHECK(c != NULL);
    char *a = fm_pinned_alloc(c, 5000);
    CHECK(a != NULL && h.n_alloc == 1);
    CHECK(fm_pinned_find(c, a, 5000) == a);
    CHECK(fm_pinned_find(c, a + 100, 8000) == a);   /* inside the rounded 8 KiB block */
    CHECK(fm_pinned_find(c, a + 100, 8192) == NULL); /* runs past its end */
    int x;
    CHECK(fm_pinned_find(c, &x, 4) == NULL);
    /* a copy reads `a`: after release it is not reused until the copy is done */
    CHECK(fm_pinned_record(c, a, EV(0)) == FM_OK);
    CHECK(fm_pinned_pending(c, a) == EV(0));
    CHECK(fm_pinned_free(c, a) == FM_OK);
    CHECK(fm_pinned_find(c, a, 1) == NULL); /* released blocks are not "pinned tensors" any more */
    char *b = fm_pinned_alloc(c, 6000);
    CHECK(b != a && h.n_alloc == 2);
    fm_pinned_stats st;
    fm_pinned_get_stats(c, &st);
    CHECK(st.n_busy_skips == 1 && st.n_cache_hits == 0 && st.reserved == 16384 && st.in_use == 8192);
    /* busy blocks survive empty_cache */
    CHECK(fm_pinned_empty_cache(c) == 0);
    h.done[0] = 1;
    char *a2 = fm_pinned_alloc(c, 7000);
    CHECK(a2 == a);                     /* the copy finished: cached block reused */
    CHECK(h.n_ev_released == 1);
    CHECK(fm_pinned_pending(c, a2) == NULL);
    /* a newer copy's event replaces (and releases) the older one */
    CHECK(fm_pinned_record(c, b, EV(1)) == FM_OK);
    CHECK(fm_pinned_record(c, b, EV(2)) == FM_OK);
    CHECK(h.n_ev_released == 2);
    CHECK(fm_pinned_record(c, &x, EV(3)) == FM_ERR_INVALID); /* unknown block: the event is released */
    CHECK(h.n_ev_released == 3);
    CHECK(fm_pinned_free(c, b) == FM_OK);
    CHECK(fm_pinned_free(c, b) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("not an allocated pinned block");
    CHECK(fm_pinned_free(c, &x) == FM_ERR_INVALID);
    h.done[2] = 1;
    CHECK(fm_pinned_empty_cache(c) == 8192); /* b goes; a2 is in use */
    CHECK(h.n_free == 1);
    /* the host refuses: idle cached blocks are released first, then a clear OOM */
    h.refuse = 1;
    CHECK(fm_pinned_alloc(c, 100) == NULL);
    CHECK(fm_last_status() == FM_ERR_OOM);
    CHECK_ERR_CONTAINS("cannot page-lock");
    h.refuse = 0;
    fm_pinned_get_stats(c, &st);
    CHECK(st.n_copies == 3 && st.n_host_allocs == 2 && st.n_host_frees == 1);
    CHECK(fm_pinned_destroy(c) == 1); /* a2 still in use */
    CHECK(h.n_free == 2 && h.n_alloc == 2);
    fm_clear_error();
}

/* ------------------------------------------------------------------ part 2 */

static int g_skipped_cases, g_gpu_cases;
static bool g_has_case[FM_OP_COUNT]; /* ops the conformance list ran (coverage_check) */
static double g_worst_nse;       /* the largest normalized squared error of one dtype's cases */
static char g_worst_label[200]; /* and the case that had it */
/* No device: run_case checks only that the cpu reference of every case runs (so the case
 * list itself - shapes, attrs - is tested on every machine). */
static int g_cpu_only, g_cpu_cases;

static fm_tensor *rand_tensor(int nd, const int64_t *shape, fm_dtype dt, double lo, double hi, uint64_t seed) {
    fm_rng r;
    fm_rng_init(&r, seed);
    fm_tensor *f = fm_tensor_empty(nd, shape, FM_F32, FM_CPU);
    if (!f) return NULL;
    fm_tensor_uniform_(f, lo, hi, &r);
    if (dt == FM_F32) return f;
    fm_tensor *t = fm_to_dtype(f, dt);
    fm_tensor_release(f);
    return t;
}

static fm_tensor *index_tensor(int nd, const int64_t *shape, int64_t hi, uint64_t seed) {
    fm_tensor *t = fm_tensor_empty(nd, shape, FM_I64, FM_CPU);
    int64_t n = fm_tensor_numel(t);
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        ((int64_t *)t->storage->data)[i] = (int64_t)((s >> 33) % (uint64_t)hi);
    }
    return t;
}

#define GUARD 64

typedef struct out_spec { int nd; int64_t shape[FM_MAX_DIMS]; fm_dtype dt; int exact; } out_spec;

/* A cuda output inside a larger buffer: GUARD elements of poison each side, the
 * output itself poisoned too (NaN for floats, 0xA5 bytes otherwise). */
static fm_tensor *guarded_out(const out_spec *o, fm_tensor **big_out) {
    int64_t n = 1;
    for (int i = 0; i < o->nd; i++) n *= o->shape[i];
    int64_t total = n + 2 * GUARD;
    fm_device cu = {FM_DEV_CUDA, 0};
    size_t es = fm_dtype_size(o->dt);
    unsigned char *host = malloc((size_t)total * es);
    for (int64_t i = 0; i < total; i++) {
        if (fm_dtype_is_float(o->dt)) {
            if (o->dt == FM_F32) { float v = NAN; memcpy(host + i * es, &v, es); }
            else if (o->dt == FM_F64) { double v = NAN; memcpy(host + i * es, &v, es); }
            else { uint16_t v = 0x7fc1; memcpy(host + i * es, &v, es); }
        } else {
            memset(host + i * es, 0xA5, es);
        }
    }
    fm_tensor *h = fm_tensor_from_data(host, 1, &total, o->dt);
    free(host);
    fm_tensor *big = fm_tensor_to(h, cu);
    fm_tensor_release(h);
    if (!big) return NULL;
    int64_t st[FM_MAX_DIMS];
    fm_contiguous_strides(o->nd, o->shape, st);
    fm_tensor *v = fm_view_raw(big, o->nd, o->shape, st, GUARD);
    *big_out = big;
    return v;
}

/* Guards intact? Returns the count of damaged guard elements. */
static int check_guards(fm_tensor *big, int64_t n) {
    fm_tensor *h = fm_tensor_to(big, FM_CPU);
    if (!h) return 1;
    size_t es = fm_dtype_size(h->dtype);
    const unsigned char *p = h->storage->data;
    int bad = 0;
    int64_t total = n + 2 * GUARD;
    for (int64_t i = 0; i < total; i++) {
        if (i >= GUARD && i < GUARD + n) continue;
        const unsigned char *e = p + i * es, *ref = p; /* element 0 is a guard: the pattern */
        if (memcmp(e, ref, es)) bad++;
    }
    fm_tensor_release(h);
    return bad;
}

static double nse(const fm_tensor *gpu_host, const fm_tensor *ref, int *nonfinite, int *mismatch_nan) {
    int64_t n = fm_tensor_numel(ref);
    double num = 0, den = 0;
    *nonfinite = 0;
    *mismatch_nan = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = fm_tensor_get(gpu_host, i), b = fm_tensor_get(ref, i);
        if (isnan(b) || isinf(b)) { if (!(isnan(a) == isnan(b) && (isnan(a) || a == b))) (*mismatch_nan)++; continue; }
        if (!isfinite(a)) { (*nonfinite)++; continue; }
        num += (a - b) * (a - b);
        den += b * b;
    }
    return den > 0 ? num / den : num;
}

typedef struct conf_case {
    const char *label;
    fm_op_id op;
    int n_in, n_out;
    fm_tensor *in[FM_CALL_MAX_IN]; /* host inputs, in the dtype under test (owned) */
    out_spec out[FM_CALL_MAX_OUT];
    const void *attrs;
    unsigned keep; /* inputs (bit i) given to the cpu as they are: f16 operands of a fixed format
                      (int4 scales and offsets), not values in the dtype under test */
    double tol;    /* > 0: the bound on the normalized squared error instead of the dtype's, where
                      the cpu kernel itself rounds more than the dtype (int4: x to int8) */
} conf_case;

/* Run one case on both devices and compare. CPU reference: float inputs widened to f32
 * (the CPU kernels' dtype) unless they already are f32/f64. */
static void run_case(conf_case *c, fm_dtype dt) {
    fm_device cu = {FM_DEV_CUDA, 0};
    fm_op_call hc = {.op = c->op, .n_in = c->n_in, .n_out = c->n_out, .attrs = c->attrs};
    fm_op_call gc = hc;
    fm_tensor *hin[FM_CALL_MAX_IN] = {0}, *gin[FM_CALL_MAX_IN] = {0}, *hout[FM_CALL_MAX_OUT] = {0};
    fm_tensor *gout[FM_CALL_MAX_OUT] = {0}, *gbig[FM_CALL_MAX_OUT] = {0};
    char label[160];
    snprintf(label, sizeof label, "%s [%s]", c->label, fm_dtype_name(dt));
    g_has_case[c->op] = true;
    if (g_cpu_only) {
        fm_op_call cc = hc;
        for (int i = 0; i < c->n_in; i++) {
            if (!c->in[i]) continue;
            fm_dtype idt = c->in[i]->dtype;
            hin[i] = (idt == FM_F16 || idt == FM_BF16) && !(c->keep >> i & 1) ? fm_to_dtype(c->in[i], FM_F32) : fm_tensor_retain(c->in[i]);
            cc.in[i] = hin[i];
        }
        for (int i = 0; i < c->n_out; i++) {
            if (c->out[i].nd < 0) continue;
            fm_dtype hdt = (c->out[i].dt == FM_F16 || c->out[i].dt == FM_BF16) ? FM_F32 : c->out[i].dt;
            cc.out[i] = hout[i] = fm_tensor_empty(c->out[i].nd, c->out[i].shape, hdt, FM_CPU);
        }
        fm_status cs = fm_dispatch(&cc);
        CHECK_MSG(cs == FM_OK, "%s: cpu reference failed: %s", label, fm_last_error());
        g_cpu_cases++;
        goto done;
    }
    g_gpu_cases++;
    for (int i = 0; i < c->n_in; i++) {
        if (!c->in[i]) continue;
        fm_dtype idt = c->in[i]->dtype;
        hin[i] = (idt == FM_F16 || idt == FM_BF16) && !(c->keep >> i & 1) ? fm_to_dtype(c->in[i], FM_F32) : fm_tensor_retain(c->in[i]);
        gin[i] = fm_tensor_to(c->in[i], cu);
        CHECK_MSG(gin[i] != NULL, "%s: moving input %d to cuda: %s", label, i, fm_last_error());
        hc.in[i] = hin[i];
        gc.in[i] = gin[i];
    }
    for (int i = 0; i < c->n_out; i++) {
        out_spec o = c->out[i];
        if (o.nd < 0) continue; /* optional output left NULL */
        fm_dtype hdt = (o.dt == FM_F16 || o.dt == FM_BF16) ? FM_F32 : o.dt;
        hout[i] = fm_tensor_empty(o.nd, o.shape, hdt, FM_CPU);
        gout[i] = guarded_out(&o, &gbig[i]);
        CHECK_MSG(gout[i] != NULL, "%s: cuda output %d: %s", label, i, fm_last_error());
        hc.out[i] = hout[i];
        gc.out[i] = gout[i];
    }
    fm_status hs = fm_dispatch(&hc);
    if (hs != FM_OK) {
        /* a dropped case is a failure (#15: the GPU check counts them so) */
        CHECK_MSG(false, "%s: no cpu reference: %s", label, fm_last_error());
        g_skipped_cases++;
        goto done;
    }
    fm_status gs = fm_dispatch(&gc);
    CHECK_MSG(gs == FM_OK, "%s: cuda kernel failed: %s", label, fm_last_error());
    if (gs != FM_OK) goto done;
    fm_status ss = fm_backend_get(FM_DEV_CUDA)->synchronize(0);
    CHECK_MSG(ss == FM_OK, "%s: cuda fault: %s", label, fm_last_error());
    if (ss != FM_OK) goto done;
    for (int i = 0; i < c->n_out; i++) {
        if (!gout[i]) continue;
        int64_t n = fm_tensor_numel(gout[i]);
        int damaged = check_guards(gbig[i], n);
        CHECK_MSG(damaged == 0, "%s: output %d: %d guard elements overwritten", label, i, damaged);
        fm_tensor *gh = fm_tensor_to(gout[i], FM_CPU);
        int nonfinite, nanmis;
        double e = nse(gh, hout[i], &nonfinite, &nanmis);
        double tol = (c->out[i].exact || !fm_dtype_is_float(c->out[i].dt)) ? 0.0
                     : c->tol > 0 ? c->tol
                     : (c->out[i].dt == FM_F16 || c->out[i].dt == FM_BF16 || dt == FM_F16 || dt == FM_BF16) ? 1e-3 : 1e-6;
        if (e > g_worst_nse) { g_worst_nse = e; snprintf(g_worst_label, sizeof g_worst_label, "%s output %d", label, i); }
        CHECK_MSG(nonfinite == 0, "%s: output %d: %d NaN/inf (or unwritten) elements where the cpu has finite values", label, i, nonfinite);
        CHECK_MSG(nanmis == 0, "%s: output %d: %d elements differ in NaN/inf from the cpu", label, i, nanmis);
        CHECK_MSG(e <= tol, "%s: output %d: normalized squared error %.3g > %.1g", label, i, e, tol);
        fm_tensor_release(gh);
    }
done:
    for (int i = 0; i < FM_CALL_MAX_IN; i++) { fm_tensor_release(hin[i]); fm_tensor_release(gin[i]); }
    for (int i = 0; i < FM_CALL_MAX_OUT; i++) { fm_tensor_release(hout[i]); fm_tensor_release(gout[i]); fm_tensor_release(gbig[i]); }
    fm_clear_error();
}

static void case_free(conf_case *c) {
    for (int i = 0; i < FM_CALL_MAX_IN; i++) fm_tensor_release(c->in[i]);
}

static out_spec spec(int nd, const int64_t *shape, fm_dtype dt) {
    out_spec o;
    memset(&o, 0, sizeof o);
    o.nd = nd;
    for (int i = 0; i < nd; i++) o.shape[i] = shape[i];
    o.dt = dt;
    return o;
}

/* conv2d (+ backward with every subset of gradients), NCHW and NHWC, stride, padding,
 * dilation, groups (depthwise included). */
typedef struct conv_shape { fm_layout lay; int64_t N, C, H, W, O, kh, kw; int s0, s1, p0, p1, d0, d1, g; } conv_shape;

static void conv_cases(fm_dtype dt) {
    static const conv_shape cs[] = {
        {FM_NCHW, 2, 3, 11, 9, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1},
        {FM_NCHW, 3, 4, 10, 12, 6, 3, 2, 2, 1, 1, 0, 1, 2, 2},
        {FM_NHWC, 2, 6, 9, 9, 6, 3, 3, 2, 2, 1, 1, 2, 2, 6}, /* depthwise */
        {FM_NHWC, 2, 5, 8, 7, 7, 1, 1, 1, 1, 0, 0, 1, 1, 1},
        {FM_NCHW, 4, 1, 28, 28, 4, 5, 5, 1, 1, 2, 2, 1, 1, 1},
        {FM_NHWC, 3, 4, 12, 10, 8, 3, 3, 1, 2, 0, 1, 1, 1, 2},
    };
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        const conv_shape *q = &cs[k];
        fm_conv2d_attrs ca;
        memset(&ca, 0, sizeof ca);
        ca.p.stride[0] = q->s0; ca.p.stride[1] = q->s1;
        ca.p.padding[0] = q->p0; ca.p.padding[1] = q->p1;
        ca.p.dilation[0] = q->d0; ca.p.dilation[1] = q->d1;
        ca.p.groups = q->g;
        ca.p.layout = q->lay;
        int64_t Ho = (q->H + 2 * q->p0 - q->d0 * (q->kh - 1) - 1) / q->s0 + 1;
        int64_t Wo = (q->W + 2 * q->p1 - q->d1 * (q->kw - 1) - 1) / q->s1 + 1;
        bool nhwc = q->lay == FM_NHWC;
        int64_t xs[4] = {q->N, nhwc ? q->H : q->C, nhwc ? q->W : q->H, nhwc ? q->C : q->W};
        int64_t ys[4] = {q->N, nhwc ? Ho : q->O, nhwc ? Wo : Ho, nhwc ? q->O : Wo};
        int64_t ws[4] = {q->O, q->C / q->g, q->kh, q->kw};
        char label[96];
        snprintf(label, sizeof label, "conv2d #%zu %s", k, nhwc ? "NHWC" : "NCHW");
        conf_case c = {.label = label, .op = FM_OP_CONV2D, .n_in = 3, .n_out = 1, .attrs = &ca};
        c.in[0] = rand_tensor(4, xs, dt, -1, 1, 2000 + k);
        c.in[1] = rand_tensor(4, ws, dt, -0.5, 0.5, 2010 + k);
        c.in[2] = k % 2 ? NULL : rand_tensor(1, &q->O, dt, -0.5, 0.5, 2020 + k);
        c.out[0] = spec(4, ys, dt);
        run_case(&c, dt);
        if (k == 1 || k == 5) { /* the same through chunks of 2 samples (dw accumulates across chunks) */
            char cl[112];
            snprintf(cl, sizeof cl, "%s chunked", label);
            c.label = cl;
            setenv("FATHOM_CUDA_CONV_CHUNK", "2", 1);
            run_case(&c, dt);
            conf_case b = {.label = "conv2d_backward chunked", .op = FM_OP_CONV2D_BACKWARD, .n_in = 3, .n_out = 3, .attrs = &ca};
            b.in[0] = rand_tensor(4, ys, dt, -1, 1, 2040 + k);
            b.in[1] = fm_tensor_retain(c.in[0]);
            b.in[2] = fm_tensor_retain(c.in[1]);
            b.out[0] = spec(4, xs, dt);
            b.out[1] = spec(4, ws, dt);
            b.out[2] = spec(1, &q->O, dt);
            run_case(&b, dt);
            case_free(&b);
            unsetenv("FATHOM_CUDA_CONV_CHUNK");
            c.label = label;
        }
        /* backward: all three, dx only, dw + db only */
        for (int which = 0; which < 3; which++) {
            char bl[112];
            snprintf(bl, sizeof bl, "conv2d_backward #%zu %s %s", k, nhwc ? "NHWC" : "NCHW",
                     which == 0 ? "dx dw db" : which == 1 ? "dx" : "dw db");
            conf_case b = {.label = bl, .op = FM_OP_CONV2D_BACKWARD, .n_in = 3, .n_out = 3, .attrs = &ca};
            b.in[0] = rand_tensor(4, ys, dt, -1, 1, 2030 + k);
            b.in[1] = fm_tensor_retain(c.in[0]);
            b.in[2] = fm_tensor_retain(c.in[1]);
            b.out[0] = which == 2 ? spec(-1, NULL, dt) : spec(4, xs, dt);
            b.out[1] = which == 1 ? spec(-1, NULL, dt) : spec(4, ws, dt);
            b.out[2] = which == 1 ? spec(-1, NULL, dt) : spec(1, &q->O, dt);
            run_case(&b, dt);
            case_free(&b);
        }
        case_free(&c);
    }
}

/* max/avg pool2d (+ backward), both layouts, padding, count_include_pad either way. */
static void pool_cases(fm_dtype dt) {
    typedef struct { fm_layout lay; int64_t N, C, H, W; int k0, k1, s0, s1, p0, p1; bool incl; } ps;
    static const ps cs[] = {
        {FM_NCHW, 2, 3, 12, 10, 2, 2, 2, 2, 0, 0, true},
        {FM_NCHW, 2, 3, 11, 13, 3, 3, 2, 2, 1, 1, false},
        {FM_NHWC, 2, 5, 9, 8, 3, 2, 1, 2, 1, 0, true},
        {FM_NHWC, 3, 4, 7, 7, 2, 2, 2, 2, 1, 1, false},
    };
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        const ps *q = &cs[k];
        fm_pool2d_attrs pa;
        memset(&pa, 0, sizeof pa);
        pa.p.kernel[0] = q->k0; pa.p.kernel[1] = q->k1;
        pa.p.stride[0] = q->s0; pa.p.stride[1] = q->s1;
        pa.p.padding[0] = q->p0; pa.p.padding[1] = q->p1;
        pa.p.count_include_pad = q->incl;
        pa.p.layout = q->lay;
        bool nhwc = q->lay == FM_NHWC;
        int64_t Ho = (q->H + 2 * q->p0 - q->k0) / q->s0 + 1, Wo = (q->W + 2 * q->p1 - q->k1) / q->s1 + 1;
        int64_t xs[4] = {q->N, nhwc ? q->H : q->C, nhwc ? q->W : q->H, nhwc ? q->C : q->W};
        int64_t ys[4] = {q->N, nhwc ? Ho : q->C, nhwc ? Wo : Ho, nhwc ? q->C : Wo};
        char l1[64], l2[64], l3[64], l4[64];
        snprintf(l1, sizeof l1, "max_pool2d #%zu", k);
        snprintf(l2, sizeof l2, "max_pool2d_backward #%zu", k);
        snprintf(l3, sizeof l3, "avg_pool2d #%zu", k);
        snprintf(l4, sizeof l4, "avg_pool2d_backward #%zu", k);
        conf_case m = {.label = l1, .op = FM_OP_MAX_POOL2D, .n_in = 1, .n_out = 2, .attrs = &pa};
        m.in[0] = rand_tensor(4, xs, dt, -2, 2, 2100 + k);
        m.out[0] = spec(4, ys, dt);
        m.out[1] = spec(4, ys, FM_I64);
        run_case(&m, dt);
        /* the backward gets the cpu's argmax of the same (rounded) values */
        fm_tensor *x32 = fm_to_dtype(m.in[0], FM_F32);
        fm_tensor *y32 = fm_tensor_empty(4, ys, FM_F32, FM_CPU), *idx = fm_tensor_empty(4, ys, FM_I64, FM_CPU);
        fm_op_call fc = {.op = FM_OP_MAX_POOL2D, .n_in = 1, .n_out = 2, .in = {x32}, .out = {y32, idx}, .attrs = &pa};
        if (fm_dispatch(&fc) == FM_OK) {
            conf_case mb = {.label = l2, .op = FM_OP_MAX_POOL2D_BACKWARD, .n_in = 3, .n_out = 1, .attrs = &pa};
            mb.in[0] = rand_tensor(4, ys, dt, -1, 1, 2110 + k);
            mb.in[1] = fm_tensor_retain(m.in[0]);
            mb.in[2] = fm_tensor_retain(idx);
            mb.out[0] = spec(4, xs, dt);
            run_case(&mb, dt);
            case_free(&mb);
        }
        fm_tensor_release_n(3, x32, y32, idx);
        conf_case a = {.label = l3, .op = FM_OP_AVG_POOL2D, .n_in = 1, .n_out = 1, .attrs = &pa};
        a.in[0] = fm_tensor_retain(m.in[0]);
        a.out[0] = spec(4, ys, dt);
        run_case(&a, dt);
        conf_case ab = {.label = l4, .op = FM_OP_AVG_POOL2D_BACKWARD, .n_in = 1, .n_out = 1, .attrs = &pa};
        ab.in[0] = rand_tensor(4, ys, dt, -1, 1, 2120 + k);
        ab.out[0] = spec(4, xs, dt);
        run_case(&ab, dt);
        case_free(&ab);
        case_free(&a);
        case_free(&m);
    }
}

/* Running statistics are updated in place: compare them after one training call on each device. */
static void bn_running_check(fm_dtype dt, fm_layout lay, const int64_t *xs, int64_t C) {
    if (g_cpu_only) return;
    fm_device cu = {FM_DEV_CUDA, 0};
    fm_tensor *x = rand_tensor(4, xs, dt, -1, 2, 2200);
    fm_tensor *rm = rand_tensor(1, &C, dt, -0.1, 0.1, 2201), *rv = rand_tensor(1, &C, dt, 0.9, 1.1, 2202);
    fm_tensor *gx = fm_tensor_to(x, cu), *grm = fm_tensor_to(rm, cu), *grv = fm_tensor_to(rv, cu);
    fm_tensor *hx = fm_to_dtype(x, FM_F32), *hrm = fm_to_dtype(rm, FM_F32), *hrv = fm_to_dtype(rv, FM_F32);
    fm_tensor *hy = fm_batch_norm(hx, NULL, NULL, hrm, hrv, true, 0.1, 1e-5, lay);
    fm_tensor *gy = fm_batch_norm(gx, NULL, NULL, grm, grv, true, 0.1, 1e-5, lay);
    CHECK_MSG(hy && gy, "batch_norm running stats [%s]: %s", fm_dtype_name(dt), fm_last_error());
    if (hy && gy) {
        fm_tensor *m2 = fm_tensor_to(grm, FM_CPU), *v2 = fm_tensor_to(grv, FM_CPU);
        int nf, nm;
        double tol = dt == FM_F32 ? 1e-6 : 1e-3;
        double e1 = nse(m2, hrm, &nf, &nm), e2 = nse(v2, hrv, &nf, &nm);
        CHECK_MSG(e1 <= tol && e2 <= tol, "batch_norm running stats [%s %s]: nse mean %.3g var %.3g", fm_dtype_name(dt),
                  lay == FM_NHWC ? "NHWC" : "NCHW", e1, e2);
        fm_tensor_release_n(2, m2, v2);
    }
    fm_tensor_release_n(11, x, rm, rv, gx, grm, grv, hx, hrm, hrv, hy, gy);
    fm_clear_error();
}

/* batch_norm train and eval (+ backward), NCHW and channels-last, with and without affine. */
static void bn_cases(fm_dtype dt) {
    for (int k = 0; k < 4; k++) {
        fm_layout lay = k & 1 ? FM_NHWC : FM_NCHW;
        int training = k < 2 ? 1 : 0;
        int64_t C = 6, xs[4] = {4, lay == FM_NHWC ? 5 : C, 7, lay == FM_NHWC ? C : 5};
        fm_bn_attrs ba = {training, 0.1, 1e-5, lay};
        char l1[64], l2[64];
        snprintf(l1, sizeof l1, "batch_norm %s %s", training ? "train" : "eval", lay == FM_NHWC ? "NHWC" : "NCHW");
        snprintf(l2, sizeof l2, "batch_norm_backward %s %s", training ? "train" : "eval", lay == FM_NHWC ? "NHWC" : "NCHW");
        conf_case c = {.label = l1, .op = FM_OP_BATCH_NORM, .n_in = 5, .n_out = 3, .attrs = &ba};
        c.in[0] = rand_tensor(4, xs, dt, -1, 2, 2300 + k);
        c.in[1] = k == 1 ? NULL : rand_tensor(1, &C, dt, 0.5, 1.5, 2310 + k);
        c.in[2] = k == 1 ? NULL : rand_tensor(1, &C, dt, -0.5, 0.5, 2320 + k);
        c.in[3] = rand_tensor(1, &C, dt, -0.1, 0.1, 2330 + k);
        c.in[4] = rand_tensor(1, &C, dt, 0.9, 1.1, 2340 + k);
        c.out[0] = spec(4, xs, dt);
        c.out[1] = spec(1, &C, dt);
        c.out[2] = spec(1, &C, dt);
        run_case(&c, dt);
        /* backward from the cpu's saved statistics */
        fm_tensor *x32 = fm_to_dtype(c.in[0], FM_F32);
        fm_tensor *rm32 = fm_to_dtype(c.in[3], FM_F32), *rv32 = fm_to_dtype(c.in[4], FM_F32);
        fm_tensor *y = fm_tensor_empty(4, xs, FM_F32, FM_CPU);
        fm_tensor *sm = fm_tensor_empty(1, &C, FM_F32, FM_CPU), *sr = fm_tensor_empty(1, &C, FM_F32, FM_CPU);
        fm_op_call fc = {.op = FM_OP_BATCH_NORM, .n_in = 5, .n_out = 3, .in = {x32, NULL, NULL, rm32, rv32},
                         .out = {y, sm, sr}, .attrs = &ba};
        if (fm_dispatch(&fc) == FM_OK) {
            conf_case b = {.label = l2, .op = FM_OP_BATCH_NORM_BACKWARD, .n_in = 5, .n_out = 3, .attrs = &ba};
            b.in[0] = rand_tensor(4, xs, dt, -1, 1, 2350 + k);
            b.in[1] = fm_tensor_retain(c.in[0]);
            b.in[2] = c.in[1] ? fm_tensor_retain(c.in[1]) : NULL;
            b.in[3] = fm_to_dtype(sm, dt);
            b.in[4] = fm_to_dtype(sr, dt);
            b.out[0] = spec(4, xs, dt);
            b.out[1] = spec(1, &C, dt);
            b.out[2] = spec(1, &C, dt);
            run_case(&b, dt);
            case_free(&b);
        }
        fm_tensor_release_n(6, x32, rm32, rv32, y, sm, sr);
        case_free(&c);
        if (training) bn_running_check(dt, lay, xs, C);
    }
}

/* cat (variadic, strided inputs, an empty one), gather, scatter_add, scatter, scatter_nd, index_add. */
static void index_cases(fm_dtype dt) {
    if (!g_cpu_only) {
        fm_axis_attrs aa = {1};
        fm_tensor *a = rand_tensor(3, (int64_t[]){4, 5, 33}, dt, -1, 1, 2400);
        fm_tensor *bb = rand_tensor(3, (int64_t[]){4, 33, 7}, dt, -1, 1, 2401);
        fm_tensor *b = fm_transpose(bb, 1, 2); /* [4, 7, 33], strided */
        fm_tensor *e = rand_tensor(3, (int64_t[]){4, 0, 33}, dt, -1, 1, 2402);
        fm_tensor *full = rand_tensor(3, (int64_t[]){4, 12, 33}, dt, -1, 1, 2403);
        fm_tensor *d = fm_slice(full, 1, 1, 12, 2); /* [4, 6, 33], every other row */
        fm_tensor *ts[4] = {a, b, e, d};
        fm_device cu = {FM_DEV_CUDA, 0};
        fm_tensor *g[4];
        for (int i = 0; i < 4; i++) {
            fm_tensor *gc = fm_tensor_to(ts[i], cu); /* contiguous on the device... */
            g[i] = gc;
        }
        /* ...so the strided views are rebuilt there: the transposed and sliced inputs */
        fm_tensor *gbb = fm_tensor_to(bb, cu), *gfull = fm_tensor_to(full, cu);
        fm_tensor_release(g[1]);
        fm_tensor_release(g[3]);
        g[1] = fm_transpose(gbb, 1, 2);
        g[3] = fm_slice(gfull, 1, 1, 12, 2);
        int64_t ys[3] = {4, 18, 33};
        fm_tensor *hy = fm_tensor_empty(3, ys, dt == FM_F64 ? FM_F64 : dt, FM_CPU);
        fm_op_call hc = {.op = FM_OP_CAT, .n_in = 4, .n_out = 1, .var_in = ts, .out = {hy}, .attrs = &aa};
        out_spec os = spec(3, ys, dt);
        fm_tensor *gbig = NULL, *gy = guarded_out(&os, &gbig);
        fm_op_call gc2 = {.op = FM_OP_CAT, .n_in = 4, .n_out = 1, .var_in = g, .out = {gy}, .attrs = &aa};
        g_gpu_cases++;
        g_has_case[FM_OP_CAT] = true;
        fm_status hs = fm_dispatch(&hc), gs = gy ? fm_dispatch(&gc2) : fm_last_status();
        CHECK_MSG(hs == FM_OK && gs == FM_OK, "cat [%s]: %s", fm_dtype_name(dt), fm_last_error());
        if (hs == FM_OK && gs == FM_OK) {
            fm_backend_get(FM_DEV_CUDA)->synchronize(0);
            CHECK_MSG(check_guards(gbig, fm_tensor_numel(gy)) == 0, "cat [%s]: guard elements overwritten", fm_dtype_name(dt));
            fm_tensor *back = fm_tensor_to(gy, FM_CPU);
            /* data movement: bit-exact */
            CHECK_MSG(back && !memcmp(fm_tensor_data(back), fm_tensor_data(hy), fm_tensor_nbytes(hy)), "cat [%s]: differs from the cpu",
                      fm_dtype_name(dt));
            fm_tensor_release(back);
        }
        for (int i = 0; i < 4; i++) fm_tensor_release(g[i]);
        fm_tensor_release_n(11, a, bb, b, e, full, d, gbb, gfull, hy, gy, gbig);
        fm_clear_error();
    }
    {
        int64_t ts_[3] = {5, 9, 17}, is[3] = {5, 12, 13};
        for (int ax = 0; ax < 3; ax++) {
            fm_axis_attrs aa = {ax};
            int64_t ish[3] = {ax == 0 ? 8 : is[0], ax == 1 ? 12 : is[1] - 4, ax == 2 ? 20 : is[2]};
            conf_case c = {.label = "gather", .op = FM_OP_GATHER, .n_in = 2, .n_out = 1, .attrs = &aa};
            c.in[0] = rand_tensor(3, ts_, dt, -1, 1, 2500 + ax);
            c.in[1] = index_tensor(3, ish, ts_[ax], 2510 + ax);
            c.out[0] = spec(3, ish, dt);
            c.out[0].exact = 1;
            run_case(&c, dt);
            /* scatter_add: in = {base (zeros), index, src}; repeated indices accumulate */
            conf_case s = {.label = "scatter_add", .op = FM_OP_SCATTER_ADD, .n_in = 3, .n_out = 1, .attrs = &aa};
            s.in[0] = rand_tensor(3, ts_, dt, -1, 1, 2520 + ax);
            s.in[1] = fm_tensor_retain(c.in[1]);
            s.in[2] = rand_tensor(3, ish, dt, -1, 1, 2530 + ax);
            s.out[0] = spec(3, ts_, dt);
            run_case(&s, dt);
            case_free(&s);
            /* scatter, each reduction: in = {t, index, src}; repeats apply in index order on both */
            for (int r = 0; r <= FM_SCATTER_AMIN; r++) {
                fm_scatter_attrs sa = {ax, r};
                conf_case sc = {.label = "scatter", .op = FM_OP_SCATTER, .n_in = 3, .n_out = 1, .attrs = &sa};
                sc.in[0] = rand_tensor(3, ts_, dt, -1, 1, 2570 + ax);
                sc.in[1] = fm_tensor_retain(c.in[1]);
                sc.in[2] = rand_tensor(3, ish, dt, -1, 1, 2580 + ax);
                sc.out[0] = spec(3, ts_, dt);
                sc.out[0].exact = r == FM_SCATTER_NONE;
                run_case(&sc, dt);
                case_free(&sc);
            }
            /* scatter_nd: 6 tuples of ax + 1 indices into [5, 9, 17] (repeats included), slices of the rest */
            {
                fm_scatter_attrs sa = {0, ax % 2 ? FM_SCATTER_ADD : FM_SCATTER_NONE};
                int64_t nsh[2] = {6, ax + 1}, ush[3] = {6, 0, 0};
                int un = 1;
                for (int d = ax + 1; d < 3; d++) ush[un++] = ts_[d];
                conf_case nd = {.label = "scatter_nd", .op = FM_OP_SCATTER_ND, .n_in = 3, .n_out = 1, .attrs = &sa};
                nd.in[0] = rand_tensor(3, ts_, dt, -1, 1, 2590 + ax);
                nd.in[1] = index_tensor(2, nsh, ts_[0], 2595 + ax);
                nd.in[2] = rand_tensor(un, ush, dt, -1, 1, 2598 + ax);
                nd.out[0] = spec(3, ts_, dt);
                nd.out[0].exact = sa.reduce == FM_SCATTER_NONE;
                run_case(&nd, dt);
                case_free(&nd);
            }
            /* index_add: index 1-D along the axis (repeats included) */
            int64_t L = 11, srcs[3] = {ts_[0], ts_[1], ts_[2]};
            srcs[ax] = L;
            conf_case ia = {.label = "index_add", .op = FM_OP_INDEX_ADD, .n_in = 3, .n_out = 1, .attrs = &aa};
            ia.in[0] = rand_tensor(3, ts_, dt, -1, 1, 2540 + ax);
            ia.in[1] = index_tensor(1, &L, ts_[ax], 2550 + ax);
            ia.in[2] = rand_tensor(3, srcs, dt, -1, 1, 2560 + ax);
            ia.out[0] = spec(3, ts_, dt);
            run_case(&ia, dt);
            case_free(&ia);
            case_free(&c);
        }
    }
}

/* The ops of the given ops.def groups, in table order; returns the count. */
static int ops_in_groups(fm_op_group g1, fm_op_group g2, fm_op_id *out) {
    int n = 0;
    for (int op = 0; op < FM_OP_COUNT; op++) {
        fm_op_group g = fm_op_get_info((fm_op_id)op)->group;
        if (g == g1 || g == g2) out[n++] = (fm_op_id)op;
    }
    return n;
}

static void optim_cases(fm_dtype dt);
static void master_weight_cases(void);
static void quant_cases(fm_dtype dt);

/* SDPA forward and backward cases at one shape (both causal settings), compared with the
 * cpu; `tag` goes into the labels. The backward starts from the cpu's forward results. */
static void sdpa_cases(fm_dtype dt, int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D, uint64_t seed,
                       const char *tag) {
    for (int causal = 0; causal < 2; causal++) {
        char lf[96], lb[96];
        snprintf(lf, sizeof lf, "sdpa%s%s %lldx%lldx%lld/%lld D%lld", tag, causal ? " causal" : "", (long long)H,
                 (long long)Tq, (long long)Tk, (long long)Hkv, (long long)D);
        snprintf(lb, sizeof lb, "sdpa_backward%s%s %lldx%lldx%lld/%lld D%lld", tag, causal ? " causal" : "", (long long)H,
                 (long long)Tq, (long long)Tk, (long long)Hkv, (long long)D);
        fm_sdpa_attrs sa = {causal, 0, FM_F32};
        conf_case c = {.label = lf, .op = FM_OP_SDPA, .n_in = 3, .n_out = 2, .attrs = &sa};
        c.in[0] = rand_tensor(4, (int64_t[]){B, H, Tq, D}, dt, -1, 1, seed + causal);
        c.in[1] = rand_tensor(4, (int64_t[]){B, Hkv, Tk, D}, dt, -1, 1, seed + 10 + causal);
        c.in[2] = rand_tensor(4, (int64_t[]){B, Hkv, Tk, D}, dt, -1, 1, seed + 20 + causal);
        c.out[0] = spec(4, (int64_t[]){B, H, Tq, D}, dt);
        c.out[1] = spec(3, (int64_t[]){B, H, Tq}, FM_F32);
        run_case(&c, dt);
        fm_tensor *q32 = fm_to_dtype(c.in[0], FM_F32), *k32 = fm_to_dtype(c.in[1], FM_F32), *v32 = fm_to_dtype(c.in[2], FM_F32);
        fm_tensor *o = fm_tensor_empty(4, (int64_t[]){B, H, Tq, D}, FM_F32, FM_CPU);
        fm_tensor *lse = fm_tensor_empty(3, (int64_t[]){B, H, Tq}, FM_F32, FM_CPU);
        fm_op_call fc = {.op = FM_OP_SDPA, .n_in = 3, .n_out = 2, .in = {q32, k32, v32}, .out = {o, lse}, .attrs = &sa};
        if (fm_dispatch(&fc) == FM_OK) {
            conf_case b = {.label = lb, .op = FM_OP_SDPA_BACKWARD, .n_in = 6, .n_out = 3, .attrs = &sa};
            b.in[0] = rand_tensor(4, (int64_t[]){B, H, Tq, D}, dt, -1, 1, seed + 30 + causal);
            b.in[1] = fm_tensor_retain(c.in[0]);
            b.in[2] = fm_tensor_retain(c.in[1]);
            b.in[3] = fm_tensor_retain(c.in[2]);
            b.in[4] = dt == FM_F32 ? fm_tensor_retain(o) : fm_to_dtype(o, dt);
            b.in[5] = fm_tensor_retain(lse);
            b.out[0] = spec(4, (int64_t[]){B, H, Tq, D}, dt);
            b.out[1] = spec(4, (int64_t[]){B, Hkv, Tk, D}, dt);
            b.out[2] = spec(4, (int64_t[]){B, Hkv, Tk, D}, dt);
            run_case(&b, dt);
            case_free(&b);
        } else {
            CHECK_MSG(0, "%s: cpu forward for the backward case failed: %s", lf, fm_last_error());
        }
        fm_tensor_release_n(5, q32, k32, v32, o, lse);
        case_free(&c);
    }
}

/* The tiled and the reference kernels on the same device inputs: forward outputs (o, lse)
 * and the three gradients agree within 1e-6 (f32) or 1e-3 (bf16/f16) normalized squared
 * error. GPU only (the cpu side of both is sdpa_cases'). */
static void sdpa_tiled_vs_reference(fm_dtype dt, int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D,
                                    uint64_t seed) {
    if (g_cpu_only) return;
    const fm_device cu = {FM_DEV_CUDA, 0};
    const double tol = dt == FM_F32 ? 1e-6 : 1e-3;
    const int64_t qs[4] = {B, H, Tq, D}, ks[4] = {B, Hkv, Tk, D}, ls[3] = {B, H, Tq};
    for (int causal = 0; causal < 2; causal++) {
        fm_sdpa_attrs sa = {causal, 0, FM_F32};
        fm_tensor *in[4] = {rand_tensor(4, qs, dt, -1, 1, seed + 40 + causal), rand_tensor(4, ks, dt, -1, 1, seed + 50 + causal),
                            rand_tensor(4, ks, dt, -1, 1, seed + 60 + causal), rand_tensor(4, qs, dt, -1, 1, seed + 70 + causal)};
        fm_tensor *gin[4], *out[3][5] = {{0}};
        for (int i = 0; i < 4; i++) gin[i] = fm_tensor_to(in[i], cu);
        static const char *const kname[3] = {"reference", "tiled", "tensor cores"};
        for (int tiled = 0; tiled < 3; tiled++) {
            fm_cuda_attention_set_tiled(tiled);
            fm_tensor **r = out[tiled];
            r[0] = fm_tensor_empty(4, qs, dt, cu);
            r[1] = fm_tensor_empty(3, ls, FM_F32, cu);
            fm_op_call f = {.op = FM_OP_SDPA, .n_in = 3, .n_out = 2, .in = {gin[0], gin[1], gin[2]}, .out = {r[0], r[1]}, .attrs = &sa};
            CHECK_MSG(fm_dispatch(&f) == FM_OK, "sdpa %s: %s", kname[tiled], fm_last_error());
            /* both backwards from the reference's forward, so only the backward kernels differ */
            r[2] = fm_tensor_empty(4, qs, dt, cu);
            r[3] = fm_tensor_empty(4, ks, dt, cu);
            r[4] = fm_tensor_empty(4, ks, dt, cu);
            fm_op_call bw = {.op = FM_OP_SDPA_BACKWARD, .n_in = 6, .n_out = 3,
                             .in = {gin[3], gin[0], gin[1], gin[2], out[0][0], out[0][1]}, .out = {r[2], r[3], r[4]}, .attrs = &sa};
            CHECK_MSG(fm_dispatch(&bw) == FM_OK, "sdpa_backward %s: %s", kname[tiled], fm_last_error());
        }
        fm_cuda_attention_set_tiled(1);
        CHECK(fm_backend_get(FM_DEV_CUDA)->synchronize(0) == FM_OK);
        static const char *const names[5] = {"out", "lse", "dq", "dk", "dv"};
        for (int m = 1; m < 3; m++)
        for (int k = 0; k < 5; k++) {
            fm_tensor *a = out[0][k] ? fm_tensor_to(out[0][k], FM_CPU) : NULL, *b = out[m][k] ? fm_tensor_to(out[m][k], FM_CPU) : NULL;
            fm_tensor *a32 = a ? fm_to_dtype(a, FM_F32) : NULL, *b32 = b ? fm_to_dtype(b, FM_F32) : NULL;
            int nonfinite = 0, nanmis = 0;
            double e = a32 && b32 ? nse(b32, a32, &nonfinite, &nanmis) : INFINITY;
            CHECK_MSG(e <= tol && nonfinite == 0 && nanmis == 0,
                      "sdpa %s vs reference [%s] %lldx%lldx%lld/%lld D%lld%s: %s nse %.3g (tol %g), %d non-finite",
                      kname[m], fm_dtype_name(dt), (long long)H, (long long)Tq, (long long)Tk, (long long)Hkv, (long long)D,
                      causal ? " causal" : "", names[k], e, tol, nonfinite);
            fm_tensor_release_n(4, a, b, a32, b32);
        }
        for (int t = 0; t < 3; t++)
            for (int k = 0; k < 5; k++) fm_tensor_release(out[t][k]);
        for (int i = 0; i < 4; i++) fm_tensor_release_n(2, in[i], gin[i]);
    }
}

static void conformance(fm_dtype dt) {
    /* the elementwise lists come from ops.def's groups, as the CUDA backend registers them */
    fm_op_id unary[FM_OP_COUNT], binary[FM_OP_COUNT];
    int n_unary = ops_in_groups(FM_GROUP_UNARY, FM_GROUP_ACT, unary), n_binary = ops_in_groups(FM_GROUP_BINARY, FM_GROUP_COMPARE, binary);
    unary[n_unary++] = FM_OP_COPY;
    fm_unary_attrs ua = {0.1, 0.5};
    int64_t s23[] = {37, 129}, s1[] = {129}, s3[] = {4, 37, 129};
    for (int k = 0; k < n_unary; k++) {
        conf_case c = {.label = fm_op_get_info(unary[k])->name, .op = unary[k], .n_in = 1, .n_out = 1, .attrs = &ua};
        fm_op_id o = unary[k];
        bool pos = o == FM_OP_LOG || o == FM_OP_SQRT || o == FM_OP_RSQRT, unit = o == FM_OP_ASIN || o == FM_OP_ACOS || o == FM_OP_ATANH;
        /* each op's domain: x > 0, |x| < 1, x > 1 (acosh) or [-3, 3] */
        double lo = pos ? 0.1 : unit ? -0.9 : o == FM_OP_ACOSH ? 1.1 : -3, hi = unit ? 0.9 : 3;
        fm_tensor *base = rand_tensor(2, (int64_t[]){129, 37}, dt, lo, hi, 11 + k);
        c.in[0] = fm_transpose(base, 0, 1); /* a strided input */
        fm_tensor_release(base);
        c.out[0] = spec(2, s23, dt);
        run_case(&c, dt);
        /* unary backward of the same op: in = {dy, x, y=NULL} */
        fm_unary_bwd_attrs ba = {unary[k], ua};
        conf_case b = {.label = "unary_backward", .op = FM_OP_UNARY_BACKWARD, .n_in = 3, .n_out = 1, .attrs = &ba};
        b.in[0] = rand_tensor(2, s23, dt, -1, 1, 99 + k);
        b.in[1] = fm_tensor_retain(c.in[0]);
        b.out[0] = spec(2, s23, dt);
        run_case(&b, dt);
        case_free(&b);
        case_free(&c);
        /* contiguous, 16-byte rows: the vector path (ew_vec_kernel) */
        conf_case v = {.label = fm_op_get_info(unary[k])->name, .op = unary[k], .n_in = 1, .n_out = 1, .attrs = &ua};
        int64_t sv[2] = {6, 64};
        v.in[0] = rand_tensor(2, sv, dt, lo, hi, 150 + k);
        v.out[0] = spec(2, sv, dt);
        run_case(&v, dt);
        case_free(&v);
    }
    for (int k = 0; k < n_binary; k++) { /* the vector path: same shape, then a row (a bias) */
        if (fm_op_get_info(binary[k])->group == FM_GROUP_COMPARE) continue;
        int64_t sv[3] = {3, 6, 64}, sr[1] = {64};
        for (int row = 0; row < 2; row++) {
            conf_case c = {.label = fm_op_get_info(binary[k])->name, .op = binary[k], .n_in = 2, .n_out = 1};
            c.in[0] = rand_tensor(3, sv, dt, binary[k] == FM_OP_POW ? 0.1 : -2, 2, 250 + k);
            c.in[1] = row ? rand_tensor(1, sr, dt, 0.5, 2, 350 + k) : rand_tensor(3, sv, dt, 0.5, 2, 360 + k);
            c.out[0] = spec(3, sv, dt);
            run_case(&c, dt);
            case_free(&c);
        }
    }
    for (int k = 0; k < n_binary; k++) {
        conf_case c = {.label = fm_op_get_info(binary[k])->name, .op = binary[k], .n_in = 2, .n_out = 1};
        c.in[0] = rand_tensor(3, s3, dt, binary[k] == FM_OP_POW ? 0.1 : -2, 2, 200 + k);
        c.in[1] = rand_tensor(1, s1, dt, 0.5, 2, 300 + k); /* broadcast */
        bool cmp = fm_op_get_info(binary[k])->group == FM_GROUP_COMPARE;
        c.out[0] = spec(3, s3, cmp ? FM_BOOL : dt);
        run_case(&c, dt);
        case_free(&c);
    }
    {   /* where with a broadcast condition */
        conf_case c = {.label = "where", .op = FM_OP_WHERE, .n_in = 3, .n_out = 1};
        fm_tensor *r = rand_tensor(1, s1, FM_F32, -1, 1, 400);
        fm_tensor *z = fm_tensor_zeros(1, s1, FM_F32, FM_CPU);
        c.in[0] = fm_gt(r, z);
        fm_tensor_release_n(2, r, z);
        c.in[1] = rand_tensor(3, s3, dt, -1, 1, 401);
        c.in[2] = rand_tensor(3, s3, dt, -1, 1, 402);
        c.out[0] = spec(3, s3, dt);
        run_case(&c, dt);
        case_free(&c);
    }
    {   /* the REDUCE group: over the middle axis, the last axis, and everything; the ones
         * along one dim (max_dim, min_dim, argmax) along each of the last two */
        fm_op_id red[FM_OP_COUNT];
        int n_red = ops_in_groups(FM_GROUP_REDUCE, FM_GROUP_REDUCE, red);
        unsigned masks[] = {2u, 4u, 7u};
        for (int k = 0; k < n_red; k++)
            for (int m = 0; m < 3; m++) {
                if (red[k] == FM_OP_MAX_DIM || red[k] == FM_OP_MIN_DIM || red[k] == FM_OP_ARGMAX) break;
                fm_reduce_attrs ra = {masks[m], 1};
                conf_case c = {.label = fm_op_get_info(red[k])->name, .op = red[k], .n_in = 1, .n_out = 1, .attrs = &ra};
                c.in[0] = rand_tensor(3, s3, dt, -2, 2, 500 + k);
                int64_t os[3] = {masks[m] & 1 ? 1 : 4, masks[m] & 2 ? 1 : 37, masks[m] & 4 ? 1 : 129};
                c.out[0] = spec(3, os, dt);
                run_case(&c, dt);
                case_free(&c);
            }
        /* sums and means down long columns (the row-chunked kernels): a middle axis of 700
         * with 3 outer blocks, the first two axes (a bias gradient's shape), one axis of 1000 */
        static const int64_t lc[3][4] = {{3, 700, 45, 2}, {6, 350, 45, 3}, {1000, 300, 1, 1}};
        for (int i = 0; i < 3; i++)
            for (int mean = 0; mean < 2; mean++) {
                fm_reduce_attrs ra = {(unsigned)lc[i][3], 1};
                int64_t is[3] = {lc[i][0], lc[i][1], lc[i][2]};
                int64_t os[3] = {ra.axes_mask & 1 ? 1 : is[0], ra.axes_mask & 2 ? 1 : is[1], ra.axes_mask & 4 ? 1 : is[2]};
                conf_case c = {.label = mean ? "mean (long columns)" : "sum (long columns)", .op = mean ? FM_OP_MEAN : FM_OP_SUM,
                               .n_in = 1, .n_out = 1, .attrs = &ra};
                c.in[0] = rand_tensor(3, is, dt, -2, 2, 560 + (uint64_t)(2 * i + mean));
                c.out[0] = spec(3, os, dt);
                run_case(&c, dt);
                case_free(&c);
            }
        for (int ax = 1; ax < 3; ax++) {
            fm_dim_attrs da = {ax};
            int64_t os[3] = {4, ax == 1 ? 1 : 37, ax == 2 ? 1 : 129};
            for (int mn = 0; mn < 2; mn++) {
                conf_case c = {.label = mn ? "min_dim" : "max_dim", .op = mn ? FM_OP_MIN_DIM : FM_OP_MAX_DIM, .n_in = 1, .n_out = 2, .attrs = &da};
                c.in[0] = rand_tensor(3, s3, dt, -2, 2, 600 + ax + 10 * mn);
                c.out[0] = spec(3, os, dt);
                c.out[1] = spec(3, os, FM_I64);
                run_case(&c, dt);
                case_free(&c);
            }
            conf_case a = {.label = "argmax", .op = FM_OP_ARGMAX, .n_in = 1, .n_out = 1, .attrs = &da};
            a.in[0] = rand_tensor(3, s3, dt, -2, 2, 600 + ax);
            a.out[0] = spec(3, os, FM_I64);
            run_case(&a, dt);
            case_free(&a);
            /* topk: a few largest, the smallest, and (axis 1) the whole axis sorted; ties of the
             * half types come lower index first on both */
            for (int q = 0; q < 3; q++) {
                fm_topk_attrs ta = {q == 2 ? s3[ax] : 5 + q, ax, q != 1};
                int64_t ks[3] = {s3[0], s3[1], s3[2]};
                ks[ax] = ta.k;
                if (q == 2 && ax == 2) continue;
                conf_case tk = {.label = "topk", .op = FM_OP_TOPK, .n_in = 1, .n_out = 2, .attrs = &ta};
                tk.in[0] = rand_tensor(3, s3, dt, -2, 2, 620 + ax + 10 * q);
                tk.out[0] = spec(3, ks, dt);
                tk.out[0].exact = 1;
                tk.out[1] = spec(3, ks, FM_I64);
                run_case(&tk, dt);
                case_free(&tk);
            }
        }
    }
    {   /* matmul: plain, transposed operand, batch broadcast */
        int64_t M = 67, K = 129, N = 45;
        conf_case c = {.label = "matmul", .op = FM_OP_MATMUL, .n_in = 2, .n_out = 1};
        c.in[0] = rand_tensor(2, (int64_t[]){M, K}, dt, -1, 1, 700);
        fm_tensor *bt = rand_tensor(2, (int64_t[]){N, K}, dt, -1, 1, 701);
        c.in[1] = fm_transpose(bt, 0, 1);
        fm_tensor_release(bt);
        c.out[0] = spec(2, (int64_t[]){M, N}, dt);
        run_case(&c, dt);
        case_free(&c);
        conf_case b = {.label = "matmul batched+broadcast", .op = FM_OP_MATMUL, .n_in = 2, .n_out = 1};
        fm_tensor *a3 = rand_tensor(3, (int64_t[]){3, M, K}, dt, -1, 1, 702);
        fm_tensor *b2 = rand_tensor(3, (int64_t[]){1, K, N}, dt, -1, 1, 703);
        b.in[0] = a3;
        b.in[1] = fm_expand(b2, 3, (int64_t[]){3, K, N});
        fm_tensor_release(b2);
        b.out[0] = spec(3, (int64_t[]){3, M, N}, dt);
        run_case(&b, dt);
        case_free(&b);
    }
    {   /* softmax family */
        fm_softmax_attrs sa = {1};
        int64_t s[] = {33, 1000};
        fm_op_id f[] = {FM_OP_SOFTMAX, FM_OP_LOG_SOFTMAX}, bw[] = {FM_OP_SOFTMAX_BACKWARD, FM_OP_LOG_SOFTMAX_BACKWARD};
        for (int k = 0; k < 2; k++) {
            conf_case c = {.label = fm_op_get_info(f[k])->name, .op = f[k], .n_in = 1, .n_out = 1, .attrs = &sa};
            c.in[0] = rand_tensor(2, s, dt, -5, 5, 800 + k);
            c.out[0] = spec(2, s, dt);
            run_case(&c, dt);
            conf_case b = {.label = fm_op_get_info(bw[k])->name, .op = bw[k], .n_in = 2, .n_out = 1, .attrs = &sa};
            b.in[0] = rand_tensor(2, s, dt, -1, 1, 810 + k);
            b.in[1] = rand_tensor(2, s, dt, k ? -5 : 0, k ? -0.1 : 0.01, 820 + k);
            b.out[0] = spec(2, s, dt);
            run_case(&b, dt);
            case_free(&b);
            case_free(&c);
        }
    }
    {   /* cross-entropy (+ backward), each reduction, ignore_index and smoothing */
        int64_t N = 50, C = 1003;
        for (int red = 0; red < 3; red++) {
            fm_ce_attrs ca = {3, red == 1 ? 0.1 : 0.0, (fm_reduction)red};
            conf_case c = {.label = "cross_entropy", .op = FM_OP_CROSS_ENTROPY, .n_in = 2, .n_out = 1, .attrs = &ca};
            c.in[0] = rand_tensor(2, (int64_t[]){N, C}, dt, -4, 4, 900 + red);
            c.in[1] = index_tensor(1, &N, C, 901);
            ((int64_t *)c.in[1]->storage->data)[7] = 3; /* an ignored row */
            int64_t os = N;
            c.out[0] = spec(red == FM_REDUCE_NONE ? 1 : 0, &os, dt);
            run_case(&c, dt);
            conf_case b = {.label = "cross_entropy_backward", .op = FM_OP_CROSS_ENTROPY_BACKWARD, .n_in = 3, .n_out = 1, .attrs = &ca};
            b.in[0] = red == FM_REDUCE_NONE ? rand_tensor(1, &N, dt, 0, 1, 902) : rand_tensor(0, NULL, dt, 0.5, 1, 903);
            b.in[1] = fm_tensor_retain(c.in[0]);
            b.in[2] = fm_tensor_retain(c.in[1]);
            b.out[0] = spec(2, (int64_t[]){N, C}, dt);
            run_case(&b, dt);
            case_free(&b);
            case_free(&c);
        }
        fm_mse_attrs ma = {FM_REDUCE_MEAN};
        conf_case m = {.label = "mse_loss", .op = FM_OP_MSE_LOSS, .n_in = 2, .n_out = 1, .attrs = &ma};
        m.in[0] = rand_tensor(2, s23, dt, -1, 1, 950);
        m.in[1] = rand_tensor(2, s23, dt, -1, 1, 951);
        m.out[0] = spec(0, NULL, dt);
        run_case(&m, dt);
        case_free(&m);
    }
    {   /* layer norm and RMS norm (+ backward) */
        int64_t M = 70, N = 768;
        fm_norm_attrs na = {1e-5};
        fm_dtype sdt = FM_F32;
        conf_case c = {.label = "layer_norm", .op = FM_OP_LAYER_NORM, .n_in = 3, .n_out = 3, .attrs = &na};
        c.in[0] = rand_tensor(2, (int64_t[]){M, N}, dt, -2, 3, 1000);
        c.in[1] = rand_tensor(1, &N, dt, 0.5, 1.5, 1001);
        c.in[2] = rand_tensor(1, &N, dt, -0.5, 0.5, 1002);
        c.out[0] = spec(2, (int64_t[]){M, N}, dt);
        c.out[1] = spec(1, &M, sdt);
        c.out[2] = spec(1, &M, sdt);
        run_case(&c, dt);
        /* backward with the reference statistics computed on the cpu */
        fm_tensor *x32 = fm_to_dtype(c.in[0], FM_F32), *mean = fm_mean(x32, 1, (int[]){1}, false);
        fm_tensor *var = fm_var(x32, 1, (int[]){1}, 0, false), *ve = fm_add_scalar(var, 1e-5), *rstd = fm_rsqrt(ve);
        conf_case b = {.label = "layer_norm_backward", .op = FM_OP_LAYER_NORM_BACKWARD, .n_in = 5, .n_out = 3, .attrs = &na};
        b.in[0] = rand_tensor(2, (int64_t[]){M, N}, dt, -1, 1, 1003);
        b.in[1] = fm_tensor_retain(c.in[0]);
        b.in[2] = fm_tensor_retain(c.in[1]);
        b.in[3] = fm_tensor_retain(mean);
        b.in[4] = fm_tensor_retain(rstd);
        b.out[0] = spec(2, (int64_t[]){M, N}, dt);
        b.out[1] = spec(1, &N, dt);
        b.out[2] = spec(1, &N, dt);
        run_case(&b, dt);
        conf_case r = {.label = "rms_norm", .op = FM_OP_RMS_NORM, .n_in = 2, .n_out = 2, .attrs = &na};
        r.in[0] = fm_tensor_retain(c.in[0]);
        r.in[1] = fm_tensor_retain(c.in[1]);
        r.out[0] = spec(2, (int64_t[]){M, N}, dt);
        r.out[1] = spec(1, &M, sdt);
        run_case(&r, dt);
        fm_tensor *sq = fm_mul(x32, x32), *ms = fm_mean(sq, 1, (int[]){1}, false), *mse_ = fm_add_scalar(ms, 1e-5);
        fm_tensor *rr = fm_rsqrt(mse_);
        conf_case rb = {.label = "rms_norm_backward", .op = FM_OP_RMS_NORM_BACKWARD, .n_in = 4, .n_out = 2, .attrs = &na};
        rb.in[0] = fm_tensor_retain(b.in[0]);
        rb.in[1] = fm_tensor_retain(c.in[0]);
        rb.in[2] = fm_tensor_retain(c.in[1]);
        rb.in[3] = fm_tensor_retain(rr);
        rb.out[0] = spec(2, (int64_t[]){M, N}, dt);
        rb.out[1] = spec(1, &N, dt);
        run_case(&rb, dt);
        fm_tensor_release_n(9, x32, mean, var, ve, rstd, sq, ms, mse_, rr);
        case_free(&rb);
        case_free(&r);
        case_free(&b);
        case_free(&c);
    }
    {   /* embedding (+ backward) and dropout (masks must match exactly) */
        int64_t V = 300, D = 96, n = 77;
        conf_case e = {.label = "embedding", .op = FM_OP_EMBEDDING, .n_in = 2, .n_out = 1};
        e.in[0] = rand_tensor(2, (int64_t[]){V, D}, dt, -1, 1, 1100);
        e.in[1] = index_tensor(1, &n, V, 1101);
        e.out[0] = spec(2, (int64_t[]){n, D}, dt);
        run_case(&e, dt);
        conf_case eb = {.label = "embedding_backward", .op = FM_OP_EMBEDDING_BACKWARD, .n_in = 2, .n_out = 1};
        eb.in[0] = rand_tensor(2, (int64_t[]){n, D}, dt, -1, 1, 1102);
        eb.in[1] = fm_tensor_retain(e.in[1]);
        eb.out[0] = spec(2, (int64_t[]){V, D}, dt);
        run_case(&eb, dt);
        fm_dropout_attrs da = {0.3, 1234, 77};
        conf_case d = {.label = "dropout", .op = FM_OP_DROPOUT, .n_in = 1, .n_out = 2, .attrs = &da};
        d.in[0] = rand_tensor(2, s23, dt, -1, 1, 1103);
        d.out[0] = spec(2, s23, dt);
        d.out[1] = spec(2, s23, FM_U8);
        d.out[1].exact = 1;
        run_case(&d, dt);
        case_free(&d);
        case_free(&eb);
        case_free(&e);
    }
    /* attention (+ backward): causal and not, grouped-query, with the default (tiled) kernels */
    sdpa_cases(dt, 2, 4, 2, 70, 70, 64, 1200, "");
    /* the tiled kernels against the cpu and against the warp-per-row reference: T not a multiple
     * of the tile (32) nor of the row blocks (16, 8), grouped-query 4:1 and 3 heads per kv head,
     * head dims 64 and 128, Tq < Tk and Tq > Tk (top-left causal), and D = 96 (lanes past D idle) */
    static const int64_t shapes[][6] = {{1, 4, 1, 37, 37, 64}, {2, 2, 2, 70, 70, 128}, {1, 2, 1, 5, 45, 64},
                                        {1, 6, 2, 129, 129, 128}, {1, 2, 2, 33, 33, 96}, {1, 2, 1, 45, 5, 64}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const int64_t *z = shapes[i];
        static const char *const kernels[3] = {" reference", " tiled", " tensor cores"};
        for (int mode = 0; mode < 3; mode++) {
            fm_cuda_attention_set_tiled(mode);
            sdpa_cases(dt, z[0], z[1], z[2], z[3], z[4], z[5], 1300 + 10 * (uint64_t)i, kernels[mode]);
        }
        fm_cuda_attention_set_tiled(1);
        sdpa_tiled_vs_reference(dt, z[0], z[1], z[2], z[3], z[4], z[5], 1300 + 10 * (uint64_t)i);
    }
    {   /* indexing */
        fm_axis_attrs aa = {1};
        int64_t n = 20;
        conf_case c = {.label = "index_select", .op = FM_OP_INDEX_SELECT, .n_in = 2, .n_out = 1, .attrs = &aa};
        c.in[0] = rand_tensor(3, s3, dt, -1, 1, 1300);
        c.in[1] = index_tensor(1, &n, 37, 1301);
        c.out[0] = spec(3, (int64_t[]){4, n, 129}, dt);
        run_case(&c, dt);
        case_free(&c);
        fm_one_hot_attrs oa = {10};
        conf_case o = {.label = "one_hot", .op = FM_OP_ONE_HOT, .n_in = 1, .n_out = 1, .attrs = &oa};
        o.in[0] = index_tensor(1, &n, 10, 1302);
        o.out[0] = spec(2, (int64_t[]){n, 10}, FM_F32);
        run_case(&o, dt);
        case_free(&o);
    }
    for (int m = 0; m < 4; m++) { /* cumsum along the middle and last axes, each mode; an i64 one exact */
        fm_cumsum_attrs ca = {m < 2 ? 1 : 2, (m & 1) != 0, m >= 2};
        conf_case c = {.label = "cumsum", .op = FM_OP_CUMSUM, .n_in = 1, .n_out = 1, .attrs = &ca};
        c.in[0] = rand_tensor(3, (int64_t[]){4, 37, 129}, dt, -1, 1, 1310 + m);
        c.out[0] = spec(3, (int64_t[]){4, 37, 129}, dt);
        run_case(&c, dt);
        case_free(&c);
        conf_case ci = {.label = "cumsum i64", .op = FM_OP_CUMSUM, .n_in = 1, .n_out = 1, .attrs = &ca};
        ci.in[0] = index_tensor(2, (int64_t[]){4, 37}, 1000, 1320 + m);
        ca.axis = 1;
        ci.out[0] = spec(2, (int64_t[]){4, 37}, FM_I64);
        ci.out[0].exact = 1;
        run_case(&ci, dt);
        case_free(&ci);
    }
    {   /* qkv_split_heads (+ backward with a missing dk), grouped-query */
        int64_t B = 2, T = 9, H = 4, KV = 2, D = 16, W = (H + 2 * KV) * D;
        fm_qkv_split_attrs qa = {H, KV, D};
        conf_case c = {.label = "qkv_split_heads", .op = FM_OP_QKV_SPLIT_HEADS, .n_in = 1, .n_out = 3, .attrs = &qa};
        c.in[0] = rand_tensor(3, (int64_t[]){B, T, W}, dt, -1, 1, 1400);
        c.out[0] = spec(4, (int64_t[]){B, H, T, D}, dt);
        c.out[1] = spec(4, (int64_t[]){B, KV, T, D}, dt);
        c.out[2] = spec(4, (int64_t[]){B, KV, T, D}, dt);
        for (int i = 0; i < 3; i++) c.out[i].exact = 1;
        run_case(&c, dt);
        conf_case b = {.label = "qkv_split_heads_backward", .op = FM_OP_QKV_SPLIT_HEADS_BACKWARD, .n_in = 3, .n_out = 1, .attrs = &qa};
        b.in[0] = rand_tensor(4, (int64_t[]){B, H, T, D}, dt, -1, 1, 1401);
        b.in[2] = rand_tensor(4, (int64_t[]){B, KV, T, D}, dt, -1, 1, 1402);
        b.out[0] = spec(3, (int64_t[]){B, T, W}, dt);
        b.out[0].exact = 1;
        run_case(&b, dt);
        case_free(&b);
        case_free(&c);
    }
    for (int inv = 0; inv < 2; inv++) { /* rope and its transpose (the gradient) */
        fm_rope_attrs ra = {inv};
        conf_case r = {.label = inv ? "rope (inverse)" : "rope", .op = FM_OP_ROPE, .n_in = 3, .n_out = 1, .attrs = &ra};
        r.in[0] = rand_tensor(4, (int64_t[]){2, 3, 7, 16}, dt, -2, 2, 1450 + inv);
        r.in[1] = rand_tensor(2, (int64_t[]){7, 16}, dt, -1, 1, 1452);
        r.in[2] = rand_tensor(2, (int64_t[]){7, 16}, dt, -1, 1, 1453);
        r.out[0] = spec(4, (int64_t[]){2, 3, 7, 16}, dt);
        run_case(&r, dt);
        case_free(&r);
    }
    {   /* lstm_cell: 5 rows of 37 hidden units, gates wide enough to saturate */
        conf_case l = {.label = "lstm_cell", .op = FM_OP_LSTM_CELL, .n_in = 3, .n_out = 2};
        l.in[0] = rand_tensor(2, (int64_t[]){5, 148}, dt, -6, 6, 1460);
        l.in[1] = rand_tensor(2, (int64_t[]){5, 148}, dt, -2, 2, 1461);
        l.in[2] = rand_tensor(2, (int64_t[]){5, 37}, dt, -2, 2, 1462);
        l.out[0] = spec(2, (int64_t[]){5, 37}, dt);
        l.out[1] = spec(2, (int64_t[]){5, 37}, dt);
        run_case(&l, dt);
        case_free(&l);
        conf_case gr = {.label = "gru_cell", .op = FM_OP_GRU_CELL, .n_in = 3, .n_out = 1};
        gr.in[0] = rand_tensor(2, (int64_t[]){5, 111}, dt, -6, 6, 1463);
        gr.in[1] = rand_tensor(2, (int64_t[]){5, 111}, dt, -2, 2, 1464);
        gr.in[2] = rand_tensor(2, (int64_t[]){5, 37}, dt, -1, 1, 1465);
        gr.out[0] = spec(2, (int64_t[]){5, 37}, dt);
        run_case(&gr, dt);
        case_free(&gr);
    }
    {   /* bias_gelu_tanh and add_layer_norm (+ backward): 150 rows span several gradient chunks */
        int64_t M = 150, xs[2] = {150, 130}, vs[1] = {130};
        const fm_dtype sdt = dt == FM_F64 ? FM_F64 : FM_F32; /* statistics: f32, f64 for f64 */
        conf_case g = {.label = "bias_gelu_tanh", .op = FM_OP_BIAS_GELU_TANH, .n_in = 2, .n_out = 1};
        g.in[0] = rand_tensor(2, xs, dt, -4, 4, 1500);
        g.in[1] = rand_tensor(1, vs, dt, -1, 1, 1501);
        g.out[0] = spec(2, xs, dt);
        run_case(&g, dt);
        conf_case gb = {.label = "bias_gelu_tanh_backward", .op = FM_OP_BIAS_GELU_TANH_BACKWARD, .n_in = 3, .n_out = 2};
        gb.in[0] = rand_tensor(2, xs, dt, -1, 1, 1502);
        gb.in[1] = fm_tensor_retain(g.in[0]);
        gb.in[2] = fm_tensor_retain(g.in[1]);
        gb.out[0] = spec(2, xs, dt);
        gb.out[1] = spec(1, vs, dt);
        run_case(&gb, dt);
        case_free(&gb);
        case_free(&g);
        fm_norm_attrs na = {1e-5};
        for (int h_null = 0; h_null < 2; h_null++) {
            conf_case a = {.label = h_null ? "add_layer_norm (x alone, no affine)" : "add_layer_norm", .op = FM_OP_ADD_LAYER_NORM,
                           .n_in = 4, .n_out = 4, .attrs = &na};
            a.in[0] = rand_tensor(2, xs, dt, -2, 2, 1510);
            if (!h_null) {
                a.in[1] = rand_tensor(2, xs, dt, 1, 3, 1511);
                a.in[2] = rand_tensor(1, vs, dt, 0.5, 1.5, 1512);
                a.in[3] = rand_tensor(1, vs, dt, -1, 1, 1513);
            }
            a.out[0] = spec(2, xs, dt);
            if (h_null) a.out[0].nd = -1; /* the sum is x itself */
            a.out[1] = spec(2, xs, dt);
            a.out[2] = spec(1, &M, sdt);
            a.out[3] = spec(1, &M, sdt);
            run_case(&a, dt);
            case_free(&a);
            conf_case ab = {.label = h_null ? "add_layer_norm_backward (no dsum)" : "add_layer_norm_backward",
                            .op = FM_OP_ADD_LAYER_NORM_BACKWARD, .n_in = 6, .n_out = 3, .attrs = &na};
            ab.in[0] = rand_tensor(2, xs, dt, -1, 1, 1520);
            if (!h_null) ab.in[1] = rand_tensor(2, xs, dt, -1, 1, 1521);
            ab.in[2] = rand_tensor(2, xs, dt, -2, 2, 1522);
            ab.in[3] = rand_tensor(1, vs, dt, 0.5, 1.5, 1523);
            ab.in[4] = rand_tensor(1, &M, sdt, -0.2, 0.2, 1524);
            ab.in[5] = rand_tensor(1, &M, sdt, 0.5, 1.5, 1525);
            ab.out[0] = spec(2, xs, dt);
            ab.out[1] = spec(1, vs, dt);
            ab.out[2] = spec(1, vs, dt);
            run_case(&ab, dt);
            case_free(&ab);
        }
    }
    conv_cases(dt);
    pool_cases(dt);
    bn_cases(dt);
    index_cases(dt);
    optim_cases(dt);
    quant_cases(dt);
}

/* The quantized ops (f32 activations only): int8 dynamic and static, through
 * cuBLASLt (K, N multiples of 4) and the plain kernel (K = 37), on weights in
 * rows and in panels (with stored row sums and a fused ReLU, or at K = 37 a fused
 * GELU: tanh form dynamic, exact static); the int8 embedding on the panels; int4
 * with and without offsets and bias; the int4 embedding. Weights made by the packers. */
static void quant_cases(fm_dtype dt) {
    if (dt != FM_F32) return;
    const int64_t Ks[2] = {64, 37};
    for (int ki = 0; ki < 2; ki++)
        for (int stat = 0; stat < 2; stat++)
            for (int pk = 0; pk < 2; pk++) {
                int64_t M = 19, N = ki ? 10 : 24, K = Ks[ki], xs[2] = {M, K}, ws[2] = {N, K}, ys[2] = {M, N};
                fm_tensor *w = rand_tensor(2, ws, FM_F32, -1, 1, 1600 + (uint64_t)ki), *q = NULL, *s = NULL, *p = NULL, *u = NULL;
                CHECK(fm_quantize_weight_int8(w, &q, &s) == FM_OK);
                if (pk) CHECK(fm_pack_weight_int8(q, &p, &u) == FM_OK);
                const int act = !pk ? FM_QACT_NONE : !ki ? FM_QACT_RELU : stat ? FM_QACT_GELU : FM_QACT_GELU_TANH;
                fm_qlinear8_attrs at = {stat ? 0.02 : 0.0, stat ? 120 : 0, act, 0};
                const char *act_label[4] = {stat ? "qlinear_int8 (static)" : "qlinear_int8 (dynamic)",
                                            stat ? "qlinear_int8 (static, panels, relu)" : "qlinear_int8 (dynamic, panels, relu)",
                                            "qlinear_int8 (dynamic, panels, tanh gelu)", "qlinear_int8 (static, panels, gelu)"};
                conf_case c = {.label = act_label[act],
                               .op = FM_OP_QLINEAR_INT8, .n_in = 5, .n_out = 1, .attrs = &at};
                c.in[0] = rand_tensor(2, xs, FM_F32, -2, 2.5, 1610);
                c.in[1] = pk ? p : q;
                c.in[2] = s;
                c.in[3] = ki ? NULL : rand_tensor(1, &N, FM_F32, -1, 1, 1611);
                c.in[4] = pk ? u : NULL;
                c.out[0] = spec(2, ys, FM_F32);
                run_case(&c, dt);
                if (pk && !stat) { /* the table lookup on the same panels */
                    int64_t is[2] = {3, 5}, es[3] = {3, 5, K};
                    fm_q8emb_attrs ea = {K};
                    conf_case e = {.label = "qembedding_int8", .op = FM_OP_QEMBEDDING_INT8, .n_in = 3, .n_out = 1, .attrs = &ea,
                                   .keep = 1u << 1};
                    e.in[0] = fm_tensor_retain(p);
                    e.in[1] = fm_tensor_retain(s);
                    e.in[2] = index_tensor(2, is, N, 1612);
                    e.out[0] = spec(3, es, FM_F32);
                    run_case(&e, dt);
                    case_free(&e);
                }
                case_free(&c);
                if (pk) fm_tensor_release(q);
                fm_tensor_release(w);
            }
    for (int wm = 0; wm < 2; wm++) {
        int64_t M = 6, N = 12, K = 128, xs[2] = {M, K}, ws[2] = {N, K}, ys[2] = {M, N};
        fm_tensor *w = rand_tensor(2, ws, FM_F32, -1, 1, 1620), *p = NULL, *s = NULL, *mi = NULL;
        CHECK(fm_quantize_weight_int4(w, 64, wm, &p, &s, &mi) == FM_OK);
        fm_q4_attrs at = {64};
        /* the cpu's AVX2/AVX-512 rows round x to int8 at one scale per group (quant_kernels.h),
         * the cuda kernel multiplies f32 x: for x uniform in [-1, 1] that rounding's normalized
         * squared error is about (1/127)^2/12 / (1/3) = 1.6e-5, over the f32 bound of 1e-6 */
        conf_case c = {.label = wm ? "qlinear_int4 (with min, bias)" : "qlinear_int4", .op = FM_OP_QLINEAR_INT4, .n_in = 5, .n_out = 1, .attrs = &at,
                       .keep = 1u << 2 | 1u << 3, .tol = 1e-4};
        c.in[0] = rand_tensor(2, xs, FM_F32, -1, 1, 1621);
        c.in[1] = p;
        c.in[2] = s;
        c.in[3] = mi;
        c.in[4] = wm ? rand_tensor(1, &N, FM_F32, -1, 1, 1622) : NULL;
        c.out[0] = spec(2, ys, FM_F32);
        run_case(&c, dt);
        int64_t is[2] = {3, 5}, es[3] = {3, 5, K};
        conf_case e = {.label = "qembedding_int4", .op = FM_OP_QEMBEDDING_INT4, .n_in = 4, .n_out = 1, .attrs = &at,
                       .keep = 1u << 1 | 1u << 2};
        e.in[0] = fm_tensor_retain(p);
        e.in[1] = fm_tensor_retain(s);
        e.in[2] = mi ? fm_tensor_retain(mi) : NULL;
        e.in[3] = index_tensor(2, is, N, 1623);
        e.out[0] = spec(3, es, FM_F32);
        run_case(&e, dt);
        case_free(&e);
        case_free(&c);
        fm_tensor_release(w);
    }
}

/* The optimizer's in-place kernels (OPTIM_STEP, SCALE_INPLACE): the same call
 * on cpu copies and cuda copies of a parameter, its gradient and state, then the
 * updated parameter and state compared (two steps, so SGD's non-first momentum
 * branch runs too). Without a device only the cpu side runs. f32 parameters only
 * (what the optimizer takes besides f64); SUM_SQ_BLOCKS goes through run_case. */
/* AdamW over one parameter named "w" (decay 0.1, lr 1e-3). */
static fm_optim *master_opt(fm_tensor *p) {
    fm_optim_config c = fm_optim_default_config(FM_OPTIM_ADAMW);
    c.weight_decay = 0.1;
    fm_optim *o = fm_optim_new(&c);
    int g = o ? fm_optim_add_group(o, c.weight_decay) : -1;
    if (g < 0 || fm_optim_add_param(o, g, "w", p) != FM_OK) { fm_optim_free(o); return NULL; }
    return o;
}

static fm_tensor *opt_slot(fm_optim *o, const char *name) {
    fm_named_list l;
    if (!o || fm_optim_state(o, &l) != FM_OK) return NULL;
    fm_tensor *t = NULL;
    for (int i = 0; i < l.n; i++)
        if (!strcmp(l.items[i].name, name)) t = fm_tensor_retain(l.items[i].tensor);
    fm_named_list_free(&l);
    return t;
}

static bool same_bytes(const fm_tensor *a, const fm_tensor *b) {
    return a && b && a->dtype == b->dtype && fm_tensor_numel(a) == fm_tensor_numel(b) &&
           !memcmp(fm_tensor_data(a), fm_tensor_data(b), (size_t)fm_tensor_numel(a) * fm_dtype_size(a->dtype));
}

static void nse_check(const char *what, fm_tensor *dev, const fm_tensor *ref, double tol) {
    fm_tensor *back = dev ? fm_tensor_to(dev, FM_CPU) : NULL;
    int nonfinite = 0, nanmis = 0;
    double e = back ? nse(back, ref, &nonfinite, &nanmis) : INFINITY;
    CHECK_MSG(e <= tol && nonfinite == 0 && nanmis == 0, "%s: normalized squared error %.3g (bound %g)", what, e, tol);
    fm_tensor_release(back);
}

/* bf16/f16 parameters with f32 master weights, 3 AdamW steps. The cpu half checks the
 * meaning: the optimizer's master ("w.master_weight") is bit for bit the f32 parameter
 * of an f32 run fed the same (16-bit) gradients, and the parameter is that master
 * rounded to nearest even. With a device, the same optimizer on cuda parameters and the
 * fused fm_cuda_adamw_step with masters are compared with the cpu run. */
static void master_weight_cases(void) {
    fm_device cu = {FM_DEV_CUDA, 0};
    int64_t n = 5000;
    fm_dtype dts[2] = {FM_BF16, FM_F16};
    for (int k = 0; k < 2; k++) {
        fm_dtype dt = dts[k];
        const char *dn = fm_dtype_name(dt);
        fm_tensor *p16 = rand_tensor(1, &n, dt, -1, 1, 1700 + k), *p32 = fm_to_dtype(p16, FM_F32);
        fm_tensor *pd = NULL, *pf = NULL, *mf = NULL, *m1 = NULL, *m2 = NULL;
        if (!g_cpu_only) {
            pd = fm_tensor_to(p16, cu);
            pf = fm_tensor_to(p16, cu);
            mf = fm_tensor_to(p32, cu);
            m1 = fm_tensor_zeros(1, &n, FM_F32, cu);
            m2 = fm_tensor_zeros(1, &n, FM_F32, cu);
        }
        fm_tensor_requires_grad_(p16, true);
        fm_tensor_requires_grad_(p32, true);
        if (pd) fm_tensor_requires_grad_(pd, true);
        fm_optim *o16 = master_opt(p16), *o32 = master_opt(p32), *od = pd ? master_opt(pd) : NULL;
        CHECK_MSG(o16 && o32 && (g_cpu_only || od), "master weights %s: optimizer: %s", dn, fm_last_error());
        for (int step = 1; step <= 3 && o16 && o32; step++) {
            fm_tensor *g16 = rand_tensor(1, &n, dt, -1, 1, 1710 + 10 * k + step);
            p16->grad = fm_tensor_retain(g16);
            p32->grad = fm_to_dtype(g16, FM_F32);
            CHECK_MSG(fm_optim_step(o16) == FM_OK && fm_optim_step(o32) == FM_OK, "master weights %s: cpu step: %s", dn, fm_last_error());
            if (od) {
                pd->grad = fm_tensor_to(g16, cu);
                CHECK_MSG(fm_optim_step(od) == FM_OK, "master weights %s: cuda step: %s", dn, fm_last_error());
                fm_tensor *gf = fm_tensor_to(g16, cu);
                fm_adamw_hparams hp = {1e-3, 0.9, 0.999, 1e-8, 0.1, step, 0};
                CHECK_MSG(fm_cuda_adamw_step(1, &pf, &gf, &m1, &m2, &mf, &hp) == FM_OK, "master weights %s: fused: %s", dn, fm_last_error());
                fm_tensor_release(gf);
                fm_optim_zero_grad(od);
            }
            fm_optim_zero_grad(o16);
            fm_optim_zero_grad(o32);
            fm_tensor_release(g16);
        }
        fm_tensor *master = opt_slot(o16, "w.master_weight"), *mom = opt_slot(o16, "w.exp_avg"), *rounded = fm_to_dtype(p32, dt);
        CHECK_MSG(master && master->dtype == FM_F32 && mom && mom->dtype == FM_F32, "master weights %s: f32 master and moments in the state", dn);
        CHECK_MSG(same_bytes(master, p32), "master weights %s: the master is not the f32 run's parameter bit for bit", dn);
        CHECK_MSG(same_bytes(p16, rounded), "master weights %s: the parameter is not its master rounded", dn);
        if (g_cpu_only) g_cpu_cases++;
        else {
            g_gpu_cases++;
            int f0 = t_failures;
            fm_tensor *dmaster = opt_slot(od, "w.master_weight");
            nse_check("master weights: cuda optimizer's master", dmaster, master, 1e-10);
            nse_check("master weights: cuda optimizer's parameter", pd, p16, 1e-6);
            nse_check("master weights: fused adamw's master", mf, master, 1e-10);
            nse_check("master weights: fused adamw's parameter", pf, p16, 1e-6);
            fm_tensor_release(dmaster);
            printf("master weights %s (the optimizer on cuda, fused adamw) vs cpu: %s\n", dn, t_failures == f0 ? "pass" : "FAIL");
        }
        fm_optim_free(o16);
        fm_optim_free(o32);
        fm_optim_free(od);
        fm_tensor_release_n(5, master, mom, rounded, p16, p32);
        fm_tensor_release_n(5, pd, pf, mf, m1, m2);
    }
}

static void optim_cases(fm_dtype dt) {
    if (dt != FM_F32) return;
    master_weight_cases();
    fm_device cu = {FM_DEV_CUDA, 0};
    int64_t n = 20000; /* three SUM_SQ blocks, the last partial */
    const char *names[] = {"optim_step sgd", "optim_step sgd nesterov", "optim_step adam", "optim_step adamw"};
    for (int k = 0; k < 4; k++) {
        fm_optim_step_attrs a = {.kind = k < 2 ? 0 : k - 1, .nesterov = k == 1, .lr = 0.01, .wd = 0.02, .momentum = 0.9,
                                 .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
        fm_tensor *h[4] = {rand_tensor(1, &n, dt, -1, 1, 1600 + k), rand_tensor(1, &n, dt, -1, 1, 1610 + k),
                           rand_tensor(1, &n, dt, -0.1, 0.1, 1620 + k), rand_tensor(1, &n, dt, 0, 0.01, 1630 + k)};
        if (a.kind == 0) { fm_tensor_release(h[3]); h[3] = NULL; }
        fm_tensor *d[4] = {0};
        for (int i = 0; i < 4 && !g_cpu_only; i++) d[i] = h[i] ? fm_tensor_to(h[i], cu) : NULL;
        g_has_case[FM_OP_OPTIM_STEP] = true;
        for (int step = 1; step <= 2; step++) {
            a.first = step == 1;
            a.bc1 = 1 - pow(a.beta1, step);
            a.bc2 = 1 - pow(a.beta2, step);
            fm_op_call hc = {.op = FM_OP_OPTIM_STEP, .n_in = 4, .in = {h[0], h[1], h[2], h[3]}, .attrs = &a};
            CHECK_MSG(fm_dispatch(&hc) == FM_OK, "%s: cpu: %s", names[k], fm_last_error());
            if (g_cpu_only) continue;
            fm_op_call gc = {.op = FM_OP_OPTIM_STEP, .n_in = 4, .in = {d[0], d[1], d[2], d[3]}, .attrs = &a};
            CHECK_MSG(fm_dispatch(&gc) == FM_OK, "%s: cuda: %s", names[k], fm_last_error());
        }
        if (g_cpu_only) g_cpu_cases++;
        else g_gpu_cases++;
        for (int i = 0; i < 4 && !g_cpu_only; i++) {
            if (!h[i] || i == 1) continue;
            fm_tensor *back = d[i] ? fm_tensor_to(d[i], FM_CPU) : NULL;
            int nonfinite = 0, nanmis = 0;
            double e = back ? nse(back, h[i], &nonfinite, &nanmis) : INFINITY;
            CHECK_MSG(e <= 1e-10 && nonfinite == 0 && nanmis == 0, "%s: tensor %d: normalized squared error %.3g", names[k], i, e);
            fm_tensor_release(back);
        }
        for (int i = 0; i < 4; i++) fm_tensor_release_n(2, h[i], d[i]);
    }
    conf_case q = {.label = "sum_sq_blocks", .op = FM_OP_SUM_SQ_BLOCKS, .n_in = 1, .n_out = 1};
    int64_t nb = (n + FM_SUM_SQ_BLOCK - 1) / FM_SUM_SQ_BLOCK;
    q.in[0] = rand_tensor(1, &n, dt, -3, 3, 1640);
    q.out[0] = spec(1, &nb, FM_F64);
    run_case(&q, dt);
    case_free(&q);
    fm_scale_attrs sa = {0.37};
    fm_tensor *hx = rand_tensor(1, &n, dt, -3, 3, 1650), *dx = g_cpu_only ? NULL : fm_tensor_to(hx, cu);
    g_has_case[FM_OP_SCALE_INPLACE] = true;
    fm_op_call hs = {.op = FM_OP_SCALE_INPLACE, .n_in = 1, .in = {hx}, .attrs = &sa};
    CHECK_MSG(fm_dispatch(&hs) == FM_OK, "scale_inplace: cpu: %s", fm_last_error());
    if (!g_cpu_only) {
        fm_op_call gs = {.op = FM_OP_SCALE_INPLACE, .n_in = 1, .in = {dx}, .attrs = &sa};
        CHECK_MSG(fm_dispatch(&gs) == FM_OK, "scale_inplace: cuda: %s", fm_last_error());
        fm_tensor *back = fm_tensor_to(dx, FM_CPU);
        int nonfinite = 0, nanmis = 0;
        double e = back ? nse(back, hx, &nonfinite, &nanmis) : INFINITY;
        CHECK_MSG(e == 0 && nonfinite == 0, "scale_inplace: normalized squared error %.3g (one f32 multiply: exact)", e);
        fm_tensor_release(back);
        g_gpu_cases++;
    } else {
        g_cpu_cases++;
    }
    fm_tensor_release_n(2, hx, dx);
}

/* Errors the GPU path must report like the CPU: bad targets, missing kernels. */
/* Every op the CUDA backend claims must have had a conformance case: with a device,
 * the ops its kernel table fills; without one, the ops it claims by ops.def group
 * (fm_cuda_kernels_elementwise and _reduce register every UNARY, ACT, BINARY, COMPARE
 * and REDUCE op), so a new op of those groups cannot go untested. Returns the count
 * of claimed ops without a case. */
static int coverage_check(const fm_backend *cuda) {
    int missing = 0;
    for (int op = 0; op < FM_OP_COUNT; op++) {
        const fm_op_info *info = fm_op_get_info((fm_op_id)op);
        bool claimed = cuda ? cuda->kernels[op] != NULL
                            : info->group != FM_GROUP_OTHER;
        if (!claimed || g_has_case[op]) continue;
        missing++;
        CHECK_MSG(false, "%s has a CUDA kernel but no conformance case in tests/test_cuda.c", info->name);
    }
    return missing;
}

static void gpu_errors(void) {
    fm_device cu = {FM_DEV_CUDA, 0};
    int64_t N = 4, C = 5;
    fm_tensor *x = rand_tensor(2, (int64_t[]){N, C}, FM_F32, -1, 1, 1);
    fm_tensor *t = index_tensor(1, &N, C, 2);
    ((int64_t *)t->storage->data)[2] = 9;
    fm_tensor *gx = fm_tensor_to(x, cu), *gt = fm_tensor_to(t, cu);
    /* the op does not wait for the device: the bad target is reported at the next host
     * read of that device (the loss, read once per step), in the CPU's words */
    fm_tensor *loss = fm_cross_entropy(gx, gt, -100, 0, FM_REDUCE_MEAN);
    CHECK(loss != NULL);
    fm_tensor *hl = loss ? fm_tensor_to(loss, FM_CPU) : NULL;
    CHECK(hl == NULL);
    CHECK_ERR_CONTAINS("target 9 at position 2 is out of range [0, 5)");
    fm_tensor *again = loss ? fm_tensor_to(loss, FM_CPU) : NULL; /* reported once: the next read succeeds */
    CHECK(again != NULL);
    fm_tensor_release_n(7, x, t, gx, gt, loss, hl, again);
    /* embedding: the same, for an index outside the table */
    fm_tensor *w = rand_tensor(2, (int64_t[]){5, 3}, FM_F32, -1, 1, 4), *ix = index_tensor(1, &N, 5, 5);
    ((int64_t *)ix->storage->data)[1] = 7;
    fm_tensor *gw = fm_tensor_to(w, cu), *gix = fm_tensor_to(ix, cu);
    fm_tensor *emb = fm_embedding(gw, gix), *he = emb ? fm_tensor_to(emb, FM_CPU) : NULL;
    CHECK(emb != NULL && he == NULL);
    CHECK_ERR_CONTAINS("index 7 at position 1 is out of range [0, 5)");
    fm_tensor_release_n(6, w, ix, gw, gix, emb, he);
    /* an op without a cuda kernel (if any is left) names itself and the device */
    const fm_backend *cb = fm_backend_get(FM_DEV_CUDA);
    for (int op = 0; op < FM_OP_COUNT; op++) {
        if (cb->kernels[op]) continue;
        fm_tensor *a = rand_tensor(1, &N, FM_F32, 0, 1, 3), *ga = fm_tensor_to(a, cu), *gy = fm_tensor_empty(1, &N, FM_F32, cu);
        fm_op_call call = {.op = (fm_op_id)op, .n_in = 1, .n_out = 1, .in = {ga}, .out = {gy}};
        CHECK(fm_dispatch(&call) != FM_OK);
        CHECK_ERR_CONTAINS("not implemented on cuda");
        printf("ops without a cuda kernel: %s (first)\n", fm_op_get_info((fm_op_id)op)->name);
        fm_tensor_release_n(3, a, ga, gy);
        break;
    }
    /* bad indices of the new indexing kernels, in the cpu's words */
    fm_tensor *src = rand_tensor(2, (int64_t[]){3, 4}, FM_F32, 0, 1, 6), *gsrc = fm_tensor_to(src, cu);
    fm_tensor *bi = index_tensor(2, (int64_t[]){3, 4}, 4, 7);
    ((int64_t *)bi->storage->data)[5] = 4;
    fm_tensor *gbi = fm_tensor_to(bi, cu);
    fm_tensor *bad = fm_gather(gsrc, 1, gbi);
    CHECK(bad == NULL);
    CHECK_ERR_CONTAINS("gather: index 4 is out of range for axis 1 with size 4");
    fm_tensor_release_n(5, src, gsrc, bi, gbi, bad);
    /* fused AdamW against the formula on the host */
    fm_tensor *p = rand_tensor(1, (int64_t[]){1000}, FM_F32, -1, 1, 4), *g = rand_tensor(1, (int64_t[]){1000}, FM_F32, -1, 1, 5);
    fm_tensor *gp = fm_tensor_to(p, cu), *gg = fm_tensor_to(g, cu);
    fm_tensor *m = fm_tensor_zeros(1, (int64_t[]){1000}, FM_F32, cu), *v = fm_tensor_zeros(1, (int64_t[]){1000}, FM_F32, cu);
    fm_adamw_hparams hp = {1e-2, 0.9, 0.999, 1e-8, 0.1, 1, 0};
    CHECK(fm_cuda_adamw_step(1, &gp, &gg, &m, &v, NULL, &hp) == FM_OK);
    fm_tensor *hp_ = fm_tensor_to(gp, FM_CPU);
    double worst = 0;
    for (int i = 0; i < 1000; i++) {
        double p0 = fm_tensor_get(p, i), g0 = fm_tensor_get(g, i);
        double mm = 0.1 * g0, vv = 0.001 * g0 * g0;
        double want = p0 - 1e-2 * 0.1 * p0 - 1e-2 / 0.1 * mm / (sqrt(vv / 0.001) + 1e-8);
        double d = fabs(fm_tensor_get(hp_, i) - want);
        if (d > worst) worst = d;
    }
    CHECK_MSG(worst < 1e-5, "adamw: worst error %g", worst);
    fm_tensor_release_n(7, p, g, gp, gg, m, v, hp_);
}

static void gpu_allocator(void) {
    fm_allocator *a = fm_cuda_allocator(0);
    CHECK(a != NULL);
    if (!a) return;
    fm_memory_stats s0, s1;
    a->get_stats(a, &s0);
    void *p = a->alloc(a, 3000);
    CHECK(p != NULL);
    a->get_stats(a, &s1);
    CHECK(s1.allocated == s0.allocated + 3072);
    a->free(a, p, 3000);
    void *q = a->alloc(a, 3000);
    CHECK(q == p); /* cached, same stream */
    a->free(a, q, 3000);
    size_t huge = (size_t)1 << 50;
    CHECK(a->alloc(a, huge) == NULL);
    CHECK_ERR_CONTAINS("out of memory on cuda:0");
    a->empty_cache(a);
}

/* ------------------------------------------------------------------ part 3 */

/* Training-step equivalence: the same small networks, built from public ops and trained
 * with SGD for 10 steps on the cpu and on cuda in f32, must give the same losses (1e-4
 * relative). A fashion-cnn-like net (conv, batch norm, relu, max pool, linear) and a tiny
 * transformer step (embedding, layer norm, causal attention, MLP, cross-entropy). */
#define NPARAM 16
typedef struct net {
    fm_device dev;
    int n;
    fm_tensor *p[NPARAM];
    fm_tensor *rm, *rv; /* batch norm running stats */
} net;

static fm_tensor *param(net *m, int nd, const int64_t *shape, double scale, uint64_t seed) {
    fm_tensor *h = rand_tensor(nd, shape, FM_F32, -scale, scale, seed);
    fm_tensor *t = fm_tensor_to(h, m->dev);
    fm_tensor_release(h);
    fm_tensor_requires_grad_(t, true);
    m->p[m->n++] = t;
    return t;
}

static void net_free(net *m) {
    for (int i = 0; i < m->n; i++) fm_tensor_release(m->p[i]);
    fm_tensor_release_n(2, m->rm, m->rv);
}

/* p -= lr * grad, outside the tape */
static fm_status sgd(net *m, double lr) {
    bool prev = fm_set_grad_enabled(false);
    fm_status st = FM_OK;
    for (int i = 0; i < m->n && st == FM_OK; i++) {
        fm_tensor *g = m->p[i]->grad;
        if (!g) continue;
        fm_tensor *u = fm_mul_scalar(g, lr), *np = u ? fm_sub(m->p[i], u) : NULL;
        st = np ? fm_copy_(m->p[i], np) : fm_last_status();
        fm_tensor_release_n(2, u, np);
        fm_tensor_zero_grad(m->p[i]);
    }
    fm_set_grad_enabled(prev);
    return st;
}

static fm_tensor *cnn_loss(net *m, fm_tensor *x, fm_tensor *y) {
    fm_conv2d_params cp = fm_conv2d_default_params();
    cp.padding[0] = cp.padding[1] = 1;
    fm_pool2d_params pp;
    memset(&pp, 0, sizeof pp);
    pp.kernel[0] = pp.kernel[1] = 2;
    pp.layout = FM_NCHW;
    fm_tensor *c1 = fm_conv2d(x, m->p[0], m->p[1], &cp);
    fm_tensor *b1 = fm_batch_norm(c1, m->p[2], m->p[3], m->rm, m->rv, true, 0.1, 1e-5, FM_NCHW);
    fm_tensor *r1 = fm_relu(b1), *p1 = fm_max_pool2d(r1, &pp);
    cp.groups = 2;
    fm_tensor *c2 = fm_conv2d(p1, m->p[4], m->p[5], &cp);
    fm_tensor *r2 = fm_relu(c2);
    pp.stride[0] = pp.stride[1] = 2;
    fm_tensor *p2 = fm_avg_pool2d(r2, &pp);
    fm_tensor *f = fm_reshape(p2, 2, (int64_t[]){x->shape[0], -1});
    fm_tensor *lo = fm_linear(f, m->p[6], m->p[7]);
    fm_tensor *loss = fm_cross_entropy(lo, y, -100, 0, FM_REDUCE_MEAN);
    fm_tensor_release_n(10, c1, b1, r1, p1, c2, r2, p2, f, lo, NULL);
    return loss;
}

static fm_tensor *gpt_loss(net *m, fm_tensor *tok, fm_tensor *tgt, int64_t B, int64_t T, int64_t D, int64_t H) {
    fm_tensor *e = fm_embedding(m->p[0], tok);                    /* [B*T, D] */
    fm_tensor *pos = fm_add(e, m->p[1]);                           /* + position table [B*T, D] */
    fm_tensor *h = fm_layer_norm(pos, 1, m->p[2], m->p[3], 1e-5);
    fm_tensor *qkv = fm_linear(h, m->p[4], NULL);                  /* [B*T, 3D] */
    fm_tensor *parts[3] = {0};
    fm_tensor *r5 = fm_reshape(qkv, 5, (int64_t[]){B, T, 3, H, D / H});
    fm_tensor *pm = fm_permute(r5, (int[]){2, 0, 3, 1, 4});        /* [3, B, H, T, Dh] */
    for (int i = 0; i < 3; i++) parts[i] = fm_select(pm, 0, i);
    fm_tensor *att = fm_scaled_dot_product_attention(parts[0], parts[1], parts[2], true, 0);
    fm_tensor *at = fm_permute(att, (int[]){0, 2, 1, 3});
    fm_tensor *a2 = fm_reshape(at, 2, (int64_t[]){B * T, D});
    fm_tensor *o = fm_linear(a2, m->p[5], m->p[6]);
    fm_tensor *res = fm_add(pos, o);
    fm_tensor *h2 = fm_layer_norm(res, 1, m->p[7], m->p[8], 1e-5);
    fm_tensor *u = fm_linear(h2, m->p[9], m->p[10]), *g = fm_gelu(u), *dn = fm_linear(g, m->p[11], m->p[12]);
    fm_tensor *res2 = fm_add(res, dn);
    fm_tensor *logits = fm_linear(res2, m->p[13], NULL);
    fm_tensor *loss = fm_cross_entropy(logits, tgt, -100, 0, FM_REDUCE_MEAN);
    fm_tensor_release_n(19, e, pos, h, qkv, parts[0], parts[1], parts[2], r5, pm, att, at, a2, o, res, h2, u, g, dn, res2);
    fm_tensor_release(logits);
    return loss;
}

static void run_steps(int which, fm_device dev, double *losses) {
    net m;
    memset(&m, 0, sizeof m);
    m.dev = dev;
    fm_tensor *x = NULL, *y = NULL;
    const int64_t B = 2, T = 16, D = 32, H = 4, V = 40;
    if (which == 0) {
        param(&m, 4, (int64_t[]){8, 1, 3, 3}, 0.5, 3000);
        param(&m, 1, (int64_t[]){8}, 0.1, 3001);
        fm_tensor *one = fm_tensor_ones(1, (int64_t[]){8}, FM_F32, dev), *zero = fm_tensor_zeros(1, (int64_t[]){8}, FM_F32, dev);
        fm_tensor_requires_grad_(one, true);
        fm_tensor_requires_grad_(zero, true);
        m.p[m.n++] = one;
        m.p[m.n++] = zero;
        param(&m, 4, (int64_t[]){8, 4, 3, 3}, 0.3, 3002);
        param(&m, 1, (int64_t[]){8}, 0.1, 3003);
        param(&m, 2, (int64_t[]){10, 8 * 3 * 3}, 0.2, 3004);
        param(&m, 1, (int64_t[]){10}, 0.1, 3005);
        m.rm = fm_tensor_zeros(1, (int64_t[]){8}, FM_F32, dev);
        m.rv = fm_tensor_ones(1, (int64_t[]){8}, FM_F32, dev);
        fm_tensor *hx = rand_tensor(4, (int64_t[]){16, 1, 12, 12}, FM_F32, 0, 1, 3010);
        fm_tensor *hy = index_tensor(1, (int64_t[]){16}, 10, 3011);
        x = fm_tensor_to(hx, dev);
        y = fm_tensor_to(hy, dev);
        fm_tensor_release_n(2, hx, hy);
    } else {
        param(&m, 2, (int64_t[]){V, D}, 0.5, 3100);
        param(&m, 2, (int64_t[]){B * T, D}, 0.1, 3101);
        param(&m, 1, (int64_t[]){D}, 0.1, 3102);
        param(&m, 1, (int64_t[]){D}, 0.1, 3103);
        param(&m, 2, (int64_t[]){3 * D, D}, 0.2, 3104);
        param(&m, 2, (int64_t[]){D, D}, 0.2, 3105);
        param(&m, 1, (int64_t[]){D}, 0.05, 3106);
        param(&m, 1, (int64_t[]){D}, 0.1, 3107);
        param(&m, 1, (int64_t[]){D}, 0.1, 3108);
        param(&m, 2, (int64_t[]){4 * D, D}, 0.2, 3109);
        param(&m, 1, (int64_t[]){4 * D}, 0.05, 3110);
        param(&m, 2, (int64_t[]){D, 4 * D}, 0.1, 3111);
        param(&m, 1, (int64_t[]){D}, 0.05, 3112);
        param(&m, 2, (int64_t[]){V, D}, 0.2, 3113);
        fm_tensor *ht = index_tensor(1, (int64_t[]){B * T}, V, 3120), *hg = index_tensor(1, (int64_t[]){B * T}, V, 3121);
        x = fm_tensor_to(ht, dev);
        y = fm_tensor_to(hg, dev);
        fm_tensor_release_n(2, ht, hg);
    }
    for (int step = 0; step < 10; step++) {
        fm_tensor *loss = which == 0 ? cnn_loss(&m, x, y) : gpt_loss(&m, x, y, B, T, D, H);
        losses[step] = loss ? fm_tensor_item(loss) : NAN;
        fm_status st = loss ? fm_backward(loss, NULL, false) : fm_last_status();
        if (st == FM_OK) st = sgd(&m, which == 0 ? 0.1 : 0.05);
        CHECK_MSG(st == FM_OK, "%s step %d on %s: %s", which ? "tiny transformer" : "cnn", step,
                  dev.type == FM_DEV_CUDA ? "cuda" : "cpu", fm_last_error());
        fm_tensor_release(loss);
        if (st != FM_OK) break;
    }
    fm_tensor_release_n(2, x, y);
    net_free(&m);
    fm_clear_error();
}

static void train_step_equivalence(void) {
    const char *names[2] = {"fashion-cnn-like", "tiny transformer"};
    for (int which = 0; which < 2; which++) {
        double lc[10], lg[10], worst = 0;
        for (int i = 0; i < 10; i++) lc[i] = lg[i] = NAN;
        run_steps(which, FM_CPU, lc);
        run_steps(which, (fm_device){FM_DEV_CUDA, 0}, lg);
        for (int i = 0; i < 10; i++) {
            double r = fabs(lg[i] - lc[i]) / fmax(fabs(lc[i]), 1e-12);
            if (!(r <= worst)) worst = r; /* NaN counts as worst */
        }
        printf("train-step equivalence %s: cpu loss %.6f -> %.6f, cuda %.6f -> %.6f, worst relative difference %.3g\n",
               names[which], lc[0], lc[9], lg[0], lg[9], worst);
        CHECK_MSG(worst <= 1e-4, "train-step equivalence %s: losses differ by %.3g relative (> 1e-4)", names[which], worst);
        CHECK_MSG(lc[9] < lc[0], "train-step equivalence %s: the cpu loss did not go down (%.6f -> %.6f)", names[which], lc[0], lc[9]);
    }
}

/* Pinned batches: fm_tensor_to from a pinned tensor goes through the copy stream and
 * matches a pageable copy; the cache reuses the block once the copy is done. */
static void gpu_pinned(void) {
    fm_device cu = {FM_DEV_CUDA, 0};
    int64_t n = 1 << 20;
    fm_tensor *p = fm_cuda_pinned_empty(1, &n, FM_F32);
    CHECK_MSG(p != NULL, "pinned: %s", fm_last_error());
    if (!p) return;
    CHECK(fm_cuda_is_pinned(p));
    float *d = fm_tensor_data(p);
    for (int64_t i = 0; i < n; i++) d[i] = (float)(i % 1000) * 0.5f;
    fm_pinned_stats s0, s1;
    fm_cuda_pinned_stats(&s0);
    fm_tensor *g = fm_tensor_to(p, cu);
    fm_tensor *sum = g ? fm_sum(g, 0, NULL, false) : NULL; /* compute ordered after the copy */
    fm_cuda_pinned_stats(&s1);
    CHECK(s1.n_copies == s0.n_copies + 1);
    CHECK(fm_cuda_pinned_wait(p) == FM_OK);
    for (int64_t i = 0; i < n; i++) d[i] = -1; /* safe now: the copy is done */
    fm_tensor *back = g ? fm_tensor_to(g, FM_CPU) : NULL;
    int bad = 0;
    for (int64_t i = 0; back && i < n; i++) bad += ((float *)fm_tensor_data(back))[i] != (float)(i % 1000) * 0.5f;
    CHECK_MSG(back && bad == 0, "pinned copy: %d elements differ", bad);
    double want = 0;
    for (int64_t i = 0; i < n; i++) want += (double)(i % 1000) * 0.5;
    CHECK_MSG(sum && fabs(fm_tensor_item(sum) - want) <= 1e-6 * want, "pinned copy then sum: %g vs %g", sum ? fm_tensor_item(sum) : NAN, want);
    fm_tensor_release_n(4, p, g, sum, back);
    fm_tensor *p2 = fm_cuda_pinned_empty(1, &n, FM_F32); /* the cached block comes back */
    fm_pinned_stats s2;
    fm_cuda_pinned_stats(&s2);
    CHECK(s2.n_cache_hits >= 1);
    fm_tensor_release(p2);
    fm_clear_error();
}

int main(void) {
    test_sizes();
    test_small_pool();
    test_streams();
    test_large_pool();
    test_limits_and_oom();
    test_empty_cache_partial();
    test_max_split();
    test_preallocate();
    test_stress();
    test_pinned_cache();
    fprintf(stderr, "allocator bookkeeping: %d checks, %d failures\n", t_checks, t_failures);

    fm_build_info bi;
    fm_get_build_info(&bi);
    fm_cuda_info ci;
    fm_cuda_query(&ci);
    if (!bi.cuda_built || ci.n_devices == 0) {
        TEST_SKIP("GPU conformance, GPU allocator and GPU error tests: %s", ci.reason);
        /* asking for cuda must fail clearly, never fall back to the cpu */
        CHECK(ci.reason[0] != 0);
        fm_tensor *t = fm_tensor_empty(1, (int64_t[]){4}, FM_F32, (fm_device){FM_DEV_CUDA, 0});
        CHECK(t == NULL);
        CHECK(fm_last_status() != FM_OK && fm_last_error()[0]);
        fm_tensor *h = fm_tensor_zeros(1, (int64_t[]){4}, FM_F32, FM_CPU), *moved = fm_tensor_to(h, (fm_device){FM_DEV_CUDA, 0});
        CHECK(moved == NULL);
        CHECK_ERR_CONTAINS("cuda:0");
        fm_tensor_release_n(3, t, h, moved);
        CHECK(fm_cuda_allocator(0) == NULL);
        CHECK(fm_backend_get(FM_DEV_CUDA) == NULL);
        fm_tensor *pin = fm_cuda_pinned_empty(1, (int64_t[]){4}, FM_F32); /* no pinned memory without a device */
        CHECK(pin == NULL);
        CHECK(fm_last_status() == FM_ERR_UNSUPPORTED);
        fm_tensor_release(pin);
        TEST_SKIP("train-step equivalence (cnn, tiny transformer; 10 steps cuda vs cpu) and pinned copies: %s", ci.reason);
        /* what runs without a device: every conformance case's cpu reference, and the
         * training-step networks on the cpu (their losses must go down) */
        g_cpu_only = 1;
        int f0 = t_failures;
        fm_dtype cdts[] = {FM_F32, FM_BF16};
        for (int i = 0; i < 2; i++) conformance(cdts[i]);
        printf("conformance cases, cpu side only: %d run, %d failures\n", g_cpu_cases, t_failures - f0);
        int missing = coverage_check(NULL);
        printf("conformance coverage of the ops.def groups the CUDA backend claims: %d without a case\n", missing);
        bool had = g_has_case[FM_OP_GELU]; /* the check fails on a claimed op without a case */
        g_has_case[FM_OP_GELU] = false;
        EXPECT_CHECK_FAILS(coverage_check(NULL));
        g_has_case[FM_OP_GELU] = had;
        for (int which = 0; which < 2; which++) {
            double l[10];
            run_steps(which, FM_CPU, l);
            printf("train-step networks on the cpu: %s loss %.6f -> %.6f\n", which ? "tiny transformer" : "fashion-cnn-like", l[0], l[9]);
            CHECK_MSG(l[9] < l[0], "train-step network %d: the cpu loss did not go down (%.6f -> %.6f)", which, l[0], l[9]);
        }
        TEST_DONE();
    }
    printf("cuda: %d device(s), %s, runtime %d, driver %d\n", ci.n_devices, ci.devices[0].name, ci.runtime_version,
           ci.driver_version);
    gpu_allocator();
    int f0 = t_failures;
    fm_dtype dts[] = {FM_F32, FM_BF16, FM_F16};
    for (int i = 0; i < 3; i++) {
        int before = t_failures;
        g_worst_nse = 0;
        g_worst_label[0] = 0;
        conformance(dts[i]);
        printf("conformance %s: %s (NMSE bound %g; the largest %.3g, %s)\n", fm_dtype_name(dts[i]), t_failures == before ? "pass" : "FAIL",
               dts[i] == FM_F32 ? 1e-6 : 1e-3, g_worst_nse, g_worst_label[0] ? g_worst_label : "-");
    }
    int missing = coverage_check(fm_backend_get(FM_DEV_CUDA));
    printf("conformance coverage: %d CUDA kernels without a case\n", missing);
    gpu_errors();
    gpu_pinned();
    train_step_equivalence();
    printf("conformance: %d cases, %d without a cpu reference, %d failures\n", g_gpu_cases, g_skipped_cases, t_failures - f0);
    TEST_DONE();
}
