/* What the fused GPT-2 ops buy: bias + GELU(tanh) and residual add + LayerNorm.
 *
 * Two measurements, each as alternating rounds (fused, unfused, fused, ...) so
 * that load from other processes hits both sides alike; the median round is
 * reported per side, one JSON line per measurement:
 *   - per op, forward + backward on the activation shapes of the two GPT bench
 *     configs: fm_bias_gelu_tanh vs fm_add + fm_gelu_tanh, and
 *     fm_add_layer_norm vs fm_add + fm_layer_norm (loss = sum(out * c), so the
 *     backward sees a dense gradient; fused: both outputs feed the loss, as the
 *     residual and the norm do in the model);
 *   - the model's training step without the optimizer (forward, cross-entropy,
 *     backward) with fm_gpt_set_fusion on and off, for kjv-gpt and gpt-6x384.
 * Usage: bench_gpt_fusion [--rounds N] [--threads N] [--ops-only|--model-only] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "core/parallel.h" /* fm_set_num_threads */
#include "fathom/autograd.h"
#include "fathom/gpt.h"
#include "fathom/ops.h"


static void release_grad(fm_tensor *t) {
    if (t) { fm_tensor_release(t->grad); t->grad = NULL; }
}

/* ---- per op ---- */

typedef struct {
    fm_tensor *x, *h, *b, *w, *lb, *c;
} op_in;

/* one forward + backward; returns seconds, negative on error */
static double op_once(int which, int fused, op_in *in) {
    double t0 = bench_now_s();
    fm_tensor *y = NULL, *s = NULL;
    if (which == 0) {
        if (fused) y = fm_bias_gelu_tanh(in->x, in->b);
        else {
            fm_tensor *t = fm_add(in->x, in->b);
            y = t ? fm_gelu_tanh(t) : NULL;
            fm_tensor_release(t);
        }
    } else if (fused) {
        if (fm_add_layer_norm(in->x, in->h, in->w, in->lb, 1e-5, &s, &y)) y = NULL;
    } else {
        s = fm_add(in->x, in->h);
        y = s ? fm_layer_norm(s, 1, in->w, in->lb, 1e-5) : NULL;
    }
    fm_tensor *a = y ? fm_mul(y, in->c) : NULL, *b2 = s ? fm_mul(s, in->c) : NULL;
    fm_tensor *t = a && b2 ? fm_add(a, b2) : fm_tensor_retain(a);
    fm_tensor *L = t ? fm_sum(t, 0, NULL, false) : NULL;
    fm_status st = L ? fm_backward(L, NULL, false) : FM_ERR_INVALID;
    fm_tensor_release_n(6, y, s, a, b2, t, L);
    release_grad(in->x); release_grad(in->h); release_grad(in->b); release_grad(in->w); release_grad(in->lb);
    return st == FM_OK ? bench_now_s() - t0 : -1;
}

static int bench_op(int which, int64_t M, int64_t N, int rounds, int reps, int threads) {
    fm_rng r;
    fm_rng_init(&r, 7);
    op_in in;
    in.x = fm_tensor_randn(2, (int64_t[]){M, N}, FM_F32, &r);
    in.h = fm_tensor_randn(2, (int64_t[]){M, N}, FM_F32, &r);
    in.c = fm_tensor_randn(2, (int64_t[]){M, N}, FM_F32, &r);
    in.b = fm_tensor_randn(1, (int64_t[]){N}, FM_F32, &r);
    in.w = fm_tensor_randn(1, (int64_t[]){N}, FM_F32, &r);
    in.lb = fm_tensor_randn(1, (int64_t[]){N}, FM_F32, &r);
    fm_tensor *all[6] = {in.x, in.h, in.c, in.b, in.w, in.lb};
    for (int i = 0; i < 6; i++) fm_tensor_requires_grad_(all[i], i != 2);
    double *tf = malloc(sizeof(double) * (size_t)rounds), *tu = malloc(sizeof(double) * (size_t)rounds);
    int rc = 0;
    for (int k = 0; k < 3; k++) { op_once(which, 1, &in); op_once(which, 0, &in); } /* warm the allocator's cache */
    for (int i = 0; i < rounds && !rc; i++)
        for (int fused = 1; fused >= 0 && !rc; fused--) {
            double best = 0;
            for (int k = 0; k < reps; k++) {
                double t = op_once(which, fused, &in);
                if (t < 0) { fprintf(stderr, "bench: %s\n", fm_last_error()); rc = 1; break; }
                best += t;
            }
            (fused ? tf : tu)[i] = best / reps;
        }
    if (!rc) {
        double f = bench_median(tf, rounds), u = bench_median(tu, rounds);
        printf("{\"bench\":\"gpt_fused_op\",\"op\":\"%s\",\"shape\":[%lld,%lld],\"fused_us\":%.1f,\"unfused_us\":%.1f,"
               "\"speedup\":%.3f,\"rounds\":%d,\"threads\":%d}\n",
               which == 0 ? "bias_gelu_tanh" : "add_layer_norm", (long long)M, (long long)N, 1e6 * f, 1e6 * u, u / f,
               rounds, threads);
        fflush(stdout);
    }
    for (int i = 0; i < 6; i++) fm_tensor_release(all[i]);
    free(tf);
    free(tu);
    return rc;
}

