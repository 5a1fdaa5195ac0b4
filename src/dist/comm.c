/* The communicator: joining the MPI world, and the f32 collectives as
 * non-blocking point-to-point exchanges polled against a deadline.
 *
 * Why not MPI_Iallreduce: the MPI standard leaves the order in which a reduction
 * adds the ranks' values to the implementation (it may change with the message
 * size or the algorithm picked), and a pending collective cannot say which peer it
 * is waiting for. Here an all-reduce is an exchange of chunks (rank j gets chunk j
 * from everyone), a sum in rank order in double, and an exchange of the reduced
 * chunks: each rank sends 2(N-1)/N of the buffer, as a ring all-reduce does, the
 * result is the same bits whatever the timing, and a timeout lists the peers whose
 * data never came. */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/dist_internal.h"

double dist_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool fm_dist_mpi_built(void) { return FATHOM_HAVE_MPI != 0; }

/* Started by an MPI launcher? (OpenMPI, MPICH/Hydra and PMIx-based launchers set these.) */
static bool launched_by_mpi(void) {
    const char *f = getenv("FATHOM_DIST");
    if (f && !strcmp(f, "mpi")) return true;
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return true;
    return false;
}

static fm_status timeout_from_env(double *out) {
    *out = 300.0;
    const char *s = getenv("FATHOM_DIST_TIMEOUT");
    if (!s || !*s) return FM_OK;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v > 0))
        return fm_set_error(FM_ERR_INVALID, "FATHOM_DIST_TIMEOUT='%s': expected a number of seconds > 0", s);
    *out = v;
    return FM_OK;
}

#if FATHOM_HAVE_MPI
static fm_status mpi_error(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return fm_set_error(FM_ERR_IO, "%s: MPI error: %.*s", what, len, msg);
}

static fm_status join_mpi(fm_dist *d) {
    int inited = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        /* only the thread that calls fathom talks to MPI */
        if ((rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS)
            return mpi_error(rc, "dist init");
        d->we_inited = true;
    }
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &d->comm)) != MPI_SUCCESS) return mpi_error(rc, "dist init");
    MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(d->comm, &d->rank);
    MPI_Comm_size(d->comm, &d->size);
    MPI_Comm node;
    if (MPI_Comm_split_type(d->comm, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_rank(node, &d->local_rank);
        MPI_Comm_size(node, &d->local_size);
        MPI_Comm_free(&node);
    }
    d->mpi = true;
    return FM_OK;
}
#endif

fm_status fm_dist_init(fm_dist **out) {
    if (!out) return fm_set_error(FM_ERR_INVALID, "dist init: out is NULL");
    *out = NULL;
    double timeout;
    if (timeout_from_env(&timeout) != FM_OK) return fm_last_status();
    fm_dist *d = calloc(1, sizeof *d);
    if (!d) return fm_set_error(FM_ERR_OOM, "dist init: out of memory");
    d->size = 1;
    d->timeout_s = timeout;
    if (launched_by_mpi()) {
#if FATHOM_HAVE_MPI
        if (join_mpi(d) != FM_OK) { free(d); return fm_last_status(); }
#else
        free(d);
        return fm_set_error(FM_ERR_UNSUPPORTED, "started by an MPI launcher, but this fathom was built without "
                            "MPI: install OpenMPI (libopenmpi-dev) and rebuild (FATHOM_MPI=AUTO or ON)");
#endif
    }
    *out = d;
    return FM_OK;
}

fm_dist *dist_plan_group(int size, int rank) {
    if (size < 1 || rank < 0 || rank >= size) {
        fm_set_error(FM_ERR_INVALID, "plan group: rank %d of %d", rank, size);
        return NULL;
    }
    fm_dist *d = calloc(1, sizeof *d);
    if (!d) { fm_set_error(FM_ERR_OOM, "plan group: out of memory"); return NULL; }
    d->size = size;
    d->rank = rank;
    d->local_size = size;
    d->local_rank = rank;
    d->timeout_s = 300;
    d->sim = true;
    return d;
}

