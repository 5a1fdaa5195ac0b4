/* NCCL: the communicator's collectives on CUDA buffers (`mpirun -np N fathom
 * train --device cuda`). Each rank drives the GPU of its local rank; rank 0 makes
 * the NCCL unique id and MPI broadcasts it (NCCL's own bootstrap needs one
 * out-of-band exchange, and MPI already wires the ranks).
 *
 * Ordering: fathom queues every kernel of a device on its compute stream
 * (fm_cuda_compute_stream). A collective goes on a stream of its own, after an
 * event recorded on the compute stream (so it reads the finished gradients) and
 * an event recorded after it is what the host polls and what the compute stream
 * waits for before anything reads the result; backward keeps running on the
 * compute stream meanwhile, which is the overlap.
 *
 * Timeout: the communicator is made non-blocking (ncclConfig_t.blocking = 0),
 * so the host polls every collective against the job's deadline
 * (FATHOM_DIST_TIMEOUT) and aborts the communicator (ncclCommAbort) when a rank
 * died or hangs. NCCL does not say which peer is missing, so the error says so.
 *
 * Order of the sums: NCCL's (ring or tree), not the MPI path's rank order, so
 * results agree with the CPU's to rounding, not bit for bit.
 *
 * Built only where CMake found NCCL with CUDA and MPI (FATHOM_NCCL); elsewhere
 * every entry point says why it cannot run. Compiled here, never run on a GPU
 * (docs/DISTRIBUTED.md: unverified). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"

bool fm_dist_nccl_built(void) { return FATHOM_HAVE_NCCL != 0; }
bool fm_dist_uses_nccl(const fm_dist *d) { return d && d->nccl; }

#if FATHOM_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backend/cuda/cuda_backend.h" /* fm_cuda_compute_stream */

struct dist_nccl {
    ncclComm_t comm;
    int device;
    cudaStream_t compute, stream; /* fathom's compute stream; the collectives' own */
};

static fm_status cuda_fail(cudaError_t e, const char *what) {
    return fm_set_error(FM_ERR_IO, "%s: CUDA error: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static fm_status nccl_fail(fm_dist *d, ncclResult_t r, const char *what) {
    const char *last = d->nccl ? ncclGetLastError(d->nccl->comm) : NULL;
    return fm_set_error(FM_ERR_IO, "rank %d of %d: %s: NCCL error: %s%s%s", d->rank, d->size, what, ncclGetErrorString(r),
                        last && *last ? ": " : "", last ? last : "");
}

/* Polls the communicator until the operations NCCL is still setting up have been
 * queued (a non-blocking communicator returns ncclInProgress first). */
static fm_status nccl_settle(fm_dist *d, ncclResult_t r, const char *what) {
    double deadline = dist_now() + d->timeout_s;
    while (r == ncclInProgress) {
        if (dist_now() > deadline) {
            ncclCommAbort(d->nccl->comm);
            d->broken = true;
            return fm_set_error(FM_ERR_STATE, "rank %d of %d: %s timed out after %g s: a rank died or hangs (NCCL "
                                "does not say which; the limit is FATHOM_DIST_TIMEOUT seconds)", d->rank, d->size, what,
                                d->timeout_s);
        }
        ncclCommGetAsyncError(d->nccl->comm, &r);
    }
    return r == ncclSuccess ? FM_OK : nccl_fail(d, r, what);
}

fm_status dist_nccl_init(fm_dist *d, int device) {
    if (d->nccl) return d->nccl->device == device ? FM_OK : fm_set_error(FM_ERR_INVALID, "dist: NCCL is already on cuda:%d", d->nccl->device);
    void *compute = fm_cuda_compute_stream(device);
    if (!compute) return fm_last_status();
    /* rank 0's id and whether it could make one: every rank fails alike if not */
    struct { int ok; ncclUniqueId id; } msg;
    memset(&msg, 0, sizeof msg);
    ncclResult_t r = ncclSuccess;
    if (d->rank == 0) msg.ok = (r = ncclGetUniqueId(&msg.id)) == ncclSuccess;
    if (fm_dist_broadcast(d, &msg, sizeof msg, 0) != FM_OK) return fm_last_status();
    if (!msg.ok)
        return d->rank == 0 ? nccl_fail(d, r, "NCCL unique id")
                            : fm_set_error(FM_ERR_IO, "rank %d of %d: rank 0 could not make the NCCL unique id", d->rank, d->size);
    ncclUniqueId id = msg.id;
    struct dist_nccl *n = calloc(1, sizeof *n);
    if (!n) return fm_set_error(FM_ERR_OOM, "dist: out of memory");
    n->device = device;
    n->compute = (cudaStream_t)compute;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) { free(n); return cuda_fail(e, "NCCL stream"); }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    d->nccl = n;
    r = ncclCommInitRankConfig(&n->comm, d->size, id, d->rank, &cfg);
    fm_status st = r == ncclSuccess || r == ncclInProgress ? nccl_settle(d, r, "NCCL communicator set-up") : nccl_fail(d, r, "NCCL init");
    if (st != FM_OK) {
        if (!d->broken) {
            cudaStreamDestroy(n->stream);
            free(n);
            d->nccl = NULL;
        }
        return st;
    }
    return FM_OK;
}

