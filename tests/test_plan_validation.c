/* The planner against published measurements (tests/data/plan_validation.tsv):
 * each row's settings are planned with the real GPU database, the prediction
 * is compared with the published figure, and the errors are summarized per
 * kind (memory, training time, inference); rows whose confidence column starts
 * with "unscored" (a run the planner cannot model, said why) are shown but not
 * summarized. The test fails when a summary is above its limit (the limits and why they are what they are: docs/PLANNER.md).
 *
 * `test_plan_validation --markdown` prints the table docs/PLANNER.md shows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/plan.h"
#include "test_util.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MAXROWS 128
/* Training-time limits. The goal is median <= 10%, worst <= 30%.
 * The median meets it (9.5% over 36 points since llm.c's two rows follow the
 * runs' own command files, 2026-12-03; 9.0% over 35 before), and the limit is
 * the goal. The worst does not: Llama 3.1's 8B (about twice the GPU-hours its
 * FLOPs need on H100, which one achievable MFU per GPU cannot reproduce; its
 * sources give no layout to correct, and its long-context stage, whatever its
 * split, leaves it beyond 30%). The worst limit only guards today's figure
 * from getting worse; docs/PLANNER.md says so beside the table. */
#define TRAIN_MEDIAN 0.10
#define TRAIN_WORST 0.53
/* First-token latency (TensorRT-LLM at batch 1): the issue sets no goal. 13.2%
 * median, 42.2% worst since a prefill adds one read of the weights to its
 * compute instead of taking the larger (30.1% and 64.1% before); see
 * docs/PLANNER.md. The limits keep today's figures from getting worse. */
#define TTFT_MEDIAN 0.14
#define TTFT_WORST 0.43
/* Inference: the goal is the median (<= 15%); the worst has none. 39.1%
 * (TensorRT-LLM's LLaMA 7B on H100, batch 768 of 128 in / 128 out) since a
 * static batch is prefilled together (32.9% before, with each prompt paying a
 * read of the weights; 120.8% before the v0.6.1 rows read the KV cache once per
 * query head). This keeps it from getting worse. */
#define INFER_WORST 0.40
/* The goal is <= 15%; the limit is today's 4.2%, rounded up. */
#define INFER_MEDIAN 0.05
#define MEM_MEDIAN 0.02
#define MEM_WORST 0.14

typedef struct point {
    char id[64], kind[32], spec[512], cite[2048], conf[2048];
    double published, predicted, err; /* err: (predicted - published) / published */
    int ok;                           /* the planner produced a figure */
} point;

