/* Per-GPU memory of a job: weights, gradients, optimizer state, activations
 * (Korthikanti et al. 2022, by checkpointing mode), KV cache (with the model's
 * kv_heads, so grouped-query attention is not overcounted), logits, allocator
 * headroom and CUDA context. Also the job's defaults and its sanity checks.
 *
 * Each term is computed once, in one place, and the same code writes the
 * formula with its numbers into `explain`: what --explain prints cannot drift
 * from what the planner computed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_internal.h"

void fm_plan_job_defaults(fm_plan_job *job) {
    memset(job, 0, sizeof *job);
    job->task = FM_PLAN_INFERENCE;
    job->precision = FM_PLAN_BF16;
    job->batch = 1;
    job->optimizer = FM_PLAN_ADAMW;
    job->checkpointing = FM_PLAN_CKPT_NONE;
    job->tensor_parallel = 1;
    job->pipeline_parallel = 1;
    job->virtual_stages = 1;
    job->expert_parallel = 1;
    job->pricing = FM_PLAN_ON_DEMAND;
    job->lora_rank = 16;
    job->flash_attention = 1;
    job->master_weights = 1;
    job->decode_efficiency = 0.8;
    job->context_gib = 1.0;
    job->headroom = 0.10;
}

int plan_is_training(fm_plan_task t) { return t != FM_PLAN_INFERENCE; }

double plan_weight_bytes(fm_plan_precision p) {
    switch (p) {
    case FM_PLAN_FP32: return 4;
    case FM_PLAN_BF16: case FM_PLAN_FP16: return 2;
    case FM_PLAN_INT8: return 34.0 / 32.0; /* Q8_0: fp16 scale per 32 int8 weights */
    case FM_PLAN_INT4: return 18.0 / 32.0; /* Q4_0: fp16 scale per 32 4-bit weights */
    case FM_PLAN_FP8: return 1;             /* per-tensor scales: negligible */
    }
    return 2;
}

double plan_act_bytes(fm_plan_precision p) { return p == FM_PLAN_FP32 ? 4 : 2; }
double plan_kv_bytes(const fm_plan_job *job) { return job->kv_cache_8bit ? 1 : plan_act_bytes(job->precision); }

int64_t plan_resolved_seq(const fm_plan_model *m, const fm_plan_job *job) {
    if (job->seq > 0) return job->seq;
    if (m->arch == FM_PLAN_ARCH_CNN) return 1;
    return m->max_seq > 0 && m->max_seq < 2048 ? m->max_seq : 2048;
}

double plan_resolved_mfu(const fm_plan_job *job) {
    if (job->mfu > 0) return job->mfu;
    /* Without a GPU (the summary line): FACTS' 30-50% for large multi-GPU runs.
     * Rows use the GPU's own figure (plan_gpu_mfu). */
    if (job->task == FM_PLAN_QLORA) return 0.30;
    return 0.40;
}

double plan_gpu_mfu(const fm_plan_gpu *g, const fm_plan_job *job) {
    if (job->mfu > 0) return job->mfu;
    double v = job->precision == FM_PLAN_FP32 ? g->mfu_fp32 : job->precision == FM_PLAN_FP8 ? g->mfu_fp8 : g->mfu_bf16;
    if (!(v > 0)) v = g->mfu_bf16;
    /* QLoRA dequantizes its 4-bit base for every matmul: three quarters of the
     * 16-bit figure (the old flat 0.30 against 0.40). */
    if (job->task == FM_PLAN_QLORA) v *= 0.75;
    return v;
}

int plan_micro_batches(const fm_plan_job *job) {
    if (job->micro_batches > 0) return job->micro_batches;
    return job->pipeline_parallel > 1 ? 4 * job->pipeline_parallel : 1;
}

double plan_lora_params(const fm_plan_model *m, int rank) {
    if (m->arch == FM_PLAN_ARCH_CNN || m->heads <= 0) return 0;
    double h = (double)m->hidden, f = (double)m->ffn;
    double kv = (double)m->kv_heads * plan_head_dim(m);
    /* Adapters A (r x in) and B (out x r) on every linear of a block. */
    double per = (h + h) + 2 * (h + kv) + (h + h);          /* q, k, v, o */
    if (m->arch == FM_PLAN_ARCH_LLAMA) per += 2 * (h + f) + (f + h); /* gate, up, down */
    else per += (h + f) + (f + h);                             /* fc1, fc2 */
    return (double)rank * per * (double)m->layers;
}

