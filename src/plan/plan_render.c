/* Turning a plan into text for people, JSON for programs, and --explain's
 * formulas with their numbers. Rendering only: nothing here computes a figure
 * that plan_memory.c or plan_compute.c did not. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "plan/plan_internal.h"

char *plan_explain_time(const fm_plan_result *r, const fm_plan_row *row);

static const char *arch_name(fm_plan_arch a) {
    switch (a) {
    case FM_PLAN_ARCH_GPT: return "gpt";
    case FM_PLAN_ARCH_LLAMA: return "llama";
    case FM_PLAN_ARCH_BERT: return "bert";
    case FM_PLAN_ARCH_CNN: return "cnn";
    }
    return "?";
}

static void fmt_time(double s, char *out, size_t cap) {
    if (s < 0) snprintf(out, cap, "-");
    else if (s < 1) snprintf(out, cap, "%.1f ms", s * 1e3);
    else if (s < 120) snprintf(out, cap, "%.1f s", s);
    else if (s < 7200) snprintf(out, cap, "%.1f min", s / 60);
    else if (s < 3 * 86400) snprintf(out, cap, "%.1f h", s / 3600);
    else snprintf(out, cap, "%.1f d", s / 86400);
}

static void fmt_money(double usd, char *out, size_t cap) {
    if (usd < 0) snprintf(out, cap, "-");
    else if (usd < 10) snprintf(out, cap, "$%.2f", usd);
    else if (usd < 1e5) snprintf(out, cap, "$%.0f", usd);
    else snprintf(out, cap, "$%.3gM", usd / 1e6);
}

static void fmt_rate(double v, char *out, size_t cap) {
    if (v < 0) snprintf(out, cap, "-");
    else if (v < 100) snprintf(out, cap, "%.1f", v);
    else if (v < 1e6) snprintf(out, cap, "%.0f", v);
    else snprintf(out, cap, "%.3gM", v / 1e6);
}

static const char *rate_unit(const fm_plan_result *r) {
    if (r->model.arch == FM_PLAN_ARCH_CNN) return "img/s";
    if (r->job.task == FM_PLAN_INFERENCE && r->model.arch == FM_PLAN_ARCH_BERT) return "seq/s";
    return "tok/s";
}

static void describe_model(plan_sb *sb, const fm_plan_model *m) {
    plan_sb_printf(sb, "%s: %.4g B parameters (%lld)", m->name, (double)m->params / 1e9, (long long)m->params);
    if (m->arch == FM_PLAN_ARCH_CNN) {
        plan_sb_printf(sb, ", CNN, %.3g GFLOP per image\n", m->cnn_flops_per_sample / 1e9);
        return;
    }
    plan_sb_printf(sb, "\n  %s, %lld layers, hidden %lld, %lld heads (%lld KV), ffn %lld, vocab %lld, context %lld; dims: %s\n",
                   arch_name(m->arch), (long long)m->layers, (long long)m->hidden, (long long)m->heads,
                   (long long)m->kv_heads, (long long)m->ffn, (long long)m->vocab, (long long)m->max_seq, m->dims_source);
}

static void describe_job(plan_sb *sb, const fm_plan_result *r) {
    const fm_plan_job *j = &r->job;
    plan_sb_printf(sb, "job: %s, %s, batch %lld", fm_plan_task_name(j->task), fm_plan_precision_name(j->precision),
                   (long long)j->batch);
    if (r->model.arch != FM_PLAN_ARCH_CNN) plan_sb_printf(sb, ", seq %lld", (long long)j->seq);
    if (plan_is_training(j->task)) {
        plan_sb_printf(sb, ", %s, checkpointing %s, ZeRO-%d", fm_plan_optimizer_name(j->optimizer),
                       fm_plan_ckpt_name(j->checkpointing), j->zero);
        if (j->task == FM_PLAN_LORA || j->task == FM_PLAN_QLORA) plan_sb_printf(sb, ", LoRA rank %d", j->lora_rank);
        if (!j->master_weights && j->precision != FM_PLAN_FP32) plan_sb_printf(sb, ", no fp32 master weights");
        if (j->optimizer_in_backward) plan_sb_printf(sb, ", optimizer in backward");
        if (j->offload_optimizer) plan_sb_printf(sb, ", optimizer offloaded to CPU");
        if (j->chunked_loss) plan_sb_printf(sb, ", chunked loss");
        if (j->fused_loss) plan_sb_printf(sb, ", fused loss");
        if (j->no_dropout) plan_sb_printf(sb, ", no dropout");
    }
    plan_sb_printf(sb, ", tensor-parallel %d", j->tensor_parallel);
    if (j->pipeline_parallel > 1) {
        plan_sb_printf(sb, ", pipeline %d stages x %d micro-batches", j->pipeline_parallel, plan_micro_batches(j));
        if (j->virtual_stages > 1) plan_sb_printf(sb, " (interleaved, %d virtual stages)", j->virtual_stages);
    }
    plan_sb_printf(sb, ", GPUs %s", j->gpus > 0 ? "" : "as needed");
    if (j->gpus > 0) plan_sb_printf(sb, "%d", j->gpus);
    if (j->requests_per_second > 0)
        plan_sb_printf(sb, ", serving %.4g req/s x %lld output tokens", j->requests_per_second, (long long)j->output_tokens);
    else if (j->tokens > 0)
        plan_sb_printf(sb, ", %.4g %s%s", j->tokens, r->model.arch == FM_PLAN_ARCH_CNN ? "images" : "tokens",
                       r->tokens_defaulted ? " (20 x params, Chinchilla: give --tokens)" : "");
    plan_sb_printf(sb, "\n");
}

static void memory_block(plan_sb *sb, const fm_plan_result *r) {
    const fm_plan_memory *m = &r->mem;
    plan_sb_printf(sb, "Memory per GPU (%d GPU%s%s):\n", r->requested_gpus, r->requested_gpus > 1 ? "s" : "",
                   r->job.gpus == 0 && r->requested_gpus > r->job.tensor_parallel ? ", the count the recommendation needs" : "");
    struct { const char *n; double v; } rows[] = {
        {"weights", m->weights}, {"gradients", m->gradients}, {"optimizer state", m->optimizer},
        {"activations", m->activations}, {"KV cache", m->kv_cache}, {"logits", m->logits},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        plan_sb_printf(sb, "  %-28s %9.2f GiB\n", rows[i].n, rows[i].v / FM_GIB);
    plan_sb_printf(sb, "  %-28s %9.2f GiB\n", "= allocated", m->allocated / FM_GIB);
    char hl[64];
    snprintf(hl, sizeof hl, "allocator headroom (%.0f%%)", r->job.headroom * 100);
    plan_sb_printf(sb, "  %-28s %9.2f GiB\n", hl, m->headroom / FM_GIB);
    plan_sb_printf(sb, "  %-28s %9.2f GiB\n", "framework/CUDA context", m->context / FM_GIB);
    plan_sb_printf(sb, "  %-28s %9.2f GiB\n", "= total", m->total / FM_GIB);
    if (m->cpu_offload > 0) plan_sb_printf(sb, "  (+ %.2f GiB of optimizer state in CPU memory)\n", m->cpu_offload / FM_GIB);
}

static void assumptions(plan_sb *sb, const fm_plan_result *r) {
    const fm_plan_job *j = &r->job;
    const char *peak = j->precision == FM_PLAN_FP32 ? "fp32" : j->precision == FM_PLAN_FP8 ? "fp8 tensor" : "16-bit tensor";
    if (j->mfu > 0) plan_sb_printf(sb, "Assumptions: MFU %.0f%% of the dense %s peak (--mfu)", j->mfu * 100, peak);
    else plan_sb_printf(sb, "Assumptions: each GPU's achievable MFU of the dense %s peak from the database (its source: "
                            "--explain)", peak);
    if (j->task == FM_PLAN_INFERENCE && (r->model.arch == FM_PLAN_ARCH_GPT || r->model.arch == FM_PLAN_ARCH_LLAMA))
        plan_sb_printf(sb, "; decoding reaches %.0f%% of memory bandwidth; KV cache in %s", j->decode_efficiency * 100,
                       j->kv_cache_8bit == 1 ? "fp8" : j->kv_cache_8bit == 2 ? "int8" : "16 bits");
    if (j->task == FM_PLAN_INFERENCE && j->kv_read_per_query_head)
        plan_sb_printf(sb, "; decode reads each KV head once per query head");
    plan_sb_printf(sb, "; flash attention %s; prices dated %s.\n", j->flash_attention ? "on" : "off",
                   r->nrows ? r->rows[0].gpu->price[0].date : "-");
}

static void reason(plan_sb *sb, const fm_plan_result *r, const fm_plan_row *row) {
    char a[32], b[32], c[32];
    int pr = r->job.pricing;
    fmt_money(row->usd_per_hour, a, sizeof a);
    if (row->usd_per_hour >= 0) plan_sb_printf(sb, "%d x %s: %s/h %s", row->gpus, row->gpu->name, a, fm_plan_pricing_name(pr));
    else plan_sb_printf(sb, "%d x %s: no %s price in the database", row->gpus, row->gpu->name, fm_plan_pricing_name(pr));
    if (row->cost[pr] >= 0) {
        fmt_money(row->cost[pr], b, sizeof b);
        fmt_time(row->run_s, c, sizeof c);
        plan_sb_printf(sb, r->job.requests_per_second > 0 ? ", %s per hour of serving" : ", %s for the run (%s)", b, c);
    }
    if (row->cost_per_mtok[pr] >= 0)
        plan_sb_printf(sb, ", $%.2f per 1M %s", row->cost_per_mtok[pr],
                       r->model.arch == FM_PLAN_ARCH_CNN ? "images"
                       : r->job.task == FM_PLAN_INFERENCE && r->model.arch == FM_PLAN_ARCH_BERT ? "sequences" : "tokens");
    fmt_rate(row->tokens_per_s, a, sizeof a);
    plan_sb_printf(sb, ", %s %s", a, rate_unit(r));
    if (r->job.requests_per_second > 0 && row->decode_batch > 0) {
        fmt_time(row->ttft_s, b, sizeof b);
        plan_sb_printf(sb, ", %d replica%s decoding %lld sequences each (KV room for %lld), first token in %s",
                       row->replicas, row->replicas > 1 ? "s" : "", (long long)row->decode_batch,
                       (long long)row->kv_capacity_seqs, b);
    }
    plan_sb_printf(sb, ", %.1f of %.1f GiB used\n", row->mem.total / FM_GIB, row->gpu->memory_gib);
}

char *fm_plan_render_text(const fm_plan_result *r) {
    plan_sb sb = {0};
    plan_sb_printf(&sb, "fathom plan: ");
    describe_model(&sb, &r->model);
    describe_job(&sb, r);
    plan_sb_printf(&sb, "\n");
    memory_block(&sb, r);
    plan_sb_printf(&sb, "\n");
    assumptions(&sb, r);
    int pr = r->job.pricing;
    int have_run = 0;
    for (int i = 0; i < r->nrows; i++) have_run |= r->rows[i].run_s >= 0;
    plan_sb_printf(&sb, "\n%-18s %5s %-4s %4s %8s %9s %9s %9s  %-26s\n", "GPU", "GiB", "fits", "min", "GiB/GPU",
                   r->job.task == FM_PLAN_INFERENCE ? "step" : "step", "run", rate_unit(r),
                   have_run ? (r->job.requests_per_second > 0 ? "$/hour od / spot / reserved" : "$ run od / spot / reserved")
                            : "$/1M tok od / spot / reserved");
    for (int i = 0; i < r->nrows; i++) {
        const fm_plan_row *row = &r->rows[i];
        char fits[16], minb[16], st[32], rt[32], rate[32], c[3][32];
        if (r->job.gpus > 0) snprintf(fits, sizeof fits, "%s", row->fits ? "yes" : "no");
        else snprintf(fits, sizeof fits, "%s", row->min_gpus ? "yes" : "no");
        if (row->min_gpus) snprintf(minb, sizeof minb, "%d", row->min_gpus);
        else if (row->min_gpus_zero3) snprintf(minb, sizeof minb, "z3:%d", row->min_gpus_zero3);
        else snprintf(minb, sizeof minb, "-");
        fmt_time(row->step_s, st, sizeof st);
        fmt_time(row->run_s, rt, sizeof rt);
        fmt_rate(row->tokens_per_s, rate, sizeof rate);
        for (int k = 0; k < 3; k++) fmt_money(have_run ? row->cost[k] : row->cost_per_mtok[k], c[k], sizeof c[k]);
        plan_sb_printf(&sb, "%-18s %5.0f %-4s %4s %8.2f %9s %9s %9s  %s / %s / %s\n", row->gpu->name, row->gpu->memory_gib,
                       fits, minb, row->mem.total / FM_GIB, st, rt, rate, c[0], c[1], c[2]);
    }
    plan_sb_printf(&sb, "(min: fewest GPUs that fit with these settings; z3:N = only with --zero 3; GiB/GPU at the count "
                        "the time and cost assume)\n");

    plan_sb_printf(&sb, "\nRecommendation (%s prices):\n", fm_plan_pricing_name(pr));
    if (r->cheapest >= 0) {
        plan_sb_printf(&sb, "  cheapest that fits: ");
        reason(&sb, r, &r->rows[r->cheapest]);
    }
    double budget = r->job.budget_usd;
    if (r->fastest >= 0) {
        plan_sb_printf(&sb, "  fastest%s: ", budget > 0 ? " within budget" : "");
        reason(&sb, r, &r->rows[r->fastest]);
    } else if (budget > 0 && r->nranked > 0) {
        /* Say so rather than leave the line out: the budget excluded every option. */
        char b[32];
        fmt_money(budget, b, sizeof b);
        plan_sb_printf(&sb, "  fastest within budget: none; all %d priced option%s that fit cost more than %s %s\n",
                       r->nranked, r->nranked > 1 ? "s" : "", b,
                       r->rows[r->ranked[0]].cost[pr] >= 0 ? "for the run" : "per 1M tokens");
    }
    if (r->cheapest < 0 && r->fastest < 0 && r->nranked == 0)
        plan_sb_printf(&sb, "  nothing %s: reduce batch or seq, quantize, checkpoint activations, or shard "
                            "(--zero 3, --tensor-parallel)%s\n", r->nfit ? "priced fits" : "fits",
                       r->nfit ? "; or price the unpriced cards that fit in the database" : "");
    if (r->nranked > 1) {
        /* Every option is listed: a ranking that stops at some count hides the rest. */
        plan_sb_printf(&sb, "  ranked by cost (all %d that fit and have %s prices):\n", r->nranked,
                       fm_plan_pricing_name(pr));
        for (int i = 0; i < r->nranked; i++) {
            const fm_plan_row *row = &r->rows[r->ranked[i]];
            double key = row->cost[pr] >= 0 ? row->cost[pr] : row->cost_per_mtok[pr];
            plan_sb_printf(&sb, "    %d. %s", i + 1, budget > 0 && key > budget ? "[over budget] " : "");
            reason(&sb, r, row);
        }
    }
    if (r->nwarnings) {
        plan_sb_printf(&sb, "\nWarnings:\n");
        for (int i = 0; i < r->nwarnings; i++) plan_sb_printf(&sb, "  - %s\n", r->warnings[i]);
    }
    return plan_sb_take(&sb);
}