void dist_nccl_free(fm_dist *d) {
    if (!d || !d->nccl) return;
    if (!d->broken) {
        ncclCommFinalize(d->nccl->comm);
        ncclCommDestroy(d->nccl->comm);
        cudaStreamDestroy(d->nccl->stream);
    }
    free(d->nccl);
    d->nccl = NULL;
}

/* Queues the collective `run` on the NCCL stream after the compute stream's work so
 * far; *done is an event recorded after it. */
typedef ncclResult_t (*nccl_op)(struct dist_nccl *n, const void *in, void *out, size_t count, int root);

static ncclResult_t op_allreduce(struct dist_nccl *n, const void *in, void *out, size_t count, int root) {
    (void)root;
    return ncclAllReduce(in, out, count, ncclFloat32, ncclAvg, n->comm, n->stream);
}
static ncclResult_t op_allreduce_sum(struct dist_nccl *n, const void *in, void *out, size_t count, int root) {
    (void)root;
    return ncclAllReduce(in, out, count, ncclFloat32, ncclSum, n->comm, n->stream);
}
static ncclResult_t op_rs_avg(struct dist_nccl *n, const void *in, void *out, size_t count, int root) {
    (void)root;
    return ncclReduceScatter(in, out, count, ncclFloat32, ncclAvg, n->comm, n->stream);
}
static ncclResult_t op_rs_sum(struct dist_nccl *n, const void *in, void *out, size_t count, int root) {
    (void)root;
    return ncclReduceScatter(in, out, count, ncclFloat32, ncclSum, n->comm, n->stream);
}
static ncclResult_t op_allgather(struct dist_nccl *n, const void *in, void *out, size_t count, int root) {
    (void)root;
    return ncclAllGather(in, out, count, ncclFloat32, n->comm, n->stream);
}
static ncclResult_t op_broadcast(struct dist_nccl *n, const void *in, void *out, size_t count, int root) {
    return ncclBroadcast(in, out, count, ncclInt8, root, n->comm, n->stream);
}