fm_status fm_plan_job_check(const fm_plan_model *m, const fm_plan_job *job) {
    if ((unsigned)job->task > FM_PLAN_QLORA) return fm_set_error(FM_ERR_INVALID, "unknown task");
    if ((unsigned)job->precision > FM_PLAN_FP8) return fm_set_error(FM_ERR_INVALID, "unknown precision");
    if (job->pipeline_parallel < 1 || job->pipeline_parallel > 1024)
        return fm_set_error(FM_ERR_INVALID, "--pipeline-parallel %d is out of range (1..1024)", job->pipeline_parallel);
    if (job->virtual_stages < 1 || job->virtual_stages > 1024)
        return fm_set_error(FM_ERR_INVALID, "--virtual-stages %d is out of range (1..1024)", job->virtual_stages);
    if (job->virtual_stages > 1 && (job->pipeline_parallel < 2 || m->layers < (int64_t)job->pipeline_parallel * job->virtual_stages))
        return fm_set_error(FM_ERR_INVALID, "--virtual-stages %d interleaves a pipeline: it needs --pipeline-parallel N (N >= 2) "
                            "and at least one layer per virtual stage (%s has %lld layers for %d x %d)", job->virtual_stages,
                            m->name, (long long)m->layers, job->pipeline_parallel, job->virtual_stages);
    if (job->micro_batches < 0 || job->micro_batches > 100000)
        return fm_set_error(FM_ERR_INVALID, "--micro-batches %d is out of range (1..100000)", job->micro_batches);
    if (job->expert_parallel < 1 || job->expert_parallel > 4096)
        return fm_set_error(FM_ERR_INVALID, "--expert-parallel %d is out of range (1..4096)", job->expert_parallel);
    if (job->pipeline_parallel > 1 && (!plan_is_training(job->task) || m->layers < job->pipeline_parallel ||
                                       m->arch == FM_PLAN_ARCH_CNN))
        return fm_set_error(FM_ERR_INVALID, "--pipeline-parallel %d needs a training task and at least as many layers "
                            "(%s has %lld)", job->pipeline_parallel, m->name, (long long)m->layers);
    if (job->expert_parallel > 1 && (m->experts <= 1 || m->experts % job->expert_parallel))
        return fm_set_error(FM_ERR_INVALID, "--expert-parallel %d must divide the experts of a mixture-of-experts model "
                            "(%s has %lld)", job->expert_parallel, m->name, (long long)(m->experts > 1 ? m->experts : 0));
    if (job->sequence_parallel && job->tensor_parallel < 2)
        return fm_set_error(FM_ERR_INVALID, "--sequence-parallel splits activations across the tensor-parallel group: "
                            "add --tensor-parallel N (N >= 2)");
    if (job->precision == FM_PLAN_FP8 && (job->task == FM_PLAN_QLORA))
        return fm_set_error(FM_ERR_INVALID, "qlora keeps a 4-bit base; fp8 does not apply (use --precision bf16)");
    if (job->fused_loss && job->chunked_loss)
        return fm_set_error(FM_ERR_INVALID, "--fused-loss and --chunked-loss are two ways of computing the loss: give one");
    if (job->kv_cache_8bit && job->task != FM_PLAN_INFERENCE)
        return fm_set_error(FM_ERR_INVALID, "--kv-cache-dtype %s is for inference: training keeps no KV cache",
                            job->kv_cache_8bit == 2 ? "int8" : "fp8");
    if (job->kv_read_per_query_head && job->task != FM_PLAN_INFERENCE)
        return fm_set_error(FM_ERR_INVALID, "--decode-kv-reads per-query-head is for inference: training has no decode step");
    if (job->batch < 1 || job->batch > 1000000)
        return fm_set_error(FM_ERR_INVALID, "--batch %lld is out of range (1..1000000)", (long long)job->batch);
    if (job->seq < 0 || job->seq > 10000000)
        return fm_set_error(FM_ERR_INVALID, "--seq %lld is out of range (1..10000000)", (long long)job->seq);
    if (job->tensor_parallel < 1 || job->tensor_parallel > 1024)
        return fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d is out of range (1..1024)", job->tensor_parallel);
    if (job->gpus < 0 || job->gpus > 65536)
        return fm_set_error(FM_ERR_INVALID, "--gpus %d is out of range (1..65536)", job->gpus);
    if (job->zero < 0 || job->zero > 3) return fm_set_error(FM_ERR_INVALID, "--zero %d: stages are 0, 1, 2 and 3", job->zero);
    if (!(job->tokens >= 0) || job->tokens > 1e16)
        return fm_set_error(FM_ERR_INVALID, "--tokens %g is out of range (up to 1e16)", job->tokens);
    if (!(job->requests_per_second >= 0) || job->requests_per_second > 1e9)
        return fm_set_error(FM_ERR_INVALID, "--requests-per-second %g is out of range", job->requests_per_second);
    if (job->output_tokens < 0 || job->output_tokens > 10000000)
        return fm_set_error(FM_ERR_INVALID, "--output-tokens %lld is out of range", (long long)job->output_tokens);
    if (job->mfu < 0 || job->mfu > 1) return fm_set_error(FM_ERR_INVALID, "--mfu %g must be in (0, 1]", job->mfu);
    if (!(job->decode_efficiency > 0) || job->decode_efficiency > 1)
        return fm_set_error(FM_ERR_INVALID, "decode efficiency %g must be in (0, 1]", job->decode_efficiency);
    if (!(job->context_gib >= 0) || job->context_gib > 1024)
        return fm_set_error(FM_ERR_INVALID, "context overhead %g GiB is out of range", job->context_gib);
    if (!(job->headroom >= 0) || job->headroom > 10)
        return fm_set_error(FM_ERR_INVALID, "allocator headroom %g is out of range (0..10)", job->headroom);
    if (!(job->budget_usd >= 0)) return fm_set_error(FM_ERR_INVALID, "--budget must not be negative");

    int t = job->tensor_parallel;
    if (job->gpus > 0 && job->gpus % t)
        return fm_set_error(FM_ERR_INVALID, "--gpus %d is not a multiple of --tensor-parallel %d", job->gpus, t);
    if (job->gpus > 0 && job->gpus % (t * job->pipeline_parallel))
        return fm_set_error(FM_ERR_INVALID, "--gpus %d is not a multiple of --tensor-parallel %d x --pipeline-parallel %d",
                            job->gpus, t, job->pipeline_parallel);
    if (job->output_tokens > 0 && m->max_seq > 0 && m->arch != FM_PLAN_ARCH_CNN && job->output_tokens >= m->max_seq)
        return fm_set_error(FM_ERR_INVALID, "--output-tokens %lld is longer than %s's context of %lld tokens: no prompt "
                            "would fit", (long long)job->output_tokens, m->name, (long long)m->max_seq);
    if (t > 1) {
        if (m->arch == FM_PLAN_ARCH_CNN)
            return fm_set_error(FM_ERR_INVALID, "tensor parallelism splits attention heads; %s has none", m->name);
        if (m->heads % t)
            return fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d does not divide the %lld attention heads of %s", t,
                                (long long)m->heads, m->name);
        if (m->kv_heads % t && t % m->kv_heads)
            return fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d and the %lld KV heads of %s do not divide either way",
                                t, (long long)m->kv_heads, m->name);
    }
    if (job->task == FM_PLAN_QLORA && job->precision != FM_PLAN_BF16 && job->precision != FM_PLAN_FP16 &&
        job->precision != FM_PLAN_INT4)
        return fm_set_error(FM_ERR_INVALID, "qlora with %s is impossible: QLoRA keeps a 4-bit base and computes in bf16 "
                            "or fp16 (use --precision bf16, or --task lora for a %s base)",
                            fm_plan_precision_name(job->precision), fm_plan_precision_name(job->precision));
    if ((job->task == FM_PLAN_TRAIN || job->task == FM_PLAN_FINETUNE) &&
        (job->precision == FM_PLAN_INT8 || job->precision == FM_PLAN_INT4))
        return fm_set_error(FM_ERR_INVALID, "full-parameter %s in %s is not possible: gradients need fp32, bf16 or fp16 "
                            "weights (for a quantized base use --task qlora or --task lora)",
                            fm_plan_task_name(job->task), fm_plan_precision_name(job->precision));
    if ((job->task == FM_PLAN_LORA || job->task == FM_PLAN_QLORA)) {
        if (m->arch == FM_PLAN_ARCH_CNN)
            return fm_set_error(FM_ERR_INVALID, "LoRA planning covers transformer models, not %s", m->name);
        if (job->lora_rank < 1 || job->lora_rank > m->hidden)
            return fm_set_error(FM_ERR_INVALID, "--lora-rank %d is out of range (1..%lld, the hidden size)", job->lora_rank,
                                (long long)m->hidden);
    }
    if (job->task == FM_PLAN_INFERENCE && job->zero)
        return fm_set_error(FM_ERR_INVALID, "--zero shards training state; it does not apply to --task inference");
    if (job->requests_per_second > 0 && job->task != FM_PLAN_INFERENCE)
        return fm_set_error(FM_ERR_INVALID, "--requests-per-second plans serving; use it with --task inference");
    if (job->requests_per_second > 0 && job->output_tokens < 1)
        return fm_set_error(FM_ERR_INVALID, "--requests-per-second needs --output-tokens N (tokens generated per request)");
    if (job->requests_per_second > 0 && (m->arch == FM_PLAN_ARCH_BERT || m->arch == FM_PLAN_ARCH_CNN))
        return fm_set_error(FM_ERR_INVALID, "%s does not generate tokens; serving plans cover decoder models", m->name);
    return FM_OK;
}

