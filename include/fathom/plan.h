/* fathom/plan.h: the hardware and cost planner behind `fathom plan`.
 *
 * Given a model (a preset, architecture dimensions, a bare parameter count or a
 * safetensors file) and a job (task, precision, batch, sequence, optimizer,
 * checkpointing, sharding), the planner estimates per-GPU memory, the number of
 * GPUs needed, step and run time, decode speed and cost, for every GPU in a
 * database loaded at run time (data/gpus.json). Every figure comes from the
 * formulas in docs/PLANNER.md; the renderers can print them with numbers filled in.
 *
 * Memory figures are bytes; GPU memory in the database is in GiB, which is what
 * the cards actually have (a "24 GB" RTX 4090 reports 24564 MiB). */
#ifndef FATHOM_PLAN_H
#define FATHOM_PLAN_H
#include "fathom/export.h"

#include <stdint.h>

#include "fathom/error.h" /* fm_status and fm_last_error() for every call below */
#include "fathom/tensor.h" /* fm_device */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the GPU database ---- */

typedef enum fm_plan_pricing {
    FM_PLAN_ON_DEMAND = 0,
    FM_PLAN_SPOT = 1,
    FM_PLAN_RESERVED = 2,
    FM_PLAN_PRICING_COUNT = 3
} fm_plan_pricing;

typedef struct fm_plan_price {
    double usd_per_hour; /* < 0: no price known */
    char date[32];
    char source[256];
} fm_plan_price;

typedef struct fm_plan_gpu {
    char name[64];
    char kind[16];         /* "consumer", "workstation" or "datacenter" */
    double memory_gib;     /* capacity */
    double bandwidth_gbs;  /* memory bandwidth, GB/s (1e9) */
    double fp32_tflops;    /* dense, non-tensor; < 0 unknown */
    double bf16_tflops;    /* dense tensor rate, fp32 accumulate, never sparse */
    double fp8_tflops;     /* dense fp8 tensor rate; < 0: no fp8 tensor cores */
    double int8_tops;      /* dense; < 0 unknown */
    double tdp_w;
    /* Achievable model FLOPs utilization of a large, well-tuned training step,
     * per precision (< 0: unknown), with where the figure comes from. */
    double mfu_fp32, mfu_bf16, mfu_fp8;
    char mfu_source[256];
    /* Measured maximum achievable matmul efficiency (a large dense GEMM's
     * fraction of the peak) for 16-bit and fp8 inputs, < 0 where not measured;
     * forward-only inference (prefill, compute-bound decode) runs its GEMMs at
     * it. Optional in the database ("mfu": {"matmul": {...}}). */
    double matmul_bf16, matmul_fp8;
    char matmul_source[256];
    int bf16;              /* 1 if the card computes in bf16 (T4 does not) */
    char link[64];         /* interconnect name */
    int nvlink;
    int pcie_lanes;
    double link_gbs;       /* per-GPU bandwidth for collective traffic inside a node, GB/s */
    int gpus_per_node;     /* GPUs sharing link_gbs (8 in an HGX server, 72 in an NVL72 rack) */
    double inter_node_gbs; /* per-GPU share of the network between nodes (InfiniBand/RoCE), GB/s */
    fm_plan_price price[FM_PLAN_PRICING_COUNT];
    int line;              /* line of the entry in the database file */
} fm_plan_gpu;

typedef struct fm_plan_db {
    fm_plan_gpu *gpus;
    int count;
    char path[512];
} fm_plan_db;

/* The database path used when none is given: $FATHOM_GPU_DB, else the source
 * tree's data/gpus.json if it exists, else the installed copy. */
FM_API const char *fm_plan_db_default_path(void);
/* Load and validate a database (path NULL: the default). A malformed or
 * incomplete file is refused with "file:line: ..." naming the missing field. */
FM_API fm_plan_db *fm_plan_db_load(const char *path);
FM_API void fm_plan_db_free(fm_plan_db *db);
/* Find a GPU by name: case, spaces and dashes are ignored, and a unique part of
 * a name is enough ("4090"). Unknown or ambiguous names fail with suggestions. */