static fm_status queue(fm_dist *d, nccl_op run, const void *in, void *out, size_t count, int root, const char *what, void **done) {
    *done = NULL;
    struct dist_nccl *n = d->nccl;
    if (!n || d->broken) return fm_set_error(FM_ERR_STATE, "%s: no NCCL communicator (call fm_dist_use_device first)", what);
    cudaEvent_t ready, fin;
    cudaError_t e = cudaSetDevice(n->device);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    if (e != cudaSuccess) return cuda_fail(e, what);
    e = cudaEventRecord(ready, n->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(n->stream, ready, 0);
    cudaEventDestroy(ready); /* released once the wait has been satisfied */
    if (e != cudaSuccess) return cuda_fail(e, what);
    fm_status st = nccl_settle(d, run(n, in, out, count, root), what);
    if (st != FM_OK) return st;
    if ((e = cudaEventCreateWithFlags(&fin, cudaEventDisableTiming)) != cudaSuccess) return cuda_fail(e, what);
    if ((e = cudaEventRecord(fin, n->stream)) != cudaSuccess) { cudaEventDestroy(fin); return cuda_fail(e, what); }
    *done = fin;
    return FM_OK;
}

bool dist_nccl_test(fm_dist *d, void *done) {
    (void)d;
    return !done || cudaEventQuery((cudaEvent_t)done) != cudaErrorNotReady;
}

fm_status dist_nccl_wait(fm_dist *d, void *done, const char *what) {
    if (!done) return FM_OK;
    cudaEvent_t ev = (cudaEvent_t)done;
    double t0 = dist_now(), deadline = t0 + d->timeout_s;
    cudaError_t e;
    while ((e = cudaEventQuery(ev)) == cudaErrorNotReady) {
        ncclResult_t r = ncclSuccess;
        ncclCommGetAsyncError(d->nccl->comm, &r);
        if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(d, r, what);
        if (dist_now() > deadline) {
            ncclCommAbort(d->nccl->comm);
            d->broken = true;
            return fm_set_error(FM_ERR_STATE, "rank %d of %d: %s timed out after %g s: a rank died or hangs (NCCL does "
                                "not say which; the limit is FATHOM_DIST_TIMEOUT seconds)", d->rank, d->size, what, d->timeout_s);
        }
    }
    d->stats.wait_seconds += dist_now() - t0;
    if (e != cudaSuccess) return cuda_fail(e, what);
    /* whatever the compute stream queues next may read the result */
    if ((e = cudaStreamWaitEvent(d->nccl->compute, ev, 0)) != cudaSuccess) return cuda_fail(e, what);
    d->stats.collectives++;
    return FM_OK;
}

void dist_nccl_event_free(void *done) {
    if (done) cudaEventDestroy((cudaEvent_t)done);
}

fm_status dist_nccl_allreduce_avg_start(fm_dist *d, float *buf, int64_t n, const char *what, void **done) {
    if (d->size > 1) d->stats.bytes_sent += 2 * (int64_t)(d->size - 1) * ((n + d->size - 1) / d->size) * 4;
    return queue(d, op_allreduce, buf, buf, (size_t)n, 0, what, done);
}

/* One collective, waited for. */
static fm_status blocking(fm_dist *d, nccl_op run, const void *in, void *out, size_t count, int root, const char *what) {
    void *done = NULL;
    fm_status st = queue(d, run, in, out, count, root, what, &done);
    if (st == FM_OK) st = dist_nccl_wait(d, done, what);
    dist_nccl_event_free(done);
    return st;
}

fm_status dist_nccl_collective(fm_dist *d, dist_dev_op op, const void *in, void *out, int64_t count, int root) {
    switch (op) {
    case DIST_DEV_ALLREDUCE_AVG: return blocking(d, op_allreduce, in, out, (size_t)count, 0, "NCCL all-reduce");
    case DIST_DEV_ALLREDUCE_SUM: return blocking(d, op_allreduce_sum, in, out, (size_t)count, 0, "NCCL all-reduce (sum)");
    case DIST_DEV_REDUCE_SCATTER_AVG: return blocking(d, op_rs_avg, in, out, (size_t)count, 0, "NCCL reduce-scatter");
    case DIST_DEV_REDUCE_SCATTER_SUM: return blocking(d, op_rs_sum, in, out, (size_t)count, 0, "NCCL reduce-scatter");
    case DIST_DEV_ALLGATHER: return blocking(d, op_allgather, in, out, (size_t)count, 0, "NCCL all-gather");
    case DIST_DEV_BROADCAST: return blocking(d, op_broadcast, in, out, (size_t)count, root, "NCCL broadcast");
    }
    return fm_set_error(FM_ERR_INTERNAL, "dist: unknown NCCL collective %d", (int)op);
}

#else /* !FATHOM_HAVE_NCCL */

#define NO_NCCL "this fathom was built without NCCL (it needs the CUDA toolkit's NCCL, CUDA and MPI; FATHOM_NCCL=AUTO or ON)"

fm_status dist_nccl_init(fm_dist *d, int device) {
    (void)d; (void)device;
    return fm_set_error(FM_ERR_UNSUPPORTED, "NCCL: %s", NO_NCCL);
}
void dist_nccl_free(fm_dist *d) { (void)d; }
bool dist_nccl_test(fm_dist *d, void *done) { (void)d; (void)done; return true; }
fm_status dist_nccl_wait(fm_dist *d, void *done, const char *what) {
    (void)d; (void)done;
    return fm_set_error(FM_ERR_UNSUPPORTED, "%s: %s", what, NO_NCCL);
}
void dist_nccl_event_free(void *done) { (void)done; }
fm_status dist_nccl_allreduce_avg_start(fm_dist *d, float *buf, int64_t n, const char *what, void **done) {
    (void)d; (void)buf; (void)n; *done = NULL;
    return fm_set_error(FM_ERR_UNSUPPORTED, "%s: %s", what, NO_NCCL);
}
fm_status dist_nccl_collective(fm_dist *d, dist_dev_op op, const void *in, void *out, int64_t count, int root) {
    (void)d; (void)op; (void)in; (void)out; (void)count; (void)root;
    return fm_set_error(FM_ERR_UNSUPPORTED, "NCCL: %s", NO_NCCL);
}
#endif