/* "1.23 GiB" */
static double gib(double bytes) { return bytes / FM_GIB; }

/* Storage of frozen or inference weights: quantized formats cover the block
 * linears only; embeddings, the output head and norms stay 16-bit, as in
 * bitsandbytes, torchtune and llama.cpp's defaults. */
static double stored_weights(const fm_plan_model *m, fm_plan_precision p, plan_sb *ex, const char *what) {
    double P = (double)m->params, E = (double)m->embed_params, B = P - E;
    if (p == FM_PLAN_INT8 || p == FM_PLAN_INT4 || p == FM_PLAN_FP8) {
        double wb = plan_weight_bytes(p), v = B * wb + E * 2;
        if (ex)
            plan_sb_printf(ex, "  %s = block params x %s bytes + embedding/head params x 2 B\n"
                               "        = %.4g x %.4f + %.4g x 2 = %.3f GiB\n",
                           what, p == FM_PLAN_INT8 ? "1.0625 (Q8_0: 34 B per 32)" : p == FM_PLAN_FP8 ? "1 (fp8)" : "0.5625 (Q4_0: 18 B per 32)", B, wb,
                           E, gib(v));
        return v;
    }
    double wb = plan_weight_bytes(p), v = P * wb;
    if (ex) plan_sb_printf(ex, "  %s = params x %.0f B (%s) = %.4g x %.0f = %.3f GiB\n", what, wb,
                           fm_plan_precision_name(p), P, wb, gib(v));
    return v;
}

