/* src/dist on tensors of a device (dist_device.c, ddp.c's device buckets): the
 * collectives on check-device tensors (host-staged) give the bits of the same
 * collectives on CPU tensors, and data-parallel gradient buckets over parameters on
 * the check device give the CPU parameters' averaged gradients bit for bit. Runs in
 * one process and under `mpirun -np 2` / `-np 4` (ctest test_dist_device_np2/np4).
 * The NCCL path (CUDA tensors) shares everything above the transport; without a
 * GPU only its refusal in a build without NCCL is checked here, its run is
 * tools/gpu-check.sh's NCCL smoke test. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/dist.h"
#include "fathom/fathom.h"
#include "test_util.h"

static const fm_device CHK = {FM_DEV_CHECK, 0};
static int R, N;

static fm_tensor *rank_tensor(int64_t n, int salt) {
    fm_tensor *t = fm_tensor_empty(1, &n, FM_F32, FM_CPU);
    float *p = t ? fm_tensor_data(t) : NULL;
    for (int64_t k = 0; p && k < n; k++) p[k] = (float)sin(0.37 * (double)k + 1.7 * R + salt) * (float)(1 + R);
    return t;
}

static bool same(const fm_tensor *dev, const fm_tensor *host) {
    size_t nb = fm_tensor_nbytes(host);
    void *h = malloc(nb ? nb : 1);
    bool ok = h && dev && fm_tensor_numel(dev) == fm_tensor_numel(host) && fm_tensor_copy_to_host(dev, h, host->dtype) == FM_OK &&
              !memcmp(h, fm_tensor_data(host), nb);
    free(h);
    return ok;
}

static void test_collectives(fm_dist *d) {
    /* all-reduce (1001 values: padded chunks) */
    fm_tensor *a = rank_tensor(1001, 0), *da = fm_tensor_to(a, CHK);
    CHECK(fm_dist_allreduce_avg_tensor(d, a) == FM_OK && fm_dist_allreduce_avg_tensor(d, da) == FM_OK);
    CHECK_MSG(same(da, a), "all-reduce on check differs from the cpu's");
    /* reduce-scatter, average and sum */
    int64_t shard = 37, whole = shard * N;
    for (int avg = 0; avg < 2; avg++) {
        fm_tensor *in = rank_tensor(whole, 1 + avg), *din = fm_tensor_to(in, CHK);
        fm_tensor *out = fm_tensor_zeros(1, &shard, FM_F32, FM_CPU), *dout = fm_tensor_zeros(1, &shard, FM_F32, CHK);
        CHECK(fm_dist_reduce_scatter_tensor(d, in, out, avg) == FM_OK && fm_dist_reduce_scatter_tensor(d, din, dout, avg) == FM_OK);
        CHECK_MSG(same(dout, out), "reduce-scatter (%s) on check differs from the cpu's", avg ? "average" : "sum");
        CHECK(fm_dist_reduce_scatter_tensor(d, din, out, avg) == FM_ERR_INVALID); /* devices mixed */
        CHECK_ERR_CONTAINS("one device");
        fm_tensor_release_n(4, in, din, out, dout);
    }
    /* all-gather */
    fm_tensor *g = rank_tensor(5, 7), *dg = fm_tensor_to(g, CHK);
    int64_t gn = 5 * N;
    fm_tensor *go = fm_tensor_zeros(1, &gn, FM_F32, FM_CPU), *dgo = fm_tensor_zeros(1, &gn, FM_F32, CHK);
    CHECK(fm_dist_allgather_tensor(d, g, go) == FM_OK && fm_dist_allgather_tensor(d, dg, dgo) == FM_OK);
    CHECK_MSG(same(dgo, go), "all-gather on check differs from the cpu's");
    for (int j = 0; j < N; j++) CHECK(fm_tensor_get(go, j * 5 + 2) == (float)sin(0.37 * 2 + 1.7 * j + 7) * (float)(1 + j));
    /* broadcast from the last rank, an i32 tensor */
    int64_t bn = 9;
    fm_tensor *b = fm_tensor_empty(1, &bn, FM_I32, FM_CPU);
    for (int k = 0; k < 9; k++) ((int32_t *)fm_tensor_data(b))[k] = 100 * R + k;
    fm_tensor *db = fm_tensor_to(b, CHK);
    CHECK(fm_dist_broadcast_tensor(d, db, N - 1) == FM_OK);
    for (int k = 0; k < 9; k++) ((int32_t *)fm_tensor_data(b))[k] = 100 * (N - 1) + k;
    CHECK_MSG(same(db, b), "broadcast on check: not the root's values");
    /* bad input */
    fm_tensor *i32 = fm_tensor_zeros(1, &bn, FM_I32, CHK);
    CHECK(fm_dist_allreduce_avg_tensor(d, i32) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("contiguous f32");
    fm_tensor_release_n(11, a, da, g, dg, go, dgo, b, db, i32, NULL, NULL);
}

