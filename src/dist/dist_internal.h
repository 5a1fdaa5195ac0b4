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
    bool sim;        /* a planner's stand-in group (dist_plan_group): collectives move nothing */
    double timeout_s;
    uint32_t seq;    /* collectives started, for message tags */
    fm_dist_stats stats;
    struct dist_nccl *nccl; /* collectives on CUDA buffers (nccl.c, fm_dist_use_device), or NULL */
    bool staged;     /* CUDA without NCCL by choice (FATHOM_DIST_NCCL=0): through host copies and MPI */
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
/* A stand-in for rank `rank` of a group of `size` (the planner runs a rank's training step
 * on the meta device, where there is no data to exchange): every collective returns at
 * once and leaves the buffers as they are. Free with fm_dist_finalize. */
fm_dist *dist_plan_group(int size, int rank);

/* ---- NCCL (nccl.c; without FATHOM_HAVE_NCCL each says why it cannot run) ----
 * Collectives on buffers of the GPU the communicator was set up on, queued after
 * the work on fathom's compute stream; their events are what the host polls and
 * what the compute stream waits for before reading the results. */
typedef enum { DIST_DEV_ALLREDUCE_AVG, DIST_DEV_ALLREDUCE_SUM, DIST_DEV_REDUCE_SCATTER_AVG, DIST_DEV_REDUCE_SCATTER_SUM, DIST_DEV_ALLGATHER,
               DIST_DEV_BROADCAST } dist_dev_op;
fm_status dist_nccl_init(fm_dist *d, int device);
void dist_nccl_free(fm_dist *d);
/* Starts an in-place average of n f32 values on the GPU; *done: an event to test/wait. */
fm_status dist_nccl_allreduce_avg_start(fm_dist *d, float *buf, int64_t n, const char *what, void **done);
bool dist_nccl_test(fm_dist *d, void *done);
/* Waits for done against the timeout (aborting the communicator when it passes). */
fm_status dist_nccl_wait(fm_dist *d, void *done, const char *what);
void dist_nccl_event_free(void *done);
/* One collective, waited for. count: f32 values per rank (all-reduce: the whole
 * buffer; reduce-scatter: the output shard; all-gather: the input shard), bytes for a
 * broadcast. */
fm_status dist_nccl_collective(fm_dist *d, dist_dev_op op, const void *in, void *out, int64_t count, int root);
/* t (contiguous, any device) = its numel values of dtype dt at host address h (dist_device.c). */
fm_status dist_from_host(fm_tensor *t, const void *h, fm_dtype dt);
#endif