/* Korthikanti et al. 2022: activation bytes of one transformer layer at 16 bits,
 * s*b*h*(10 + 24/t + 5*a*s/(h*t)) with tensor-parallel degree t (34 + 5as/h at
 * t = 1). Flash attention or selective recompute drops the s^2 term. */
static double korthikanti_layer(double s, double b, double h, double a, double t, int drop_scores, int sp, int dropout) {
    /* The 10sbh not split by tensor parallelism is the two norms' inputs
     * (4), the QKV and MLP inputs (4) and the two dropout masks (2, one byte
     * per element); sequence parallelism splits it t ways too. Without
     * dropout the masks are not kept (8 instead of 10), and eager attention
     * keeps the softmax output (2as^2b, also the input of scores x V) but no
     * mask (as^2b) and no dropped copy (2as^2b): 2 instead of 5. */
    double unsplit = dropout ? 10 : 8, scores = dropout ? 5 : 2;
    double coef = (sp ? unsplit / t : unsplit) + 24 / t + (drop_scores ? 0 : scores * a * s / (h * t));
    return s * b * h * coef;
}

/* What every memory term needs, computed once by memory_at. */
typedef struct mem_ctx {
    const fm_plan_model *m;
    const fm_plan_job *job;
    int t, pp, cnn, decoder;
    double dp, s, b, L, h, a, V, P, ab, hd, kv_heads_gpu;
} mem_ctx;

