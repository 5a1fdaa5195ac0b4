/* Where batch-1 KV-cache decoding spends its time, for the GPT bench configs.
 *
 * Two measurements, one JSON line each:
 *   - "gemv": fm_cpu_gemm with M == 1 on every weight shape of the model (the
 *     GEMVs that stream the weights once per token), as GB/s of weight bytes, next
 *     to a measured copy bandwidth (read + write of a 64 MiB buffer);
 *   - "decode": single-token fm_gpt_forward_cached steps on a model with random
 *     weights (decoding cost does not depend on the values), over positions
 *     1..--tokens; ms per token (median of --rounds), tokens/s, and the bound of
 *     weight + KV bytes per token over the copy bandwidth;
 *   - "generate": fm_gpt_generate over the same positions with sampling at
 *     temperature 0.8 (as bench_gpt.py runs `fathom generate`): the forward
 *     passes plus the loop's own work (input tensor, logits copy, sampling).
 * Usage: bench_gpt_generate [--config gpt-6x384|kjv-gpt|gpt2-small] [--tokens N] [--rounds N]
 *                           [--threads N] [--profile trace.json] [--decode-only] [--precision fp32|bf16]
 * --precision bf16 runs both under bf16 autocast, as `fathom generate --precision bf16`
 * does, with bf16 copies of the weights made once (fm_gpt_keep_lowp_weights for the
 * "decode" steps; fm_gpt_generate makes its own).
 * gpt2-small: 12 x 768, ffn 3072, vocab 8192 (bench_quant's large shape). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_kernels.h" /* fm_cpu_gemm */
#include "bench_util.h"
#include "core/parallel.h"           /* fm_set_num_threads */
#include "fathom/amp.h" /* fm_autocast_set */
#include "fathom/gpt.h"
#include "fathom/ops.h"
#include "fathom/profile.h"


typedef struct { char *dst; const char *src; } copy_ctx;
static void copy_part(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    copy_ctx *c = vctx;
    memcpy(c->dst + (b << 20), c->src + (b << 20), (size_t)(e - b) << 20);
}

/* best of 7 copies of 64 MiB over the pool (as bench_gpt.py's torch copy uses
 * its threads): bytes moved (read + write) per second */
static double copy_bandwidth(void) {
    size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) { free(a); free(b); return 0; }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e9;
    for (int r = 0; r < 7; r++) {
        double t0 = bench_now_s();
        fm_parallel_for(64, 1, copy_part, &(copy_ctx){b, a});
        double t = bench_now_s() - t0;
        if (t < best) best = t;
        a[r] = b[n - 1 - (size_t)r]; /* keeps the copies observable */
    }
    free(a);
    free(b);
    return 2.0 * (double)n / best;
}

/* y[1, N] = x[1, K] W^T, W [N, K] row-major (the linear layers' layout), as the
 * model calls it; GB/s of weight bytes, median of rounds */
static double gemv_gbps(int64_t N, int64_t K, int rounds) {
    float *w = malloc(sizeof(float) * (size_t)(N * K)), *x = malloc(sizeof(float) * (size_t)K),
          *y = malloc(sizeof(float) * (size_t)N);
    /* as many weight copies as the model has layers' worth of bytes, so the
     * weights come from memory as in decoding, not from the cache */
    int copies = (int)((48ll << 20) / (N * K * 4)) + 1;
    float **ws = calloc((size_t)copies, sizeof *ws);
    double *t = malloc(sizeof(double) * (size_t)rounds);
    double r = 0;
    if (!w || !x || !y || !ws || !t) goto done;
    for (int64_t i = 0; i < N * K; i++) w[i] = (float)((i * 7919) % 1000) * 1e-3f;
    for (int64_t i = 0; i < K; i++) x[i] = 1.0f;
    for (int c = 0; c < copies; c++) {
        ws[c] = malloc(sizeof(float) * (size_t)(N * K));
        if (!ws[c]) goto done;
        memcpy(ws[c], w, sizeof(float) * (size_t)(N * K));
    }
    for (int rr = 0; rr < rounds; rr++) {
        double t0 = bench_now_s();
        for (int c = 0; c < copies; c++)
            fm_cpu_gemm(&(fm_cpu_gemm_args){FM_F32, false, true, 1, N, K, x, K, ws[c], K, 0.0, y, N});
        t[rr] = (bench_now_s() - t0) / copies;
    }
    r = (double)(N * K * 4) / bench_median(t, rounds) / 1e9;
done:
    for (int c = 0; ws && c < copies; c++) free(ws[c]);
    free(ws);
    free(w);
    free(x);
    free(y);
    free(t);
    return r;
}

