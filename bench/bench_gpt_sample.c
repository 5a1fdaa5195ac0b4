/* Sampling one token (fm_gpt_sample) at GPT-2's vocabulary (50257) against the
 * sampler before it (kept below: a radix sort of the whole vocabulary on every
 * token), the two interleaved call by call (A B A B ...) so that load from other
 * processes falls on both alike, on the same logits and draws. Prints the median
 * time per token, the ratio, and how many of the draws picked a different token
 * (the new sampler must give the same ids for the same seed).
 *
 *   ./build/bench_gpt_sample [draws] [vocab]      (default 400 draws per mode, 50257)
 *
 * The logits are GPT-like: Gaussian (sd 2.5) with a few tokens well above the
 * rest, a fresh vector every 8 draws. bench/bench_gpt_sample.py times PyTorch's
 * equivalent (Hugging Face's top-k / top-p warpers) on the same shapes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "gpt_sample_ref.h" /* tests/: the draw from the sorted logits */

/* ---- the previous sampler (commit 3f226cc, src/gpt/gpt_generate.c) ---- */

static uint32_t desc_key(float v) {
    if (v != v) return UINT32_MAX;
    if (v == 0) v = 0.0f;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

static void sort_desc(const float *logits, int V, scored *s, uint32_t *key, scored *tmp, uint32_t *ktmp) {
    for (int i = 0; i < V; i++) { s[i].v = logits[i]; s[i].i = i; key[i] = desc_key(logits[i]); }
    for (int shift = 0; shift < 32; shift += 8) {
        int count[257] = {0};
        for (int i = 0; i < V; i++) count[((key[i] >> shift) & 255) + 1]++;
        if (count[((key[0] >> shift) & 255) + 1] == V) continue;
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        for (int i = 0; i < V; i++) {
            int d = count[(key[i] >> shift) & 255]++;
            tmp[d] = s[i];
            ktmp[d] = key[i];
        }
        memcpy(s, tmp, sizeof *s * (size_t)V);
        memcpy(key, ktmp, sizeof *key * (size_t)V);
    }
}

static int old_sample(const float *logits, int V, const fm_gpt_sample_params *p, uint64_t draw) {
    char *mem = malloc((sizeof(scored) * 2 + sizeof(double) + sizeof(uint32_t) * 2) * (size_t)V);
    if (!mem) return -1;
    scored *s = (scored *)(void *)mem, *tmp = s + V;
    double *pr = (double *)(void *)(tmp + V);
    uint32_t *key = (uint32_t *)(void *)(pr + V), *ktmp = key + V;
    sort_desc(logits, V, s, key, tmp, ktmp);
    int tok = ref_sample_in_order(s, V, p, draw, pr);
    free(mem);
    return tok;
}

/* ---- the bench ---- */
/* this thread's CPU time: on a loaded machine wall-clock medians mostly measure the
 * other processes (a 50k-entry pass is descheduled over and over, a short one is not) */
static double cpu_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rs = 88172645463325252ull;
static double urand(void) {
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}
static double gauss(void) { return sqrt(-2.0 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand()); }

static void fill(float *lg, int V) {
    for (int i = 0; i < V; i++) lg[i] = (float)(2.5 * gauss());
    for (int j = 0; j < 6; j++) lg[(int)(urand() * V)] += (float)(8.0 + 4.0 * urand());
}

int main(int argc, char **argv) {
    int draws = argc > 1 ? atoi(argv[1]) : 400, V = argc > 2 ? atoi(argv[2]) : 50257;
    if (draws < 8) draws = 8;
    if (V < 64) V = 64;
    const struct { const char *what; double T; int k; double p; } modes[] = {
        {"top_k 40", 0.8, 40, 1.0},          {"top_k 40, top_p 0.95", 0.8, 40, 0.95},
        {"top_p 0.95", 0.8, 0, 0.95},        {"top_p 0.9, T 1", 1.0, 0, 0.9},
        {"temperature 1 only", 1.0, 0, 1.0}, {"top_k 1000", 1.0, 1000, 1.0},
    };
    float *lg = malloc(sizeof(float) * (size_t)V);
    double *ta = malloc(sizeof(double) * (size_t)draws), *tb = malloc(sizeof(double) * (size_t)draws);
    double *wa = malloc(sizeof(double) * (size_t)draws), *wb = malloc(sizeof(double) * (size_t)draws);
    if (!lg || !ta || !tb || !wa || !wb) { fprintf(stderr, "out of memory\n"); return 1; }
    printf("vocab %d; median of %d interleaved draws per mode; one thread; CPU time (wall clock)\n", V, draws);
    printf("%-22s %18s %18s %8s %9s\n", "mode", "before us", "after us", "speedup", "differ");
    int total_diff = 0;
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        fm_gpt_sample_params sp = {modes[mi].T, modes[mi].k, modes[mi].p, 1234};
        int diff = 0;
        for (int d = 0; d < draws; d++) {
            if (d % 8 == 0) fill(lg, V);
            double w0 = bench_now_s(), t0 = cpu_now_s();
            int a = old_sample(lg, V, &sp, (uint64_t)d);
            double w1 = bench_now_s(), t1 = cpu_now_s();
            int b = fm_gpt_sample(lg, V, &sp, (uint64_t)d);
            double w2 = bench_now_s(), t2 = cpu_now_s();
            ta[d] = t1 - t0;
            tb[d] = t2 - t1;
            wa[d] = w1 - w0;
            wb[d] = w2 - w1;
            diff += a != b;
        }
        double a = bench_median(ta, draws) * 1e6, b = bench_median(tb, draws) * 1e6;
        double a2 = bench_median(wa, draws) * 1e6, b2 = bench_median(wb, draws) * 1e6;
        printf("%-22s %7.1f (%8.1f) %7.1f (%8.1f) %7.2fx %4d/%d\n", modes[mi].what, a, a2, b, b2, a / b, diff, draws);
        total_diff += diff;
    }
    free(lg); free(ta); free(tb); free(wa); free(wb);
    return total_diff ? 1 : 0;
}