/* ---- the model's training step (no optimizer) ---- */

typedef struct { const char *name; int L, H, C, F, T, B; } cfg_t;

static double step_once(fm_gpt *m, fm_tensor *x, fm_tensor *y) {
    const fm_named_list *ps = fm_gpt_parameters(m);
    for (int i = 0; i < ps->n; i++) release_grad(ps->items[i].tensor);
    double t0 = bench_now_s();
    fm_tensor *loss = NULL, *lg = fm_gpt_forward(m, x, y, &loss);
    fm_status st = lg ? fm_backward(loss, NULL, false) : FM_ERR_INVALID;
    fm_tensor_release_n(2, lg, loss);
    return st == FM_OK ? bench_now_s() - t0 : -1;
}

static int bench_model(const cfg_t *k, int rounds, int threads) {
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_GPT2);
    c.n_layer = k->L;
    c.n_head = k->H;
    c.n_kv_head = k->H;
    c.n_embd = k->C;
    c.ffn_hidden = k->F;
    c.block_size = k->T;
    c.vocab_size = 512;
    fm_rng r;
    fm_rng_init(&r, 1);
    fm_gpt *m = fm_gpt_new(&c, &r);
    if (!m) { fprintf(stderr, "bench: %s\n", fm_last_error()); return 1; }
    int64_t n = (int64_t)k->B * k->T;
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(n + 1));
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i <= n; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; ids[i] = (int64_t)(s % 512); }
    fm_tensor *x = fm_tensor_from_data(ids, 2, (int64_t[]){k->B, k->T}, FM_I64);
    fm_tensor *y = fm_tensor_from_data(ids + 1, 2, (int64_t[]){k->B, k->T}, FM_I64);
    free(ids);
    double *tf = malloc(sizeof(double) * (size_t)rounds), *tu = malloc(sizeof(double) * (size_t)rounds);
    int rc = 0;
    for (int w = 0; w < 2; w++) {
        fm_gpt_set_fusion(m, true); step_once(m, x, y);
        fm_gpt_set_fusion(m, false); step_once(m, x, y);
    }
    for (int i = 0; i < rounds && !rc; i++)
        for (int fused = 1; fused >= 0; fused--) {
            fm_gpt_set_fusion(m, fused);
            double t = step_once(m, x, y);
            if (t < 0) { fprintf(stderr, "bench: %s\n", fm_last_error()); rc = 1; break; }
            (fused ? tf : tu)[i] = t;
        }
    if (!rc) {
        double f = bench_median(tf, rounds), u = bench_median(tu, rounds);
        printf("{\"bench\":\"gpt_fused_step\",\"config\":\"%s\",\"what\":\"forward+backward\",\"fused_ms\":%.2f,"
               "\"unfused_ms\":%.2f,\"speedup\":%.3f,\"fused_tok_s\":%.0f,\"unfused_tok_s\":%.0f,\"rounds\":%d,"
               "\"threads\":%d}\n",
               k->name, 1e3 * f, 1e3 * u, u / f, (double)n / f, (double)n / u, rounds, threads);
        fflush(stdout);
    }
    free(tf);
    free(tu);
    fm_tensor_release_n(2, x, y);
    fm_gpt_free(m);
    return rc;
}

int main(int argc, char **argv) {
    int rounds = 15, threads = 2, ops = 1, model = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ops-only")) model = 0;
        else if (!strcmp(argv[i], "--model-only")) ops = 0;
        else {
            fprintf(stderr, "usage: bench_gpt_fusion [--rounds N] [--threads N] [--ops-only|--model-only]\n");
            return 2;
        }
    }
    if (rounds < 1 || threads < 1) { fprintf(stderr, "bench_gpt_fusion: --rounds and --threads must be >= 1\n"); return 2; }
    fm_set_num_threads(threads);
    int rc = 0;
    if (ops) {
        /* kjv-gpt: 16 x 128 rows, 128 wide, MLP 512; gpt-6x384: 8 x 256 rows, 384 wide, MLP 1536 */
        rc |= bench_op(0, 2048, 512, rounds, 5, threads);
        rc |= bench_op(0, 2048, 1536, rounds, 3, threads);
        rc |= bench_op(1, 2048, 128, rounds, 10, threads);
        rc |= bench_op(1, 2048, 384, rounds, 5, threads);
    }
    if (model) {
        const cfg_t cfgs[2] = {{"kjv-gpt", 4, 4, 128, 512, 128, 16}, {"gpt-6x384", 6, 6, 384, 1536, 256, 8}};
        for (int i = 0; i < 2; i++) rc |= bench_model(&cfgs[i], rounds, threads);
    }
    return rc;
}
