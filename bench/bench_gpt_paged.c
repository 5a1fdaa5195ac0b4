/* The batched decode step over the paged KV cache (src/gpt/gpt_paged.c), the
 * core of the server's continuous batching: time per step and tokens/s with n
 * sequences decoding together (n = 1, 2, 4, 8, 16), each at a context of 32-64:
 * over 15 timed runs of 4 steps, the minimum and the median wall time and the
 * minimum and median CPU time of the process per step. On a shared machine the
 * wall figures measure the other processes as much as this one; the CPU time
 * (run with FATHOM_NUM_THREADS=1 for one thread's) does not count the time the
 * process waits for a core, so it is the figure to compare between n.
 * Usage: bench_gpt_paged MODEL_DIR [N STEPS]
 *   MODEL_DIR: a GPT written by `fathom train` (e.g. kjv-gpt), or a GPT graph that
 *   `fathom compile` or `fathom quantize` wrote from one (served the same way).
 *   N STEPS: instead, run STEPS steps of N sequences (context 32 up to the model's,
 *   then again from 32) and print the CPU and wall time per step (the wall time includes the
 *   restarts' 32 steps): a load to profile (perf).
 *       bench_gpt_paged --gpt2-small
 *   instead builds a GPT-2-small-shaped model (12 x 768, 12 heads, vocab 8192,
 *   context 128, random weights), traces and compiles its graph, quantizes it to
 *   int4 (g32) and int8 dynamic, and runs the table for each form as served
 *   (graph_gpt_paged.c), with each form's tokens/s over f32's at each n.
 * FATHOM_BENCH_KV=f16: the cache's blocks in f16 (text_generation.kv_cache_dtype). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fathom/gpt.h"
#include "fathom/graph.h"
#include "fathom/quant.h"
#include "gpt/gpt_paged.h"
#include "graph/graph_gpt_paged.h"

static const fm_paged_weights *g_q; /* a graph's quantized weights (NULL: a trained model) */

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static fm_gpt_paged *start(fm_gpt *m, const fm_gpt_config *c, int n, int *seqs, int32_t *tok, float *lg) {
    const char *kv = getenv("FATHOM_BENCH_KV"); /* f16: the cache's blocks in half precision */
    fm_gpt_paged *p = fm_gpt_paged_new_ex(m, g_q, 16 * (c->block_size / 16 + 1), 16, 16, kv && !strcmp(kv, "f16") ? FM_F16 : FM_F32);
    if (!p) return NULL;
    for (int i = 0; i < n; i++) { seqs[i] = fm_gpt_paged_open(p); tok[i] = (i * 7 + 1) % c->vocab_size; }
    for (int t = 0; t < 32; t++)
        if (fm_gpt_paged_step(m, p, n, seqs, tok, lg) != FM_OK) { fm_gpt_paged_free(p); return NULL; } /* context 32 */
    return p;
}

static int profile_load(fm_gpt *m, const fm_gpt_config *c, int n, long steps, float *lg) {
    int seqs[16];
    int32_t tok[16];
    fm_gpt_paged *p = start(m, c, n, seqs, tok, lg);
    if (!p) { fprintf(stderr, "bench_gpt_paged: %s\n", fm_last_error()); return 1; }
    double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID), w0 = clock_s(CLOCK_MONOTONIC);
    for (long s = 0; s < steps; s++) {
        if (fm_gpt_paged_len(p, seqs[0]) + 1 > c->block_size) { /* restart at context 32 */
            fm_gpt_paged_free(p);
            if (!(p = start(m, c, n, seqs, tok, lg))) { fprintf(stderr, "bench_gpt_paged: %s\n", fm_last_error()); return 1; }
        }
        if (fm_gpt_paged_step(m, p, n, seqs, tok, lg) != FM_OK) { fprintf(stderr, "%s\n", fm_last_error()); return 1; }
    }
    printf("{\"sequences\": %d, \"steps\": %ld, \"step_cpu_ms_mean\": %.4f, \"step_wall_ms_mean\": %.4f}\n", n, steps,
           (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / (double)steps * 1e3, (clock_s(CLOCK_MONOTONIC) - w0) / (double)steps * 1e3);
    fm_gpt_paged_free(p);
    return 0;
}

/* The table for n = 1, 2, 4, 8, 16; tokens/s best into best[5] (may be NULL). */
static int run_table(fm_gpt *m, const fm_gpt_config *c, const char *label, float *lg, double *best) {
    int rc = 0;
    printf("{\"model\": \"%s\", \"n_layer\": %d, \"n_embd\": %d, \"results\": [\n", label, c->n_layer, c->n_embd);
    const int ns[] = {1, 2, 4, 8, 16};
    enum { RUNS = 15 };
    for (int k = 0; k < 5 && rc == 0; k++) {
        int n = ns[k], seqs[16];
        int32_t tok[16];
        fm_gpt_paged *p = start(m, c, n, seqs, tok, lg);
        if (!p) { fprintf(stderr, "bench_gpt_paged: %s\n", fm_last_error()); rc = 1; break; }
        double wall[RUNS], cpu[RUNS];
        for (int rep = 0; rep < RUNS && rc == 0; rep++) {
            if (fm_gpt_paged_len(p, seqs[0]) + 4 > 64) { /* keep the context in 32-64 */
                fm_gpt_paged_free(p);
                if (!(p = start(m, c, n, seqs, tok, lg))) { fprintf(stderr, "bench_gpt_paged: %s\n", fm_last_error()); rc = 1; break; }
            }
            double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            for (int t = 0; t < 4; t++)
                if (fm_gpt_paged_step(m, p, n, seqs, tok, lg) != FM_OK) { fprintf(stderr, "%s\n", fm_last_error()); rc = 1; break; }
            cpu[rep] = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / 4;
            wall[rep] = (clock_s(CLOCK_MONOTONIC) - t0) / 4;
        }
        if (rc == 0) {
            qsort(wall, RUNS, sizeof *wall, cmp_d);
            qsort(cpu, RUNS, sizeof *cpu, cmp_d);
            printf("  {\"sequences\": %d, \"step_ms_min\": %.3f, \"step_ms_median\": %.3f, \"step_cpu_ms_min\": %.3f, "
                   "\"step_cpu_ms_median\": %.3f, \"tokens_per_s_best\": %.0f}%s\n",
                   n, wall[0] * 1e3, wall[RUNS / 2] * 1e3, cpu[0] * 1e3, cpu[RUNS / 2] * 1e3, n / wall[0], k < 4 ? "," : "");
            if (best) best[k] = n / wall[0];
        }
        fm_gpt_paged_free(p);
    }
    printf("]}\n");
    return rc;
}

