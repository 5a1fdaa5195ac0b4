/* The thread pool (src/core/parallel.c): every element of a job runs exactly
 * once, in the chunk that static partitioning gives it (the tid argument is the
 * chunk index whichever thread ran it), jobs back to back never mix, and nested
 * calls run inline. More threads than cores (8 on this 2-core machine) keep the
 * OS descheduling workers, so the caller regularly takes a chunk whose worker
 * has not claimed it yet: the path that must keep all of the above true. The
 * jobs run again with no spin at all (every wait sleeps on the condition
 * variables) and with a long one. fm_parallel_for_dynamic covers every element
 * exactly once in grain-sized pieces. And fm_parallel_serial keeps the caller's
 * jobs on the caller. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"
#include "core/parallel.h"

typedef struct job {
    int64_t n, chunk;
    atomic_int *hits;
    atomic_int bad_tid;
    atomic_long sum;
} job;

static atomic_long g_taken; /* chunks other than 0 run by the calling thread */

static void mark(void *vctx, int64_t b, int64_t e, int tid) {
    job *j = vctx;
    if (b / j->chunk != tid || (e < j->n && e - b != j->chunk)) atomic_fetch_add(&j->bad_tid, 1);
    if (tid != 0 && fm_thread_id() == 0) atomic_fetch_add(&g_taken, 1);
    long s = 0;
    for (int64_t i = b; i < e; i++) {
        atomic_fetch_add_explicit(&j->hits[i], 1, memory_order_relaxed);
        s += (long)i;
    }
    atomic_fetch_add(&j->sum, s);
}

static void nested(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    job *j = vctx;
    for (int64_t i = b; i < e; i++) { /* an inner parallel_for runs on this thread, as one chunk */
        job in = {4, 4, j->hits + i * 4, 0, 0};
        fm_parallel_for(4, 1, mark, &in);
        if (in.bad_tid) atomic_fetch_add(&j->bad_tid, 1);
    }
}

typedef struct serial_ctx {
    atomic_int *calls, *off;
    int64_t n;
} serial_ctx;

/* One call of a job: counted; flagged unless it is the whole range, tid 0, on the calling thread. */
static void one_call(void *vctx, int64_t b, int64_t e, int tid) {
    serial_ctx *c = vctx;
    atomic_fetch_add(c->calls, 1);
    if (b != 0 || e != c->n || tid != 0 || fm_thread_id() != 0) atomic_fetch_add(c->off, 1);
}

enum { MAXN = 5000 };

typedef struct dyn_ctx {
    int64_t n, grain;
    atomic_int *hits;
    atomic_int bad; /* a call that is not one claimed piece: [k * grain, min(n, (k + 1) * grain)) */
} dyn_ctx;

static void dyn_mark(void *vctx, int64_t b, int64_t e, int tid) {
    dyn_ctx *c = vctx;
    bool whole = b == 0 && e == c->n; /* the serial fall-back's one call */
    if (!whole && (b % c->grain || e != (b + c->grain < c->n ? b + c->grain : c->n) || tid < 0 || tid >= fm_num_threads()))
        atomic_fetch_add(&c->bad, 1);
    for (int64_t i = b; i < e; i++) atomic_fetch_add_explicit(&c->hits[i], 1, memory_order_relaxed);
}

/* fm_parallel_for_dynamic: every element exactly once, in grain-sized pieces, whatever thread claims them */
static int run_dynamic(atomic_int *hits, int count) {
    int bad = 0;
    for (int it = 0; it < count && hits; it++) {
        int64_t n = 1 + (it * 7919) % MAXN, grain = 1 + it % 37;
        dyn_ctx c = {n, grain, hits, 0};
        for (int64_t i = 0; i < n; i++) atomic_store_explicit(&hits[i], 0, memory_order_relaxed);
        fm_parallel_for_dynamic(n, grain, dyn_mark, &c);
        int ok = atomic_load(&c.bad) == 0;
        for (int64_t i = 0; i < n && ok; i++) ok = atomic_load(&hits[i]) == 1;
        if (!ok) bad++;
    }
    return bad;
}