static json_t *num_or_null(double v) { return v >= 0 ? json_real(v) : json_null(); }

static json_t *memory_json(const fm_plan_memory *m) {
    json_t *o = json_object();
    json_object_set_new(o, "weights_bytes", json_real(m->weights));
    json_object_set_new(o, "gradients_bytes", json_real(m->gradients));
    json_object_set_new(o, "optimizer_bytes", json_real(m->optimizer));
    json_object_set_new(o, "activations_bytes", json_real(m->activations));
    json_object_set_new(o, "kv_cache_bytes", json_real(m->kv_cache));
    json_object_set_new(o, "logits_bytes", json_real(m->logits));
    json_object_set_new(o, "allocated_bytes", json_real(m->allocated));
    json_object_set_new(o, "headroom_bytes", json_real(m->headroom));
    json_object_set_new(o, "reserved_bytes", json_real(m->reserved));
    json_object_set_new(o, "context_bytes", json_real(m->context));
    json_object_set_new(o, "total_bytes", json_real(m->total));
    json_object_set_new(o, "total_gib", json_real(m->total / FM_GIB));
    json_object_set_new(o, "cpu_offload_bytes", json_real(m->cpu_offload));
    return o;
}

static const char *const pk[] = {"on_demand", "spot", "reserved"};

