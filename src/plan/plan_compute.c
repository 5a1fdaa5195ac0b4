/* The plan for every GPU: how many are needed, how long a step and the whole
 * run take, decode speed, what it costs at each pricing, the ranking, and the
 * warnings that matter. Memory comes from plan_memory.c.
 *
 * Time = FLOPs / (GPUs x dense peak x MFU). The peak is the dense 16-bit
 * tensor rate with fp32 accumulation (never the sparse datasheet headline);
 * the MFU is an assumption and is printed with every figure. Decoding is
 * memory-bound: tokens/s = efficiency x bandwidth / bytes read per step. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_internal.h"

/* Spot instances: assumed mean time between interruptions, and checkpoint
 * write bandwidth, for the checkpoint-interval advice. */
#define SPOT_MTBI_HOURS 4.0
#define CKPT_WRITE_GBS 2.0

static int fits_at(const fm_plan_model *m, const fm_plan_job *job, const fm_plan_gpu *g, int n, fm_plan_memory *mem) {
    fm_plan_memory tmp;
    fm_plan_memory *o = mem ? mem : &tmp;
    fm_plan_memory_at(m, job, n, o, NULL);
    return o->total <= g->memory_gib * FM_GIB;
}

/* Smallest multiple of the tensor-parallel degree that fits. Memory per GPU
 * never grows with more GPUs, so a binary search over the multiples works. */
static int min_gpus(const fm_plan_model *m, const fm_plan_job *job, const fm_plan_gpu *g) {
    int t = job->tensor_parallel * job->pipeline_parallel, hi = 65536 / t, lo = 1;
    if (!fits_at(m, job, g, hi * t, NULL)) return 0;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (fits_at(m, job, g, mid * t, NULL)) hi = mid;
        else lo = mid + 1;
    }
    return lo * t;
}