/* Unpack a mem_ctx into the names the formulas use. */
#define MEM_UNPACK(c)                                                                                        \
    const fm_plan_model *m = (c)->m;                                                                         \
    const fm_plan_job *job = (c)->job;                                                                       \
    __attribute__((unused)) int t = (c)->t, pp = (c)->pp, cnn = (c)->cnn, decoder = (c)->decoder;            \
    __attribute__((unused)) double dp = (c)->dp, s = (c)->s, b = (c)->b, L = (c)->L, h = (c)->h, a = (c)->a; \
    __attribute__((unused)) double V = (c)->V, P = (c)->P, ab = (c)->ab, hd = (c)->hd;                       \
    __attribute__((unused)) double kv_heads_gpu = (c)->kv_heads_gpu

/* Inference: weights, KV cache, last-position logits, one layer's prefill activations. */
static void memory_inference(const mem_ctx *c, fm_plan_memory *o, plan_sb *ex) {
    MEM_UNPACK(c);
    o->weights = stored_weights(m, job->precision, ex, "weights") / t;
    if (ex && t > 1) plan_sb_printf(ex, "        / tensor-parallel %d = %.3f GiB\n", t, gib(o->weights));
    if (decoder) {
        double kb = plan_kv_bytes(job), kvb = 2 * L * kv_heads_gpu * hd * s * b * kb;
        o->kv_cache = kvb;
        if (ex)
            plan_sb_printf(ex, "  KV cache = 2 x layers x kv_heads/GPU x head_dim x seq x batch x %.0f B%s\n"
                               "        = 2 x %.0f x %.4g x %.0f x %.0f x %.0f x %.0f = %.3f GiB (%.0f KiB per token)\n",
                           kb, job->kv_cache_8bit ? " (8-bit KV cache)" : "", L, kv_heads_gpu, hd, s, b, kb, gib(kvb),
                           2 * L * kv_heads_gpu * hd * kb / 1024);
        o->logits = b * V * 4;
        if (ex) plan_sb_printf(ex, "  logits = batch x vocab x 4 B (last position, fp32) = %.0f x %.0f x 4 = %.3f GiB\n",
                               b, V, gib(o->logits));
    }
    if (cnn) {
        o->activations = b * m->cnn_infer_elems * ab;
        if (ex) plan_sb_printf(ex, "  activations = batch x %.3g live elements (three largest feature maps) x %.0f B = %.3f GiB\n",
                               m->cnn_infer_elems, ab, gib(o->activations));
    } else {
        /* One layer at a time is live while prefilling: residual, norm output,
         * q/k/v, attention output and the MLP's hidden activations. */
        double kvd = (double)m->kv_heads * hd, f = (double)m->ffn;
        double per_tok = 2 * h + (h + 2 * kvd) + h + 2 * f;
        double act = s * b * per_tok * ab / t;
        double scores = job->flash_attention ? 0 : 2 * a * s * s * b * ab / t;
        o->activations = act + scores;
        if (ex) {
            plan_sb_printf(ex, "  activations (prefill, one layer live) = seq x batch x (2h + h + 2kv_dim + h + 2ffn) x %.0f B / tp\n"
                               "        = %.0f x %.0f x %.0f x %.0f / %d = %.3f GiB\n",
                           ab, s, b, per_tok, ab, t, gib(act));
            if (scores > 0)
                plan_sb_printf(ex, "    + attention scores (no flash attention) 2 x heads x seq^2 x batch x %.0f B / tp = %.3f GiB\n",
                               ab, gib(scores));
        }
    }
}

