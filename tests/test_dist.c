/* src/dist: collectives and data-parallel gradient buckets.
 *
 * Runs in any world size: plain (one process, no MPI) and under
 * `mpirun --oversubscribe -np 2` / `-np 4` (ctest test_dist_np2, test_dist_np4).
 * Every rank computes the expected results itself (the inputs of every rank are
 * a function of the rank), so each rank checks the bits it received.
 *
 * `test_dist timeout`: rank 1 arrives late at an all-reduce; rank 0 must fail
 * within its 1 s timeout with an error naming rank 1, and ends the job
 * (tests/cli_dist.sh checks the message and the exit). */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "fathom/fathom.h"
#include "fathom/dist.h"
#include "fathom/optim.h"
#include "test_util.h"

static int R, N;

static float val(int rank, int64_t k) { return (float)sin(0.37 * (double)k + 1.7 * rank) * (float)(1 + rank); }

static void test_allreduce(fm_dist *d, int64_t n) {
    float *buf = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t k = 0; k < n; k++) buf[k] = val(R, k);
    CHECK(fm_dist_allreduce_avg_f32(d, buf, n) == FM_OK);
    int bad = 0;
    for (int64_t k = 0; k < n; k++) {
        double s = 0;
        for (int j = 0; j < N; j++) s += (double)val(j, k);
        if (buf[k] != (float)(s / N)) bad++;
    }
    CHECK_MSG(bad == 0, "all-reduce of %lld values: %d differ from the rank-order sum", (long long)n, bad);
    free(buf);
}

static void test_collectives(fm_dist *d) {
    test_allreduce(d, 0);
    test_allreduce(d, 1);
    test_allreduce(d, 1001); /* not a multiple of 2 or 4: padded chunks */
    int64_t shard = 37;
    float *in = malloc(sizeof(float) * (size_t)(shard * N)), *out = malloc(sizeof(float) * (size_t)(shard * N));
    for (int64_t k = 0; k < shard * N; k++) in[k] = val(R, k);
    CHECK(fm_dist_reduce_scatter_f32(d, in, out, shard, false) == FM_OK);
    int bad = 0;
    for (int64_t k = 0; k < shard; k++) {
        double s = 0;
        for (int j = 0; j < N; j++) s += (double)val(j, R * shard + k);
        bad += out[k] != (float)s;
    }
    CHECK_MSG(bad == 0, "reduce-scatter (sum): %d of %lld values differ", bad, (long long)shard);
    for (int64_t k = 0; k < shard; k++) in[k] = val(R, k);
    CHECK(fm_dist_allgather_f32(d, in, out, shard) == FM_OK);
    bad = 0;
    for (int j = 0; j < N; j++)
        for (int64_t k = 0; k < shard; k++) bad += out[j * shard + k] != val(j, k);
    CHECK_MSG(bad == 0, "all-gather: %d values differ", bad);
    free(in);
    free(out);
    char msg[30] = "not the root";
    if (R == N - 1) snprintf(msg, sizeof msg, "from rank %d", R);
    CHECK(fm_dist_broadcast(d, msg, 27, N - 1) == FM_OK); /* 27: not a multiple of 4 */
    char want[30];
    snprintf(want, sizeof want, "from rank %d", N - 1);
    CHECK_MSG(!strcmp(msg, want), "broadcast gave '%s'", msg);
    { /* a larger broadcast (a real MPI broadcast: it counts no bytes, as MPI picks who relays) */
        fm_dist_stats s0, s1;
        fm_dist_stats_get(d, &s0);
        enum { nb = 3000001 };
        unsigned char *b = malloc(nb);
        for (int k = 0; k < nb; k++) b[k] = (unsigned char)(R == 0 ? k * 31 + 7 : 0xee);
        CHECK(fm_dist_broadcast(d, b, nb, 0) == FM_OK);
        int wrong = 0;
        for (int k = 0; k < nb; k++) wrong += b[k] != (unsigned char)(k * 31 + 7);
        CHECK_MSG(wrong == 0, "broadcast of %d bytes: %d differ from the root's", nb, wrong);
        fm_dist_stats_get(d, &s1);
        CHECK(s1.bytes_sent == s0.bytes_sent && s1.collectives == s0.collectives + (N > 1));
        free(b);
        CHECK(fm_dist_broadcast(d, msg, 4, N) != FM_OK);
        CHECK_ERR_CONTAINS("is not a rank");
    }
    { /* dropout seeds: rank 0 keeps the job's seed, every rank gets its own */
        CHECK(fm_dist_rank_seed(1234, 0) == 1234);
        uint64_t s[64];
        int same = 0;
        for (int a = 0; a < 64; a++) {
            s[a] = fm_dist_rank_seed(1234, a);
            for (int b2 = 0; b2 < a; b2++) same += s[a] == s[b2];
        }
        CHECK_MSG(same == 0, "%d pairs of ranks got the same dropout seed", same);
    }
    double v[2] = {R + 0.5, 1.0};
    CHECK(fm_dist_allreduce_sum_f64(d, v, 2) == FM_OK);
    CHECK(v[0] == N * (N - 1) / 2.0 + 0.5 * N && v[1] == N);
    CHECK(fm_dist_check_same(d, 42, "the recipe") == FM_OK);
    if (N > 1) {
        CHECK(fm_dist_check_same(d, R == 1 ? 7 : 42, "the recipe") != FM_OK);
        CHECK_ERR_CONTAINS("the recipe differs between ranks: rank 1 does not match rank 0");
    }
    fm_dist_stats st;
    fm_dist_stats_get(d, &st);
    CHECK(st.collectives >= 5);
    CHECK(N == 1 ? st.bytes_sent == 0 : st.bytes_sent > 0);
}