FM_API const fm_plan_gpu *fm_plan_db_find(const fm_plan_db *db, const char *name);

/* ---- the model ---- */

typedef enum fm_plan_arch {
    FM_PLAN_ARCH_GPT = 0,   /* GPT-2 style: learned positions, GeLU MLP, biases */
    FM_PLAN_ARCH_LLAMA = 1, /* RMSNorm, SwiGLU MLP, grouped-query attention */
    FM_PLAN_ARCH_BERT = 2,  /* encoder: no KV cache */
    FM_PLAN_ARCH_CNN = 3    /* convolutional (resnet-50): per-sample figures */
} fm_plan_arch;

typedef struct fm_plan_model {
    char name[128];
    fm_plan_arch arch;
    int64_t layers, hidden, heads, kv_heads, ffn, vocab, max_seq;
    int64_t head_dim;      /* 0: hidden / heads (Gemma sets its own) */
    int64_t experts;       /* mixture of experts: MLPs per layer (0 or 1: dense) */
    int64_t experts_active;/* experts each token runs through */
    int qkv_bias;          /* Qwen2: biases on q, k and v */
    int no_bias;           /* GPT: Linear and LayerNorm without biases (a fathom GPT-2 config's "bias": false) */
    int tied_embeddings;
    int64_t params;        /* total parameter count */
    int64_t embed_params;  /* embeddings + untied output head (stay 16-bit when quantized) */
    int64_t largest_layer; /* parameters of the largest single block or embedding */
    char dims_source[96];  /* "preset", "given", "config.json", "tensor names", "estimated", ... */
    /* CNN only: forward FLOPs, saved activation elements, and the inference
     * working set (elements) per sample. */
    double cnn_flops_per_sample;
    double cnn_act_elems;
    double cnn_infer_elems;
} fm_plan_model;

/* Parse a count such as "7B", "124M", "1.5e9", "350K", "2T" (K/M/B/T = 1e3..1e12).
 * Rejects negative, zero, non-numeric and overflowing input. */
FM_API fm_status fm_plan_parse_count(const char *text, double *out);

FM_API int fm_plan_preset_count(void);
FM_API const char *fm_plan_preset_name(int i);
/* Fill `out` from a named preset (real published dimensions; parameters counted
 * from them). Unknown names fail with the closest names suggested. */
FM_API fm_status fm_plan_model_preset(const char *name, fm_plan_model *out);
/* Fill from dimensions: set arch, layers, hidden, heads, vocab (kv_heads, ffn and
 * max_seq may be 0 for their defaults) in `m`, then call this to validate and count. */
FM_API fm_status fm_plan_model_from_dims(fm_plan_model *m);
/* Only a parameter count: dimensions are estimated from a Llama-like shape. */
FM_API fm_status fm_plan_model_from_params(double params, fm_plan_model *out);
/* A safetensors file, a Hugging Face config.json (no weights needed), or a
 * directory holding either. Only headers are read: parameters are counted from
 * the tensor shapes when there are weights, else from the config. Dimensions
 * come from config.json (llama, mistral, mixtral, qwen2, gemma, gpt2 and bert
 * families, or fathom's own GPT config), else from tensor names and shapes,
 * else they are estimated from the count. A directory written by `fathom train`
 * for a layer-list recipe (recipe.ini beside the weights) is planned as the CNN
 * or MLP it is. A malformed config, an unknown model_type or a missing or
 * absurd field fails with "file:line: field ...". */
FM_API fm_status fm_plan_model_from_file(const char *path, fm_plan_model *out);
/* Read a safetensors header only and count its elements. */
FM_API fm_status fm_plan_safetensors_count(const char *path, int64_t *params, int *tensors);

/* ---- the job ---- */