void fm_dist_finalize(fm_dist *d) {
    if (!d) return;
    dist_nccl_free(d);
#if FATHOM_HAVE_MPI
    if (d->mpi && !d->broken) {
        MPI_Comm_free(&d->comm);
        if (d->we_inited) MPI_Finalize();
    }
#endif
    free(d);
}

void fm_dist_abort(fm_dist *d, int code) {
    fflush(stdout);
    fflush(stderr);
#if FATHOM_HAVE_MPI
    if (d && d->mpi) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    (void)d;
    exit(code);
}

int fm_dist_rank(const fm_dist *d) { return d ? d->rank : 0; }
int fm_dist_size(const fm_dist *d) { return d ? d->size : 1; }
int fm_dist_local_rank(const fm_dist *d) { return d ? d->local_rank : 0; }
int fm_dist_local_size(const fm_dist *d) { return d && d->local_size > 0 ? d->local_size : 1; }
bool fm_dist_uses_mpi(const fm_dist *d) { return d && d->mpi; }
double fm_dist_timeout(const fm_dist *d) { return d ? d->timeout_s : 0; }

fm_status fm_dist_set_timeout(fm_dist *d, double seconds) {
    if (!d || !(seconds > 0) || seconds > 1e7)
        return fm_set_error(FM_ERR_INVALID, "dist: timeout %g s must be > 0 (and at most 10^7)", seconds);
    d->timeout_s = seconds;
    return FM_OK;
}

void fm_dist_stats_get(const fm_dist *d, fm_dist_stats *out) {
    if (out) memset(out, 0, sizeof *out);
    if (d && out) *out = d->stats;
}
void fm_dist_stats_reset(fm_dist *d) {
    if (d) memset(&d->stats, 0, sizeof d->stats);
}

uint64_t fm_dist_hash(uint64_t h, const void *data, size_t n) {
    if (!h) h = 1469598103934665603ull;
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}

/* ---- the non-blocking exchanges ---- */

/* dst[k] = sum over ranks j (in order) of src[j*chunk + k], / size if average */
static void reduce_chunks(const float *src, float *dst, int64_t chunk, int size, bool average) {
    for (int64_t k = 0; k < chunk; k++) {
        double s = 0;
        for (int j = 0; j < size; j++) s += (double)src[(int64_t)j * chunk + k];
        dst[k] = (float)(average ? s / size : s);
    }
}

#if FATHOM_HAVE_MPI
/* Posts one exchange: to each peer j, `chunk` values from sendbase + j*sstride;
 * from each peer j, into recvbase + j*chunk. */
static fm_status post_exchange(dist_work *w, const float *sendbase, int64_t sstride, float *recvbase, int tag) {
    fm_dist *d = w->d;
    int k = 0, rc = MPI_SUCCESS;
    for (int j = 0; j < d->size && rc == MPI_SUCCESS; j++)
        if (j != d->rank) rc = MPI_Irecv(recvbase + (int64_t)j * w->chunk, (int)w->chunk, MPI_FLOAT, j, tag, d->comm, &w->req[k++]);
    for (int j = 0; j < d->size && rc == MPI_SUCCESS; j++)
        if (j != d->rank) {
            rc = MPI_Isend(sendbase + (int64_t)j * sstride, (int)w->chunk, MPI_FLOAT, j, tag, d->comm, &w->req[k++]);
            d->stats.bytes_sent += w->chunk * (int64_t)sizeof(float);
        }
    w->n_req = k;
    if (rc != MPI_SUCCESS) { d->broken = true; return mpi_error(rc, w->what); }
    return FM_OK;
}
#endif

