/* Time on a GPU: the training step and the serving solver. Each term is
 * computed once and, when `ex` is given, written out with its numbers, so that
 * --explain prints what the planner computed and nothing else.
 *
 * Training step = compute + pipeline bubble + fixed overhead + exposed
 * communication:
 *   compute    = FLOPs per token (recompute counted as extra FLOPs) x tokens
 *                per step / (GPUs x dense peak x achievable MFU of this GPU
 *                and precision, from the database);
 *   bubble     = compute x (stages - 1) / (virtual stages x micro-batches)
 *                (1F1B, interleaved when virtual stages > 1);
 *   overhead   = a fixed per-step cost + the optimizer update, which reads and
 *                writes the training state at memory bandwidth;
 *   tensor-parallel all-reduces (4 per layer, 6 with full recompute) and
 *   expert-parallel all-to-alls are exposed; the data-parallel gradient
 *   all-reduce overlaps the backward pass (2/3 of compute) and only its excess
 *   counts.
 * Collectives see the topology: NVLink/NVSwitch or PCIe inside a node of
 * gpus_per_node GPUs (link_gbs), InfiniBand/RoCE between nodes (inter_node_gbs);
 * an all-reduce takes the faster of ring and tree, latency included; one that
 * spans nodes runs hierarchically (inside each node, then across nodes).
 *
 * Serving (decoder models): a decode step reads the weights a batch touches
 * and every sequence's KV cache at the achievable bandwidth, or is bound by
 * compute, whichever is slower, plus 2 tensor-parallel all-reduces per layer.
 * A prefill (the time to first token) is its compute (GEMMs and attention,
 * plus the memory-bound ops between them) plus one read of the weights, plus
 * its 2 all-reduces per layer; a static batch prefills its prompts together.
 * A prefill computes at the measured matmul ceiling (MAMF), not the training
 * MFU.
 * KV capacity counts 16-token pages in the memory the weights leave. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plan/plan_internal.h"

#define STEP_OVERHEAD_S 0.005   /* launch gaps, data loading, logging per step (assumed) */
#define LAT_NVLINK_S 10e-6      /* per hop of a collective inside an NVLink/NVSwitch node (assumed) */
#define LAT_PCIE_S 20e-6        /* per hop over PCIe through the host (assumed) */
#define LAT_NET_S 25e-6         /* per hop between nodes over InfiniBand/RoCE (assumed) */
#define KV_BLOCK_TOKENS 16      /* paged KV cache block (vLLM's default) */
#define MAX_DECODE_BATCH 256    /* sequences a serving engine decodes together (vLLM's max_num_seqs) */
#define GPUS_ON_EARTH 1e7       /* more than all datacenter GPUs shipped: a plan beyond is a typo */

typedef struct net {
    double gbs, lat;
    const char *name;
} net;

/* The link a group of `n` GPUs, `stride` apart in the node's numbering, talks over. */
static net group_net(const fm_plan_gpu *g, int n, int stride) {
    net k;
    if ((double)n * stride <= g->gpus_per_node) {
        k.gbs = g->link_gbs;
        k.lat = g->nvlink || g->link_gbs >= 100 ? LAT_NVLINK_S : LAT_PCIE_S;
        k.name = g->link;
    } else {
        k.gbs = g->inter_node_gbs;
        k.lat = LAT_NET_S;
        k.name = "the network between nodes";
    }
    return k;
}

/* All-reduce of `bytes` over n GPUs: ring 2(n-1)/n x bytes / bw + 2(n-1)
 * hops of latency, or tree 2 x bytes / bw + 2 log2(n) hops; the faster. */
static double allreduce_s(double bytes, int n, net k) {
    if (n <= 1) return 0;
    double bw = k.gbs * 1e9;
    double ring = 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * k.lat;
    double tree = 2.0 * bytes / bw + 2.0 * ceil(log2((double)n)) * k.lat;
    return ring < tree ? ring : tree;
}

/* Data-parallel all-reduce across `dp` groups spaced `stride` = t x pp apart:
 * inside a node while the group fits in one, else hierarchical. */