/* key=value settings into a model and a job; returns 0 with a message on a bad key. */
static int apply_spec(const char *spec, fm_plan_model *m, fm_plan_job *j, char *gpu, size_t gcap, double io[2], char *why,
                      size_t wcap) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    fm_plan_model dims;
    memset(&dims, 0, sizeof dims);
    const char *preset = NULL, *params = NULL, *arch = NULL;
    int untied = -1;
    fm_plan_job_defaults(j);
    gpu[0] = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) { snprintf(why, wcap, "no '=' in \"%s\"", tok); return 0; }
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        double d = 0;
        if (!strcmp(k, "gpu")) {
            /* GPU names have spaces: the value runs to the end of the spec */
            size_t used = (size_t)(v - buf);
            snprintf(gpu, gcap, "%s", spec + used);
            break;
        }
        if (!strcmp(k, "preset")) preset = v;
        else if (!strcmp(k, "params")) params = v;
        else if (!strcmp(k, "arch")) arch = v;
        else if (!strcmp(k, "tokens")) { if (fm_plan_parse_count(v, &j->tokens)) { snprintf(why, wcap, "tokens"); return 0; } }
        else if (!strcmp(k, "task")) j->task = (fm_plan_task)fm_plan_task_parse(v);
        else if (!strcmp(k, "precision")) j->precision = (fm_plan_precision)fm_plan_precision_parse(v);
        else if (!strcmp(k, "optimizer")) j->optimizer = (fm_plan_optimizer)fm_plan_optimizer_parse(v);
        else if (!strcmp(k, "checkpointing")) j->checkpointing = (fm_plan_ckpt)fm_plan_ckpt_parse(v);
        else {
            char *end = NULL;
            d = strtod(v, &end);
            if (!end || *end) { snprintf(why, wcap, "%s=%s: not a number", k, v); return 0; }
            if (!strcmp(k, "layers")) dims.layers = (int64_t)d;
            else if (!strcmp(k, "hidden")) dims.hidden = (int64_t)d;
            else if (!strcmp(k, "heads")) dims.heads = (int64_t)d;
            else if (!strcmp(k, "kv_heads")) dims.kv_heads = (int64_t)d;
            else if (!strcmp(k, "ffn")) dims.ffn = (int64_t)d;
            else if (!strcmp(k, "vocab")) dims.vocab = (int64_t)d;
            else if (!strcmp(k, "max_seq")) dims.max_seq = (int64_t)d;
            else if (!strcmp(k, "untied")) untied = (int)d;
            else if (!strcmp(k, "seq")) j->seq = (int64_t)d;
            else if (!strcmp(k, "batch")) j->batch = (int64_t)d;
            else if (!strcmp(k, "gpus")) j->gpus = (int)d;
            else if (!strcmp(k, "lora_rank")) j->lora_rank = (int)d;
            else if (!strcmp(k, "zero")) j->zero = (int)d;
            else if (!strcmp(k, "tp")) j->tensor_parallel = (int)d;
            else if (!strcmp(k, "pp")) j->pipeline_parallel = (int)d;
            else if (!strcmp(k, "mb")) j->micro_batches = (int)d;
            else if (!strcmp(k, "vs")) j->virtual_stages = (int)d;
            else if (!strcmp(k, "no_master")) j->master_weights = !d;
            else if (!strcmp(k, "oib")) j->optimizer_in_backward = (int)d;
            else if (!strcmp(k, "offload")) j->offload_optimizer = (int)d;
            else if (!strcmp(k, "chunked")) j->chunked_loss = (int)d;
            else if (!strcmp(k, "fused")) j->fused_loss = (int)d;
            else if (!strcmp(k, "no_dropout")) j->no_dropout = (int)d;
            else if (!strcmp(k, "kv8")) j->kv_cache_8bit = (int)d;
            else if (!strcmp(k, "kvq")) j->kv_read_per_query_head = (int)d;
            else if (!strcmp(k, "in")) io[0] = d;
            else if (!strcmp(k, "out")) io[1] = d;
            else { snprintf(why, wcap, "unknown key \"%s\"", k); return 0; }
        }
    }
    fm_status st;
    if (preset) st = fm_plan_model_preset(preset, m);
    else if (params) {
        double n = 0;
        st = fm_plan_parse_count(params, &n);
        if (!st) st = fm_plan_model_from_params(n, m);
    } else if (arch) {
        *m = dims;
        m->arch = !strcmp(arch, "gpt") ? FM_PLAN_ARCH_GPT : FM_PLAN_ARCH_LLAMA;
        m->tied_embeddings = m->arch == FM_PLAN_ARCH_GPT;
        if (untied >= 0) m->tied_embeddings = !untied;
        st = fm_plan_model_from_dims(m);
    } else {
        snprintf(why, wcap, "no model (preset=, params= or arch=)");
        return 0;
    }
    if (st) { snprintf(why, wcap, "%s", fm_last_error()); return 0; }
    if (!gpu[0]) { snprintf(why, wcap, "no gpu="); return 0; }
    return 1;
}

/* A static batch as TensorRT-LLM's gptSessionBenchmark runs it: `batch`
 * prompts of `in` tokens prefilled together (the plan's static-batch prefill),
 * then `out` decode steps of the whole batch at a mean context of in + out/2.
 * Output tokens/s per GPU of the replica. */
static int predict_batch(const fm_plan_db *db, const fm_plan_model *m, fm_plan_job *j, const char *gpu, const double io[2],
                         double *out, char *why, size_t wcap) {
    if (!(io[0] > 0 && io[1] > 0)) { snprintf(why, wcap, "batch_tok_s needs in= and out="); return 0; }
    double t[2];
    for (int pass = 0; pass < 2; pass++) {
        j->seq = (int64_t)(pass == 0 ? io[0] : io[0] + io[1] / 2);
        fm_plan_result *r = fm_plan_compute(m, j, db, gpu);
        if (!r) { snprintf(why, wcap, "%s", fm_last_error()); return 0; }
        const fm_plan_row *row = &r->rows[0];
        int fits = row->gpus > 0 && row->step_s > 0;
        t[pass] = pass == 0 ? row->prefill_s : row->step_s;
        fm_plan_result_free(r);
        if (!fits) { snprintf(why, wcap, "no time: the batch does not fit %s as given", gpu); return 0; }
    }
    double B = (double)j->batch;
    *out = B * io[1] / (t[0] + io[1] * t[1]) / j->tensor_parallel;
    return 1;
}