typedef enum fm_plan_task {
    FM_PLAN_INFERENCE = 0, FM_PLAN_FINETUNE, FM_PLAN_TRAIN, FM_PLAN_LORA, FM_PLAN_QLORA
} fm_plan_task;
typedef enum fm_plan_precision {
    FM_PLAN_FP32 = 0, FM_PLAN_BF16, FM_PLAN_FP16, FM_PLAN_INT8, FM_PLAN_INT4,
    FM_PLAN_FP8 /* fp8 matmuls (Transformer Engine style): training keeps bf16 weights, inference stores fp8 */
} fm_plan_precision;
typedef enum fm_plan_optimizer { FM_PLAN_ADAMW = 0, FM_PLAN_SGD, FM_PLAN_ADAM8BIT } fm_plan_optimizer;
typedef enum fm_plan_ckpt { FM_PLAN_CKPT_NONE = 0, FM_PLAN_CKPT_SELECTIVE, FM_PLAN_CKPT_FULL } fm_plan_ckpt;

typedef struct fm_plan_job {
    fm_plan_task task;
    fm_plan_precision precision;
    int64_t batch;            /* micro-batch per data-parallel rank (or per serving replica) */
    int64_t seq;              /* 0: min(2048, the model's context) */
    fm_plan_optimizer optimizer;
    fm_plan_ckpt checkpointing;
    int zero;                 /* ZeRO stage 0..3 */
    int tensor_parallel;
    int pipeline_parallel;    /* stages (1: none); weights and training state split across them */
    int micro_batches;        /* per step and pipeline (gradient accumulation); 0: 1, or 4 x stages with a pipeline */
    int virtual_stages;       /* interleaved pipeline schedule (Narayanan et al. 2021): model chunks per pipeline rank;
                                 1: plain 1F1B. The bubble shrinks to (stages - 1) / (virtual x micro-batches) */
    int sequence_parallel;    /* 1: the norm/dropout activations are split across the tensor-parallel group too */
    int expert_parallel;      /* mixture of experts: GPUs the experts are spread over (1: none, no all-to-all) */
    int gpus;                 /* 0: as many as needed */
    double tokens;            /* training tokens (inference: output tokens); 0: default */
    double requests_per_second;
    int64_t output_tokens;    /* per request, for serving */
    fm_plan_pricing pricing;  /* the pricing the recommendation ranks by */
    double budget_usd;        /* 0: none; "fastest within budget" */
    int lora_rank;
    int flash_attention;      /* 1: no s^2 attention scores are stored */
    int master_weights;       /* 1: fp32 master copy for 16-bit training */
    int optimizer_in_backward;/* 1: each gradient is freed right after its update */
    int offload_optimizer;    /* 1: optimizer state lives in CPU memory (paged/offloaded) */
    int chunked_loss;         /* 1: logits kept 16-bit, fp32 loss computed chunk by chunk */
    int fused_loss;           /* 1: a fused cross-entropy kernel (flash-attn's, Liger's): the 16-bit logits and
                                 their 16-bit gradient, no fp32 copies */
    int no_dropout;           /* 1: the model trains without dropout (p = 0, as Llama and MPT do): no dropout
                                 masks are kept (Korthikanti's 2sbh per layer, and as^2b with eager attention) */
    double mfu;               /* 0: the GPU's achievable MFU from the database (per precision) */
    double decode_efficiency; /* fraction of memory bandwidth decoding reaches */
    double context_gib;       /* CUDA context + framework overhead per GPU */
    double headroom;          /* caching-allocator reserve over allocated, fraction */
    int kv_cache_8bit;        /* 1 (fp8) or 2 (int8): inference keeps the KV cache in 8 bits, as vLLM's
                                 --kv-cache-dtype fp8 and TensorRT-LLM's fp8 KV cache do; 0: 16 bits */
    int kv_read_per_query_head; /* 1: the decode attention kernel reads a KV head once for every query head that
                                 uses it (one thread block per query head and sequence, as TensorRT-LLM's masked
                                 MHA kernel before its XQA kernel, v0.8): heads/kv_heads times the KV bytes of a
                                 grouped-query model; 0: once per KV head (FlashAttention/FlashInfer decode, XQA) */
} fm_plan_job;

