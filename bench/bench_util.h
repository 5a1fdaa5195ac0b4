/* Timing helpers shared by the C benchmarks: a monotonic clock and the median
 * of a set of timings (the benches report medians of repeated rounds). */
#ifndef FATHOM_BENCH_UTIL_H
#define FATHOM_BENCH_UTIL_H
#include <stdlib.h>
#include <time.h>

/* FATHOM_BENCH_CLOCK=cpu: the process's CPU time instead of the wall clock. On a
 * machine shared with other jobs a process gets a core only part of the time,
 * which the wall clock counts and CPU time does not; meaningful at one thread
 * (FATHOM_NUM_THREADS=1), where CPU time is the time the work ran. The Python
 * side of the benches (the .py scripts in bench/) reads the same variable. */
static inline double bench_now_s(void) {
    static int cpu = -1;
    if (cpu < 0) {
        const char *e = getenv("FATHOM_BENCH_CLOCK");
        cpu = e && e[0] == 'c' && e[1] == 'p' && e[2] == 'u' && !e[3];
    }
    struct timespec ts;
    clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double bench_now_ms(void) { return 1e3 * bench_now_s(); }

/* ascending order for qsort over doubles */
static inline int bench_cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* sorts v */
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
#endif