static int predict(const fm_plan_db *db, point *p, char *why, size_t wcap) {
    fm_plan_model m;
    fm_plan_job j;
    char gpu[128];
    double io[2] = {0, 0};
    if (!apply_spec(p->spec, &m, &j, gpu, sizeof gpu, io, why, wcap)) return 0;
    if (!strcmp(p->kind, "batch_tok_s")) return predict_batch(db, &m, &j, gpu, io, &p->predicted, why, wcap);
    fm_plan_result *r = fm_plan_compute(&m, &j, db, gpu);
    if (!r) { snprintf(why, wcap, "%s", fm_last_error()); return 0; }
    const fm_plan_row *row = &r->rows[0];
    int ok = 1;
    const char *k = p->kind;
    if (!strcmp(k, "fits")) p->predicted = row->min_gpus == 1 ? 1 : 0;
    else if (!strcmp(k, "alloc_gib")) p->predicted = row->mem.allocated / GIB;
    else if (!strcmp(k, "total_gib")) p->predicted = row->mem.total / GIB;
    else if (!strcmp(k, "states_gb")) p->predicted = (row->mem.weights + row->mem.gradients + row->mem.optimizer) / 1e9;
    else if (row->gpus <= 0 || row->tokens_per_s <= 0) {
        snprintf(why, wcap, "no time: the job does not fit %s as given (%.1f GiB per GPU)", gpu, row->mem.total / GIB);
        ok = 0;
    } else if (!strcmp(k, "gpu_hours")) p->predicted = row->run_s * row->gpus / 3600;
    else if (!strcmp(k, "tok_s_gpu")) p->predicted = row->tokens_per_s / row->gpus;
    else if (!strcmp(k, "tflops_gpu")) p->predicted = r->flops_per_token * row->tokens_per_s / row->gpus / 1e12;
    else if (!strcmp(k, "decode_tok_s")) p->predicted = row->tokens_per_s;
    else if (!strcmp(k, "ttft_ms")) p->predicted = row->ttft_s * 1e3;
    else { snprintf(why, wcap, "unknown kind \"%s\"", k); ok = 0; }
    fm_plan_result_free(r);
    return ok;
}

static int read_points(const char *path, point *pts, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); return -1; }
    char line[4096];
    int n = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            /* a longer line would be read as two, the second taken for a row */
            fprintf(stderr, "%s:%d: line longer than %d characters; shorten it\n", path, lineno, (int)sizeof line - 2);
            fclose(f);
            return -1;
        }
        if (line[0] == '#' || line[0] == '\n') continue;
        line[strcspn(line, "\n")] = 0;
        char *field[6];
        int nf = 0;
        char *s = line;
        while (nf < 6) {
            field[nf++] = s;
            char *tab = strchr(s, '\t');
            if (!tab) break;
            *tab = 0;
            s = tab + 1;
        }
        if (nf != 6 || n == cap) {
            fprintf(stderr, "%s:%d: expected 6 tab-separated fields, got %d\n", path, lineno, nf);
            fclose(f);
            return -1;
        }
        point *p = &pts[n++];
        memset(p, 0, sizeof *p);
        snprintf(p->id, sizeof p->id, "%.*s", (int)sizeof p->id - 1, field[0]);
        snprintf(p->kind, sizeof p->kind, "%.*s", (int)sizeof p->kind - 1, field[1]);
        p->published = strtod(field[2], NULL);
        snprintf(p->spec, sizeof p->spec, "%.*s", (int)sizeof p->spec - 1, field[3]);
        snprintf(p->cite, sizeof p->cite, "%.*s", (int)sizeof p->cite - 1, field[4]);
        snprintf(p->conf, sizeof p->conf, "%.*s", (int)sizeof p->conf - 1, field[5]);
    }
    fclose(f);
    return n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median and worst absolute error of the points whose kind is in `kinds`. */
static int summarize(const point *pts, int n, const char *const *kinds, double *median, double *worst) {
    double e[MAXROWS];
    int k = 0;
    for (int i = 0; i < n; i++)
        for (const char *const *kk = kinds; *kk; kk++)
            if (!strcmp(pts[i].kind, *kk) && pts[i].ok && strncmp(pts[i].conf, "unscored", 8)) e[k++] = fabs(pts[i].err);
    qsort(e, (size_t)k, sizeof e[0], cmp_double);
    *median = k ? (k % 2 ? e[k / 2] : (e[k / 2 - 1] + e[k / 2]) / 2) : 0;
    *worst = k ? e[k - 1] : 0;
    return k;
}