/* One GPU's row: fit, memory, every time term, serving figures, prices and costs. */
static json_t *row_json(const fm_plan_result *r, const fm_plan_row *row) {
    json_t *o = json_object();
    json_object_set_new(o, "gpu", json_string(row->gpu->name));
    json_object_set_new(o, "memory_gib", json_real(row->gpu->memory_gib));
    json_object_set_new(o, "fits", json_boolean(r->job.gpus > 0 ? row->fits : row->min_gpus > 0));
    json_object_set_new(o, "min_gpus", row->min_gpus ? json_integer(row->min_gpus) : json_null());
    json_object_set_new(o, "min_gpus_with_zero3", row->min_gpus_zero3 ? json_integer(row->min_gpus_zero3) : json_null());
    json_object_set_new(o, "gpus", row->gpus ? json_integer(row->gpus) : json_null());
    json_object_set_new(o, "memory_per_gpu", memory_json(&row->mem));
    json_object_set_new(o, "peak_tflops", num_or_null(row->peak_tflops));
    json_object_set_new(o, "mfu", json_real(row->mfu));
    json_object_set_new(o, "mfu_source", json_string(r->job.mfu > 0 ? "--mfu" : row->gpu->mfu_source));
    json_object_set_new(o, "step_seconds", num_or_null(row->step_s));
    json_object_set_new(o, "compute_seconds", num_or_null(row->compute_s));
    json_object_set_new(o, "comm_seconds", num_or_null(row->comm_s));
    if (plan_is_training(r->job.task) && row->step_s >= 0) {
        json_t *terms = json_object();
        json_object_set_new(terms, "pipeline_bubble", json_real(row->pp_bubble_s));
        json_object_set_new(terms, "overhead", json_real(row->overhead_s));
        json_object_set_new(terms, "tensor_parallel_comm", json_real(row->tp_comm_s));
        json_object_set_new(terms, "expert_all_to_all", json_real(row->moe_comm_s));
        json_object_set_new(terms, "data_parallel_all_reduce", json_real(row->dp_comm_s));
        json_object_set_new(o, "step_terms_seconds", terms);
    }
    if (r->job.task == FM_PLAN_INFERENCE && row->decode_batch > 0) {
        json_t *sv = json_object();
        json_object_set_new(sv, "kv_capacity_sequences", json_integer(row->kv_capacity_seqs));
        json_object_set_new(sv, "decode_batch", json_integer(row->decode_batch));
        json_object_set_new(sv, "prefill_seconds", json_real(row->prefill_s));
        json_object_set_new(sv, "time_to_first_token_seconds", json_real(row->ttft_s));
        json_object_set_new(o, "serving", sv);
    }
    json_object_set_new(o, "run_seconds", num_or_null(row->run_s));
    json_object_set_new(o, "throughput", num_or_null(row->tokens_per_s));
    json_object_set_new(o, "throughput_unit", json_string(rate_unit(r)));
    if (row->replicas) json_object_set_new(o, "replicas", json_integer(row->replicas));
    if (row->too_many) json_object_set_new(o, "more_gpus_than_exist", json_true());
    json_t *cost = json_object(), *cpm = json_object(), *price = json_object();
    for (int k = 0; k < 3; k++) {
        json_object_set_new(cost, pk[k], num_or_null(row->cost[k]));
        json_object_set_new(cpm, pk[k], num_or_null(row->cost_per_mtok[k]));
        json_object_set_new(price, pk[k], num_or_null(row->gpu->price[k].usd_per_hour));
    }
    json_object_set_new(o, "priced", json_boolean(row->gpu->price[r->job.pricing].usd_per_hour >= 0));
    json_object_set_new(o, "usd_per_gpu_hour", price);
    json_object_set_new(o, "cost_usd", cost);
    json_object_set_new(o, "cost_per_million_tokens_usd", cpm);
    return o;
}