static double dp_allreduce_s(const fm_plan_gpu *g, double bytes, int dp, int stride, plan_sb *ex) {
    int per_node = g->gpus_per_node / stride;
    if (per_node < 1) per_node = 1;
    if (dp <= per_node) {
        net k = group_net(g, dp, stride);
        double v = allreduce_s(bytes, dp, k);
        if (ex) plan_sb_printf(ex, "  data-parallel all-reduce of %.4g GB over %d GPUs on %s (%.0f GB/s, ring or tree, "
                                   "the faster) = %.4g s\n", bytes / 1e9, dp, k.name, k.gbs, v);
        return v;
    }
    int nodes = (dp + per_node - 1) / per_node;
    net in = group_net(g, per_node, stride), out = group_net(g, g->gpus_per_node + 1, 1);
    double a = allreduce_s(bytes, per_node, in), b = allreduce_s(bytes / per_node, nodes, out);
    if (ex)
        plan_sb_printf(ex, "  data-parallel all-reduce, hierarchical: %d GPUs in each node over %s (%.0f GB/s) %.4g s + "
                           "%d nodes over the network (%.4g GB/s per GPU, 1/%d of the bytes each) %.4g s\n",
                       per_node, in.name, in.gbs, a, nodes, out.gbs, per_node, b);
    return a + b;
}

double plan_peak_tflops(const fm_plan_gpu *g, fm_plan_precision p) {
    /* Weight-only int8/int4 dequantize to 16 bits before the matmul. */
    if (p == FM_PLAN_FP32) return g->fp32_tflops;
    if (p == FM_PLAN_FP8) return g->fp8_tflops;
    return g->bf16_tflops;
}

/* Model FLOPs per token (per sample for a CNN), including recomputation. A
 * mixture of experts computes with its active parameters only. */
double plan_flops_per_token(const fm_plan_model *m, const fm_plan_job *job, plan_sb *ex) {
    double P = plan_active_params(m), L = (double)m->layers, h = (double)m->hidden;
    double s = (double)plan_resolved_seq(m, job);
    const char *N = m->experts > 1 ? "N_active" : "N";
    if (m->arch == FM_PLAN_ARCH_CNN) {
        double f = m->cnn_flops_per_sample;
        if (job->task == FM_PLAN_INFERENCE) {
            if (ex) plan_sb_printf(ex, "  FLOPs per image (forward) = %.3g\n", f);
            return f;
        }
        double mul = 3 + (job->checkpointing == FM_PLAN_CKPT_FULL ? 1 : 0);
        if (ex) plan_sb_printf(ex, "  FLOPs per image = %.0f x forward %.3g (forward + 2x backward%s) = %.4g\n", mul, f,
                               mul > 3 ? " + recompute" : "", mul * f);
        return mul * f;
    }
    double attn = 4 * L * h * s; /* QK^T and attention x V, forward (PaLM) */
    if (ex && m->experts > 1)
        plan_sb_printf(ex, "  mixture of experts: %lld of %lld experts per token, N_active = %.4g of %.4g parameters\n",
                       (long long)m->experts_active, (long long)m->experts, P, (double)m->params);
    if (job->task == FM_PLAN_INFERENCE) {
        double v = 2 * P + attn;
        if (ex) plan_sb_printf(ex, "  FLOPs per token (forward) = 2%s + 4*L*s*h = 2 x %.4g + 4 x %.0f x %.0f x %.0f = %.4g\n",
                               N, P, L, s, h, v);
        return v;
    }
    int lora = job->task == FM_PLAN_LORA || job->task == FM_PLAN_QLORA;
    /* LoRA skips the weight-gradient GEMMs of the frozen base: 2N forward +
     * 2N for the input gradients, instead of 6N. */
    double v = lora ? 4 * P + 2 * attn : 6 * P + 3 * attn;
    if (ex) {
        if (lora) plan_sb_printf(ex, "  FLOPs per token (LoRA: no weight gradients for the base) = 4%s + 8*L*s*h = %.4g\n", N, v);
        else plan_sb_printf(ex, "  FLOPs per token = 6%s + 12*L*s*h = 6 x %.4g + 12 x %.0f x %.0f x %.0f = %.4g\n", N, P, L,
                            s, h, v);
    }
    if (job->checkpointing == FM_PLAN_CKPT_FULL) {
        v += 2 * P + attn;
        if (ex) plan_sb_printf(ex, "    + full recompute, counted as extra FLOPs (one more forward) 2%s + 4*L*s*h -> %.4g\n",
                               N, v);
    } else if (job->checkpointing == FM_PLAN_CKPT_SELECTIVE) {
        v += attn;
        if (ex) plan_sb_printf(ex, "    + selective recompute, counted as extra FLOPs (attention core) 4*L*s*h -> %.4g\n", v);
    }
    return v;
}