/* Defaults: inference, bf16, batch 1, seq auto, adamw, no checkpointing, zero 0,
 * tp 1, gpus auto, on-demand, rank 16, flash attention on, master weights on,
 * decode efficiency 0.8, context 1 GiB, headroom 10%. */
FM_API void fm_plan_job_defaults(fm_plan_job *job);
/* Reject impossible combinations (qlora with fp32, tensor parallel not dividing
 * the heads, ...) and absurd numbers. */
FM_API fm_status fm_plan_job_check(const fm_plan_model *model, const fm_plan_job *job);

FM_API const char *fm_plan_task_name(fm_plan_task t);
FM_API const char *fm_plan_precision_name(fm_plan_precision p);
FM_API const char *fm_plan_optimizer_name(fm_plan_optimizer o);
FM_API const char *fm_plan_ckpt_name(fm_plan_ckpt c);
FM_API const char *fm_plan_pricing_name(fm_plan_pricing p);
/* Parse the names above (-1 if unknown). */
FM_API int fm_plan_task_parse(const char *s);
FM_API int fm_plan_precision_parse(const char *s);
FM_API int fm_plan_optimizer_parse(const char *s);
FM_API int fm_plan_ckpt_parse(const char *s);
FM_API int fm_plan_pricing_parse(const char *s);

/* ---- results ---- */

typedef struct fm_plan_memory {
    double weights, gradients, optimizer, activations, kv_cache, logits;
    double allocated;  /* sum of the above: what torch.cuda.max_memory_allocated would report */
    double headroom;   /* caching-allocator reserve on top */
    double reserved;   /* allocated + headroom */
    double context;    /* CUDA context + framework */
    double total;      /* reserved + context: what nvidia-smi would show */
    double cpu_offload;/* bytes kept in CPU memory instead (offloaded optimizer) */
} fm_plan_memory;

typedef struct fm_plan_row {
    const fm_plan_gpu *gpu;
    int fits;            /* at the requested GPU count (or at min_gpus when auto) */
    int min_gpus;        /* smallest count that fits; 0 if none does with these settings */
    int min_gpus_zero3;  /* training: the count with ZeRO-3 when min_gpus is 0 */
    int gpus;            /* count the time and cost below assume (0: does not fit) */
    fm_plan_memory mem;  /* per GPU at `gpus` */
    double peak_tflops;  /* the dense rate used */
    double mfu;
    double step_s, compute_s, comm_s; /* comm_s: the exposed communication (sum of the terms below, as they add to the step) */
    double dp_comm_s;    /* data-parallel gradient all-reduce, total (overlaps the backward pass) */
    double tp_comm_s;    /* tensor-parallel all-reduces per step (exposed), or per decode step when serving */
    double pp_bubble_s;  /* pipeline fill and drain */
    double moe_comm_s;   /* expert-parallel all-to-all */
    double overhead_s;   /* fixed per-step overhead and the optimizer update */
    /* serving */
    int64_t kv_capacity_seqs; /* concurrent sequences whose KV cache fits (paged, 16-token blocks), per replica */
    int64_t decode_batch;     /* sequences decoded together per replica */
    double prefill_s;         /* one request's prompt */
    double ttft_s;            /* time to first token (prefill at this load; queueing not modelled) */
    double run_s;        /* < 0: unknown */
    double tokens_per_s; /* training throughput, decode tokens/s, or samples/s */
    int replicas;        /* serving: replicas needed for the requested load */
    int too_many;        /* serving: the rate needs more GPUs than exist (gpus is then 0) */
    double usd_per_hour; /* all GPUs of the row at the ranked pricing; < 0 unknown */
    double cost[FM_PLAN_PRICING_COUNT];         /* for the run; < 0 unknown */
    double cost_per_mtok[FM_PLAN_PRICING_COUNT];/* per million tokens; < 0 unknown */
} fm_plan_row;