char *fm_plan_render_json(const fm_plan_result *r) {
    const fm_plan_model *m = &r->model;
    const fm_plan_job *j = &r->job;
    json_t *root = json_object();
    json_t *model = json_object();
    json_object_set_new(model, "name", json_string(m->name));
    json_object_set_new(model, "arch", json_string(arch_name(m->arch)));
    json_object_set_new(model, "params", json_integer(m->params));
    json_object_set_new(model, "embedding_params", json_integer(m->embed_params));
    json_object_set_new(model, "layers", json_integer(m->layers));
    json_object_set_new(model, "hidden", json_integer(m->hidden));
    json_object_set_new(model, "heads", json_integer(m->heads));
    json_object_set_new(model, "kv_heads", json_integer(m->kv_heads));
    json_object_set_new(model, "ffn", json_integer(m->ffn));
    json_object_set_new(model, "vocab", json_integer(m->vocab));
    json_object_set_new(model, "context", json_integer(m->max_seq));
    json_object_set_new(model, "dims_source", json_string(m->dims_source));
    json_object_set_new(root, "model", model);

    json_t *job = json_object();
    json_object_set_new(job, "task", json_string(fm_plan_task_name(j->task)));
    json_object_set_new(job, "precision", json_string(fm_plan_precision_name(j->precision)));
    json_object_set_new(job, "batch", json_integer(j->batch));
    json_object_set_new(job, "seq", json_integer(j->seq));
    json_object_set_new(job, "optimizer", json_string(fm_plan_optimizer_name(j->optimizer)));
    json_object_set_new(job, "checkpointing", json_string(fm_plan_ckpt_name(j->checkpointing)));
    json_object_set_new(job, "zero", json_integer(j->zero));
    json_object_set_new(job, "tensor_parallel", json_integer(j->tensor_parallel));
    json_object_set_new(job, "pipeline_parallel", json_integer(j->pipeline_parallel));
    json_object_set_new(job, "micro_batches", json_integer(plan_micro_batches(j)));
    json_object_set_new(job, "virtual_stages", json_integer(j->virtual_stages));
    json_object_set_new(job, "gpus", j->gpus > 0 ? json_integer(j->gpus) : json_null());
    json_object_set_new(job, "tokens", j->tokens > 0 ? json_real(j->tokens) : json_null());
    json_object_set_new(job, "tokens_assumed_chinchilla", json_boolean(r->tokens_defaulted));
    json_object_set_new(job, "requests_per_second", json_real(j->requests_per_second));
    json_object_set_new(job, "output_tokens", json_integer(j->output_tokens));
    json_object_set_new(job, "pricing", json_string(fm_plan_pricing_name(j->pricing)));
    json_object_set_new(job, "lora_rank", json_integer(j->lora_rank));
    json_object_set_new(job, "flash_attention", json_boolean(j->flash_attention));
    json_object_set_new(job, "master_weights", json_boolean(j->master_weights));
    json_object_set_new(job, "optimizer_in_backward", json_boolean(j->optimizer_in_backward));
    json_object_set_new(job, "offload_optimizer", json_boolean(j->offload_optimizer));
    json_object_set_new(job, "chunked_loss", json_boolean(j->chunked_loss));
    json_object_set_new(job, "fused_loss", json_boolean(j->fused_loss));
    json_object_set_new(job, "dropout", json_boolean(!j->no_dropout));
    json_object_set_new(job, "decode_kv_reads", json_string(j->kv_read_per_query_head ? "per-query-head" : "grouped"));
    json_object_set_new(job, "kv_cache_dtype", json_string(j->kv_cache_8bit == 1 ? "fp8" : j->kv_cache_8bit == 2 ? "int8" : "auto"));
    json_object_set_new(root, "job", job);

    json_t *as = json_object();
    json_object_set_new(as, "mfu", j->mfu > 0 ? json_real(j->mfu) : json_string("per GPU (gpus[].mfu)"));
    json_object_set_new(as, "decode_efficiency", json_real(j->decode_efficiency));
    json_object_set_new(as, "context_gib", json_real(j->context_gib));
    json_object_set_new(as, "allocator_headroom", json_real(j->headroom));
    json_object_set_new(as, "flops_per_token", json_real(r->flops_per_token));
    json_object_set_new(as, "total_flops", r->total_flops > 0 ? json_real(r->total_flops) : json_null());
    json_object_set_new(root, "assumptions", as);

    json_t *mem = memory_json(&r->mem);
    json_object_set_new(mem, "gpus", json_integer(r->requested_gpus));
    json_object_set_new(root, "memory_per_gpu", mem);

    json_t *rows = json_array();
    for (int i = 0; i < r->nrows; i++) json_array_append_new(rows, row_json(r, &r->rows[i]));
    json_object_set_new(root, "gpus", rows);

    json_t *rec = json_object();
    json_object_set_new(rec, "pricing", json_string(fm_plan_pricing_name(j->pricing)));
    json_object_set_new(rec, "cheapest", r->cheapest >= 0 ? json_string(r->rows[r->cheapest].gpu->name) : json_null());
    json_object_set_new(rec, "cheapest_gpus", r->cheapest >= 0 ? json_integer(r->rows[r->cheapest].gpus) : json_null());
    json_object_set_new(rec, "fastest", r->fastest >= 0 ? json_string(r->rows[r->fastest].gpu->name) : json_null());
    json_object_set_new(rec, "fastest_gpus", r->fastest >= 0 ? json_integer(r->rows[r->fastest].gpus) : json_null());
    json_t *ranked = json_array();
    for (int i = 0; i < r->nranked; i++) json_array_append_new(ranked, json_string(r->rows[r->ranked[i]].gpu->name));
    json_object_set_new(rec, "ranked_by_cost", ranked);
    json_object_set_new(root, "recommendation", rec);

    json_t *w = json_array();
    for (int i = 0; i < r->nwarnings; i++) json_array_append_new(w, json_string(r->warnings[i]));
    json_object_set_new(root, "warnings", w);

    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(root);
    if (!text) {
        fm_set_error(FM_ERR_OOM, "out of memory writing JSON");
        return NULL;
    }
    /* json_dumps memory comes from jansson's allocator (malloc by default);
     * copy so that callers can always free() what a renderer returns. */
    char *out = strdup(text);
    free(text);
    return out;
}