/* ---- data parallel equals one process with the whole batch ---- */

enum { IN = 8, HID = 16, OUT = 4, PER_RANK = 3, STEPS = 5 };

typedef struct mlp { fm_tensor *p[4]; } mlp; /* w1 [HID, IN], b1, w2 [OUT, HID], b2 */

static mlp mlp_new(void) {
    mlp m;
    int64_t shapes[4][2] = {{HID, IN}, {HID, 0}, {OUT, HID}, {OUT, 0}};
    for (int i = 0; i < 4; i++) {
        int nd = shapes[i][1] ? 2 : 1;
        m.p[i] = fm_tensor_zeros(nd, shapes[i], FM_F32, FM_CPU);
        float *x = fm_tensor_data(m.p[i]);
        for (int64_t k = 0; k < fm_tensor_numel(m.p[i]); k++) x[k] = 0.3f * (float)cos(1.3 * k + i);
        fm_tensor_requires_grad_(m.p[i], true);
    }
    return m;
}

static fm_optim *optim_for(mlp *m) {
    fm_optim_config c = fm_optim_default_config(FM_OPTIM_ADAMW);
    c.lr = 0.05;
    fm_optim *o = fm_optim_new(&c);
    int g = fm_optim_add_group(o, 0.01);
    const char *names[4] = {"w1", "b1", "w2", "b2"};
    for (int i = 0; i < 4; i++) fm_optim_add_param(o, g, names[i], m->p[i]);
    return o;
}

/* samples [first, first + count) of a fixed data set */
static double step_loss(mlp *m, int first, int count) {
    int64_t xs[2] = {count, IN}, ts[2] = {count, OUT};
    fm_tensor *x = fm_tensor_zeros(2, xs, FM_F32, FM_CPU), *t = fm_tensor_zeros(2, ts, FM_F32, FM_CPU);
    float *xp = fm_tensor_data(x), *tp = fm_tensor_data(t);
    for (int i = 0; i < count; i++) {
        for (int k = 0; k < IN; k++) xp[i * IN + k] = (float)sin(0.71 * (first + i) + 1.1 * k);
        for (int j = 0; j < OUT; j++) tp[i * OUT + j] = (float)cos(0.53 * (first + i) + j);
    }
    fm_tensor *h = fm_linear(x, m->p[0], m->p[1]), *a = fm_tanh(h), *y = fm_linear(a, m->p[2], m->p[3]);
    fm_tensor *loss = fm_mse_loss(y, t, FM_REDUCE_MEAN);
    double l = fm_tensor_item(loss);
    CHECK(fm_backward(loss, NULL, false) == FM_OK);
    fm_tensor_release_n(6, x, t, h, a, y, loss);
    return l;
}

