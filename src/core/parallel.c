/* A persistent thread pool for fm_parallel_for.
 *
 * Workers sleep on a condition variable between jobs; a job is split into one
 * contiguous chunk per thread (static partitioning, so which element lands in
 * which chunk is a pure function of n and the thread count, and reductions
 * written per chunk stay deterministic). The caller runs chunk 0 itself, then
 * any chunk no worker has claimed yet: each chunk is claimed exactly once (a
 * compare-and-swap), and its fn call gets the chunk's index as tid whichever
 * thread runs it. So a worker that the OS has descheduled (another process on
 * a shared machine) no longer stalls the whole job: the caller takes its chunk.
 * Spinning briefly (spin_until) before sleeping keeps the wake-up latency of back-to-back
 * small ops low on a 2-core machine. */
#include "core/parallel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* How long a thread spins before it sleeps, in time rather than iterations
 * (a pause costs 16 ns on one x86 core and several times that on another).
 * Waking a sleeping worker costs a futex round trip, and inside a VM the IPI
 * that wakes a halted vCPU: tens of microseconds, paid again at every job
 * after a sleep. A training step's gaps between parallel jobs (serial
 * bookkeeping, small ops below the grain) reach several hundred microseconds,
 * so the default budget is 1 ms (libgomp spins a few ms by default, Intel's
 * OpenMP 200 ms). On an Intel Xeon model 207 VM at 2 threads, the 32 us spin
 * this replaces left ~24 context switches per MLP train step and ~190 per
 * kjv-gpt step (a 300 us budget: ~125; 1 ms: ~3), and the median MLP step was
 * 5-25% slower (docs/PERFORMANCE.md).
 *
 * The spin adapts per thread: it doubles (up to the budget) after a wait that
 * the spin satisfied, and after one that slept but was shorter than the budget
 * (a longer spin would have caught it), and halves (down to SPIN_MIN_NS) after
 * one longer than the budget. Back-to-back ops (a training or decode step) keep
 * it long; a server between requests, or a job whose other thread another
 * process has descheduled for longer than the budget, shrinks it, so the pool
 * stops burning CPU the oversubscribed cores need. (It used to halve after any
 * wait that slept: serial set-up work halved it to 1 us, and then the 50 us gaps
 * of a decode step slept every time, never satisfied by a spin that would double
 * it again: 60 context switches a token, 20-25% of a Zen 3's int4 decode.) FATHOM_SPIN_US sets the budget (0: never spin);
 * fm_parallel_set_spin_us sets it from code (the server keeps it short). */
#define SPIN_DEFAULT_NS 1000000
#define SPIN_MIN_NS 1000
static _Atomic int64_t g_spin_max_ns = -1; /* -1: not read from the environment yet */
static _Atomic int64_t g_spin_default_ns = SPIN_DEFAULT_NS; /* without a valid FATHOM_SPIN_US */
static atomic_bool g_spin_warned;

static int64_t spin_max_ns(void) {
    int64_t v = atomic_load_explicit(&g_spin_max_ns, memory_order_relaxed);
    if (v >= 0) return v;
    const char *e = getenv("FATHOM_SPIN_US");
    char *end = NULL;
    long long us = e && *e ? strtoll(e, &end, 10) : -1;
    bool ok = us >= 0 && end && *end == '\0';
    v = ok ? (int64_t)(us > 1000000 ? 1000000 : us) * 1000 : atomic_load_explicit(&g_spin_default_ns, memory_order_relaxed);
    int64_t expect = -1;
    if (atomic_compare_exchange_strong_explicit(&g_spin_max_ns, &expect, v, memory_order_relaxed, memory_order_relaxed) &&
        e && *e && !ok && !atomic_exchange(&g_spin_warned, true)) /* said once: by the thread whose reading was stored */
        fprintf(stderr, "fathom: warning: FATHOM_SPIN_US=%s is not a whole number of microseconds >= 0; the default (%lld) is used\n",
                e, (long long)(v / 1000));
    return atomic_load_explicit(&g_spin_max_ns, memory_order_relaxed);
}

void fm_parallel_set_spin_us(int64_t us) {
    if (us < 0) us = 0;
    if (us > 1000000) us = 1000000;
    atomic_store_explicit(&g_spin_max_ns, us * 1000, memory_order_relaxed);
}

void fm_parallel_set_spin_default_us(int64_t us) {
    if (us < 0) us = 0;
    if (us > 1000000) us = 1000000;
    atomic_store_explicit(&g_spin_default_ns, us * 1000, memory_order_relaxed);
    atomic_store_explicit(&g_spin_max_ns, -1, memory_order_relaxed); /* read FATHOM_SPIN_US again over it */
}

int64_t fm_parallel_spin_us(void) { return spin_max_ns() / 1000; }

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void spin_grow(int64_t *budget, int64_t max) {
    *budget = *budget * 2 > max ? max : (*budget * 2 < SPIN_MIN_NS ? SPIN_MIN_NS : *budget * 2);
}

/* Spins up to *budget ns for cond(p, arg), checking the clock every 16 pauses;
 * returns cond's last value. On true *budget grows; on false the caller sleeps
 * and then calls spin_slept with *t0, the time this call started. */
static inline bool spin_until(bool (*cond)(void *, unsigned long), void *p, unsigned long arg, int64_t *budget, int64_t *t0) {
    int64_t max = spin_max_ns();
    if (*budget > max) *budget = max;
    *t0 = now_ns();
    if (*budget > 0) {
        int64_t limit = *t0 + *budget;
        do {
            for (int i = 0; i < 16; i++) {
                if (cond(p, arg)) {
                    spin_grow(budget, max);
                    return true;
                }
                CPU_RELAX();
            }
        } while (now_ns() < limit);
    }
    return cond(p, arg);
}

/* After a wait that spin_until did not end and a sleep did: a wait shorter than
 * the budget in force would have been caught by a spin that long (grow), a longer
 * one would not (shrink) */
static inline void spin_slept(int64_t *budget, int64_t t0) {
    int64_t max = spin_max_ns();
    if (now_ns() - t0 < max) spin_grow(budget, max);
    else if (*budget > SPIN_MIN_NS) *budget /= 2;
}

#define MAX_THREADS 256

typedef struct pool {
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    pthread_t th[MAX_THREADS];
    int n_threads; /* including the caller */
    int started;
    /* current job */
    fm_range_fn fn;
    void *ctx;
    int64_t n, chunk;
    atomic_int n_chunks; /* read by spinning workers without the mutex: relaxed atomics */
    atomic_ulong generation;
    atomic_int claimed[MAX_THREADS]; /* per chunk of the current job: 0 free, 1 taken (1 past n_chunks) */
    atomic_int done;                 /* chunks of the current job finished */
    int shutdown;
} pool;

static pool g_pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv_work = PTHREAD_COND_INITIALIZER,
                      .cv_done = PTHREAD_COND_INITIALIZER};
