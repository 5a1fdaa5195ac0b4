/* src/dist internals: the communicator and its non-blocking exchanges. */
#ifndef FATHOM_DIST_INTERNAL_H
#define FATHOM_DIST_INTERNAL_H
#include <stdbool.h>
#include <stdint.h>

#include "fathom/dist.h"

#if FATHOM_HAVE_MPI
#include <mpi.h>
#endif

struct fm_dist {
    int rank, size, local_rank, local_size;
    bool mpi;        /* collectives go through MPI */
    bool we_inited;  /* fm_dist_init called MPI_Init_thread */
    bool broken;     /* a collective timed out: its requests are still pending */
    double timeout_s;
    uint32_t seq;    /* collectives started, for message tags */
    fm_dist_stats stats;
#if FATHOM_HAVE_MPI
    MPI_Comm comm;
#endif
};

/* One non-blocking all-reduce (average), reduce-scatter or all-gather of f32
 * values, advanced by dist_work_test. Exchanges are point-to-point with every
 * peer, so a timeout can name the peers that sent nothing. */
typedef enum { DIST_ALLREDUCE, DIST_REDUCE_SCATTER, DIST_ALLGATHER } dist_kind;

typedef struct dist_work {
    fm_dist *d;
    dist_kind kind;
    const char *what;  /* for errors: "all-reduce", "bucket 3", ... */
    int phase;         /* 1: scatter exchange pending, 2: gather pending, 3: done */
    bool average;
    float *out;        /* result: n values (all-reduce), chunk (reduce-scatter), size*chunk (all-gather) */
    int64_t n, chunk;  /* chunk: values per rank */
    float *send, *recv; /* size*chunk each */
    int tag;
    double t_start, t_done;
    int n_req;
#if FATHOM_HAVE_MPI
    MPI_Request *req;  /* 2*(size-1): receives first, then sends */
#endif
} dist_work;

/* Starts w (zeroed by the caller, kind/what/average set). all-reduce: in/out are
 * n values (in may equal out); reduce-scatter: in is size*chunk, out chunk;
 * all-gather: in is chunk, out size*chunk. */
fm_status dist_work_start(dist_work *w, fm_dist *d, const float *in, float *out, int64_t n);
/* Advances w; true once its result is in out. */
bool dist_work_test(dist_work *w);
/* Waits for w against the communicator's timeout. */
fm_status dist_work_wait(dist_work *w);
/* Frees w's buffers (w itself belongs to the caller). */
void dist_work_free(dist_work *w);

double dist_now(void);
#endif