typedef struct fm_plan_result {
    fm_plan_model model;
    fm_plan_job job;       /* with defaults resolved (seq, mfu, tokens) */
    int requested_gpus;    /* GPUs the breakdown is at: the job's count, else what the recommendation needs */
    fm_plan_memory mem;    /* per GPU at requested_gpus */
    double flops_per_token;/* model FLOPs (training: fwd+bwd+recompute) */
    double total_flops;
    int tokens_defaulted;  /* 1: tokens = 20 x params (Chinchilla) was assumed */
    fm_plan_row *rows;
    int nrows;
    int *ranked;           /* indices of fitting, priced rows, cheapest first */
    int nranked;
    int cheapest, fastest; /* row indices, -1 if none (fastest: within the budget, if any) */
    int nfit;              /* rows that fit, priced or not */
    char **warnings;
    int nwarnings;
} fm_plan_result;

/* Per-GPU memory for `gpus` GPUs; `explain` (may be NULL) receives the formulas
 * with numbers filled in (malloc'd; free it). */
FM_API fm_status fm_plan_memory_at(const fm_plan_model *model, const fm_plan_job *job, int gpus,
                            fm_plan_memory *out, char **explain);
/* Plan the job on every GPU of `db` (or only `only`, a comma-separated list of
 * names, when not NULL). */
FM_API fm_plan_result *fm_plan_compute(const fm_plan_model *model, const fm_plan_job *job,
                                const fm_plan_db *db, const char *only);
FM_API void fm_plan_result_free(fm_plan_result *r);
/* A row by GPU name (exact, case-insensitive), NULL if absent. */
FM_API const fm_plan_row *fm_plan_result_row(const fm_plan_result *r, const char *gpu_name);

/* Renderers return malloc'd text (free it), NULL on failure. */
FM_API char *fm_plan_render_text(const fm_plan_result *r);
FM_API char *fm_plan_render_json(const fm_plan_result *r);
FM_API char *fm_plan_render_explain(const fm_plan_result *r);

/* ---- fathom's own CPU training runs: `fathom plan --model <recipe>` ----
 *
 * Predicts the peak that fathom's CPU allocator reports for `fathom train
 * RECIPE` (memory.peak_allocated in its --json): the data set and batch
 * buffers, weights, gradients, optimizer state, the activations each op saves
 * for backward, and the temporaries of the op running at the peak. It replays
 * the trainer's allocations buffer by buffer (what each op allocates, saves and
 * frees, with the allocator's size rounding) without allocating anything; see
 * docs/PLANNER.md. Sequential recipes (`fathom train`'s layer lists) and GPT
 * recipes ([model] type = gpt) are covered. */
typedef struct fm_plan_run_opts {
    int64_t batch;                /* 0: the recipe's */
    fm_plan_precision precision;  /* fp32 (default), bf16 or fp16 (autocast), as fathom train takes them */
    int checkpointing;            /* 0 none, 1 blocks (the "full"; GPTs and conv nets), 2 selective (GPTs) */
    int grad_accum;               /* micro-batches per step; 0 or 1: none */
    int eval;                     /* sequential recipes: 1 (default) the test split is loaded, as `fathom train`
                                     does; 0: as with --no-eval */
    /* GPT recipes: one rank of `mpirun -np ranks fathom train --tensor-parallel T --zero Z`
     * (0 or 1: one process): its part of the batch (batch / (ranks / T)), its split of the
     * model and (zero 1) its shard of the optimizer state; the figures are that rank's */
    int ranks, tensor_parallel, zero;
} fm_plan_run_opts;
FM_API void fm_plan_run_defaults(fm_plan_run_opts *o);

typedef struct fm_plan_run {
    char path[512];
    char name[64];
    char trainer[16];     /* "sequential" or "gpt" */
    char model[256];      /* one line describing the model */
    fm_plan_run_opts opts;/* with the recipe's defaults filled in */
    int64_t params, batch;
    /* bytes alive at the peak, by what they are for; they sum to `peak` */
    double data, weights, gradients, optimizer, activations, workspace;
    double peak;          /* what memory.peak_allocated should read */
    double resident;      /* before the first step: data set, batch buffers, weights */
    char peak_at[160];    /* the moment of the step the peak falls on */
    char notes[512];      /* assumptions worth printing */
    char *explain;        /* the meta-device run, one line per kernel (NULL unless asked for; fm_plan_run_free) */
} fm_plan_run;