/* Trainable parameters whose gradients are all-reduced. */
static double trainable(const fm_plan_model *m, const fm_plan_job *job) {
    int lora = job->task == FM_PLAN_LORA || job->task == FM_PLAN_QLORA;
    return lora ? plan_lora_params(m, job->lora_rank) : (double)m->params;
}

static double inference_eff(const fm_plan_job *job, const fm_plan_row *row, const char **src);

/* FLOPs per token (per image) of the forward pass that full activation
 * recompute adds (plan_flops_per_token counts them). Selective recompute (the
 * attention core) is left at the training MFU: with flash attention it runs
 * inside the attention backward kernel, not as a forward pass. */
static double recompute_forward_flops(const fm_plan_model *m, const fm_plan_job *job) {
    if (job->checkpointing != FM_PLAN_CKPT_FULL) return 0;
    if (m->arch == FM_PLAN_ARCH_CNN) return m->cnn_flops_per_sample;
    return 2 * plan_active_params(m) + 4 * (double)m->layers * (double)m->hidden * (double)plan_resolved_seq(m, job);
}

void plan_time_training(const fm_plan_model *m, const fm_plan_job *job, double fpt, fm_plan_row *row, plan_sb *ex) {
    const fm_plan_gpu *g = row->gpu;
    int t = job->tensor_parallel, pp = job->pipeline_parallel, mb = plan_micro_batches(job);
    int n = row->gpus, dp = n / (t * pp);
    int cnn = m->arch == FM_PLAN_ARCH_CNN;
    double s = (double)plan_resolved_seq(m, job), b = (double)job->batch, h = (double)m->hidden;
    double rate = row->peak_tflops * 1e12 * row->mfu;
    double items = b * (cnn ? 1 : s) * dp * mb; /* tokens (images) per step */
    /* The forward that full recompute re-runs is a forward pass like a
     * prefill: at the card's forward-only matmul efficiency, not the training
     * MFU, which prices the backward pass and the optimizer as well. */
    double rec = recompute_forward_flops(m, job);
    const char *fwd_src = "";
    double fwd_eff = rec > 0 ? inference_eff(job, row, &fwd_src) : row->mfu;
    double rec_s = rec * items / (n * row->peak_tflops * 1e12 * fwd_eff);
    row->compute_s = (fpt - rec) * items / (n * rate) + rec_s;
    if (ex) {
        plan_sb_printf(ex, "  compute = FLOPs/%s x %s per step (batch %.0f x%s dp %d x micro-batches %d) / (GPUs x peak x MFU)\n"
                           "        = %.4g x %.4g / (%d x %.4g x %.2f)", cnn ? "image" : "token", cnn ? "images" : "tokens", b,
                       cnn ? "" : " seq x", dp, mb, fpt - rec, items, n, row->peak_tflops * 1e12, row->mfu);
        if (rec > 0)
            plan_sb_printf(ex, " + recomputed forward %.4g x %.4g / (%d x %.4g x %.3f, the forward-only matmul efficiency: %s)", rec,
                           items, n, row->peak_tflops * 1e12, fwd_eff, fwd_src);
        plan_sb_printf(ex, " = %.4g s\n", row->compute_s);
    }
    /* Interleaving v model chunks per rank cuts the bubble v times (Narayanan
     * et al. 2021, section 2.2.2); its extra point-to-point traffic, like the
     * pipeline's own, is not modelled. */
    int v = job->virtual_stages > 1 ? job->virtual_stages : 1;
    row->pp_bubble_s = pp > 1 ? row->compute_s * (pp - 1) / ((double)mb * v) : 0;
    if (ex && pp > 1) {
        if (v > 1)
            plan_sb_printf(ex, "  pipeline bubble (interleaved 1F1B) = compute x (stages - 1) / (virtual stages x micro-batches) "
                               "= %.4g x %d / (%d x %d) = %.4g s\n", row->compute_s, pp - 1, v, mb, row->pp_bubble_s);
        else
            plan_sb_printf(ex, "  pipeline bubble (1F1B) = compute x (stages - 1) / micro-batches = %.4g x %d / %d = %.4g s\n",
                           row->compute_s, pp - 1, mb, row->pp_bubble_s);
    }
    /* The optimizer reads weights, gradients and state and writes weights and state. */
    double state = row->mem.weights + row->mem.gradients + row->mem.optimizer;
    double update = (state + row->mem.weights + row->mem.optimizer) / (g->bandwidth_gbs * 1e9);
    row->overhead_s = STEP_OVERHEAD_S + update;
    if (ex)
        plan_sb_printf(ex, "  overhead = %.0f ms fixed per step (assumed) + optimizer update %.4g GB moved at %.0f GB/s "
                           "(%.4g s) = %.4g s\n", STEP_OVERHEAD_S * 1e3,
                       (state + row->mem.weights + row->mem.optimizer) / 1e9, g->bandwidth_gbs, update, row->overhead_s);
    row->tp_comm_s = 0;
    if (t > 1 && !cnn) {
        net k = group_net(g, t, 1);
        int per_layer = 4 + (job->checkpointing == FM_PLAN_CKPT_FULL ? 2 : 0);
        double layers = (double)m->layers / pp, bytes = b * s * h * 2;
        double one = allreduce_s(bytes, t, k);
        row->tp_comm_s = layers * per_layer * mb * one;
        if (ex)
            plan_sb_printf(ex, "  tensor-parallel all-reduces = %.0f layers x %d per layer x %d micro-batches x %.4g s "
                               "(%.4g MB over %d GPUs on %s, %.0f GB/s) = %.4g s%s\n",
                           layers, per_layer, mb, one, bytes / 1e6, t, k.name, k.gbs, row->tp_comm_s,
                           job->sequence_parallel ? " (sequence parallel: reduce-scatter + all-gather, same bytes)" : "");
    }
    row->moe_comm_s = 0;
    if (job->expert_parallel > 1) {
        int ep = job->expert_parallel;
        net k = group_net(g, ep, t);
        double bytes = b * s * h * 2 * (double)m->experts_active, layers = (double)m->layers / pp;
        double one = (double)(ep - 1) / ep * bytes / (k.gbs * 1e9) + (ep - 1) * k.lat;
        row->moe_comm_s = layers * 4 * mb * one; /* dispatch + combine, forward and backward */
        if (ex)
            plan_sb_printf(ex, "  expert all-to-all = %.0f layers x 4 x %d micro-batches x %.4g s ((ep-1)/ep x %.4g MB over "
                               "%d GPUs on %s) = %.4g s\n", layers, mb, one, bytes / 1e6, ep, k.name, row->moe_comm_s);
    }
    row->dp_comm_s = 0;
    double exposed = 0;
    if (dp > 1) {
        double grad = trainable(m, job) * (job->precision == FM_PLAN_FP32 ? 4 : 2) / (t * pp);
        row->dp_comm_s = dp_allreduce_s(g, grad, dp, t * pp, ex) * (job->zero >= 3 ? 1.5 : 1);
        if (ex && job->zero >= 3) plan_sb_printf(ex, "    x 1.5 for ZeRO-3's weight all-gathers = %.4g s\n", row->dp_comm_s);
        exposed = row->dp_comm_s - 2.0 / 3.0 * row->compute_s;
        if (exposed < 0) exposed = 0;
        if (ex)
            plan_sb_printf(ex, "    overlaps the backward pass (2/3 of compute, %.4g s): exposed %.4g s\n",
                           2.0 / 3.0 * row->compute_s, exposed);
    }
    row->comm_s = row->tp_comm_s + row->moe_comm_s + exposed;
    row->step_s = row->compute_s + row->pp_bubble_s + row->overhead_s + row->comm_s;
    row->tokens_per_s = items / row->step_s;
    if (ex)
        plan_sb_printf(ex, "  step = compute + bubble + overhead + exposed communication = %.4g s; throughput = %.4g %s/s\n",
                       row->step_s, row->tokens_per_s, cnn ? "images" : "tokens");
}