static void test_ddp(fm_dist *d, size_t bucket_bytes, bool overlap) {
    mlp ref = mlp_new(), dp = mlp_new();
    fm_optim *oref = optim_for(&ref), *odp = optim_for(&dp);
    fm_ddp *ddp = fm_ddp_new(d, 4, dp.p, bucket_bytes);
    CHECK(ddp != NULL);
    if (!ddp) return;
    fm_ddp_set_overlap(ddp, overlap);
    CHECK(fm_ddp_broadcast_params(ddp) == FM_OK);
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        int first = s * N * PER_RANK;
        /* one process, the whole global batch (no hooks on ref's parameters) */
        double lref = step_loss(&ref, first, N * PER_RANK);
        CHECK(fm_optim_step(oref) == FM_OK);
        fm_optim_zero_grad(oref);
        /* this rank's shard, gradients averaged over ranks */
        double l = step_loss(&dp, first + R * PER_RANK, PER_RANK);
        CHECK(fm_ddp_sync(ddp) == FM_OK);
        CHECK(fm_dist_allreduce_sum_f64(d, &l, 1) == FM_OK);
        l /= N;
        CHECK(fm_optim_step(odp) == FM_OK);
        fm_optim_zero_grad(odp);
        double rel = fabs(l - lref) / fabs(lref);
        if (rel > worst) worst = rel;
    }
    CHECK_MSG(worst <= 1e-6, "loss differs by %g relative", worst);
    double pworst = 0; /* max |a - b| / max |a| per parameter tensor */
    for (int i = 0; i < 4; i++) {
        const float *a = fm_tensor_data(ref.p[i]), *b = fm_tensor_data(dp.p[i]);
        double amax = 0, dmax = 0;
        for (int64_t k = 0; k < fm_tensor_numel(ref.p[i]); k++) {
            amax = fmax(amax, fabs((double)a[k]));
            dmax = fmax(dmax, fabs((double)a[k] - b[k]));
        }
        if (dmax / amax > pworst) pworst = dmax / amax;
    }
    CHECK_MSG(pworst <= 1e-6, "parameters after %d steps differ by %g relative (bucket %zu B, overlap %d)", STEPS,
              pworst, bucket_bytes, overlap);
    fm_ddp_stats st;
    fm_ddp_stats_get(ddp, &st);
    CHECK(st.steps == STEPS);
    int64_t nparam = HID * IN + HID + OUT * HID + OUT;
    CHECK(st.bytes_reduced == STEPS * nparam * 4);
    if (N > 1) /* 2(N-1)/N of the gradient bytes, plus the padding to N chunks per bucket */
        CHECK_MSG(st.bytes_sent >= STEPS * 2 * (N - 1) * nparam * 4 / N &&
                  st.bytes_sent <= STEPS * 2 * (N - 1) * (nparam + N * fm_ddp_bucket_count(ddp)) * 4 / N,
                  "bytes sent %lld", (long long)st.bytes_sent);
    if (bucket_bytes == 64) CHECK(fm_ddp_bucket_count(ddp) == 3); /* {b2, w2} {b1} {w1} */
    fprintf(stderr, "rank %d/%d ddp bucket %zu B overlap %d: %d buckets, loss rel %.3g, param rel %.3g, comm %.3f ms, "
            "exposed %.3f ms\n", R, N, bucket_bytes, overlap, fm_ddp_bucket_count(ddp), worst, pworst,
            1e3 * st.comm_seconds, 1e3 * st.exposed_seconds);
    fm_ddp_free(ddp);
    fm_optim_free(oref);
    fm_optim_free(odp);
    for (int i = 0; i < 4; i++) fm_tensor_release_n(2, ref.p[i], dp.p[i]);
}

/* ---- ZeRO-1 equals plain data parallel ---- */

static double max_rel_diff(mlp *a, mlp *b, bool *same_bits) {
    double worst = 0;
    *same_bits = true;
    for (int i = 0; i < 4; i++) {
        const float *x = fm_tensor_data(a->p[i]), *y = fm_tensor_data(b->p[i]);
        int64_t n = fm_tensor_numel(a->p[i]);
        if (memcmp(x, y, sizeof(float) * (size_t)n)) *same_bits = false;
        for (int64_t k = 0; k < n; k++) worst = fmax(worst, fabs((double)x[k] - y[k]) / fmax(fabs((double)x[k]), 1e-3));
    }
    return worst;
}

