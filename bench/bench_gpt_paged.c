/* The batched decode step over the paged KV cache (src/gpt/gpt_paged.c), the
 * core of the server's continuous batching: time per step and tokens/s with n
 * sequences decoding together (n = 1, 2, 4, 8, 16), each at a context of 64.
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
        int steps = 32;
        double t0 = now();
        for (int t = 0; t < steps; t++)
            if (fm_gpt_paged_step(m, p, n, seqs, tok, lg) != FM_OK) { fprintf(stderr, "%s\n", fm_last_error()); return 1; }
        double dt = (now() - t0) / steps;
        printf("  {\"sequences\": %d, \"step_ms\": %.3f, \"tokens_per_s\": %.0f}%s\n", n, dt * 1e3, n / dt, k < 4 ? "," : "");
        fm_gpt_paged_free(p);
    }
    printf("]}\n");
    free(lg);
    fm_gpt_free(m);
    return 0;
}