int main(int argc, char **argv) {
    int markdown = argc > 1 && !strcmp(argv[1], "--markdown");
    fm_plan_db *db = fm_plan_db_load("data/gpus.json");
    CHECK(db != NULL);
    static point pts[MAXROWS];
    int n = read_points("tests/data/plan_validation.tsv", pts, MAXROWS);
    CHECK(n >= 40);
    if (!db || n < 0) TEST_DONE();
    if (markdown)
        printf("| id | kind | predicted | published | error | source | confidence |\n|---|---|---|---|---|---|---|\n");
    int fits_agree = 0, fits_total = 0;
    for (int i = 0; i < n; i++) {
        point *p = &pts[i];
        char why[512] = "";
        p->ok = predict(db, p, why, sizeof why);
        int unscored = !strncmp(p->conf, "unscored", 8);
        CHECK_MSG(p->ok || unscored, "%s: %s", p->id, why);
        if (!p->ok) {
            /* an unscored run the planner refuses is still shown, with why */
            if (markdown) printf("| %s | %s | (%s) | %.4g | - | %s | %s |\n", p->id, p->kind, why, p->published, p->cite, p->conf);
            continue;
        }
        if (!strcmp(p->kind, "fits")) {
            fits_total++;
            fits_agree += p->predicted == p->published;
            p->err = p->predicted == p->published ? 0 : 1;
        } else {
            p->err = (p->predicted - p->published) / p->published;
        }
        if (markdown) {
            if (!strcmp(p->kind, "fits"))
                printf("| %s | fits | %s | %s | %s | %s | %s |\n", p->id, p->predicted ? "fits" : "does not fit",
                       p->published ? "fits" : "does not fit", p->err ? "disagrees" : "agrees", p->cite, p->conf);
            else
                printf("| %s | %s | %.4g | %.4g | %+.1f%% | %s | %s |\n", p->id, p->kind, p->predicted, p->published,
                       p->err * 100, p->cite, p->conf);
        } else {
            fprintf(stderr, "%-26s %-12s predicted %-10.4g published %-10.4g %+6.1f%%\n", p->id, p->kind, p->predicted,
                    p->published, p->err * 100);
        }
    }
    static const char *const mem[] = {"alloc_gib", "total_gib", "states_gb", NULL};
    static const char *const train[] = {"gpu_hours", "tok_s_gpu", "tflops_gpu", NULL};
    static const char *const infer[] = {"decode_tok_s", "batch_tok_s", NULL};
    static const char *const first[] = {"ttft_ms", NULL};
    double mm, mw, tm, tw, im, iw, fm, fw;
    int nm = summarize(pts, n, mem, &mm, &mw), nt = summarize(pts, n, train, &tm, &tw), ni = summarize(pts, n, infer, &im, &iw);
    int nf = summarize(pts, n, first, &fm, &fw);
    FILE *out = markdown ? stdout : stderr;
    fprintf(out, "\nmemory: %d points, median |error| %.1f%%, worst %.1f%%; fit/no-fit %d of %d agree\n", nm, mm * 100,
            mw * 100, fits_agree, fits_total);
    fprintf(out, "training time: %d points, median |error| %.1f%%, worst %.1f%%\n", nt, tm * 100, tw * 100);
    fprintf(out, "inference: %d points, median |error| %.1f%%, worst %.1f%%\n", ni, im * 100, iw * 100);
    fprintf(out, "first-token latency: %d points, median |error| %.1f%%, worst %.1f%%\n", nf, fm * 100, fw * 100);
    /* The goals of issue #20; see docs/PLANNER.md for where they are met. */
    /* Memory: the goal is median <= 5%, worst <= 15%; the limits are today's
     * 1.0% and 13.2%, so that a change that loses accuracy shows. */
    CHECK_MSG(mm <= MEM_MEDIAN && mw <= MEM_WORST, "memory: median %.1f%% (limit %.0f%%, goal 5%%), worst %.1f%% (limit %.0f%%, goal 15%%)",
              mm * 100, MEM_MEDIAN * 100, mw * 100, MEM_WORST * 100);
    CHECK_MSG(fits_agree == fits_total, "fit/no-fit: %d of %d agree", fits_agree, fits_total);
    CHECK_MSG(tm <= TRAIN_MEDIAN && tw <= TRAIN_WORST, "training time: median %.1f%% (limit %.0f%%), worst %.1f%% (limit %.0f%%)",
              tm * 100, TRAIN_MEDIAN * 100, tw * 100, TRAIN_WORST * 100);
    CHECK_MSG(im <= INFER_MEDIAN, "inference: median %.1f%% (limit %.0f%%, goal <= 15%%)", im * 100, INFER_MEDIAN * 100);
    CHECK_MSG(iw <= INFER_WORST, "inference: worst %.1f%% (limit %.0f%%)", iw * 100, INFER_WORST * 100);
    /* No goal in the issue: this only keeps today's figure from getting worse. */
    CHECK_MSG(fm <= TTFT_MEDIAN && fw <= TTFT_WORST, "first-token latency: median %.1f%% (limit %.0f%%), worst %.1f%% (limit %.0f%%)",
              fm * 100, TTFT_MEDIAN * 100, fw * 100, TTFT_WORST * 100);
    fm_plan_db_free(db);
    TEST_DONE();
}