/* Training state: weights, gradients, optimizer state (LoRA, QLoRA, ZeRO, offload). */
static void memory_train_state(const mem_ctx *c, fm_plan_memory *o, plan_sb *ex) {
    MEM_UNPACK(c);
    int lora = job->task == FM_PLAN_LORA || job->task == FM_PLAN_QLORA;
    int fp32 = job->precision == FM_PLAN_FP32;
    double wt = fp32 ? 4 : 2; /* trainable weights and their gradients */
    int master = !fp32 && job->master_weights;
    double state;
    const char *sname;
    switch (job->optimizer) {
    case FM_PLAN_SGD: state = (fp32 || master) ? 4 : 2; sname = "SGD momentum"; break;
    case FM_PLAN_ADAM8BIT: state = 2; sname = "8-bit Adam m + v"; break;
    default: state = (fp32 || master) ? 8 : 4; sname = (fp32 || master) ? "fp32 Adam m + v" : "16-bit Adam m + v"; break;
    }
    double opt_b = (master ? 4 : 0) + state;
    double T = lora ? plan_lora_params(m, job->lora_rank) : P;
    double base = 0;
    if (job->task == FM_PLAN_QLORA) {
        /* QLoRA's NF4 with double quantization: 4 bits + 0.127 bits of
         * quantized block scales per weight (Dettmers et al. 2023). */
        double E = (double)m->embed_params, B = P - E, nf4 = 4.127 / 8;
        base = B * nf4 + E * 2;
        if (ex)
            plan_sb_printf(ex, "  frozen base weights (NF4, double-quantized: 4.127 bits) = block params x 0.5159 B + "
                               "embedding/head params x 2 B\n        = %.4g x %.4f + %.4g x 2 = %.3f GiB\n",
                           B, nf4, E, gib(base));
    } else if (lora) {
        base = stored_weights(m, job->precision, ex, "frozen base weights");
        if (ex) plan_sb_printf(ex, "  LoRA adapters (rank %d on every block linear) = %.4g trainable params\n",
                               job->lora_rank, T);
    }
    double w = base + T * wt, g = T * wt, opt = T * opt_b;
    if (ex) {
        plan_sb_printf(ex, "  weights = %s%.4g trainable x %.0f B = %.3f GiB\n", lora ? "base + " : "", T, wt, gib(w));
        plan_sb_printf(ex, "  gradients = %.4g x %.0f B = %.3f GiB\n", T, wt, gib(g));
        plan_sb_printf(ex, "  optimizer = %.4g x (%s%.0f B %s) = %.3f GiB\n", T, master ? "4 B fp32 master + " : "", state,
                       sname, gib(opt));
    }
    /* Tensor parallelism splits every weight matrix t ways, a pipeline the
     * layers pp ways. With 1F1B the first stage holds pp micro-batches of
     * its L/pp layers: the activations of all L layers for one micro-batch,
     * as without a pipeline (Korthikanti et al.), so they are not divided. */
    w /= t * pp; g /= t * pp; opt /= t * pp;
    if (ex && t * pp > 1) plan_sb_printf(ex, "  all three / (tensor-parallel %d x pipeline stages %d)\n", t, pp);
    if (job->optimizer_in_backward) {
        /* Each gradient is applied and freed as soon as it is produced, so
         * only the largest layer's gradient is ever alive. */
        double lg = (lora ? T / (L > 0 ? L : 1) : (double)m->largest_layer) * wt / t;
        if (ex) plan_sb_printf(ex, "  optimizer in backward: gradients = largest layer only = %.3f GiB\n", gib(lg));
        g = lg;
    }
    if (job->zero >= 1 && dp > 1) {
        opt /= dp;
        if (job->zero >= 2 && !job->optimizer_in_backward) g /= dp;
        if (job->zero >= 3) {
            /* Shards are gathered layer by layer; two layers in flight
             * (current + prefetch) stay resident. */
            double gather = 2 * (double)m->largest_layer * wt / t;
            w = w / dp + gather;
            if (ex) plan_sb_printf(ex, "  ZeRO-3: weights / %.0f + 2 gathered layers (%.3f GiB)\n", dp, gib(gather));
        }
        if (ex) plan_sb_printf(ex, "  ZeRO-%d over %.0f data-parallel GPUs: optimizer%s%s / %.0f\n", job->zero, dp,
                               job->zero >= 2 ? ", gradients" : "", job->zero >= 3 ? ", weights" : "", dp);
    }
    if (job->offload_optimizer) {
        o->cpu_offload = opt;
        if (ex) plan_sb_printf(ex, "  optimizer offloaded to CPU memory: %.3f GiB leave the GPU\n", gib(opt));
        opt = 0;
    }
    o->weights = w;
    o->gradients = g;
    o->optimizer = opt;

}