/* --gpt2-small: the same table for f32, int4 and int8 graphs of one GPT-2-small-shaped model */
static int gpt2_small(void) {
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_GPT2);
    c.n_layer = 12;
    c.n_head = 12;
    c.n_kv_head = 12;
    c.n_embd = 768;
    c.ffn_hidden = 3072;
    c.vocab_size = 8192;
    c.block_size = 128;
    c.dropout = 0;
    fm_rng rng;
    fm_rng_init(&rng, 1);
    fm_gpt *src = fm_gpt_new(&c, &rng);
    fm_graph *g = src ? fm_graph_from_gpt(src) : NULL;
    fm_compile_report rep = {0};
    fm_graph *forms[3] = {g ? fm_graph_compile(g, &rep) : NULL, NULL, NULL};
    const char *names[3] = {"gpt2-small f32 (compiled graph)", "gpt2-small int4 g32", "gpt2-small int8 dynamic"};
    fm_gpt_free(src);
    fm_graph_free(g);
    int rc = forms[0] ? 0 : 1;
    for (int f = 1; f < 3 && rc == 0; f++) {
        fm_quant_options o;
        fm_quant_options_init(&o);
        o.mode = f == 1 ? FM_QUANT_INT4 : FM_QUANT_INT8_DYNAMIC;
        o.group = 32;
        if (!(forms[f] = fm_graph_quantize(forms[0], &o, NULL))) rc = 1;
    }
    double best[3][5] = {{0}};
    float *lg = malloc(sizeof(float) * 16 * (size_t)c.vocab_size);
    if (!lg) rc = 1;
    for (int f = 0; f < 3 && rc == 0; f++) {
        fm_paged_weights q;
        fm_gpt *m = fm_graph_gpt_unpack(forms[f], names[f], &q);
        if (!m) { rc = 1; break; }
        g_q = &q;
        rc = run_table(m, fm_gpt_get_config(m), names[f], lg, best[f]);
        g_q = NULL;
        fm_gpt_free(m);
        fm_paged_weights_free(&q);
    }
    if (rc) fprintf(stderr, "bench_gpt_paged: %s\n", fm_last_error());
    else {
        const int ns[] = {1, 2, 4, 8, 16};
        printf("{\"tokens_per_s_over_f32\": [");
        for (int k = 0; k < 5; k++)
            printf("%s{\"sequences\": %d, \"int4\": %.2f, \"int8\": %.2f}", k ? ", " : "", ns[k], best[1][k] / best[0][k],
                   best[2][k] / best[0][k]);
        printf("]}\n");
    }
    free(lg);
    for (int f = 0; f < 3; f++) fm_graph_free(forms[f]);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--gpt2-small")) return gpt2_small();
    if (argc != 2 && argc != 4) { fprintf(stderr, "usage: bench_gpt_paged MODEL_DIR [N STEPS] | --gpt2-small\n"); return 2; }
    int pn = 0;
    long psteps = 0;
    if (argc == 4) {
        pn = atoi(argv[2]);
        psteps = atol(argv[3]);
        if (pn < 1 || pn > 16 || psteps < 1) { fprintf(stderr, "bench_gpt_paged: N must be 1-16, STEPS >= 1\n"); return 2; }
    }
    fm_paged_weights q = {0};
    fm_graph *g = fm_graph_dir_is_graph(argv[1]) ? fm_graph_load(argv[1]) : NULL;
    fm_gpt *m = g ? fm_graph_gpt_unpack(g, argv[1], &q) : fm_graph_dir_is_graph(argv[1]) ? NULL : fm_gpt_load_dir(argv[1], NULL);
    fm_graph_free(g);
    g_q = &q;
    if (!m) { fprintf(stderr, "bench_gpt_paged: %s\n", fm_last_error()); return 1; }
    const fm_gpt_config *c = fm_gpt_get_config(m);
    int rc = 1;
    float *lg = c->block_size >= 64 ? malloc(sizeof(float) * 16 * (size_t)c->vocab_size) : NULL;
    if (c->block_size < 64) fprintf(stderr, "bench_gpt_paged: the model's context must be >= 64\n");
    else if (lg) rc = pn ? profile_load(m, c, pn, psteps, lg) : run_table(m, c, argv[1], lg, NULL);
    free(lg);
    fm_gpt_free(m);
    fm_paged_weights_free(&q);
    return rc;
}