/* y = sum((x W)^2) over this rank's rows; returns W's averaged gradient after the buckets. */
static fm_tensor *ddp_grad(fm_dist *d, fm_device dev, size_t bucket_bytes) {
    fm_rng r;
    fm_rng_init(&r, 11); /* the same W on every rank */
    int64_t ws[2] = {16, 8}, bs[1] = {8}, xs[2] = {3, 16};
    fm_tensor *w0 = fm_tensor_randn(2, ws, FM_F32, &r), *b0 = fm_tensor_randn(1, bs, FM_F32, &r);
    fm_rng_init(&r, 100 + (uint64_t)R); /* each rank its own rows */
    fm_tensor *x0 = fm_tensor_randn(2, xs, FM_F32, &r);
    fm_tensor *w = fm_tensor_to(w0, dev), *bias = fm_tensor_to(b0, dev), *x = fm_tensor_to(x0, dev);
    fm_tensor_requires_grad_(w, true);
    fm_tensor_requires_grad_(bias, true);
    fm_tensor *params[2] = {w, bias};
    fm_ddp *p = fm_ddp_new(d, 2, params, bucket_bytes);
    CHECK_MSG(p != NULL, "ddp on %s: %s", dev.type == FM_DEV_CPU ? "cpu" : "check", fm_last_error());
    fm_tensor *grad = NULL;
    for (int step = 0; p && step < 2; step++) { /* twice: the buckets are reused */
        fm_tensor *h = fm_matmul(x, w), *hb = fm_add(h, bias), *sq = fm_mul(hb, hb), *loss = fm_sum(sq, 0, NULL, false);
        fm_tensor_zero_grad(w);
        fm_tensor_zero_grad(bias);
        CHECK(fm_backward(loss, NULL, false) == FM_OK);
        CHECK(fm_ddp_sync(p) == FM_OK);
        fm_tensor_release_n(4, h, hb, sq, loss);
    }
    if (p && w->grad) grad = fm_tensor_to(w->grad, FM_CPU);
    if (p && bias->grad) {
        fm_tensor *bg = fm_tensor_to(bias->grad, FM_CPU), *flat = grad ? fm_reshape(grad, 1, (int64_t[]){128}) : NULL;
        fm_tensor *both[2] = {flat, bg};
        fm_tensor *cat = flat && bg ? fm_cat(2, both, 0) : NULL;
        fm_tensor_release_n(3, grad, flat, bg);
        grad = cat;
    }
    fm_ddp_free(p);
    fm_tensor_release_n(6, w0, b0, x0, w, bias, x);
    return grad;
}

static void test_ddp(fm_dist *d) {
    size_t sizes[2] = {0, 64}; /* one bucket; the weight and the bias in buckets of their own */
    for (int k = 0; k < 2; k++) {
        fm_tensor *gc = ddp_grad(d, FM_CPU, sizes[k]), *gk = ddp_grad(d, CHK, sizes[k]);
        CHECK_MSG(gc && gk && same(gk, gc), "ddp on check (bucket bytes %zu): gradients differ from the cpu's", sizes[k]);
        fm_tensor_release_n(2, gc, gk);
    }
    /* parameters on two devices are refused */
    int64_t n = 4;
    fm_tensor *a = fm_tensor_zeros(1, &n, FM_F32, FM_CPU), *b = fm_tensor_zeros(1, &n, FM_F32, CHK);
    fm_tensor_requires_grad_(a, true);
    fm_tensor_requires_grad_(b, true);
    fm_tensor *ps[2] = {a, b};
    CHECK(fm_ddp_new(d, 2, ps, 0) == NULL);
    CHECK_ERR_CONTAINS("different devices");
    fm_tensor_release_n(2, a, b);
}

static void test_nccl_refusal(fm_dist *d) {
    CHECK(fm_dist_use_device(d, FM_CPU) == FM_OK && fm_dist_use_device(d, CHK) == FM_OK);
    CHECK(!fm_dist_uses_nccl(d));
    if (fm_dist_nccl_built()) return; /* joining NCCL needs a GPU: tools/gpu-check.sh */
    CHECK(fm_dist_use_device(d, (fm_device){FM_DEV_CUDA, 0}) == FM_ERR_UNSUPPORTED);
    CHECK_ERR_CONTAINS("built without NCCL");
}

int main(void) {
    fm_dist *d = NULL;
    if (fm_dist_init(&d) != FM_OK) {
        fprintf(stderr, "dist init: %s\n", fm_last_error());
        return 1;
    }
    R = fm_dist_rank(d);
    N = fm_dist_size(d);
    test_collectives(d);
    test_ddp(d);
    test_nccl_refusal(d);
    if (R == 0) printf("test_dist_device: %d rank(s), NCCL %s\n", N, fm_dist_nccl_built() ? "built" : "not built");
    fm_dist_finalize(d);
    TEST_DONE();
}