static void test_zero(fm_dist *d, double clip) {
    mlp dp = mlp_new(), zm = mlp_new();
    fm_optim *odp = optim_for(&dp), *ofull = optim_for(&zm);
    fm_ddp *ddp = fm_ddp_new(d, 4, dp.p, 64);
    fm_zero *z = fm_zero_new(d, ofull);
    if (N == 1) { /* refused: nothing to shard across */
        CHECK(z == NULL);
        CHECK_ERR_CONTAINS("--zero 1 shards the optimizer state across MPI ranks");
        fm_ddp_free(ddp);
        fm_optim_free(odp);
        fm_optim_free(ofull);
        for (int i = 0; i < 4; i++) fm_tensor_release_n(2, dp.p[i], zm.p[i]);
        return;
    }
    CHECK(z != NULL && ddp != NULL);
    if (!z || !ddp) return;
    double ndp = 0, nz = 0;
    for (int s = 0; s < STEPS; s++) {
        int first = s * N * PER_RANK + R * PER_RANK;
        step_loss(&dp, first, PER_RANK);
        CHECK(fm_ddp_sync(ddp) == FM_OK);
        if (clip > 0) CHECK(fm_optim_clip_grad_norm(odp, clip, &ndp) == FM_OK);
        CHECK(fm_optim_step(odp) == FM_OK);
        fm_optim_zero_grad(odp);
        step_loss(&zm, first, PER_RANK);
        CHECK(fm_zero_step(z, clip, &nz) == FM_OK);
    }
    bool same;
    double rel = max_rel_diff(&dp, &zm, &same);
    if (clip > 0) {
        CHECK_MSG(rel <= 1e-7 * 10, "ZeRO-1 with clipping: parameters differ by %g relative", rel); /* 1e-7 + a few ulp of the norm */
        CHECK_NEAR(nz, ndp, 1e-12);
        CHECK_MSG(nz > clip, "the last norm %g is not above the clip %g: clipping was not exercised", nz, clip);
    } else {
        CHECK_MSG(same, "ZeRO-1 parameters are not the bits of plain data parallel (max rel %g)", rel);
    }
    /* the gathered state is the full optimizer's, and loads back on a new sharding */
    fm_named_list full, ref;
    CHECK(fm_zero_full_state(z, &full) == FM_OK);
    CHECK(fm_optim_state(odp, &ref) == FM_OK);
    CHECK(full.n == ref.n && full.n == 8);
    int differ = 0;
    for (int j = 0; j < ref.n; j++) {
        int f = fm_named_list_find(&full, ref.items[j].name);
        if (f < 0) { differ++; continue; }
        if (clip == 0 && memcmp(fm_tensor_data(full.items[f].tensor), fm_tensor_data(ref.items[j].tensor),
                                (size_t)fm_tensor_numel(ref.items[j].tensor) * 4)) differ++;
    }
    CHECK_MSG(differ == 0, "%d state tensors missing or not equal to plain data parallel's", differ);
    int64_t full_bytes = 2 * (int64_t)(HID * IN + HID + OUT * HID + OUT) * 4, mine = fm_zero_state_bytes(z);
    CHECK_MSG(mine <= full_bytes / N + 2 * 4 * 4 + 512 && mine >= full_bytes / N / 2,
              "rank %d holds %lld bytes of optimizer state (full: %lld, N %d)", R, (long long)mine, (long long)full_bytes, N);
    if (R == 0)
        fprintf(stderr, "ZeRO-1 at %d ranks (clip %g): state %lld of %lld bytes on rank 0, max rel diff vs DP %.3g%s\n", N,
                clip, (long long)mine, (long long)full_bytes, rel, same ? " (same bits)" : "");
    /* sharded checkpoints: each rank's shard file restores exactly; a file of another
     * rank is refused; all N files read back give the gathered state, bit for bit */
    {
        char dir[256] = {0}, path[320], other[320];
        if (R == 0) {
            snprintf(dir, sizeof dir, "/tmp/fathom_zero_shardsXXXXXX");
            CHECK(mkdtemp(dir) != NULL);
        }
        CHECK(fm_dist_broadcast(d, dir, sizeof dir, 0) == FM_OK);
        snprintf(path, sizeof path, "%s/shard-%d", dir, R);
        snprintf(other, sizeof other, "%s/shard-%d", dir, (R + 1) % N);
        bool nonfinite = true;
        CHECK(fm_zero_save_shard(z, path, &nonfinite) == FM_OK);
        CHECK(!nonfinite);
        double sync = 0;
        CHECK(fm_dist_allreduce_sum_f64(d, &sync, 1) == FM_OK); /* every file is written */
        fm_optim *o3 = optim_for(&zm);
        fm_zero *z3 = fm_zero_new(d, o3);
        CHECK(z3 && fm_zero_load_shard(z3, other) != FM_OK);
        CHECK_ERR_CONTAINS("holds the optimizer shard of rank");
        CHECK(z3 && fm_zero_load_shard(z3, path) == FM_OK);
        fm_named_list back3, fs;
        CHECK(z3 && fm_zero_full_state(z3, &back3) == FM_OK);
        char *paths[4];
        for (int r = 0; r < N && r < 4; r++) {
            paths[r] = malloc(320);
            snprintf(paths[r], 320, "%s/shard-%d", dir, r);
        }
        CHECK(N <= 4 && fm_zero_state_from_shards((const char *const *)paths, N, ofull, &fs) == FM_OK);
        int bad3 = 0, badfs = 0;
        for (int j = 0; j < full.n; j++) {
            int a = fm_named_list_find(&back3, full.items[j].name), b = fm_named_list_find(&fs, full.items[j].name);
            size_t bytes = (size_t)fm_tensor_numel(full.items[j].tensor) * 4;
            if (a < 0 || memcmp(fm_tensor_data(back3.items[a].tensor), fm_tensor_data(full.items[j].tensor), bytes)) bad3++;
            if (b < 0 || memcmp(fm_tensor_data(fs.items[b].tensor), fm_tensor_data(full.items[j].tensor), bytes)) badfs++;
        }
        CHECK_MSG(bad3 == 0 && back3.n == full.n, "%d state tensors differ after a shard round trip", bad3);
        CHECK_MSG(badfs == 0 && fs.n == full.n, "%d state tensors differ when read from the %d shard files", badfs, N);
        fm_named_list_free(&back3);
        fm_named_list_free(&fs);
        for (int r = 0; r < N && r < 4; r++) free(paths[r]);
        fm_zero_free(z3);
        fm_optim_free(o3);
        CHECK(fm_dist_allreduce_sum_f64(d, &sync, 1) == FM_OK); /* every rank has read them */
        unlink(path);
        CHECK(fm_dist_allreduce_sum_f64(d, &sync, 1) == FM_OK); /* every file removed */
        if (R == 0) rmdir(dir);
    }
    fm_optim *o2 = optim_for(&zm);
    fm_zero *z2 = fm_zero_new(d, o2);
    CHECK(z2 && fm_zero_load_full_state(z2, &ref) == FM_OK);
    fm_named_list back;
    CHECK(z2 && fm_zero_full_state(z2, &back) == FM_OK);
    for (int j = 0; z2 && j < ref.n; j++) {
        int f = fm_named_list_find(&back, ref.items[j].name);
        CHECK(f >= 0 && !memcmp(fm_tensor_data(back.items[f].tensor), fm_tensor_data(ref.items[j].tensor),
                                (size_t)fm_tensor_numel(ref.items[j].tensor) * 4));
    }
    if (z2) fm_named_list_free(&back);
    fm_named_list_free(&full);
    fm_named_list_free(&ref);
    fm_zero_free(z2);
    fm_optim_free(o2);
    fm_zero_free(z);
    fm_ddp_free(ddp);
    fm_optim_free(odp);
    fm_optim_free(ofull);
    for (int i = 0; i < 4; i++) fm_tensor_release_n(2, dp.p[i], zm.p[i]);
}