/* Training activations kept for backward (by checkpointing mode) and the loss's logits. */
static void memory_train_acts(const mem_ctx *c, fm_plan_memory *o, plan_sb *ex) {
    MEM_UNPACK(c);
    /* Activations kept for the backward pass. */
    if (cnn) {
        double act = b * m->cnn_act_elems * ab;
        if (job->checkpointing == FM_PLAN_CKPT_FULL) {
            /* Chen et al. 2016: checkpoints every sqrt(n) layers keep about
             * 2/sqrt(n) of the activations. */
            double frac = 2 / sqrt(L);
            if (ex) plan_sb_printf(ex, "  activations = batch x %.3g saved elements x %.0f B x 2/sqrt(%.0f layers) (Chen) = %.3f GiB\n",
                                   m->cnn_act_elems, ab, L, gib(act * frac));
            act *= frac;
        } else if (ex) {
            plan_sb_printf(ex, "  activations = batch x %.3g saved elements x %.0f B = %.0f x %.3g x %.0f = %.3f GiB\n",
                           m->cnn_act_elems, ab, b, m->cnn_act_elems, ab, gib(act));
        }
        o->activations = act;
    } else {
        int drop = job->flash_attention || job->checkpointing != FM_PLAN_CKPT_NONE;
        int dropout = !job->no_dropout;
        double unsplit = dropout ? 10 : 8;
        double layer = korthikanti_layer(s, b, h, a, t, drop, job->sequence_parallel, dropout) * ab / 2;
        double act;
        if (job->checkpointing == FM_PLAN_CKPT_FULL) {
            /* Each layer's input (2sbh at 16 bits) is kept; one layer is
             * recomputed at a time and its full activations live briefly. */
            double kept = L * 2 * s * b * h * ab / 2;
            act = kept + layer;
            if (ex)
                plan_sb_printf(ex, "  activations (full recompute) = layers x 2sbh + one layer recomputed s*b*h*(%s)%s\n"
                                   "        = %.0f x 2 x %.0f x %.0f x %.0f%s + %.3f GiB = %.3f GiB\n",
                               t > 1 ? (dropout ? "10 + 24/t" : "8 + 24/t") : (dropout ? "34" : "32"),
                               dropout ? "" : " (no dropout masks)", L, s, b, h, ab == 4 ? " x 2 (fp32)" : "", gib(layer),
                               gib(act));
        } else {
            act = L * layer;
            if (ex) {
                if (drop)
                    plan_sb_printf(ex, "  activations (Korthikanti, %s: no s^2 scores%s) = layers x s*b*h*(%.0f%s + 24/t)%s\n"
                                       "        = %.0f x %.0f x %.0f x %.0f x %.4g = %.3f GiB\n",
                                   job->checkpointing == FM_PLAN_CKPT_SELECTIVE ? "selective recompute" : "flash attention",
                                   dropout ? "" : ", no dropout masks", unsplit, job->sequence_parallel ? "/t" : "",
                                   ab == 4 ? " x 2 (fp32)" : "", L, s, b, h, layer / (s * b * h), gib(act));
                else
                    plan_sb_printf(ex, "  activations (Korthikanti, no recompute%s) = layers x s*b*h*(%.0f%s + 24/t + %.0f*a*s/(h*t))%s\n"
                                       "        = %.0f x %.0f x %.0f x %.0f x %.4g = %.3f GiB\n",
                                   dropout ? "" : ", no dropout masks", unsplit, job->sequence_parallel ? "/t" : "",
                                   dropout ? 5.0 : 2.0, ab == 4 ? " x 2 (fp32)" : "", L, s, b, h, layer / (s * b * h),
                                   gib(act));
            }
        }
        /* An interleaved schedule's first stage runs (v - 1) x pp + 2(pp - 1) + 1
         * chunk forwards of L/(pp v) layers before its first backward, i.e.
         * 1 + (pp - 1)/(pp v) times the activations of the 1F1B schedule
         * (Korthikanti et al. 2022, section 4.2.3; Megatron-LM's warm-up count). */
        int v = job->virtual_stages > 1 ? job->virtual_stages : 1;
        if (pp > 1 && v > 1) {
            double f = 1 + (double)(pp - 1) / ((double)pp * v);
            double stored = job->checkpointing == FM_PLAN_CKPT_FULL ? act - layer : act;
            act += stored * (f - 1);
            if (ex) plan_sb_printf(ex, "    x (1 + (stages - 1)/(stages x virtual stages)) = %.4g for the interleaved schedule's "
                                       "first stage (its stored part) -> %.3f GiB\n", f, gib(act));
        }
        o->activations = act;
    }
    /* Logits for the loss. */
    if (decoder || (m->arch == FM_PLAN_ARCH_BERT && job->task == FM_PLAN_TRAIN)) {
        double frac = decoder ? 1 : 0.15; /* BERT pretraining scores the 15% masked positions */
        double n = b * s * V * frac / t;
        if (job->fused_loss) {
            /* A fused kernel computes the loss from the 16-bit logits and
             * writes their 16-bit gradient: no fp32 logits or softmax. */
            o->logits = n * ab * 2;
            if (ex) plan_sb_printf(ex, "  logits (fused cross-entropy) = b*s*V%s x %.0f B x 2 (logits + their gradient) = %.4g x %.0f = %.3f GiB\n",
                                   t > 1 ? "/tp" : "", ab, n, ab * 2, gib(o->logits));
        } else if (job->chunked_loss) {
            o->logits = n * ab + n * 4 / 8;
            if (ex) plan_sb_printf(ex, "  logits (chunked loss) = b*s*V x %.0f B + one of 8 fp32 chunks = %.4g x %.0f + %.4g x 0.5 = %.3f GiB\n",
                                   ab, n, ab, n, gib(o->logits));
        } else {
            o->logits = n * 4 * 2;
            if (ex) plan_sb_printf(ex, "  logits = b*s*V%s x 4 B x 2 (fp32 logits + softmax for the loss) = %.4g x 8 = %.3f GiB\n",
                                   t > 1 ? "/tp" : "", n, gib(o->logits));
        }
    }
}