fm_status dist_work_start(dist_work *w, fm_dist *d, const float *in, float *out, int64_t n) {
    w->d = d;
    w->out = out;
    w->n = n;
    w->t_start = dist_now();
    if (!w->what) w->what = "collective";
    if (d->broken) return fm_set_error(FM_ERR_STATE, "%s: an earlier collective timed out; the job cannot go on", w->what);
    int64_t size = d->size;
    w->chunk = w->kind == DIST_ALLREDUCE ? (n + size - 1) / size : n;
    if (n < 0 || w->chunk > INT_MAX)
        return fm_set_error(FM_ERR_INVALID, "%s: %lld values per rank is outside 0..%d", w->what, (long long)w->chunk, INT_MAX);
    if (w->kind != DIST_ALLGATHER) {
        int64_t total = w->kind == DIST_ALLREDUCE ? size * w->chunk : size * n;
        w->send = malloc(sizeof(float) * (size_t)(total ? total : 1));
        w->recv = malloc(sizeof(float) * (size_t)(total ? total : 1));
        if (!w->send || !w->recv) return fm_set_error(FM_ERR_OOM, "%s: out of memory for %lld values", w->what, (long long)total);
        int64_t have = w->kind == DIST_ALLREDUCE ? n : total;
        memcpy(w->send, in, sizeof(float) * (size_t)have);
        memset(w->send + have, 0, sizeof(float) * (size_t)(total - have));
        memcpy(w->recv + d->rank * w->chunk, w->send + d->rank * w->chunk, sizeof(float) * (size_t)w->chunk);
    } else {
        memmove(out + d->rank * n, in, sizeof(float) * (size_t)n);
    }
    w->phase = w->kind == DIST_ALLGATHER ? 2 : 1;
    w->tag = (int)(d->seq++ % 16000u) * 2 + 1;
    if (!d->mpi) { /* a world of one: nothing to exchange */
        dist_work_test(w);
        return FM_OK;
    }
#if FATHOM_HAVE_MPI
    w->req = malloc(sizeof(MPI_Request) * (size_t)(2 * (d->size - 1)));
    if (!w->req) return fm_set_error(FM_ERR_OOM, "%s: out of memory", w->what);
    if (w->phase == 1) return post_exchange(w, w->send, w->chunk, w->recv, w->tag);
    return post_exchange(w, out + d->rank * n, 0, out, w->tag + 1);
#else
    return fm_set_error(FM_ERR_INTERNAL, "%s: MPI world without MPI", w->what);
#endif
}

/* The exchange of the current phase is complete: go on to the next phase. */
static void next_phase(dist_work *w) {
    fm_dist *d = w->d;
    if (w->phase == 1) {
        float *mine = w->kind == DIST_ALLREDUCE ? w->send + d->rank * w->chunk : w->out;
        reduce_chunks(w->recv, mine, w->chunk, d->size, w->average);
        if (w->kind == DIST_REDUCE_SCATTER) { w->phase = 3; return; }
        w->phase = 2;
#if FATHOM_HAVE_MPI
        if (d->mpi && post_exchange(w, mine, 0, w->send, w->tag + 1) != FM_OK) { w->phase = 3; return; }
#endif
        if (d->mpi) return;
    }
    if (w->kind == DIST_ALLREDUCE) memcpy(w->out, w->send, sizeof(float) * (size_t)w->n);
    w->phase = 3;
}

bool dist_work_test(dist_work *w) {
    while (w->phase < 3) {
        if (w->d->mpi) {
#if FATHOM_HAVE_MPI
            int flag = 0;
            if (MPI_Testall(w->n_req, w->req, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) { w->phase = 3; break; }
            if (!flag) return false;
#endif
        }
        next_phase(w);
    }
    if (!w->t_done) {
        w->t_done = dist_now();
        w->d->stats.collectives++;
    }
    return true;
}

#if FATHOM_HAVE_MPI
/* Lists the peers whose message of the pending exchange has not arrived. */
static void silent_peers(dist_work *w, char *buf, size_t cap) {
    size_t len = 0;
    int k = 0;
    buf[0] = 0;
    for (int j = 0; j < w->d->size; j++) {
        if (j == w->d->rank) continue;
        int done = 0;
        MPI_Test(&w->req[k++], &done, MPI_STATUS_IGNORE);
        if (!done && len + 16 < cap) len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? ", " : "", j);
    }
    /* every peer's data is in: the peers that have not taken this rank's (a rank stopped
     * after sending its part cannot receive, and large messages need the receiver) */
    bool any_recv = len > 0;
    for (int j = 0; j < w->d->size && !any_recv; j++) {
        if (j == w->d->rank) continue;
        int done = 0;
        MPI_Test(&w->req[k++], &done, MPI_STATUS_IGNORE);
        if (!done && len + 16 < cap) len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? ", " : "", j);
    }
    if (!len) snprintf(buf, cap, "(none: its own sends did not complete)");
}
#endif