static _Thread_local int t_tid = 0;
static _Thread_local int t_in_parallel = 0;
static _Thread_local int t_serial = 0; /* fm_parallel_serial */
static _Thread_local int64_t t_spin = SPIN_DEFAULT_NS; /* this thread's spin budget in ns (spin_until) */
static int g_requested = 0;

int fm_thread_id(void) { return t_tid; }

void fm_parallel_serial(int on) { t_serial = on != 0; }

static int default_threads(void) {
    const char *e = getenv("FATHOM_NUM_THREADS");
    if (e && *e) {
        int v = atoi(e);
        if (v >= 1) return v > MAX_THREADS ? MAX_THREADS : v;
    }
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c < 1 ? 1 : (c > MAX_THREADS ? MAX_THREADS : (int)c);
}

int fm_num_threads(void) {
    if (!g_requested) g_requested = default_threads();
    return g_requested;
}

static void run_chunk(pool *p, int k) {
    int64_t b = (int64_t)k * p->chunk, e = b + p->chunk;
    if (e > p->n) e = p->n;
    if (b < e) p->fn(p->ctx, b, e, k);
}

/* Claims chunk k of the current job; the acquire pairs with the release that
 * reset it when the job was published, so fn/ctx/n/chunk are those of the job. */
static bool claim(pool *p, int k) {
    int expect = 0;
    return atomic_compare_exchange_strong_explicit(&p->claimed[k], &expect, 1, memory_order_acq_rel,
                                                   memory_order_relaxed);
}

/* Runs chunk k (claimed) and counts it; the thread that finishes the job's last
 * chunk wakes the caller. n_chunks cannot change before that count is reached. */
static void finish_chunk(pool *p, int k) {
    run_chunk(p, k);
    int nch = atomic_load_explicit(&p->n_chunks, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 == nch) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
    }
}

static bool new_job(void *vp, unsigned long seen) {
    return atomic_load_explicit(&((pool *)vp)->generation, memory_order_acquire) != seen;
}

static bool job_done(void *vp, unsigned long chunks) {
    return atomic_load_explicit(&((pool *)vp)->done, memory_order_acquire) >= (int)chunks;
}

