/* The thread pool's adaptive spin (src/core/parallel.c) recovers after a quiet
 * stretch. A program's serial set-up (loading, quantizing) leaves the pool idle
 * for milliseconds at a time, and each such wait shrinks a worker's spin. Then
 * come jobs back to back with short gaps (a decode step: one job every ~50 us).
 * The spin must grow back over those gaps; it once stayed at its 1 us floor,
 * because only a wait that a spin had ended could grow it, and a 1 us spin ends
 * none: the worker slept in the kernel before every job (60 context switches a
 * decoded token on a 2-core Zen 3, 20-25% of the step).
 *
 * Measured here as the process's voluntary context switches (getrusage) over
 * 1000 jobs 30 us apart, after 14 jobs 3 ms apart: a worker that sleeps before
 * a job switches once for it. The check allows a quarter of the jobs to sleep
 * (a busy machine deschedules the caller now and then); before the fix it was
 * about one per job. Skipped under valgrind, whose serialised threads make
 * every spin meaningless. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include "test_util.h"
#include "core/parallel.h"

static atomic_long g_sum;

static void add_range(void *ctx, int64_t b, int64_t e, int tid) {
    (void)ctx, (void)tid;
    long s = 0;
    for (int64_t i = b; i < e; i++) s += (long)i;
    atomic_fetch_add(&g_sum, s);
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static long voluntary_switches(void) {
    struct rusage u;
    return getrusage(RUSAGE_SELF, &u) == 0 ? u.ru_nvcsw : -1;
}

int main(void) {
    if (getenv("FATHOM_UNDER_VALGRIND")) {
        TEST_SKIP("valgrind runs one thread at a time: a spin cannot overlap the caller\n");
        TEST_DONE();
    }
    fm_set_num_threads(2);
    fm_parallel_set_spin_us(1000);
    long expect = 0;
    /* the quiet stretch: every wait of the worker is longer than the 1 ms budget */
    for (int r = 0; r < 14; r++) {
        struct timespec d = {0, 3000000};
        nanosleep(&d, NULL);
        fm_parallel_for(64, 1, add_range, NULL);
        expect += 64 * 63 / 2;
    }
    long before = voluntary_switches();
    CHECK(before >= 0);
    const int jobs = 1000;
    for (int r = 0; r < jobs; r++) {
        int64_t until = now_ns() + 30000; /* the caller's serial work between jobs */
        while (now_ns() < until) {
        }
        fm_parallel_for(64, 1, add_range, NULL);
        expect += 64 * 63 / 2;
    }
    long slept = voluntary_switches() - before;
    fprintf(stderr, "voluntary context switches over %d jobs 30 us apart: %ld\n", jobs, slept);
    CHECK_MSG(slept < jobs / 4, "%ld voluntary context switches over %d jobs 30 us apart: the pool's spin did not grow back after the quiet stretch", slept,
              jobs);
    CHECK(atomic_load(&g_sum) == expect);
    fm_parallel_shutdown();
    TEST_DONE();
}
