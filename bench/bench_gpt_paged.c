/* The batched decode step over the paged KV cache (src/gpt/gpt_paged.c), the
 * core of the server's continuous batching: time per step and tokens/s with n
 * sequences decoding together (n = 1, 2, 4, 8, 16), each at a context of 32-64:
 * the minimum and the median over 7 timed runs of 4 steps (the minimum is the
 * figure least disturbed by other processes on a shared machine).
 * Usage: bench_gpt_paged MODEL_DIR (a GPT written by `fathom train`, e.g. kjv-gpt). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "fathom/gpt.h"
#include "gpt/gpt_paged.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: bench_gpt_paged MODEL_DIR\n"); return 2; }
    fm_gpt *m = fm_gpt_load_dir(argv[1], NULL);
    if (!m) { fprintf(stderr, "bench_gpt_paged: %s\n", fm_last_error()); return 1; }
    const fm_gpt_config *c = fm_gpt_get_config(m);
    float *lg = malloc(sizeof(float) * 16 * (size_t)c->vocab_size);
    printf("{\"model\": \"%s\", \"n_layer\": %d, \"n_embd\": %d, \"results\": [\n", argv[1], c->n_layer, c->n_embd);
    const int ns[] = {1, 2, 4, 8, 16};
    for (int k = 0; k < 5; k++) {
        int n = ns[k], seqs[16];
        int32_t tok[16];
        fm_gpt_paged *p = fm_gpt_paged_new(m, 16 * (c->block_size / 16 + 1), 16, 16);
        for (int i = 0; i < n; i++) { seqs[i] = fm_gpt_paged_open(p); tok[i] = (i * 7 + 1) % c->vocab_size; }
        for (int t = 0; t < 32; t++) fm_gpt_paged_step(m, p, n, seqs, tok, lg); /* warm-up: context 32 */
        double runs[7];
        for (int rep = 0; rep < 7; rep++) {
            double t0 = now();
            for (int t = 0; t < 4; t++)
                if (fm_gpt_paged_step(m, p, n, seqs, tok, lg) != FM_OK) { fprintf(stderr, "%s\n", fm_last_error()); return 1; }
            runs[rep] = (now() - t0) / 4;
        }
        qsort(runs, 7, sizeof *runs, cmp_d);
        printf("  {\"sequences\": %d, \"step_ms_min\": %.3f, \"step_ms_median\": %.3f, \"tokens_per_s_best\": %.0f}%s\n", n,
               runs[0] * 1e3, runs[3] * 1e3, n / runs[0], k < 4 ? "," : "");
        fm_gpt_paged_free(p);
    }
    printf("]}\n");
    free(lg);
    fm_gpt_free(m);
    return 0;
}