fm_status dist_work_wait(dist_work *w) {
    double t0 = dist_now(), deadline = t0 + w->d->timeout_s;
    long spins = 0;
    while (!dist_work_test(w)) {
        if (dist_now() > deadline) {
            w->d->broken = true;
            char peers[256] = "";
#if FATHOM_HAVE_MPI
            silent_peers(w, peers, sizeof peers);
#endif
            w->d->stats.wait_seconds += dist_now() - t0;
            return fm_set_error(FM_ERR_STATE, "rank %d of %d: %s timed out after %g s waiting for rank %s, which died "
                                "or hangs (the limit is FATHOM_DIST_TIMEOUT seconds)", w->d->rank, w->d->size,
                                w->what, w->d->timeout_s, peers);
        }
        /* ranks may share cores (mpirun --oversubscribe): give the CPU away */
        if (++spins < 200) sched_yield();
        else nanosleep(&(struct timespec){0, 50000}, NULL);
    }
    w->d->stats.wait_seconds += dist_now() - t0;
    return w->phase == 3 && w->d->broken ? fm_set_error(FM_ERR_IO, "%s: MPI failed", w->what) : FM_OK;
}

void dist_work_free(dist_work *w) {
    if (!w) return;
    free(w->send);
    free(w->recv);
#if FATHOM_HAVE_MPI
    free(w->req);
#endif
    w->send = w->recv = NULL;
}

/* ---- blocking collectives ---- */

static fm_status run_work(fm_dist *d, dist_kind kind, const char *what, bool average, const float *in, float *out,
                          int64_t n) {
    if (!d) return fm_set_error(FM_ERR_INVALID, "%s: communicator is NULL", what);
    if (d->sim) return FM_OK;
    dist_work w;
    memset(&w, 0, sizeof w);
    w.kind = kind;
    w.what = what;
    w.average = average;
    fm_status st = dist_work_start(&w, d, in, out, n);
    if (st == FM_OK) st = dist_work_wait(&w);
    if (!d->broken) dist_work_free(&w); /* after a timeout MPI may still write into the buffers */
    return st;
}

fm_status fm_dist_allreduce_avg_f32(fm_dist *d, float *buf, int64_t n) {
    return run_work(d, DIST_ALLREDUCE, "all-reduce", true, buf, buf, n);
}

fm_status fm_dist_reduce_scatter_f32(fm_dist *d, const float *in, float *out, int64_t shard, bool average) {
    return run_work(d, DIST_REDUCE_SCATTER, "reduce-scatter", average, in, out, shard);
}

fm_status fm_dist_allgather_f32(fm_dist *d, const float *in, float *out, int64_t shard) {
    return run_work(d, DIST_ALLGATHER, "all-gather", false, in, out, shard);
}

/* doubles travel as pairs of floats' bits through the all-gather, then are summed in rank order */
fm_status fm_dist_allreduce_sum_f64(fm_dist *d, double *buf, int64_t n) {
    if (!d) return fm_set_error(FM_ERR_INVALID, "all-reduce: communicator is NULL");
    if (d->size == 1 || d->sim) return FM_OK;
    double *all = malloc(sizeof(double) * (size_t)(n * d->size + 1));
    if (!all) return fm_set_error(FM_ERR_OOM, "all-reduce: out of memory");
    fm_status st = run_work(d, DIST_ALLGATHER, "all-reduce (f64)", false, (const float *)buf, (float *)all, 2 * n);
    if (st == FM_OK)
        for (int64_t k = 0; k < n; k++) {
            double s = 0;
            for (int j = 0; j < d->size; j++) s += all[(int64_t)j * n + k];
            buf[k] = s;
        }
    if (!d->broken) free(all);
    return st;
}

/* A real broadcast: MPI_Ibcast (MPI picks the tree; the root sends the buffer, not N
 * copies of it), polled against the deadline as the exchanges are. Buffers over 1 GiB
 * go as several broadcasts (MPI counts are ints). MPI_Ibcast cannot say which rank it
 * waits for, so a timeout names the root and says that it or a rank relaying its data
 * died or hangs. Broadcast bytes are not counted in the statistics' bytes_sent: how
 * much each rank relays is MPI's choice. */
