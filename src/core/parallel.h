/* The persistent CPU thread pool. Sized by FATHOM_NUM_THREADS, default: the
 * number of cores. fm_parallel_for splits [0, n) into contiguous chunks of at
 * least `grain` items; the calling thread takes part. Nested calls run serially. */
#ifndef FATHOM_PARALLEL_H
#define FATHOM_PARALLEL_H
#include <stdint.h>

typedef void (*fm_range_fn)(void *ctx, int64_t begin, int64_t end, int thread_id);
void fm_parallel_for(int64_t n, int64_t grain, fm_range_fn fn, void *ctx);
/* The same loop with the items claimed `grain` at a time from a shared counter by every
 * thread until none is left, so a thread that starts late (woken from sleep, or
 * descheduled) takes fewer instead of the others waiting for its fixed chunk. fn is
 * called several times per thread, each call with its own disjoint [begin, end): for
 * loops whose items write disjoint outputs and keep no per-thread state across calls. */
void fm_parallel_for_dynamic(int64_t n, int64_t grain, fm_range_fn fn, void *ctx);
int fm_num_threads(void);
void fm_set_num_threads(int n);
/* While on, the calling thread runs its fm_parallel_for loops itself: for a
 * latency-bound caller whose loops are too small to pay for waking the pool
 * (the text server's one-token decode steps). Per thread; off by default. */
void fm_parallel_serial(int on);
/* How long an idle pool thread (or a caller waiting for its workers) spins
 * before it sleeps, at most, in microseconds (0: sleep at once). Default 1000,
 * or FATHOM_SPIN_US; the budget then adapts per thread (parallel.c). */
void fm_parallel_set_spin_us(int64_t us);
/* The budget used when FATHOM_SPIN_US is unset or not a number (a valid one still
 * wins): a program with its own default, as the server's 30 us. Call it before
 * fm_parallel_set_spin_us, which it undoes. */
void fm_parallel_set_spin_default_us(int64_t us);
/* The budget in force, in microseconds. */
int64_t fm_parallel_spin_us(void);
/* Index of the calling pool thread (0 = the caller/main). */
int fm_thread_id(void);
/* Shut the pool down (tests call it so valgrind sees no live threads). */
void fm_parallel_shutdown(void);
#endif