static void add_warning(fm_plan_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_warning(fm_plan_result *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    char **nw = realloc(r->warnings, sizeof(char *) * (size_t)(r->nwarnings + 1));
    if (!nw) { free(s); return; }
    r->warnings = nw;
    r->warnings[r->nwarnings++] = s;
}

/* Bytes a checkpoint of the job's trainable state takes. */
static double checkpoint_bytes(const fm_plan_model *m, const fm_plan_job *job) {
    int lora = job->task == FM_PLAN_LORA || job->task == FM_PLAN_QLORA;
    double T = lora ? plan_lora_params(m, job->lora_rank) : (double)m->params;
    double per = job->precision == FM_PLAN_FP32 ? 4 + 8 : 2 + 4 + 8;
    if (job->optimizer == FM_PLAN_SGD) per -= 4;
    if (job->optimizer == FM_PLAN_ADAM8BIT) per -= 6;
    return T * per;
}

static void plan_row(const fm_plan_model *m, const fm_plan_job *job, fm_plan_result *r, fm_plan_row *row) {
    const fm_plan_gpu *g = row->gpu;
    int t = job->tensor_parallel;
    row->min_gpus = min_gpus(m, job, g);
    if (row->min_gpus == 0 && plan_is_training(job->task) && job->zero < 3) {
        fm_plan_job z = *job;
        z.zero = 3;
        row->min_gpus_zero3 = min_gpus(m, &z, g);
    }
    if (job->gpus > 0) {
        row->fits = fits_at(m, job, g, job->gpus, NULL);
        row->gpus = row->fits ? job->gpus : row->min_gpus;
    } else {
        row->gpus = row->min_gpus;
        row->fits = row->min_gpus > 0;
    }
    fm_plan_memory_at(m, job, row->gpus > 0 ? row->gpus : (job->gpus > 0 ? job->gpus : t), &row->mem, NULL);
    row->peak_tflops = plan_peak_tflops(g, job->precision);
    row->mfu = plan_gpu_mfu(g, job);
    row->run_s = row->step_s = row->compute_s = row->comm_s = -1;
    row->tokens_per_s = -1;
    row->usd_per_hour = -1;
    for (int k = 0; k < FM_PLAN_PRICING_COUNT; k++) row->cost[k] = row->cost_per_mtok[k] = -1;
    if (row->gpus <= 0 || row->peak_tflops <= 0) return;

    double n = row->gpus, s = (double)plan_resolved_seq(m, job), b = (double)job->batch;
    double fpt = r->flops_per_token;
    int decoder = m->arch == FM_PLAN_ARCH_GPT || m->arch == FM_PLAN_ARCH_LLAMA;

    if (plan_is_training(job->task)) {
        plan_time_training(m, job, fpt, row, NULL);
        if (r->job.tokens > 0) row->run_s = r->job.tokens / row->tokens_per_s;
    } else if (decoder) {
        int ok = plan_time_serving(m, job, row, NULL);
        if (ok <= 0) {
            /* Nothing fits beside the weights, or the rate needs more GPUs than exist. */
            row->too_many = ok < 0;
            row->gpus = 0;
            row->tokens_per_s = -1;
            return;
        }
        n = row->gpus;
        if (job->requests_per_second <= 0 && r->job.tokens > 0) row->run_s = r->job.tokens / row->tokens_per_s;
    } else {
        /* Encoders and CNNs: throughput is compute-bound, in samples/s. */
        double rate = row->peak_tflops * 1e12 * row->mfu;
        double per_sample = m->arch == FM_PLAN_ARCH_CNN ? fpt : fpt * s;
        row->tokens_per_s = n * rate / per_sample;
        row->step_s = b / (row->tokens_per_s / (n / job->tensor_parallel));
        if (r->job.tokens > 0) row->run_s = r->job.tokens / row->tokens_per_s;
    }
    for (int k = 0; k < FM_PLAN_PRICING_COUNT; k++) {
        double p = g->price[k].usd_per_hour;
        if (p < 0) continue;
        double per_hour = p * n;
        if (row->run_s >= 0) row->cost[k] = row->run_s / 3600 * per_hour;
        if (row->tokens_per_s > 0) row->cost_per_mtok[k] = per_hour / (row->tokens_per_s * 3600) * 1e6;
        if (k == (int)job->pricing) row->usd_per_hour = per_hour;
    }
}

static const fm_plan_result *sort_ctx;
static double rank_key(const fm_plan_row *row, int pricing) {
    return row->cost[pricing] >= 0 ? row->cost[pricing] : row->cost_per_mtok[pricing];
}
static int by_cost(const void *a, const void *b) {
    const fm_plan_row *x = &sort_ctx->rows[*(const int *)a], *y = &sort_ctx->rows[*(const int *)b];
    double kx = rank_key(x, sort_ctx->job.pricing), ky = rank_key(y, sort_ctx->job.pricing);
    if (kx != ky) return kx < ky ? -1 : 1;
    return x->gpu->memory_gib < y->gpu->memory_gib ? -1 : x->gpu->memory_gib > y->gpu->memory_gib;
}

static void add_warnings(const fm_plan_model *m, const fm_plan_job *job, fm_plan_result *r) {
    int training = plan_is_training(job->task);
    if (!strncmp(m->dims_source, "estimated", 9))
        add_warning(r, "only a parameter count was given: layers/hidden/heads were estimated (%lld x %lld, %lld heads, "
                       "no grouped-query attention), so activations and KV cache are approximate; give --arch dims or a "
                       "--preset for exact figures", (long long)m->layers, (long long)m->hidden, (long long)m->heads);
    if (m->arch != FM_PLAN_ARCH_CNN && m->max_seq > 0 && plan_resolved_seq(m, job) > m->max_seq)
        add_warning(r, "--seq %lld exceeds %s's context of %lld tokens", (long long)plan_resolved_seq(m, job), m->name,
                    (long long)m->max_seq);
    if (job->requests_per_second > 0 && job->output_tokens >= plan_resolved_seq(m, job))
        add_warning(r, "--output-tokens %lld is not shorter than --seq %lld (the context per request): no prompt is "
                       "planned; raise --seq to prompt + output", (long long)job->output_tokens,
                    (long long)plan_resolved_seq(m, job));
    plan_sb nofp8 = {0}, wide = {0}, toomany = {0};
    int n8 = 0, nw = 0, ntm = 0;
    for (int i = 0; i < r->nrows; i++) {
        const fm_plan_gpu *g = r->rows[i].gpu;
        if (job->precision == FM_PLAN_FP8 && g->fp8_tflops < 0) plan_sb_printf(&nofp8, "%s%s", n8++ ? ", " : "", g->name);
        if (job->tensor_parallel > g->gpus_per_node) plan_sb_printf(&wide, "%s%s", nw++ ? ", " : "", g->name);
        if (r->rows[i].too_many) plan_sb_printf(&toomany, "%s%s", ntm++ ? ", " : "", g->name);
    }
    char *l8 = plan_sb_take(&nofp8), *lw = plan_sb_take(&wide), *ltm = plan_sb_take(&toomany);
    if (l8 && n8) add_warning(r, "no fp8 tensor cores on %s: not planned in fp8 (use bf16 there)", l8);
    if (lw && nw)
        add_warning(r, "--tensor-parallel %d spans more GPUs than one node holds on %s: its all-reduces cross the network "
                       "between nodes, which the time includes; keep tensor parallelism inside a node", job->tensor_parallel, lw);
    if (ltm && ntm) add_warning(r, "the rate would need more than 1e7 GPUs of %s: not planned on them", ltm);
    free(l8);
    free(lw);
    free(ltm);
    if (m->arch == FM_PLAN_ARCH_CNN)
        add_warning(r, "%s: --seq does not apply; --tokens counts images and throughput is in images/s", m->name);
    if (job->precision == FM_PLAN_INT8 || job->precision == FM_PLAN_INT4 || job->task == FM_PLAN_QLORA)
        add_warning(r, "quantized weights are dequantized to 16 bits for each matmul: time uses the 16-bit tensor rate, "
                       "not the int8 TOPS");
    if (job->precision == FM_PLAN_FP16 && training)
        add_warning(r, "fp16 training needs dynamic loss scaling (GradScaler: start at 65536, halve and skip the step on "
                       "inf/NaN, double after 2000 clean steps); bf16 does not");

    plan_sb nol = {0};
    int n_nol = 0, zero_warned = 0;
    for (int i = 0; i < r->nrows; i++) {
        const fm_plan_row *row = &r->rows[i];
        const fm_plan_gpu *g = row->gpu;
        if (!g->bf16 && job->precision == FM_PLAN_BF16)
            add_warning(r, "%s has no bf16: %s", g->name,
                        training ? "train in fp16 with dynamic loss scaling (GradScaler, initial scale 65536); memory is the same"
                                 : "run in fp16 instead (same memory and speed)");
        if (row->gpus > 1 && g->pcie_lanes < 16) {
            if (training && row->comm_s > 0)
                add_warning(r, "%s: %s link (%.0f GB/s) for %d GPUs: gradient all-reduce takes %.3g s per step against "
                               "%.3g s of compute", g->name, g->link, g->link_gbs, row->gpus, row->comm_s, row->compute_s);
            else
                add_warning(r, "%s: %s link (%.0f GB/s) halves the PCIe bandwidth multi-GPU work depends on", g->name,
                            g->link, g->link_gbs);
        }
        if (row->gpus > 1 && !g->nvlink && strcmp(g->kind, "datacenter")) {
            plan_sb_printf(&nol, "%s%s", n_nol ? ", " : "", g->name);
            n_nol++;
        }
        if (row->min_gpus == 0 && row->min_gpus_zero3 > 0 && !zero_warned++)
            add_warning(r, "with --zero %d every data-parallel GPU holds the whole training state, so no number of GPUs "
                           "fits; --zero 3 would need %d x %s (see the table for other GPUs)",
                        job->zero, row->min_gpus_zero3, g->name);
    }
    /* Unpriced cards are planned but cannot be ranked on cost: say which. */
    plan_sb unp = {0};
    int n_unp = 0;
    for (int i = 0; i < r->nrows; i++)
        if (r->rows[i].gpu->price[job->pricing].usd_per_hour < 0)
            plan_sb_printf(&unp, "%s%s", n_unp++ ? ", " : "", r->rows[i].gpu->name);
    char *ulist = plan_sb_take(&unp);
    if (ulist && n_unp)
        add_warning(r, "unpriced in the database (no %s price): %s; they are planned but not ranked on cost "
                       "(the entries' prices.*.source says why; add a price to compare them)",
                    fm_plan_pricing_name(job->pricing), ulist);
    free(ulist);
    char *list = plan_sb_take(&nol);
    if (list && n_nol)
        add_warning(r, "consumer/workstation cards lack NVLink (%s): multi-GPU traffic crosses PCIe at 16-32 GB/s instead "
                       "of 300-900 GB/s; %s", list,
                    training ? "the gradient all-reduce time is in the step estimate, and tensor parallelism across "
                               "them would be slow"
                             : "tensor parallelism across them is slow");
    free(list);

    /* Spot: long runs will be interrupted; checkpoint often enough that a
     * reclaim loses little (Young's rule). */
    int pick = r->cheapest >= 0 ? r->cheapest : r->fastest;
    if (training && pick >= 0 && r->rows[pick].run_s > 3600) {
        const fm_plan_row *row = &r->rows[pick];
        double save_s = checkpoint_bytes(m, job) / (CKPT_WRITE_GBS * 1e9);
        double interval = sqrt(2 * save_s * SPOT_MTBI_HOURS * 3600);
        /* Saving more often than every 10 minutes buys nothing a user would notice. */
        if (interval < 600) interval = 600;
        add_warning(r, "spot pricing: the run takes %.1f h on %d x %s and spot instances can be reclaimed (AWS gives 2 "
                       "minutes' notice): save a checkpoint every ~%.0f min (Young: sqrt(2 x %.1f s save x %.0f h between "
                       "interruptions, assumed; at least 10 min); %.2f GiB at %.0f GB/s)",
                    row->run_s / 3600, row->gpus, row->gpu->name, interval / 60, save_s, SPOT_MTBI_HOURS,
                    checkpoint_bytes(m, job) / FM_GIB, CKPT_WRITE_GBS);
    }
}

fm_plan_result *fm_plan_compute(const fm_plan_model *model, const fm_plan_job *job_in, const fm_plan_db *db,
                                const char *only) {
    if (!model || !job_in || !db) {
        fm_set_error(FM_ERR_INVALID, "fm_plan_compute: NULL argument");
        return NULL;
    }
    if (fm_plan_job_check(model, job_in)) return NULL;
    fm_plan_result *r = calloc(1, sizeof *r);
    if (!r) { fm_set_error(FM_ERR_OOM, "out of memory"); return NULL; }
    r->model = *model;
    r->job = *job_in;
    r->job.seq = plan_resolved_seq(model, job_in);
    /* job.mfu stays 0 unless given: each row takes its GPU's own figure. */
    if (r->job.task == FM_PLAN_TRAIN && r->job.tokens <= 0) {
        /* Chinchilla: about 20 tokens per parameter for a compute-optimal run. */
        r->job.tokens = 20.0 * (double)model->params;
        r->tokens_defaulted = 1;
    }
    r->cheapest = r->fastest = -1;
    r->requested_gpus = job_in->gpus > 0 ? job_in->gpus : job_in->tensor_parallel;
    fm_plan_memory_at(model, &r->job, r->requested_gpus, &r->mem, NULL);
    r->flops_per_token = plan_flops_per_token(model, &r->job, NULL);
    r->total_flops = r->job.tokens > 0 ? r->flops_per_token * r->job.tokens : 0;

    r->rows = calloc((size_t)db->count, sizeof *r->rows);
    r->ranked = calloc((size_t)db->count, sizeof *r->ranked);
    if (!r->rows || !r->ranked) { fm_plan_result_free(r); fm_set_error(FM_ERR_OOM, "out of memory"); return NULL; }

    /* Select GPUs: all, or the comma-separated list in `only`. */
    char *want = NULL;
    if (only && *only) {
        want = strdup(only);
        if (!want) { fm_plan_result_free(r); fm_set_error(FM_ERR_OOM, "out of memory"); return NULL; }
        char *save = NULL;
        for (char *tok = strtok_r(want, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            const fm_plan_gpu *g = fm_plan_db_find(db, tok);
            if (!g) { free(want); fm_plan_result_free(r); return NULL; }
            int dup = 0;
            for (int i = 0; i < r->nrows; i++) dup |= r->rows[i].gpu == g;
            if (!dup) r->rows[r->nrows++].gpu = g;
        }
        free(want);
    } else {
        for (int i = 0; i < db->count; i++) r->rows[r->nrows++].gpu = &db->gpus[i];
    }
    for (int i = 0; i < r->nrows; i++) plan_row(model, &r->job, r, &r->rows[i]);

    /* Rank fitting, priced rows by the run's cost (or cost per million tokens
     * when the run's length is unknown). */
    int pr = r->job.pricing;
    for (int i = 0; i < r->nrows; i++)
        if (r->rows[i].gpus > 0 && (r->rows[i].cost[pr] >= 0 || r->rows[i].cost_per_mtok[pr] >= 0))
            r->ranked[r->nranked++] = i;
    sort_ctx = r;
    qsort(r->ranked, (size_t)r->nranked, sizeof(int), by_cost);
    sort_ctx = NULL;
    if (r->nranked) r->cheapest = r->ranked[0];
    double best = 0;
    for (int i = 0; i < r->nrows; i++) {
        const fm_plan_row *row = &r->rows[i];
        if (row->gpus <= 0 || row->tokens_per_s <= 0) continue;
        r->nfit++;
        if (r->job.budget_usd > 0 && !(rank_key(row, pr) >= 0 && rank_key(row, pr) <= r->job.budget_usd)) continue;
        if (r->fastest < 0 || row->tokens_per_s > best) { best = row->tokens_per_s; r->fastest = i; }
    }
    /* With the count left to the planner, show the breakdown at the count the
     * recommendation needs: a ZeRO-3 job's per-GPU memory on one GPU is moot. */
    int rec = r->cheapest >= 0 ? r->cheapest : r->fastest;
    if (job_in->gpus == 0 && rec >= 0 && r->rows[rec].gpus != r->requested_gpus &&
        plan_is_training(r->job.task)) {
        r->requested_gpus = r->rows[rec].gpus;
        fm_plan_memory_at(model, &r->job, r->requested_gpus, &r->mem, NULL);
    }
    /* A rate that needs more GPUs than exist on every card is a typo, not a plan. */
    int too_many = 0, served = 0;
    for (int i = 0; i < r->nrows; i++) {
        too_many += r->rows[i].too_many;
        served += r->rows[i].gpus > 0;
    }
    if (too_many && !served) {
        fm_set_error(FM_ERR_INVALID, "--requests-per-second %g would need more than %.0e GPUs on every GPU it fits, more "
                     "than exist; check the rate (requests per second, not per day)", r->job.requests_per_second, 1e7);
        fm_plan_result_free(r);
        return NULL;
    }
    add_warnings(model, &r->job, r);
    return r;
}

void fm_plan_result_free(fm_plan_result *r) {
    if (!r) return;
    for (int i = 0; i < r->nwarnings; i++) free(r->warnings[i]);
    free(r->warnings);
    free(r->rows);
    free(r->ranked);
    free(r);
}

const fm_plan_row *fm_plan_result_row(const fm_plan_result *r, const char *gpu_name) {
    for (int i = 0; i < r->nrows; i++)
        if (!strcasecmp(r->rows[i].gpu->name, gpu_name)) return &r->rows[i];
    return NULL;
}

/* The time and cost formulas with numbers, for one row (plan_render.c): the
 * same functions that computed the row, asked to write out their terms. */
char *plan_explain_time(const fm_plan_result *r, const fm_plan_row *row);
char *plan_explain_time(const fm_plan_result *r, const fm_plan_row *row) {
    plan_sb sb = {0};
    const fm_plan_model *m = &r->model;
    const fm_plan_job *job = &r->job;
    plan_sb_printf(&sb, "Compute:\n");
    plan_flops_per_token(m, job, &sb);
    if (row && row->gpus > 0 && row->peak_tflops > 0) {
        const fm_plan_gpu *g = row->gpu;
        fm_plan_row tmp = *row;
        plan_sb_printf(&sb, "Time on %d x %s (dense %s peak %.4g TFLOP/s, MFU %.0f%%: %s):\n", row->gpus, g->name,
                       fm_plan_precision_name(job->precision), row->peak_tflops, row->mfu * 100,
                       job->mfu > 0 ? "given with --mfu" : g->mfu_source);
        if (plan_is_training(job->task)) {
            plan_time_training(m, job, r->flops_per_token, &tmp, &sb);
            if (row->run_s >= 0)
                plan_sb_printf(&sb, "  run = %s%.4g %s / %.4g per s = %.4g s = %.2f h\n",
                               r->tokens_defaulted ? "20 x params (Chinchilla, assumed) = " : "", job->tokens,
                               m->arch == FM_PLAN_ARCH_CNN ? "images" : "tokens", row->tokens_per_s, row->run_s,
                               row->run_s / 3600);
        } else if (m->arch == FM_PLAN_ARCH_GPT || m->arch == FM_PLAN_ARCH_LLAMA) {
            tmp.gpus = row->gpus;
            plan_time_serving(m, job, &tmp, &sb);
            if (row->run_s >= 0) plan_sb_printf(&sb, "  run = %.4g s = %.2f h\n", row->run_s, row->run_s / 3600);
        } else {
            plan_sb_printf(&sb, "  throughput (compute-bound) = GPUs x peak x MFU / FLOPs per sample = %.4g samples/s\n",
                           row->tokens_per_s);
        }
        for (int k = 0; k < FM_PLAN_PRICING_COUNT; k++) {
            if (g->price[k].usd_per_hour < 0) {
                plan_sb_printf(&sb, "  cost %s: unpriced in the database (%s)\n", fm_plan_pricing_name(k), g->price[k].source);
                continue;
            }
            if (row->cost[k] >= 0)
                plan_sb_printf(&sb, "  cost %s = %.4g h x %d GPUs x $%.3f/h = $%.2f",
                               fm_plan_pricing_name(k), row->run_s / 3600, row->gpus, g->price[k].usd_per_hour, row->cost[k]);
            else
                plan_sb_printf(&sb, "  cost %s = %d GPUs x $%.3f/h", fm_plan_pricing_name(k), row->gpus, g->price[k].usd_per_hour);
            plan_sb_printf(&sb, "; per 1M tokens = $/h / (tokens/s x 3600) x 1e6 = $%.4g  [%s; %s]\n", row->cost_per_mtok[k],
                           g->price[k].date, g->price[k].source);
        }
    }
    return plan_sb_take(&sb);
}