fm_status fm_dist_broadcast(fm_dist *d, void *buf, size_t bytes, int root) {
    if (!d) return fm_set_error(FM_ERR_INVALID, "broadcast: communicator is NULL");
    if (root < 0 || root >= d->size) return fm_set_error(FM_ERR_INVALID, "broadcast: root %d is not a rank (0..%d)", root, d->size - 1);
    if (!buf && bytes) return fm_set_error(FM_ERR_INVALID, "broadcast: buffer is NULL");
    if (d->size == 1 || bytes == 0 || d->sim) return FM_OK;
    if (d->broken) return fm_set_error(FM_ERR_STATE, "broadcast: an earlier collective timed out; the job cannot go on");
    if (!d->mpi) return fm_set_error(FM_ERR_INTERNAL, "broadcast: a world of %d without MPI", d->size);
#if FATHOM_HAVE_MPI
    const size_t max_piece = (size_t)1 << 30;
    double t0 = dist_now(), deadline = t0 + d->timeout_s;
    for (size_t at = 0; at < bytes; at += max_piece) {
        size_t piece = bytes - at < max_piece ? bytes - at : max_piece;
        MPI_Request req;
        int rc = MPI_Ibcast((char *)buf + at, (int)piece, MPI_BYTE, root, d->comm, &req);
        if (rc != MPI_SUCCESS) { d->broken = true; return mpi_error(rc, "broadcast"); }
        long spins = 0;
        for (;;) {
            int flag = 0;
            if ((rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS) {
                d->broken = true;
                return mpi_error(rc, "broadcast");
            }
            if (flag) break;
            if (dist_now() > deadline) {
                d->broken = true; /* the request stays pending: the buffer is MPI's until the job ends */
                d->stats.wait_seconds += dist_now() - t0;
                return fm_set_error(FM_ERR_STATE, "rank %d of %d: broadcast from rank %d timed out after %g s: rank %d, "
                                    "or a rank relaying its data, died or hangs (the limit is FATHOM_DIST_TIMEOUT seconds)",
                                    d->rank, d->size, root, d->timeout_s, root);
            }
            if (++spins < 200) sched_yield();
            else nanosleep(&(struct timespec){0, 50000}, NULL);
        }
    }
    d->stats.wait_seconds += dist_now() - t0;
    d->stats.collectives++;
    return FM_OK;
#else
    return fm_set_error(FM_ERR_INTERNAL, "broadcast: MPI world without MPI");
#endif
}

uint64_t fm_dist_rank_seed(uint64_t seed, int rank) {
    /* splitmix64's finalizer of rank x the golden ratio: 0 for rank 0, and a
     * different well-mixed word for every other rank */
    uint64_t z = (uint64_t)(uint32_t)rank * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return seed ^ (z ^ (z >> 31));
}

fm_status fm_dist_check_same(fm_dist *d, uint64_t value, const char *what) {
    if (!d) return fm_set_error(FM_ERR_INVALID, "check_same: communicator is NULL");
    if (d->size == 1) return FM_OK;
    uint64_t *all = calloc((size_t)d->size, sizeof *all);
    if (!all) return fm_set_error(FM_ERR_OOM, "check_same: out of memory");
    fm_status st = run_work(d, DIST_ALLGATHER, what, false, (const float *)&value, (float *)all, 2);
    if (st == FM_OK) {
        char bad[256] = "";
        size_t len = 0;
        for (int j = 1; j < d->size; j++)
            if (all[j] != all[0] && len + 16 < sizeof bad) len += (size_t)snprintf(bad + len, sizeof bad - len, "%s%d", len ? ", " : "", j);
        if (len)
            st = fm_set_error(FM_ERR_INVALID, "%s differs between ranks: rank %s %s not match rank 0 (hash %016llx); "
                              "every rank must run the same recipe, flags and data", what, bad,
                              strchr(bad, ',') ? "do" : "does", (unsigned long long)all[0]);
    }
    if (!d->broken) free(all);
    return st;
}