char *fm_plan_render_explain(const fm_plan_result *r) {
    plan_sb sb = {0};
    plan_sb_printf(&sb, "fathom plan --explain: ");
    describe_model(&sb, &r->model);
    describe_job(&sb, r);
    const fm_plan_model *m = &r->model;
    if (m->arch != FM_PLAN_ARCH_CNN) {
        double L = (double)m->layers, h = (double)m->hidden, V = (double)m->vocab, f = (double)m->ffn;
        double kv = (double)m->kv_heads * h / (double)m->heads;
        plan_sb_printf(&sb, "\nParameters (%s):\n", m->dims_source);
        if (m->arch == FM_PLAN_ARCH_LLAMA)
            plan_sb_printf(&sb, "  per layer = 2h^2 (q, o) + 2*h*kv_dim (k, v) + 3*h*ffn (SwiGLU) + 2h (norms)\n"
                                "            = 2 x %.0f^2 + 2 x %.0f x %.0f + 3 x %.0f x %.0f + 2 x %.0f = %.6g\n",
                           h, h, kv, h, f, h, 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h);
        else
            plan_sb_printf(&sb, "  per layer = h*(h + 2kv_dim) + h^2 (attention) + 2*h*ffn (MLP) + biases and norms\n");
        plan_sb_printf(&sb, "  embeddings + head + final norm = %lld (vocab %.0f x hidden %.0f%s)\n", (long long)m->embed_params,
                       V, h, m->tied_embeddings ? ", head tied" : ", head untied");
        plan_sb_printf(&sb, "  total N = %lld\n", (long long)m->params);
        (void)L;
    }
    plan_sb_printf(&sb, "\n");
    char *mem = NULL;
    if (fm_plan_memory_at(&r->model, &r->job, r->requested_gpus, &(fm_plan_memory){0}, &mem) == FM_OK && mem) {
        plan_sb_printf(&sb, "%s", mem);
    }
    free(mem);
    const fm_plan_row *row = r->cheapest >= 0 ? &r->rows[r->cheapest] : r->fastest >= 0 ? &r->rows[r->fastest] : NULL;
    if (!row)
        for (int i = 0; i < r->nrows && !row; i++)
            if (r->rows[i].gpus > 0) row = &r->rows[i];
    plan_sb_printf(&sb, "\n");
    if (row && row->gpus != r->requested_gpus) {
        char *mem2 = NULL;
        if (fm_plan_memory_at(&r->model, &r->job, row->gpus, &(fm_plan_memory){0}, &mem2) == FM_OK && mem2)
            plan_sb_printf(&sb, "At the %d GPUs the %s row needs:\n%s\n", row->gpus, row->gpu->name, mem2);
        free(mem2);
    }
    char *t = plan_explain_time(r, row);
    if (t) plan_sb_printf(&sb, "%s", t);
    free(t);
    plan_sb_printf(&sb, "\nFits: total per GPU <= the card's memory (GiB). Minimum GPUs: the smallest multiple of "
                        "tensor-parallel %d whose per-GPU total fits (ZeRO divides the sharded state by the "
                        "data-parallel count).\n", r->job.tensor_parallel);
    plan_sb_printf(&sb, "Ranking: fitting GPUs that have a price (%s), by run cost (or by cost per 1M tokens when the "
                        "run's length is unknown); fastest = highest throughput%s.\n",
                   fm_plan_pricing_name(r->job.pricing), r->job.budget_usd > 0 ? " within the budget" : "");
    return plan_sb_take(&sb);
}
