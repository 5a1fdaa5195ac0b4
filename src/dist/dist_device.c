/* Collectives on tensors of any device (include/fathom/dist.h): the CPU's go
 * through the MPI exchanges of comm.c on their memory, CUDA tensors through NCCL
 * (nccl.c) once fm_dist_use_device has joined it, and any other device's (the
 * check device; CUDA in a world of one without NCCL) through host copies around
 * the same MPI exchanges, so they give the CPU's bits. */
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"
#include "fathom/ops.h" /* fm_copy_ */

/* FATHOM_DIST_NCCL=0 keeps NCCL out: CUDA tensors' collectives go through host copies and
 * MPI, as PyTorch's gloo backend takes CUDA tensors. For a machine whose NCCL is broken or
 * absent, and so that ranks can share one GPU (NCCL refuses two ranks on one device):
 * the GPU check runs ZeRO-1 and tensor parallelism on one GPU so. */
fm_status fm_dist_use_device(fm_dist *d, fm_device dev) {
    if (!d) return fm_set_error(FM_ERR_INVALID, "dist: communicator is NULL");
    if (dev.type != FM_DEV_CUDA) return FM_OK;
    const char *e = getenv("FATHOM_DIST_NCCL");
    if (e && *e && strcmp(e, "1")) {
        if (strcmp(e, "0"))
            return fm_set_error(FM_ERR_INVALID, "FATHOM_DIST_NCCL='%s': expected 0 (collectives on CUDA tensors through "
                                "host copies and MPI) or 1 (through NCCL, the default)", e);
        d->staged = true;
        return FM_OK;
    }
    return dist_nccl_init(d, dev.index);
}

typedef enum { PATH_HOST, PATH_NCCL, PATH_STAGED } dist_path;

static dist_path path_of(const fm_dist *d, const fm_tensor *t) {
    fm_device dev = fm_tensor_device(t);
    if (dev.type == FM_DEV_CPU) return PATH_HOST;
    if (dev.type == FM_DEV_CUDA && d->nccl) return PATH_NCCL;
    return PATH_STAGED;
}

static fm_status check_f32(const char *what, const fm_tensor *t, int64_t numel) {
    if (!t || t->dtype != FM_F32 || !fm_tensor_is_contiguous(t) || (numel >= 0 && fm_tensor_numel(t) != numel))
        return fm_set_error(FM_ERR_INVALID, "%s: needs a contiguous f32 tensor%s", what, numel >= 0 ? " of the right size" : "");
    return FM_OK;
}

/* A host copy of t's values (f32), or NULL with the error set. */
static float *to_host(const fm_tensor *t) {
    int64_t n = fm_tensor_numel(t);
    float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!h) { fm_set_error(FM_ERR_OOM, "dist: out of host memory for %lld staged values", (long long)n); return NULL; }
    if (fm_tensor_copy_to_host(t, h, FM_F32) != FM_OK) { free(h); return NULL; }
    return h;
}

/* t = the n host values in h (t is contiguous and has n elements). */
fm_status dist_from_host(fm_tensor *t, const void *h, fm_dtype dt) {
    int64_t n = fm_tensor_numel(t);
    fm_tensor *src = fm_tensor_from_buffer((void *)h, 1, &n, dt, NULL, NULL);
    fm_tensor *dst = src ? fm_view(t, 1, &n) : NULL;
    fm_status st = dst ? fm_copy_(dst, src) : fm_last_status();
    fm_tensor_release_n(2, src, dst);
    return st;
}

/* An in-place all-reduce of t: the average (sum = false) or the sum over the ranks. */
static fm_status allreduce_tensor(fm_dist *d, fm_tensor *t, bool sum) {
    if (!d) return fm_set_error(FM_ERR_INVALID, "dist: communicator is NULL");
    if (check_f32(sum ? "all-reduce (sum)" : "all-reduce", t, -1)) return fm_last_status();
    int64_t n = fm_tensor_numel(t);
    fm_status (*host)(fm_dist *, float *, int64_t) = sum ? fm_dist_allreduce_sum_f32 : fm_dist_allreduce_avg_f32;
    if (sum && (d->size == 1 || d->sim)) return FM_OK;
    switch (path_of(d, t)) {
    case PATH_HOST: return host(d, fm_tensor_data(t), n);
    case PATH_NCCL:
        return dist_nccl_collective(d, sum ? DIST_DEV_ALLREDUCE_SUM : DIST_DEV_ALLREDUCE_AVG, fm_tensor_data(t),
                                    fm_tensor_data(t), n, 0);
    case PATH_STAGED: break;
    }
    float *h = to_host(t);
    if (!h) return fm_last_status();
    fm_status st = host(d, h, n);
    if (st == FM_OK) st = dist_from_host(t, h, FM_F32);
    free(h);
    return st;
}