/* True when `model` names a recipe: an .ini file, or a built-in recipe name
 * (fm_recipe_resolve) that is not an existing model file or directory. */
FM_API int fm_plan_is_recipe(const char *model);
/* Plan a recipe (a path or a built-in name). A missing recipe or one that does
 * not parse fails with the recipe loader's file:line message; options the
 * recipe's trainer refuses (selective checkpointing without transformer blocks,
 * a batch the accumulation does not divide) fail with its FM_ERR_INVALID message,
 * and so does what fails in its first step (fashion-cnn's batch norm under bf16).
 * The figures come from the trainer's model and two steps run on the meta device. */
FM_API fm_status fm_plan_run_recipe(const char *recipe, const fm_plan_run_opts *o, int explain, fm_plan_run *out);
FM_API void fm_plan_run_free(fm_plan_run *r);
FM_API char *fm_plan_run_render_text(const fm_plan_run *r);
FM_API char *fm_plan_run_render_json(const fm_plan_run *r);
FM_API char *fm_plan_run_render_explain(const fm_plan_run *r);

/* ---- an inference graph: `fathom plan --model MODEL.onnx|GRAPH_DIR` ----
 * One inference by fathom's graph runner (the ONNX file imported as `fathom import` does)
 * on the meta device, with the real allocator's accounting: the weights as they sit on a
 * device, the inputs, the run's peak above them (allocating per node, as on a GPU: the
 * CPU runner's arena is not used there) and the FLOPs and bytes its kernels count. */
#define FM_PLAN_GRAPH_MAX_DIMS 16
typedef struct fm_plan_graph_opts {
    int64_t batch;                                   /* the batch dim (named "batch", else input 0's dim 0 when
                                                      * dynamic); 0: 1 */
    int n_dims;                                      /* other dynamic dims by name (an unset one is refused) */
    const char *dim_names[FM_PLAN_GRAPH_MAX_DIMS];
    int64_t dim_values[FM_PLAN_GRAPH_MAX_DIMS];
    fm_device device;                                /* the meta device by default; the CPU to check it */
} fm_plan_graph_opts;
FM_API void fm_plan_graph_defaults(fm_plan_graph_opts *o);

typedef struct fm_plan_graph_run {
    char path[512];
    char kind[8];          /* "onnx" or "graph" */
    int nodes, consts;
    char inputs[512];      /* "input_ids i64 [8, 128], attention_mask i64 [8, 128]" */
    int64_t params;        /* elements of the floating-point constants */
    double weights;        /* bytes the graph's constants take on the device */
    double input_bytes;    /* the inputs' bytes */
    double peak;           /* the run's peak above weights and inputs (activations, scratch, outputs) */
    double output_bytes;   /* the outputs' bytes */
    double flops, bytes;   /* what the run's kernels compute and move (the profiler's counts) */
    char peak_at[96];      /* the kernel after which the peak was first seen */
} fm_plan_graph_run;
/* True when `model` is an .onnx file or a graph directory (fm_graph_dir_is_graph). */
FM_API int fm_plan_is_graph_model(const char *model);
/* Plans one inference of `model`. A dynamic dim with no size, an unknown --dim name or a size
 * below 1 fails with FM_ERR_INVALID naming the dims; a file that does not load or convert
 * fails with the loader's message. */
FM_API fm_status fm_plan_run_graph(const char *model, const fm_plan_graph_opts *o, fm_plan_graph_run *out);
FM_API char *fm_plan_graph_render_text(const fm_plan_graph_run *r);
FM_API char *fm_plan_graph_render_json(const fm_plan_graph_run *r);

#ifdef __cplusplus
}
#endif
#endif