static void *worker(void *arg) {
    pool *p = &g_pool;
    int id = (int)(intptr_t)arg;
    t_tid = id;
    t_in_parallel = 1;
    unsigned long seen = 0;
    for (;;) {
        /* A job seen while spinning is taken without the mutex: the caller holds it while
         * it publishes, so locking it here put the worker to sleep in the kernel until the
         * caller's unlock woke it, microseconds late for every job. The chunks are claimed
         * atomically, so a stale n_chunks only makes this worker claim fewer of them. */
        int64_t t0;
        if (!spin_until(new_job, p, seen, &t_spin, &t0)) {
            pthread_mutex_lock(&p->mu);
            while (!p->shutdown && atomic_load_explicit(&p->generation, memory_order_relaxed) == seen)
                pthread_cond_wait(&p->cv_work, &p->mu);
            int stop = p->shutdown;
            pthread_mutex_unlock(&p->mu);
            if (stop) break;
            spin_slept(&t_spin, t0);
        }
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        int nch = atomic_load_explicit(&p->n_chunks, memory_order_relaxed);
        /* own chunk first, then any other still unclaimed (another worker descheduled) */
        for (int j = 0; j < nch; j++) {
            int k = (id + j) % nch;
            if (k != 0 && claim(p, k)) finish_chunk(p, k);
        }
    }
    return NULL;
}

static void start_pool(pool *p, int n) {
    p->n_threads = 1;
    p->shutdown = 0;
    for (int i = 1; i < n; i++) {
        if (pthread_create(&p->th[i], NULL, worker, (void *)(intptr_t)i) != 0) break;
        p->n_threads++;
    }
    p->started = 1;
}

void fm_parallel_shutdown(void) {
    pool *p = &g_pool;
    pthread_mutex_lock(&p->mu);
    if (!p->started) { pthread_mutex_unlock(&p->mu); return; }
    p->shutdown = 1;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->th[i], NULL);
    p->started = 0;
    p->n_threads = 1;
}

__attribute__((destructor)) static void pool_at_exit(void) { fm_parallel_shutdown(); }

void fm_set_num_threads(int n) {
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    fm_parallel_shutdown();
    g_requested = n;
}

void fm_parallel_for(int64_t n, int64_t grain, fm_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int nt = fm_num_threads();
    int64_t max_chunks = (n + grain - 1) / grain;
    if (nt <= 1 || max_chunks <= 1 || t_in_parallel || t_serial) { fn(ctx, 0, n, 0); return; }
    /* One job at a time: a second non-pool thread (a data-loader worker, say)
     * that finds the pool busy runs its loop itself rather than waiting. */
    static pthread_mutex_t job_mu = PTHREAD_MUTEX_INITIALIZER;
    if (pthread_mutex_trylock(&job_mu) != 0) { fn(ctx, 0, n, 0); return; }
    pool *p = &g_pool;
    pthread_mutex_lock(&p->mu);
    if (!p->started) start_pool(p, nt);
    int workers = p->n_threads;
    int chunks = max_chunks < workers ? (int)max_chunks : workers;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = (n + chunks - 1) / chunks;
    atomic_store_explicit(&p->n_chunks, chunks, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    /* chunk 0 is the caller's; the rest are published free (release: after the job's fields) */
    atomic_store_explicit(&p->claimed[0], 1, memory_order_relaxed);
    for (int k = 1; k < workers; k++) atomic_store_explicit(&p->claimed[k], k < chunks ? 0 : 1, memory_order_release);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    t_in_parallel = 1;
    finish_chunk(p, 0);
    for (int k = 1; k < chunks; k++)
        if (claim(p, k)) finish_chunk(p, k);
    t_in_parallel = 0;
    int64_t t0;
    if (!spin_until(job_done, p, (unsigned long)chunks, &t_spin, &t0)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->done, memory_order_acquire) < chunks) pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
        spin_slept(&t_spin, t0);
    }
    pthread_mutex_unlock(&job_mu);
}

typedef struct dyn_job {
    fm_range_fn fn;
    void *ctx;
    int64_t n, grain;
    _Atomic int64_t next; /* the first item not yet claimed */
} dyn_job;

static void dyn_task(void *vctx, int64_t b0, int64_t b1, int tid) {
    (void)b0, (void)b1;
    dyn_job *j = vctx;
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&j->next, j->grain, memory_order_relaxed);
        if (b >= j->n) return;
        j->fn(j->ctx, b, b + j->grain < j->n ? b + j->grain : j->n, tid);
    }
}

void fm_parallel_for_dynamic(int64_t n, int64_t grain, fm_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t pieces = (n + grain - 1) / grain, nt = fm_num_threads();
    if (nt <= 1 || pieces <= 1 || t_in_parallel || t_serial) { fn(ctx, 0, n, 0); return; }
    dyn_job j = {.fn = fn, .ctx = ctx, .n = n, .grain = grain};
    atomic_init(&j.next, 0);
    fm_parallel_for(pieces < nt ? pieces : nt, 1, dyn_task, &j);
}