static fm_status memory_at(const fm_plan_model *m, const fm_plan_job *job, int gpus, fm_plan_memory *o, plan_sb *ex) {
    memset(o, 0, sizeof *o);
    int t = job->tensor_parallel;
    if (gpus < t) gpus = t;
    int pp = job->pipeline_parallel > 0 ? job->pipeline_parallel : 1;
    double dp = (double)(gpus / (t * pp));
    if (dp < 1) dp = 1;
    double s = (double)plan_resolved_seq(m, job), b = (double)job->batch;
    double L = (double)m->layers, h = (double)m->hidden, a = (double)m->heads, V = (double)m->vocab;
    double P = (double)m->params;
    double ab = plan_act_bytes(job->precision);
    int cnn = m->arch == FM_PLAN_ARCH_CNN, decoder = m->arch == FM_PLAN_ARCH_GPT || m->arch == FM_PLAN_ARCH_LLAMA;
    double hd = cnn ? 0 : plan_head_dim(m);
    double kv_heads_gpu = cnn ? 0 : (m->kv_heads >= t ? (double)m->kv_heads / t : 1);

    if (ex) plan_sb_printf(ex, "Memory per GPU with %d GPU%s (tensor-parallel %d, data-parallel %.0f), batch %.0f, seq %.0f:\n",
                           gpus, gpus > 1 ? "s" : "", t, dp, b, s);

    mem_ctx c = {m, job, t, pp, cnn, decoder, dp, s, b, L, h, a, V, P, ab, hd, kv_heads_gpu};
    if (job->task == FM_PLAN_INFERENCE) {
        memory_inference(&c, o, ex);
    } else {
        memory_train_state(&c, o, ex);
        memory_train_acts(&c, o, ex);
    }
    o->allocated = o->weights + o->gradients + o->optimizer + o->activations + o->kv_cache + o->logits;
    o->headroom = o->allocated * job->headroom;
    o->reserved = o->allocated + o->headroom;
    o->context = job->context_gib * FM_GIB;
    o->total = o->reserved + o->context;
    if (ex)
        plan_sb_printf(ex, "  allocated = sum of the above = %.3f GiB\n"
                           "  allocator headroom = allocated x %.0f%% (caching allocator reserve) = %.3f GiB\n"
                           "  framework/CUDA context = %.2f GiB\n"
                           "  total per GPU = %.3f GiB\n",
                       gib(o->allocated), job->headroom * 100, gib(o->headroom), job->context_gib, gib(o->total));
    return FM_OK;
}

fm_status fm_plan_memory_at(const fm_plan_model *model, const fm_plan_job *job, int gpus, fm_plan_memory *out,
                            char **explain) {
    fm_status st = fm_plan_job_check(model, job);
    if (st) return st;
    if (gpus < 1) gpus = job->tensor_parallel;
    if (gpus % job->tensor_parallel)
        return fm_set_error(FM_ERR_INVALID, "%d GPUs is not a multiple of tensor-parallel %d", gpus, job->tensor_parallel);
    plan_sb sb = {0};
    st = memory_at(model, job, gpus, out, explain ? &sb : NULL);
    if (explain) {
        *explain = plan_sb_take(&sb);
        if (!*explain) return fm_set_error(FM_ERR_OOM, "out of memory writing the explanation");
    }
    return st;
}