/* Bytes of the input token table (and a learned position table) per GPU that
 * a decode step does not stream: it gathers one row per sequence from them.
 * A tied output head is the token table and is read in full, so only an
 * untied model's input table is left out. */
static double unread_table_bytes(const fm_plan_model *m, const fm_plan_job *job) {
    if (m->arch != FM_PLAN_ARCH_GPT && m->arch != FM_PLAN_ARCH_LLAMA) return 0;
    double rows = (m->tied_embeddings ? 0 : (double)m->vocab) + (m->arch == FM_PLAN_ARCH_GPT ? (double)m->max_seq : 0);
    fm_plan_precision p = job->precision;
    /* quantized formats keep embeddings in 16 bits (plan_memory.c) */
    double eb = p == FM_PLAN_INT8 || p == FM_PLAN_INT4 || p == FM_PLAN_FP8 ? 2 : plan_weight_bytes(p);
    return rows * (double)m->hidden * eb / job->tensor_parallel;
}

/* A prefill (forward only, large GEMMs of prompt x h) runs with no backward
 * pass, no optimizer and no gradient communication: at the GPU's measured
 * maximum achievable matmul efficiency (MAMF) for the precision where the
 * database has one,
 * else at the H100 SXM's measured fraction (assumed for cards not measured);
 * fp32 keeps the training MFU. --mfu overrides it, as it does everything. */