int main(int argc, char **argv) {
    const char *config = "gpt-6x384", *profile = NULL;
    int tokens = 100, rounds = 5, threads = 2;
    bool decode_only = false;
    fm_dtype prec = FM_F32;
    for (int i = 1; i < argc; i++) {
        bool has = i + 1 < argc;
        if (!strcmp(argv[i], "--config") && has) config = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && has) tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && has) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && has) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--profile") && has) profile = argv[++i];
        else if (!strcmp(argv[i], "--decode-only")) decode_only = true;
        else if (!strcmp(argv[i], "--precision") && has && (!strcmp(argv[i + 1], "fp32") || !strcmp(argv[i + 1], "bf16")))
            prec = !strcmp(argv[++i], "bf16") ? FM_BF16 : FM_F32;
        else {
            fprintf(stderr, "usage: bench_gpt_generate [--config gpt-6x384|kjv-gpt|gpt2-small] [--tokens N] [--rounds N] "
                            "[--threads N] [--profile trace.json] [--decode-only] [--precision fp32|bf16]\n");
            return 2;
        }
    }
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_GPT2);
    c.vocab_size = 512;
    if (!strcmp(config, "kjv-gpt")) { c.n_layer = 4; c.n_head = 4; c.n_embd = 128; c.ffn_hidden = 512; c.block_size = 128; }
    else if (!strcmp(config, "gpt-6x384")) { c.n_layer = 6; c.n_head = 6; c.n_embd = 384; c.ffn_hidden = 1536; c.block_size = 256; }
    else if (!strcmp(config, "gpt2-small")) {
        c.n_layer = 12; c.n_head = 12; c.n_embd = 768; c.ffn_hidden = 3072; c.block_size = 256; c.vocab_size = 8192;
    }
    else { fprintf(stderr, "bench_gpt_generate: unknown config '%s' (gpt-6x384, kjv-gpt or gpt2-small)\n", config); return 2; }
    c.n_kv_head = c.n_head;
    if (tokens < 1 || tokens >= c.block_size || rounds < 1 || threads < 1) {
        fprintf(stderr, "bench_gpt_generate: need 1 <= tokens < block_size (%d), rounds >= 1, threads >= 1\n", c.block_size);
        return 2;
    }
    fm_set_num_threads(threads);
    const double bw = copy_bandwidth();
    const int64_t C = c.n_embd, F = c.ffn_hidden;
    if (!decode_only) {
        const int64_t shapes[4][2] = {{3 * C, C}, {C, C}, {F, C}, {C, F}};
        const char *names[4] = {"qkv", "attn_proj", "fc", "mlp_proj"};
        for (int s = 0; s < 4; s++)
            printf("{\"bench\":\"gemv\",\"config\":\"%s\",\"weight\":\"%s\",\"N\":%lld,\"K\":%lld,\"gbps\":%.1f,"
                   "\"copy_gbps\":%.1f,\"threads\":%d}\n",
                   config, names[s], (long long)shapes[s][0], (long long)shapes[s][1], gemv_gbps(shapes[s][0], shapes[s][1], 9),
                   bw / 1e9, threads);
    }
    fm_rng rng;
    fm_rng_init(&rng, 1);
    fm_gpt *m = fm_gpt_new(&c, &rng);
    fm_gpt_kv_cache *kv = m ? fm_gpt_kv_cache_new(m, 1) : NULL;
    if (!kv) { fprintf(stderr, "bench_gpt_generate: %s\n", fm_last_error()); fm_gpt_free(m); return 1; }
    fm_gpt_train_mode(m, false);
    fm_autocast_set(prec); /* fp32: off */
    /* the "decode" loop keeps bf16 weight copies as fm_gpt_generate does (a no-op at fp32) */
    if (fm_gpt_keep_lowp_weights(m, true) != FM_OK) { fprintf(stderr, "bench_gpt_generate: %s\n", fm_last_error()); return 1; }
    double *per = malloc(sizeof(double) * (size_t)rounds);
    int64_t one = 1;
    fm_tensor *idx = fm_tensor_from_data(&one, 2, (int64_t[]){1, 1}, FM_I64);
    int rc = 0;
    double ms = 0;
    for (int r = 0; r < rounds && idx && per; r++) {
        fm_gpt_kv_cache_reset(kv);
        fm_tensor *lg = fm_gpt_forward_cached(m, idx, kv); /* position 0: the prompt */
        if (!lg) { rc = 1; break; }
        fm_tensor_release(lg);
        if (profile && r == rounds - 1 && fm_profiler_start(profile)) { rc = 1; break; }
        double t0 = bench_now_s();
        for (int t = 0; t < tokens; t++) {
            lg = fm_gpt_forward_cached(m, idx, kv);
            if (!lg) { rc = 1; break; }
            fm_tensor_release(lg);
        }
        per[r] = (bench_now_s() - t0) / tokens;
        if (profile && r == rounds - 1) fm_profiler_stop();
        if (rc) break;
    }
    if (!rc && per) ms = 1e3 * bench_median(per, rounds);
    /* the whole loop as `fathom generate` runs it (sampling at temperature 0.8,
     * as bench_gpt.py's fathom_generate): the gap to "decode" is the loop's own cost */
    double gen_ms = 0;
    int32_t prompt = 1;
    fm_gpt_sample_params sp = {0.8, 0, 1.0, 1};
    for (int r = 0; r < rounds && !rc && per; r++) {
        int made = 0;
        double t0 = bench_now_s();
        if (fm_gpt_generate(m, &prompt, 1, tokens, &sp, true, NULL, &made, NULL, NULL, NULL) || made != tokens) {
            rc = 1;
            break;
        }
        per[r] = (bench_now_s() - t0) / tokens;
    }
    if (!rc && per) gen_ms = 1e3 * bench_median(per, rounds);
    if (rc || !idx || !per) {
        fprintf(stderr, "bench_gpt_generate: %s\n", fm_last_error());
        rc = 1;
    } else {
        /* every weight once, plus the cached keys and values at the mean position */
        /* bf16: the linears (and the tied head) read their 2-byte copies; the rest of the
         * parameters (norms, biases, wpe) are a few percent and counted at 2 too */
        const double pb = prec == FM_BF16 ? 2.0 : 4.0;
        double wbytes = pb * (double)fm_gpt_num_params(m) - pb * c.block_size * C; /* wpe: one row is read */
        double kvbytes = 4.0 * 2 * c.n_layer * C * (1 + tokens) / 2.0;
        printf("{\"bench\":\"decode\",\"config\":\"%s\",\"tokens\":%d,\"ms_per_token\":%.3f,\"tokens_per_s\":%.1f,"
               "\"bound_tokens_per_s\":%.1f,\"fraction_of_bound\":%.2f,\"copy_gbps\":%.1f,\"threads\":%d}\n",
               config, tokens, ms, 1e3 / ms, bw / (wbytes + kvbytes), (wbytes + kvbytes) / bw / (ms * 1e-3), bw / 1e9,
               threads);
        printf("{\"bench\":\"generate\",\"config\":\"%s\",\"tokens\":%d,\"ms_per_token\":%.3f,\"tokens_per_s\":%.1f,"
               "\"loop_overhead_ms\":%.3f,\"precision\":\"%s\",\"threads\":%d}\n",
               config, tokens, gen_ms, 1e3 / gen_ms, gen_ms - ms, prec == FM_BF16 ? "bf16" : "fp32", threads);
    }
    fm_tensor_release(idx);
    free(per);
    fm_gpt_kv_cache_free(kv);
    fm_gpt_free(m);
    return rc;
}