/* early hand-over: a leaf's gradient (and its post-accumulate hooks) comes as soon
 * as the last node using it has run, not at the end of the walk */
static int order[8], n_order;
static void note(fm_tensor *t, void *ctx) { (void)t; if (n_order < 8) order[n_order++] = (int)(intptr_t)ctx; }
static fm_tensor *note_grad(fm_tensor *g, void *ctx) { (void)g; (void)ctx; if (n_order < 8) order[n_order++] = 9; return NULL; }

static void test_early_delivery(void) {
    int64_t s[1] = {3};
    fm_tensor *a = fm_tensor_ones(1, s, FM_F32, FM_CPU), *b = fm_tensor_ones(1, s, FM_F32, FM_CPU),
              *c = fm_tensor_ones(1, s, FM_F32, FM_CPU);
    fm_tensor_requires_grad_(a, true);
    fm_tensor_requires_grad_(b, true);
    fm_tensor_requires_grad_(c, true);
    /* l = sum(tanh(a * b) * c): c is complete once the last mul has run, before the
     * walk reaches a * b (whose gradient hook notes 9) */
    fm_tensor *ab = fm_mul(a, b), *x = fm_tanh(ab), *y = fm_mul(x, c), *l = fm_sum(y, 0, NULL, false);
    fm_tensor_register_hook(ab, note_grad, NULL);
    fm_tensor_register_post_accumulate_hook(a, note, (void *)(intptr_t)1);
    fm_tensor_register_post_accumulate_hook(b, note, (void *)(intptr_t)2);
    fm_tensor_register_post_accumulate_hook(c, note, (void *)(intptr_t)3);
    CHECK(fm_backward(l, NULL, false) == FM_OK);
    CHECK_MSG(n_order == 4 && order[0] == 3 && order[1] == 9 && order[2] == 1 && order[3] == 2,
              "hand-over order %d %d %d %d (n %d), expected 3 9 1 2", order[0], order[1], order[2], order[3], n_order);
    CHECK(fm_tensor_remove_post_accumulate_hook(a, note, (void *)(intptr_t)1) == FM_OK);
    CHECK(fm_tensor_remove_post_accumulate_hook(a, note, (void *)(intptr_t)1) != FM_OK);
    fm_tensor_release_n(7, a, b, c, ab, x, y, l);
}