#define MAMF_ASSUMED_BF16 0.803 /* H100 SXM, stas00/ml-engineering @b9e2972 */
#define MAMF_ASSUMED_FP8 0.709
static double inference_eff(const fm_plan_job *job, const fm_plan_row *row, const char **src) {
    const fm_plan_gpu *g = row->gpu;
    if (job->mfu > 0 || job->precision == FM_PLAN_FP32) {
        *src = job->mfu > 0 ? "--mfu" : "fp32: the training MFU";
        return row->mfu;
    }
    double v = job->precision == FM_PLAN_FP8 ? g->matmul_fp8 : g->matmul_bf16;
    if (v > 0) {
        *src = g->matmul_source;
        return v;
    }
    *src = "not measured on this card: the H100 SXM's measured fraction, assumed";
    return job->precision == FM_PLAN_FP8 ? MAMF_ASSUMED_FP8 : MAMF_ASSUMED_BF16;
}

/* One decode step of `B` sequences at mean context `ctx` on one replica of t GPUs. */
static double decode_step_s(const fm_plan_model *m, const fm_plan_job *job, const fm_plan_row *row, double B, double ctx,
                            double kv_tok, plan_sb *ex) {
    const fm_plan_gpu *g = row->gpu;
    int t = job->tensor_parallel;
    /* A mixture of experts reads only the experts its batch routes to: of E,
     * about E(1 - (1 - k/E)^B) distinct ones. */
    double unread = unread_table_bytes(m, job);
    double w = row->mem.weights - unread, read = w;
    if (m->experts > 1) {
        double E = (double)m->experts, k = (double)m->experts_active;
        double touched = E * (1 - pow(1 - k / E, B)) / E;
        double expert_share = ((double)m->params - plan_active_params(m)) / (double)m->params * E / (E - k);
        read = w * (1 - expert_share) + w * expert_share * touched;
    }
    /* A kernel with one thread block per query head and sequence (TensorRT-LLM's
     * masked MHA before XQA) loads a grouped KV head once for each query head
     * of its group: heads/kv_heads times the KV bytes, per GPU. */
    double kv_reads = 1;
    if (job->kv_read_per_query_head && m->kv_heads > 0 && m->kv_heads < m->heads) {
        double qh = (double)m->heads / t, kvh = m->kv_heads >= t ? (double)m->kv_heads / t : 1;
        kv_reads = qh / kvh;
    }
    double bytes = read + B * ctx * kv_tok * kv_reads;
    double bw_s = bytes / (job->decode_efficiency * g->bandwidth_gbs * 1e9);
    double flops = B * (2 * plan_active_params(m) + 4 * (double)m->layers * (double)m->hidden * ctx) / t;
    /* The compute bound of a decode step keeps the training MFU: TensorRT-LLM's
     * large-batch decode steps measure far below the matmul ceiling (LLaMA 70B
     * at batch 480 on 4 H100s: about 10% of the fp8 peak and 15% of the
     * bandwidth), and the ceiling made those rows 2-2.7x too fast (tried). */
    double eff = row->mfu;
    double cmp_s = flops / (row->peak_tflops * 1e12 * eff);
    double comm = 0;
    if (t > 1) {
        net k = group_net(g, t, 1);
        comm = 2 * (double)m->layers * allreduce_s(B * (double)m->hidden * 2, t, k);
        if (ex)
            plan_sb_printf(ex, "    tensor-parallel: 2 all-reduces per layer x %lld layers of %.4g KB over %d GPUs on %s "
                               "(%.0f GB/s, latency %.0f us per hop) = %.4g ms per step\n", (long long)m->layers,
                           B * (double)m->hidden * 2 / 1e3, t, k.name, k.gbs, k.lat * 1e6, comm * 1e3);
    }
    double step = (bw_s > cmp_s ? bw_s : cmp_s) + comm;
    if (ex && unread > 0)
        plan_sb_printf(ex, "    weights read: all but the input embedding table (%.4g GB per GPU), of which a step "
                           "gathers one row per sequence\n", unread / 1e9);
    if (ex && kv_reads > 1)
        plan_sb_printf(ex, "    KV heads read once per query head (--decode-kv-reads per-query-head): %.0f query heads "
                           "per KV head, x%.0f KV bytes\n", kv_reads, kv_reads);
    if (ex)
        plan_sb_printf(ex, "    memory-bound: (weights read %.4g GB + %.0f seqs x %.0f tokens x %.4g KB KV) / (%.2f x %.0f GB/s) "
                           "= %.4g ms; compute-bound: %.4g GFLOP / (%.4g TF x %.2f) = %.4g ms; step = %.4g ms\n",
                       read / 1e9, B, ctx, kv_tok * kv_reads / 1e3, job->decode_efficiency, g->bandwidth_gbs, bw_s * 1e3,
                       flops / 1e9, row->peak_tflops, eff, cmp_s * 1e3, step * 1e3);
    return step;
}

