/* CUDA backend tests.
 *
 * Part 1 (always runs, no GPU needed): the device caching allocator's
 * bookkeeping (src/backend/cuda/cuda_pool.c) driven by a malloc-backed segment
 * allocator: size classes, best fit, splitting and merging, stream-aware reuse,
 * limits and fractions, OOM retry and messages, empty_cache, preallocate mode,
 * and a randomized stress run checking that live blocks never overlap.
 *
 * Part 2 (needs a CUDA build and a device; otherwise prints "SKIPPED: <reason>"
 * and checks that asking for cuda fails with a clear error): conformance of
 * every CUDA kernel against the CPU backend, op by op and dtype by dtype, by
 * normalized squared error (1e-6 f32, 1e-2 bf16/f16), with NaN/inf checks,
 * guard regions around every output (out-of-bounds writes) and poisoned outputs
 * (unwritten elements). Kernels are called through fm_dispatch with the same
 * fm_op_call on both devices, so front-end logic cannot mask a kernel bug. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_pool.h"
#include "core/backend.h"
#include "core/tensor_internal.h"
#include "fathom/fathom.h"
#include "ops/op_attrs.h"
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

/* ------------------------------------------------------------------ part 2 */

static int g_skipped_cases, g_gpu_cases;

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
    g_gpu_cases++;
    for (int i = 0; i < c->n_in; i++) {
        if (!c->in[i]) continue;
        fm_dtype idt = c->in[i]->dtype;
        hin[i] = (idt == FM_F16 || idt == FM_BF16) ? fm_to_dtype(c->in[i], FM_F32) : fm_tensor_retain(c->in[i]);
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
        fprintf(stderr, "  (no cpu reference for %s: %s)\n", label, fm_last_error());
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
                     : (c->out[i].dt == FM_F16 || c->out[i].dt == FM_BF16 || dt == FM_F16 || dt == FM_BF16) ? 1e-2 : 1e-6;
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

static void conformance(fm_dtype dt) {
    static const fm_op_id unary[] = {FM_OP_NEG, FM_OP_ABS, FM_OP_EXP, FM_OP_LOG, FM_OP_SQRT, FM_OP_RSQRT, FM_OP_SIN,
                                     FM_OP_COS, FM_OP_TANH, FM_OP_SIGMOID, FM_OP_RELU, FM_OP_LEAKY_RELU, FM_OP_GELU,
                                     FM_OP_GELU_TANH, FM_OP_SILU, FM_OP_CLAMP, FM_OP_COPY};
    static const fm_op_id binary[] = {FM_OP_ADD, FM_OP_SUB, FM_OP_MUL, FM_OP_DIV, FM_OP_POW, FM_OP_MAXIMUM,
                                      FM_OP_MINIMUM, FM_OP_EQ, FM_OP_NE, FM_OP_LT, FM_OP_LE, FM_OP_GT, FM_OP_GE};
    fm_unary_attrs ua = {0.1, 0.5};
    int64_t s23[] = {37, 129}, s1[] = {129}, s3[] = {4, 37, 129};
    for (size_t k = 0; k < sizeof unary / sizeof unary[0]; k++) {
        conf_case c = {.label = fm_op_get_info(unary[k])->name, .op = unary[k], .n_in = 1, .n_out = 1, .attrs = &ua};
        bool pos = unary[k] == FM_OP_LOG || unary[k] == FM_OP_SQRT || unary[k] == FM_OP_RSQRT;
        fm_tensor *base = rand_tensor(2, (int64_t[]){129, 37}, dt, pos ? 0.1 : -3, 3, 11 + k);
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
    }
    for (size_t k = 0; k < sizeof binary / sizeof binary[0]; k++) {
        conf_case c = {.label = fm_op_get_info(binary[k])->name, .op = binary[k], .n_in = 2, .n_out = 1};
        c.in[0] = rand_tensor(3, s3, dt, binary[k] == FM_OP_POW ? 0.1 : -2, 2, 200 + k);
        c.in[1] = rand_tensor(1, s1, dt, 0.5, 2, 300 + k); /* broadcast */
        bool cmp = binary[k] >= FM_OP_EQ;
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
    {   /* reductions over the middle axis, the last axis, and everything */
        static const fm_op_id red[] = {FM_OP_SUM, FM_OP_MEAN, FM_OP_AMAX, FM_OP_AMIN, FM_OP_VAR, FM_OP_STD, FM_OP_LOGSUMEXP};
        unsigned masks[] = {2u, 4u, 7u};
        for (size_t k = 0; k < sizeof red / sizeof red[0]; k++)
            for (int m = 0; m < 3; m++) {
                fm_reduce_attrs ra = {masks[m], 1};
                conf_case c = {.label = fm_op_get_info(red[k])->name, .op = red[k], .n_in = 1, .n_out = 1, .attrs = &ra};
                c.in[0] = rand_tensor(3, s3, dt, -2, 2, 500 + k);
                int64_t os[3] = {masks[m] & 1 ? 1 : 4, masks[m] & 2 ? 1 : 37, masks[m] & 4 ? 1 : 129};
                c.out[0] = spec(3, os, dt);
                run_case(&c, dt);
                case_free(&c);
            }
        for (int ax = 1; ax < 3; ax++) {
            fm_dim_attrs da = {ax};
            int64_t os[3] = {4, ax == 1 ? 1 : 37, ax == 2 ? 1 : 129};
            conf_case c = {.label = "max_dim", .op = FM_OP_MAX_DIM, .n_in = 1, .n_out = 2, .attrs = &da};
            c.in[0] = rand_tensor(3, s3, dt, -2, 2, 600 + ax);
            c.out[0] = spec(3, os, dt);
            c.out[1] = spec(3, os, FM_I64);
            run_case(&c, dt);
            conf_case a = {.label = "argmax", .op = FM_OP_ARGMAX, .n_in = 1, .n_out = 1, .attrs = &da};
            a.in[0] = fm_tensor_retain(c.in[0]);
            a.out[0] = spec(3, os, FM_I64);
            run_case(&a, dt);
            case_free(&a);
            case_free(&c);
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
    {   /* attention (+ backward): causal and not, grouped-query */
        int64_t B = 2, H = 4, Hkv = 2, T = 70, D = 64;
        for (int causal = 0; causal < 2; causal++) {
            fm_sdpa_attrs sa = {causal, 0};
            conf_case c = {.label = causal ? "sdpa causal" : "sdpa", .op = FM_OP_SDPA, .n_in = 3, .n_out = 2, .attrs = &sa};
            c.in[0] = rand_tensor(4, (int64_t[]){B, H, T, D}, dt, -1, 1, 1200 + causal);
            c.in[1] = rand_tensor(4, (int64_t[]){B, Hkv, T, D}, dt, -1, 1, 1210 + causal);
            c.in[2] = rand_tensor(4, (int64_t[]){B, Hkv, T, D}, dt, -1, 1, 1220 + causal);
            c.out[0] = spec(4, (int64_t[]){B, H, T, D}, dt);
            c.out[1] = spec(3, (int64_t[]){B, H, T}, FM_F32);
            run_case(&c, dt);
            /* backward from the cpu's forward results */
            fm_tensor *q32 = fm_to_dtype(c.in[0], FM_F32), *k32 = fm_to_dtype(c.in[1], FM_F32), *v32 = fm_to_dtype(c.in[2], FM_F32);
            fm_tensor *o = fm_tensor_empty(4, (int64_t[]){B, H, T, D}, FM_F32, FM_CPU);
            fm_tensor *lse = fm_tensor_empty(3, (int64_t[]){B, H, T}, FM_F32, FM_CPU);
            fm_op_call fc = {.op = FM_OP_SDPA, .n_in = 3, .n_out = 2, .in = {q32, k32, v32}, .out = {o, lse}, .attrs = &sa};
            if (fm_dispatch(&fc) == FM_OK) {
                conf_case b = {.label = causal ? "sdpa_backward causal" : "sdpa_backward", .op = FM_OP_SDPA_BACKWARD,
                               .n_in = 6, .n_out = 3, .attrs = &sa};
                b.in[0] = rand_tensor(4, (int64_t[]){B, H, T, D}, dt, -1, 1, 1230 + causal);
                b.in[1] = fm_tensor_retain(c.in[0]);
                b.in[2] = fm_tensor_retain(c.in[1]);
                b.in[3] = fm_tensor_retain(c.in[2]);
                b.in[4] = dt == FM_F32 ? fm_tensor_retain(o) : fm_to_dtype(o, dt);
                b.in[5] = fm_tensor_retain(lse);
                b.out[0] = spec(4, (int64_t[]){B, H, T, D}, dt);
                b.out[1] = spec(4, (int64_t[]){B, Hkv, T, D}, dt);
                b.out[2] = spec(4, (int64_t[]){B, Hkv, T, D}, dt);
                run_case(&b, dt);
                case_free(&b);
            }
            fm_tensor_release_n(5, q32, k32, v32, o, lse);
            case_free(&c);
        }
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
}

/* Errors the GPU path must report like the CPU: bad targets, missing kernels. */
static void gpu_errors(void) {
    fm_device cu = {FM_DEV_CUDA, 0};
    int64_t N = 4, C = 5;
    fm_tensor *x = rand_tensor(2, (int64_t[]){N, C}, FM_F32, -1, 1, 1);
    fm_tensor *t = index_tensor(1, &N, C, 2);
    ((int64_t *)t->storage->data)[2] = 9;
    fm_tensor *gx = fm_tensor_to(x, cu), *gt = fm_tensor_to(t, cu);
    fm_tensor *loss = fm_cross_entropy(gx, gt, -100, 0, FM_REDUCE_MEAN);
    CHECK(loss == NULL);
    CHECK_ERR_CONTAINS("target 9 at position 2 is out of range");
    fm_tensor_release_n(5, x, t, gx, gt, loss);
    /* an op without a cuda kernel names itself and the device */
    fm_tensor *a = rand_tensor(1, &N, FM_F32, 0, 1, 3), *ga = fm_tensor_to(a, cu);
    fm_tensor *ts[2] = {ga, ga};
    fm_tensor *cat = fm_cat(2, ts, 0);
    if (!cat) CHECK_ERR_CONTAINS("not implemented on cuda");
    fm_tensor_release_n(3, a, ga, cat);
    /* fused AdamW against the formula on the host */
    fm_tensor *p = rand_tensor(1, (int64_t[]){1000}, FM_F32, -1, 1, 4), *g = rand_tensor(1, (int64_t[]){1000}, FM_F32, -1, 1, 5);
    fm_tensor *gp = fm_tensor_to(p, cu), *gg = fm_tensor_to(g, cu);
    fm_tensor *m = fm_tensor_zeros(1, (int64_t[]){1000}, FM_F32, cu), *v = fm_tensor_zeros(1, (int64_t[]){1000}, FM_F32, cu);
    fm_adamw_hparams hp = {1e-2, 0.9, 0.999, 1e-8, 0.1, 1, 0};
    CHECK(fm_cuda_adamw_step(1, &gp, &gg, &m, &v, &hp) == FM_OK);
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
    fprintf(stderr, "allocator bookkeeping: %d checks, %d failures\n", t_checks, t_failures);

    fm_build_info bi;
    fm_get_build_info(&bi);
    fm_cuda_info ci;
    fm_cuda_query(&ci);
    if (!bi.cuda_built || ci.n_devices == 0) {
        printf("SKIPPED: GPU conformance, GPU allocator and GPU error tests: %s\n", ci.reason);
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
        TEST_DONE();
    }
    printf("cuda: %d device(s), %s, runtime %d, driver %d\n", ci.n_devices, ci.devices[0].name, ci.runtime_version,
           ci.driver_version);
    gpu_allocator();
    int f0 = t_failures;
    fm_dtype dts[] = {FM_F32, FM_BF16, FM_F16};
    for (int i = 0; i < 3; i++) {
        int before = t_failures;
        conformance(dts[i]);
        printf("conformance %s: %s\n", fm_dtype_name(dts[i]), t_failures == before ? "pass" : "FAIL");
    }
    gpu_errors();
    printf("conformance: %d cases, %d without a cpu reference, %d failures\n", g_gpu_cases, g_skipped_cases, t_failures - f0);
    TEST_DONE();
}