fm_status fm_dist_allreduce_avg_tensor(fm_dist *d, fm_tensor *t) { return allreduce_tensor(d, t, false); }
fm_status fm_dist_allreduce_sum_tensor(fm_dist *d, fm_tensor *t) { return allreduce_tensor(d, t, true); }

fm_status fm_dist_reduce_scatter_tensor(fm_dist *d, const fm_tensor *in, fm_tensor *out, bool average) {
    if (!d) return fm_set_error(FM_ERR_INVALID, "dist: communicator is NULL");
    int64_t shard = out ? fm_tensor_numel(out) : 0;
    if (check_f32("reduce-scatter", out, -1) || check_f32("reduce-scatter", in, shard * d->size)) return fm_last_status();
    if (path_of(d, in) != path_of(d, out) || !fm_device_eq(fm_tensor_device(in), fm_tensor_device(out)))
        return fm_set_error(FM_ERR_INVALID, "reduce-scatter: input and output must be on one device");
    switch (path_of(d, out)) {
    case PATH_HOST: return fm_dist_reduce_scatter_f32(d, fm_tensor_data(in), fm_tensor_data(out), shard, average);
    case PATH_NCCL:
        return dist_nccl_collective(d, average ? DIST_DEV_REDUCE_SCATTER_AVG : DIST_DEV_REDUCE_SCATTER_SUM, fm_tensor_data(in),
                                    fm_tensor_data(out), shard, 0);
    case PATH_STAGED: break;
    }
    float *h = to_host(in), *o = h ? malloc(sizeof(float) * (size_t)(shard ? shard : 1)) : NULL;
    fm_status st = !h ? fm_last_status() : !o ? fm_set_error(FM_ERR_OOM, "dist: out of host memory") : FM_OK;
    if (st == FM_OK) st = fm_dist_reduce_scatter_f32(d, h, o, shard, average);
    if (st == FM_OK) st = dist_from_host(out, o, FM_F32);
    free(h);
    free(o);
    return st;
}

fm_status fm_dist_allgather_tensor(fm_dist *d, const fm_tensor *in, fm_tensor *out) {
    if (!d) return fm_set_error(FM_ERR_INVALID, "dist: communicator is NULL");
    int64_t shard = in ? fm_tensor_numel(in) : 0;
    if (check_f32("all-gather", in, -1) || check_f32("all-gather", out, shard * d->size)) return fm_last_status();
    if (!fm_device_eq(fm_tensor_device(in), fm_tensor_device(out)))
        return fm_set_error(FM_ERR_INVALID, "all-gather: input and output must be on one device");
    switch (path_of(d, out)) {
    case PATH_HOST: return fm_dist_allgather_f32(d, fm_tensor_data(in), fm_tensor_data(out), shard);
    case PATH_NCCL: return dist_nccl_collective(d, DIST_DEV_ALLGATHER, fm_tensor_data(in), fm_tensor_data(out), shard, 0);
    case PATH_STAGED: break;
    }
    int64_t whole = shard * d->size;
    float *h = to_host(in), *o = h ? malloc(sizeof(float) * (size_t)(whole > 0 ? whole : 1)) : NULL;
    fm_status st = !h ? fm_last_status() : !o ? fm_set_error(FM_ERR_OOM, "dist: out of host memory") : FM_OK;
    if (st == FM_OK) st = fm_dist_allgather_f32(d, h, o, shard);
    if (st == FM_OK) st = dist_from_host(out, o, FM_F32);
    free(h);
    free(o);
    return st;
}

fm_status fm_dist_broadcast_tensor(fm_dist *d, fm_tensor *t, int root) {
    if (!d) return fm_set_error(FM_ERR_INVALID, "dist: communicator is NULL");
    if (!t || !fm_tensor_is_contiguous(t)) return fm_set_error(FM_ERR_INVALID, "broadcast: needs a contiguous tensor");
    size_t bytes = fm_tensor_nbytes(t);
    switch (path_of(d, t)) {
    case PATH_HOST: return fm_dist_broadcast(d, fm_tensor_data(t), bytes, root);
    case PATH_NCCL: return dist_nccl_collective(d, DIST_DEV_BROADCAST, fm_tensor_data(t), fm_tensor_data(t), (int64_t)bytes, root);
    case PATH_STAGED: break;
    }
    void *h = malloc(bytes ? bytes : 1);
    if (!h) return fm_set_error(FM_ERR_OOM, "dist: out of host memory for a %zu-byte broadcast", bytes);
    fm_status st = fm_tensor_copy_to_host(t, h, t->dtype);
    if (st == FM_OK) st = fm_dist_broadcast(d, h, bytes, root);
    if (st == FM_OK) st = dist_from_host(t, h, t->dtype);
    free(h);
    return st;
}