/* Prefill of `nseq` prompts of `prompt` tokens together on one replica of t
 * GPUs (one request when serving; a static batch's prompts in one context
 * phase otherwise): its GEMMs and attention at the forward-only matmul
 * efficiency, plus the memory-bound work between them (norms, residual adds,
 * rotary, the MLP's activation, the KV-cache write) at the achievable
 * bandwidth, plus one read of the weights, added rather than overlapped (a
 * short prompt's GEMMs sit near the roofline's ridge, where a kernel reaches
 * neither ceiling); plus the 2 tensor-parallel all-reduces per layer of the
 * tokens x h activations (their latency dominates a short prompt). */
static double prefill_s(const fm_plan_model *m, const fm_plan_job *job, const fm_plan_row *row, double prompt, double nseq,
                        plan_sb *ex) {
    const fm_plan_gpu *g = row->gpu;
    int t = job->tensor_parallel;
    const char *eff_src = "";
    double eff = inference_eff(job, row, &eff_src);
    double rate = row->peak_tflops * 1e12 * eff;
    double L = (double)m->layers, h = (double)m->hidden, f = (double)m->ffn;
    double kv = (double)m->kv_heads * plan_head_dim(m);
    double cmp = nseq * prompt * (2 * plan_active_params(m) + 2 * L * h * prompt) / (t * rate);
    /* Elements each token reads and writes per layer outside the GEMMs: two
     * norms (read + write h each), two residual adds (2h read, h written),
     * rotary on q and k (Llama), the activation (SwiGLU reads gate and up,
     * writes their product; GeLU reads and writes f) and the K/V write. */
    int llama = m->arch == FM_PLAN_ARCH_LLAMA;
    double elems = 4 * h + 6 * h + (llama ? 2 * (h + kv) : 0) + (llama ? 3 * f : 2 * f) + 2 * kv;
    double ab = plan_act_bytes(job->precision);
    double bw = job->decode_efficiency * g->bandwidth_gbs * 1e9;
    double elt = nseq * prompt * L * elems * ab / t / bw;
    double w = row->mem.weights - unread_table_bytes(m, job);
    double rd = w / bw;
    double comm = 0;
    net k = {0, 0, ""};
    if (t > 1) {
        k = group_net(g, t, 1);
        comm = 2 * L * allreduce_s(nseq * prompt * h * 2, t, k);
    }
    double v = cmp + elt + rd + comm;
    if (ex) {
        if (nseq > 1) plan_sb_printf(ex, "  static batch: its %.0f prompts prefilled together in one context phase\n", nseq);
        plan_sb_printf(ex, "  prefill of %.0f prompt tokens: compute %.0f x (2N + 2*L*h*prompt) / (tp x peak x %.3f, "
                           "forward-only matmul efficiency: %s) = %.4g ms + memory-bound ops between the GEMMs %.0f "
                           "tokens x %.0f layers x %.0f elements x %.0f B / tp / (%.2f x %.0f GB/s) = %.4g ms "
                           "+ one read of the weights %.4g GB / (%.2f x %.0f GB/s) = %.4g ms (not overlapped)", prompt,
                       nseq * prompt, eff, eff_src, cmp * 1e3, nseq * prompt, L, elems, ab, job->decode_efficiency,
                       g->bandwidth_gbs, elt * 1e3,
                       w / 1e9, job->decode_efficiency, g->bandwidth_gbs, rd * 1e3);
        if (t > 1)
            plan_sb_printf(ex, " + 2 tensor-parallel all-reduces per layer x %.0f layers of %.4g MB over %d GPUs on %s (%.0f GB/s, "
                               "%.0f us per hop) = %.4g ms", L, nseq * prompt * h * 2 / 1e6, t, k.name, k.gbs, k.lat * 1e6,
                           comm * 1e3);
        plan_sb_printf(ex, " = %.4g ms (time to first token, before queueing; no per-request engine overhead)\n", v * 1e3);
    }
    return v;
}