/* jobs of varying size back to back; returns how many ran an element not exactly once or in the wrong chunk */
static int run_jobs(atomic_int *hits, int count, int nt) {
    int bad = 0;
    for (int it = 0; it < count && hits; it++) {
        int64_t n = 1 + (it * 7919) % MAXN;
        int chunks = n < nt ? (int)n : nt;
        job j = {n, (n + chunks - 1) / chunks, hits, 0, 0};
        for (int64_t i = 0; i < n; i++) atomic_store_explicit(&hits[i], 0, memory_order_relaxed);
        fm_parallel_for(n, 1, mark, &j);
        int ok = j.bad_tid == 0 && j.sum == (long)(n * (n - 1) / 2);
        for (int64_t i = 0; i < n && ok; i++) ok = atomic_load(&hits[i]) == 1;
        if (!ok) bad++;
    }
    return bad;
}

int main(void) {
    fm_set_num_threads(8);
    const int nt = fm_num_threads();
    CHECK(nt == 8);
    atomic_int *hits = calloc(MAXN * 4, sizeof *hits);
    CHECK(hits != NULL);
    int bad = run_jobs(hits, 20000, nt);
    CHECK_MSG(bad == 0, "%d of 20000 jobs ran an element not exactly once or in the wrong chunk", bad);
    fm_parallel_set_spin_us(0); /* every wait sleeps */
    bad = run_jobs(hits, 3000, nt);
    CHECK_MSG(bad == 0, "no spin: %d of 3000 jobs ran an element not exactly once or in the wrong chunk", bad);
    fm_parallel_set_spin_us(5000); /* long spins, with more threads than cores */
    bad = run_jobs(hits, 3000, nt);
    CHECK_MSG(bad == 0, "5 ms spin: %d of 3000 jobs ran an element not exactly once or in the wrong chunk", bad);
    fm_parallel_set_spin_us(1000);
    /* a program's own default (the server's 30 us): used without a valid FATHOM_SPIN_US
     * (this test also runs with FATHOM_SPIN_US=12us: ctest test_parallel_bad_spin_env),
     * a valid one wins */
    {
        const char *e = getenv("FATHOM_SPIN_US");
        char *end = NULL;
        long long us = e && *e ? strtoll(e, &end, 10) : -1;
        bool valid = us >= 0 && end && *end == '\0';
        fm_parallel_set_spin_default_us(30);
        CHECK_MSG(fm_parallel_spin_us() == (valid ? (us > 1000000 ? 1000000 : us) : 30), "spin %lld us with the default 30 and FATHOM_SPIN_US=%s",
                  (long long)fm_parallel_spin_us(), e ? e : "(unset)");
        fm_parallel_set_spin_us(1000);
        CHECK(fm_parallel_spin_us() == 1000);
    }
    bad = run_dynamic(hits, 5000);
    CHECK_MSG(bad == 0, "dynamic: %d of 5000 jobs ran an element not exactly once or not in its claimed piece", bad);
    fprintf(stderr, "chunks the caller took over from a worker: %ld\n", (long)atomic_load(&g_taken));
    /* nested: 100 outer elements, each an inner job of 4 */
    if (hits) {
        for (int i = 0; i < 400; i++) atomic_store(&hits[i], 0);
        job outer = {100, 0, hits, 0, 0};
        fm_parallel_for(100, 1, nested, &outer);
        int ok = outer.bad_tid == 0;
        for (int i = 0; i < 400; i++) ok = ok && atomic_load(&hits[i]) == 1;
        CHECK(ok);
    }
    /* fm_parallel_serial: while on, the calling thread runs a job as one call of the
     * whole range (tid 0, on itself); once off, jobs are split again */
    {
        atomic_int calls = 0, off = 0;
        serial_ctx c = {&calls, &off, 1000};
        fm_parallel_serial(1);
        fm_parallel_for(1000, 1, one_call, &c);
        fm_parallel_serial(0);
        CHECK_MSG(atomic_load(&calls) == 1 && atomic_load(&off) == 0, "serial: %d calls, %d not the whole range on the caller",
                  atomic_load(&calls), atomic_load(&off));
        atomic_store(&calls, 0);
        fm_parallel_for(1000, 1, one_call, &c);
        CHECK_MSG(atomic_load(&calls) == nt, "after fm_parallel_serial(0) the job is split again (%d calls)", atomic_load(&calls));
    }
    free(hits);
    fm_set_num_threads(2);
    CHECK(fm_num_threads() == 2);
    fm_parallel_shutdown();
    TEST_DONE();
}