static int timeout_mode(fm_dist *d, bool bcast) {
    fm_dist_set_timeout(d, 1.0);
    if (bcast) { /* the root (rank 0) is late: rank 1 names it */
        if (R == 0) sleep(5);
        char b[64] = "";
        if (fm_dist_broadcast(d, b, sizeof b, 0) != FM_OK) {
            fprintf(stderr, "fathom: error: %s\n", fm_last_error());
            fm_dist_abort(d, 3);
        }
        fm_dist_finalize(d);
        return 0;
    }
    if (R == 1) sleep(5);
    float v[4] = {1, 2, 3, 4};
    if (fm_dist_allreduce_avg_f32(d, v, 4) != FM_OK) {
        fprintf(stderr, "fathom: error: %s\n", fm_last_error());
        fm_dist_abort(d, 3);
    }
    fm_dist_finalize(d);
    return 0;
}

int main(int argc, char **argv) {
    fm_dist *d = NULL;
    if (fm_dist_init(&d) != FM_OK) { fprintf(stderr, "dist init: %s\n", fm_last_error()); return 1; }
    R = fm_dist_rank(d);
    N = fm_dist_size(d);
    if (argc > 1 && !strcmp(argv[1], "timeout")) return timeout_mode(d, false);
    if (argc > 1 && !strcmp(argv[1], "timeout-bcast")) return timeout_mode(d, true);
    test_collectives(d);
    test_ddp(d, 0, true);    /* one bucket (25 MiB default) */
    test_ddp(d, 64, true);   /* 16 values: three buckets */
    test_ddp(d, 64, false);  /* all started in fm_ddp_sync */
    test_zero(d, 0);
    test_zero(d, 0.05);
    test_early_delivery();
    CHECK(fm_dist_set_timeout(d, 0) != FM_OK);
    fm_dist_finalize(d);
    if (N == 1 && fm_dist_mpi_built()) fprintf(stderr, "one process: the multi-rank runs are test_dist_np2/np4\n");
    TEST_DONE();
}