/* KV capacity: the memory the weights, workspace and allocator reserve leave,
 * in 16-token pages, divided into sequences of `ctx_max` tokens. */
static int64_t kv_capacity(const fm_plan_model *m, const fm_plan_job *job, const fm_plan_row *row, double kv_tok,
                           double ctx_max, plan_sb *ex) {
    const fm_plan_memory *mm = &row->mem;
    double fixed = (mm->weights + mm->activations + mm->logits) * (1 + job->headroom) + mm->context;
    double free_b = row->gpu->memory_gib * FM_GIB - fixed;
    double block = KV_BLOCK_TOKENS * kv_tok * (1 + job->headroom);
    double blocks = free_b > 0 ? floor(free_b / block) : 0;
    double per_seq = ceil(ctx_max / KV_BLOCK_TOKENS);
    int64_t seqs = (int64_t)floor(blocks / per_seq);
    if (ex)
        plan_sb_printf(ex, "  KV capacity per GPU: (%.4g GiB - weights, workspace, context %.4g GiB) / (%d-token blocks of "
                           "%.4g KB + headroom) = %.0f blocks; / %.0f blocks per %.0f-token sequence = %lld sequences\n",
                       row->gpu->memory_gib, fixed / FM_GIB, KV_BLOCK_TOKENS, KV_BLOCK_TOKENS * kv_tok / 1e3, blocks,
                       per_seq, ctx_max, (long long)seqs);
    (void)m;
    return seqs;
}

int plan_time_serving(const fm_plan_model *m, const fm_plan_job *job, fm_plan_row *row, plan_sb *ex) {
    int t = job->tensor_parallel;
    double s = (double)plan_resolved_seq(m, job), out = (double)job->output_tokens;
    double hd = plan_head_dim(m), ab = plan_kv_bytes(job);
    double kvh = m->kv_heads >= t ? (double)m->kv_heads / t : 1;
    double kv_tok = 2 * (double)m->layers * kvh * hd * ab;
    int serving = job->requests_per_second > 0;
    double prompt = serving ? (s > out ? s - out : 0) : s;
    row->kv_capacity_seqs = kv_capacity(m, job, row, kv_tok, s, ex);
    row->prefill_s = prefill_s(m, job, row, prompt, serving ? 1 : (double)job->batch, ex);
    row->ttft_s = row->prefill_s;
    if (!serving) {
        row->decode_batch = job->batch;
        if (ex) plan_sb_printf(ex, "  decode step at batch %lld, context %.0f:\n", (long long)job->batch, s);
        row->step_s = decode_step_s(m, job, row, (double)job->batch, s, kv_tok, ex);
        row->tokens_per_s = (double)job->batch / row->step_s;
        row->replicas = row->gpus / t;
        row->tokens_per_s *= row->replicas;
        if (ex) plan_sb_printf(ex, "  decode tokens/s = batch / step x %d replica%s = %.4g\n", row->replicas,
                               row->replicas > 1 ? "s" : "", row->tokens_per_s);
        return 1;
    }
    /* Continuous batching: as many sequences as the KV cache holds, up to the
     * engine's limit; each request holds a slot for `out` steps and its
     * prefill runs between them. */
    double B = (double)(row->kv_capacity_seqs < MAX_DECODE_BATCH ? row->kv_capacity_seqs : MAX_DECODE_BATCH);
    if (B < 1) {
        if (ex) plan_sb_printf(ex, "  no sequence of %.0f tokens fits beside the weights: cannot serve\n", s);
        return 0;
    }
    row->decode_batch = (int64_t)B;
    if (ex) plan_sb_printf(ex, "  decode step at %.0f sequences (KV capacity, at most %d), mean context %.0f:\n", B,
                           MAX_DECODE_BATCH, prompt + out / 2);
    row->step_s = decode_step_s(m, job, row, B, prompt + out / 2, kv_tok, ex);
    double per_req = row->prefill_s + out * row->step_s / B;
    double replica_rps = 1 / per_req;
    double need = ceil(job->requests_per_second / replica_rps);
    if (need < 1) need = 1;
    if (ex)
        plan_sb_printf(ex, "  one replica serves 1 / (prefill + output x step / batch) = 1 / (%.4g + %.0f x %.4g / %.0f) = "
                           "%.4g req/s; %.4g req/s need %.0f replica%s x %d GPUs\n", row->prefill_s, out, row->step_s, B,
                       replica_rps, job->requests_per_second, need, need > 1 ? "s" : "", t);
    if (need * t > GPUS_ON_EARTH) {
        row->replicas = 0;
        return -1;
    }
    row->replicas = (int)need;
    row->gpus = row->replicas * t;
    row->tokens_per_s = B / row->step_s * row->replicas;
    row->run_s = 3600; /* a serving plan is priced per hour */
    return 1;
}
