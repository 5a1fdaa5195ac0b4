/* fathom/gpt.h: decoder-only transformer language models (GPT-2 and Llama style),
 * their token files, training loop, checkpoints and sampling with a KV cache.
 *
 * One model struct covers both architectures; the config picks the parts:
 *   GPT-2: learned position embeddings, LayerNorm, GELU(tanh) MLP, biases optional.
 *   Llama: rotary position embeddings, RMSNorm, SwiGLU MLP, grouped-query
 *          attention (n_kv_head < n_head), no biases (qkv_bias: biases on the
 *          q, k and v projections only, as Qwen2 has them).
 * Both tie the output projection to the token embedding. Weights live in
 * PyTorch Linear layout ([out, in]); the Hugging Face names used for import and
 * export (fm_gpt_save_hf / fm_gpt_load_hf) transpose GPT-2's Conv1D weights and
 * split the fused QKV / gate-up projections of the Llama variant. */
#ifndef FATHOM_GPT_H
#define FATHOM_GPT_H
#include "fathom/export.h"

#include "fathom/dist.h"       /* data parallel: fm_dist, fm_dist_report */
#include "fathom/efficiency.h" /* fm_efficiency_opts: precision, checkpointing, accumulation, memory */
#include "fathom/nn.h"     /* fm_named_list: parameters with names */
#include "fathom/tensor.h"    /* fm_tensor, fm_rng */
#include "fathom/tokenizer.h" /* tokenizer kinds for training */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fm_gpt_arch { FM_GPT_GPT2 = 0, FM_GPT_LLAMA = 1 } fm_gpt_arch;
/* RoPE scaling as Hugging Face's rope_type: none; linear (positions divided by
 * factor); llama3 (low frequencies divided by factor, high ones kept, a smooth
 * blend between, set by the band factors and the original context length). */
typedef enum fm_rope_scaling { FM_ROPE_NONE = 0, FM_ROPE_LINEAR = 1, FM_ROPE_LLAMA3 = 2 } fm_rope_scaling;

typedef struct fm_gpt_config {
    fm_gpt_arch arch;
    int n_layer, n_head, n_kv_head, n_embd;
    int block_size, vocab_size;
    int ffn_hidden;    /* MLP width: GPT-2 4*n_embd, Llama about 8/3*n_embd */
    double dropout;    /* residual, attention-output and embedding dropout */
    bool bias;         /* GPT-2 only: biases in Linear and LayerNorm */
    double norm_eps;   /* 1e-5 */
    double rope_theta; /* Llama: 10000 */
    /* A separate output projection (Hugging Face's untied lm_head.weight); false:
     * the output reuses the token embedding (fathom's own models, GPT-2). */
    bool untied_head;
    fm_rope_scaling rope_scaling; /* Llama */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    /* Width of one attention head; 0: n_embd / n_head (which must then divide). Set when
     * the heads do not tile n_embd: Hugging Face configs with their own head_dim (Mistral
     * Nemo, Qwen3) and models whose heads were pruned (fathom prune --structured heads).
     * The attention then works in n_head * head_dim columns and projects back to n_embd. */
    int head_dim;
    /* Llama only: biases on the q, k and v projections (Qwen2's attention; the output
     * projection and the MLP stay without). GPT-2 has its biases through bias. */
    bool qkv_bias;
} fm_gpt_config;
/* The per-head width of a configuration: head_dim, or n_embd / n_head when it is 0. */
FM_API int fm_gpt_head_dim(const fm_gpt_config *c);

/* Defaults for an architecture (sizes of GPT-2 small / a small Llama). */
FM_API fm_gpt_config fm_gpt_config_default(fm_gpt_arch arch);
FM_API fm_status fm_gpt_config_validate(const fm_gpt_config *c);
/* "gpt2" | "llama" */
FM_API fm_status fm_gpt_arch_parse(const char *s, fm_gpt_arch *out);
FM_API const char *fm_gpt_arch_name(fm_gpt_arch a);
/* JSON (config.json beside the weights). */
FM_API fm_status fm_gpt_config_save(const fm_gpt_config *c, const char *path);
FM_API fm_status fm_gpt_config_load(const char *path, fm_gpt_config *c);

typedef struct fm_gpt fm_gpt;

/* A new model with GPT-2 style initialization (N(0, 0.02), residual projections
 * scaled by 1/sqrt(2 n_layer), zero biases, unit norms) drawn from rng (NULL:
 * global). Parameters are f32 leaves that require grad. */
FM_API fm_gpt *fm_gpt_new(const fm_gpt_config *c, fm_rng *rng);
FM_API void fm_gpt_free(fm_gpt *m);
FM_API const fm_gpt_config *fm_gpt_get_config(const fm_gpt *m);
/* Moves the parameters (with their gradients) and the RoPE tables to dev in place
 * (fm_module_to's contract: before making the optimizer); the KV caches made
 * afterwards, and generation, run there. */
FM_API fm_status fm_gpt_to(fm_gpt *m, fm_device dev);
FM_API fm_device fm_gpt_device(const fm_gpt *m);
/* Trainable parameters under fathom's own names ("h.0.attn.qkv.weight"); no_decay
 * is set on 1-D tensors (biases and norm weights). Borrowed tensors. */
FM_API const fm_named_list *fm_gpt_parameters(const fm_gpt *m);
FM_API int64_t fm_gpt_num_params(const fm_gpt *m);
FM_API void fm_gpt_train_mode(fm_gpt *m, bool training);
/* Activation checkpointing in the training forward (fathom/efficiency.h):
 * FM_CKPT_BLOCKS recomputes every block but the last during backward;
 * FM_CKPT_SELECTIVE keeps the matmul outputs and recomputes only the norms, the
 * GELU/SwiGLU and the merge of attention heads. Losses and gradients are bitwise
 * those of FM_CKPT_NONE (the default), dropout masks included. */
FM_API fm_status fm_gpt_set_checkpointing(fm_gpt *m, fm_checkpointing c);
/* GPT-2 in f32 runs fused bias + GELU and residual + LayerNorm ops (the default);
 * off: the separate ops, for measuring what the fusion buys. The two agree to
 * rounding, not bitwise. */
FM_API void fm_gpt_set_fusion(fm_gpt *m, bool on);
/* ---- tensor parallel (Megatron style; fathom/dist.h has the group and the ops) ----
 * Splits a model built whole (the same seed on every rank) over the ranks of tp, in
 * place: each rank keeps n_head/T of the heads (QKV rows; the attention output's
 * columns), ffn_hidden/T of the MLP (first projection's rows, Llama gate and up; the
 * second's columns) and vocab_size/T rows of the token embedding (and of an untied
 * lm_head); norms, wpe and the other biases are replicated. The forward then runs two
 * all-reduces per block (one after attention, one after the MLP), one after the
 * embedding, and two per block in backward; fm_gpt_forward returns this rank's V/T
 * columns of the logits (never gathered) and the loss of fm_tp_cross_entropy. Every
 * rank of tp must call it with the same batch. Before the optimizer is made; f32 CPU
 * models; no cached decoding (gather the model first). fm_gpt_tp_check: the error for
 * a T that does not fit the config (larger than n_head; not dividing n_head,
 * n_kv_head, vocab_size or ffn_hidden). */
FM_API fm_status fm_gpt_tp_check(const fm_gpt_config *c, int tp);
FM_API fm_status fm_gpt_set_tensor_parallel(fm_gpt *m, fm_dist *tp);
/* Whether param (one of fm_gpt_parameters) is split, and how (for fm_tp_gather). */
FM_API bool fm_gpt_tp_split(const fm_gpt *m, const fm_tensor *param, fm_tp_split *out);
FM_API fm_dist *fm_gpt_tp_group(const fm_gpt *m);
/* A new whole model holding the gathered parameters (a collective on the group). */
FM_API fm_gpt *fm_gpt_tp_gather_model(fm_gpt *m);
/* Copies this rank's shards of a whole model's parameters into m. */
FM_API fm_status fm_gpt_tp_load_model(fm_gpt *m, fm_gpt *full);
/* Parameters a config would have, without building the model (for memory checks). */
FM_API int64_t fm_gpt_config_num_params(const fm_gpt_config *c);
/* Generator the dropout masks come from (borrowed; NULL: the model's own). */
FM_API void fm_gpt_set_rng(fm_gpt *m, fm_rng *rng);
FM_API fm_rng *fm_gpt_rng(fm_gpt *m);

/* idx [B, T] (i64 or i32 token ids, T <= block_size). Returns logits [B, T, V].
 * With targets ([B, T], ids or -1 to ignore) *loss receives the mean
 * cross-entropy (a new scalar reference). Records the tape when grad mode is on. */
FM_API fm_tensor *fm_gpt_forward(fm_gpt *m, fm_tensor *idx, fm_tensor *targets, fm_tensor **loss);

/* ---- KV cache: incremental decoding without recomputing the prefix ---- */
typedef struct fm_gpt_kv_cache fm_gpt_kv_cache;
FM_API fm_gpt_kv_cache *fm_gpt_kv_cache_new(const fm_gpt *m, int batch);
FM_API void fm_gpt_kv_cache_free(fm_gpt_kv_cache *c);
FM_API void fm_gpt_kv_cache_reset(fm_gpt_kv_cache *c);
FM_API int fm_gpt_kv_cache_len(const fm_gpt_kv_cache *c);
/* Appends idx [B, T] (positions len .. len+T-1) and returns their logits [B, T, V].
 * No tape. Fails with a clear message when the cache would pass block_size. Under
 * bf16 autocast on the CPU each call converts the linear weights to bf16 (the
 * weights may change between calls) unless fm_gpt_keep_lowp_weights holds copies. */
FM_API fm_tensor *fm_gpt_forward_cached(fm_gpt *m, fm_tensor *idx, fm_gpt_kv_cache *c);
/* For a decode loop of your own under bf16 autocast on the CPU: on keeps a bf16 copy of
 * every linear weight, made now, which the forward's bf16 products then read instead
 * of converting each weight at every call (the weights must not change until off);
 * without bf16 autocast (or on another device) it does nothing. off drops the copies
 * (fm_gpt_free does too). fm_gpt_generate turns it on for its own loop (and off
 * after) unless the caller holds copies already. */
FM_API fm_status fm_gpt_keep_lowp_weights(fm_gpt *m, bool on);

/* ---- sampling ---- */
typedef struct fm_gpt_sample_params {
    double temperature; /* 0: greedy */
    int top_k;          /* 0: off */
    double top_p;       /* 1: off */
    uint64_t seed;
} fm_gpt_sample_params;
/* Draws a token from logits[V] (f32). draw counts the draws made so far, so a
 * sequence of samples is reproducible from the seed alone. */
FM_API int fm_gpt_sample(const float *logits, int V, const fm_gpt_sample_params *p, uint64_t draw);
/* Called with each new token as it is produced (streaming); non-zero stops. */
typedef int (*fm_gpt_token_fn)(int token, void *ctx);
/* Generates up to n_new tokens after prompt (batch 1). use_cache false re-runs the
 * whole sequence each step (the reference the cache is tested against). Stops at
 * the context limit: *out_n then holds how many were made, and *hit_limit is set.
 * out (may be NULL) receives the new tokens. Runs in the autocast precision set by
 * the caller (fm_autocast_set); under bf16 on the CPU it keeps bf16 copies of the
 * linear weights for the call (the weights must not change during it). */
FM_API fm_status fm_gpt_generate(fm_gpt *m, const int32_t *prompt, int n_prompt, int n_new,
                          const fm_gpt_sample_params *p, bool use_cache, int32_t *out, int *out_n,
                          bool *hit_limit, fm_gpt_token_fn cb, void *ctx);

/* ---- weights in Hugging Face names (safetensors) ---- */
/* GPT-2: transformer.wte.weight, transformer.h.0.attn.c_attn.weight ([in, out]), ...
 * Llama: model.embed_tokens.weight, model.layers.0.self_attn.q_proj.weight, ... */
FM_API fm_status fm_gpt_save_hf(const fm_gpt *m, const char *path);
/* Loads every tensor the architecture needs; a missing or extra name, or a shape
 * that differs, is an error naming the tensor and both shapes. Nothing changes
 * unless all checks pass. */
FM_API fm_status fm_gpt_load_hf(fm_gpt *m, const char *path);
/* The same from tensors already read (sharded checkpoints); what names the source
 * in errors. */
FM_API fm_status fm_gpt_load_hf_tensors(fm_gpt *m, const fm_named_list *l, const char *what);

/* ---- token files: a versioned header then little-endian ids ----
 * offset 0: "FMTOKENS" | u32 version (1) | u32 vocab_size | u32 token bytes (2|4) |
 * u32 reserved (0) | u64 count | count ids. */
FM_API fm_status fm_token_file_write(const char *path, const int32_t *ids, int64_t n, int vocab_size);
typedef struct fm_token_data {
    int32_t *ids;
    int64_t n;
    int vocab_size;
} fm_token_data;
/* Validates magic, version, width, count against the file size, and every id
 * against the vocabulary; expect_vocab > 0 must equal the header's. */
FM_API fm_status fm_token_file_read(const char *path, int expect_vocab, fm_token_data *out);
FM_API void fm_token_data_free(fm_token_data *d);

/* Training windows: x and y [B, T] (i64) drawn from ids[lo, hi). Random windows
 * are a pure function of (seed, step), so resuming needs only the step; eval
 * windows walk [lo, hi) in order (window i starts at lo + i*T). */
FM_API fm_status fm_gpt_batch_random(const fm_token_data *d, int64_t lo, int64_t hi, int B, int T, uint64_t seed,
                              int64_t step, fm_tensor **x, fm_tensor **y);
/* Rows [first, first + rows) of that batch of B (a data-parallel rank's part): the same
 * windows fm_gpt_batch_random puts there. */
FM_API fm_status fm_gpt_batch_random_rows(const fm_token_data *d, int64_t lo, int64_t hi, int B, int T, uint64_t seed,
                                          int64_t step, int first, int rows, fm_tensor **x, fm_tensor **y);
FM_API fm_status fm_gpt_batch_eval(const fm_token_data *d, int64_t lo, int64_t hi, int B, int T, int64_t index,
                            fm_tensor **x, fm_tensor **y);

/* ---- training (the `fathom train` flow for GPT recipes) ----
 * Reads the corpus ("kjv": the King James Bible from Debian's bible-kjv, verse
 * numbers stripped; anything else: a UTF-8 text file), trains or reuses the
 * tokenizer, writes out_dir/tokens.bin once, then trains with AdamW (decay on
 * 2-D weights only), warmup + cosine, clipping, periodic validation on the last
 * val_fraction of the tokens, and checkpoints that resume exactly. out_dir then
 * holds config.json, tokenizer.txt, model.safetensors (Hugging Face names) and
 * train_state.safetensors (optimizer moments, step, RNG), the newest checkpoint's
 * files, and ckpt/step-N/ with the complete checkpoints that resume reads. */
typedef struct fm_gpt_train_opts {
    fm_gpt_config model;
    const char *out_dir;
    const char *corpus;
    fm_tokenizer_kind tokenizer;
    int tokenizer_vocab; /* bpe */
    double val_fraction;
    int batch_size;
    int64_t steps, warmup;
    double lr, min_lr, weight_decay, beta1, beta2, grad_clip;
    int64_t eval_every, ckpt_every, log_every;
    int eval_batches;
    uint64_t seed;
    bool resume;
    int64_t stop_after; /* > 0: stop (with a checkpoint) after this step, as an interruption would */
    int sample_tokens;  /* > 0: print a sample at each evaluation */
    bool quiet;
    /* precision (autocast for the forward passes, training and validation; fp16 adds
     * the dynamic loss scaler), checkpointing, gradient accumulation (batch_size is
     * split into grad_accum micro-batches of the same windows) and the allocator's
     * mode and limit; checked with fm_efficiency_validate before anything is read */
    fm_efficiency_opts eff;
    /* observability (fathom/profile.h, fathom/observe.h): a Chrome trace of the run
     * (step, data and optimizer spans around the ops) and TensorBoard scalars every
     * log_every steps (train/loss, lr, throughput, grad_norm, loss_scale with fp16,
     * memory) and at each evaluation (val/loss); NULL: none */
    const char *profile_path;
    const char *logdir;
    /* with logdir: histograms of the weights ("weights/<name>", after the optimizer
     * step) and of their gradients ("grads/<name>", unscaled, before clipping) every
     * hist_every steps; 0: none. Progress goes to stderr through fm_progress (a
     * redrawn line on a terminal, plain lines otherwise; quiet: nothing). */
    int64_t hist_every;
    /* durability: each checkpoint is out_dir/ckpt/step-N, committed whole (a MANIFEST
     * with checksums, one rename) and linked to out_dir/; the newest keep_checkpoints
     * (>= 1, default 2) are kept. A loss over divergence_factor x its running minimum
     * (at least 0.01) stops the run (0: off; default 1e3), as a non-finite one does. */
    int keep_checkpoints;
    double divergence_factor;
    /* > 0: train this many passes over the training tokens instead of `steps`
     * (steps = ceil(epochs * train tokens / (batch_size * block_size))) */
    int epochs;
    bool no_eval; /* no validation (periodic or final) */
    /* Data parallel over the ranks of `dist` (NULL or a world of one: this process alone):
     * batch_size is the whole batch, which must split evenly over the ranks; rank r
     * trains on windows [r*B/N, (r+1)*B/N) of each step's batch (fm_gpt_batch_random_rows)
     * and validates on every N-th eval batch; rank 0 writes the data files, checkpoints
     * and the model (give the other ranks quiet, no logdir, no profile). zero: 1 shards
     * the AdamW moments (ZeRO-1). bucket_bytes: 0 for 25 MiB. */
    fm_dist *dist;
    int zero;
    size_t bucket_bytes;
    /* > 1: tensor parallel (Megatron) over groups of this many ranks of dist, data parallel
     * across the groups (world = tensor_parallel x data parallel; ranks r / T form a group).
     * The model is built whole from the seed and split (fm_gpt_set_tensor_parallel);
     * checkpoints hold the whole, unsplit parameters and optimizer state, so they resume at
     * any split. fp32 or bf16 on the CPU; ZeRO-1 over the data-parallel ranks; checkpointing
     * blocks (not selective); no samples. */
    int tensor_parallel;
    /* Knowledge distillation (fathom/distill.h, fm_gpt_distill). tokenizer_file: encode the
     * corpus with this tokenizer.txt (the teacher's) instead of building one from the
     * recipe's tokenizer keys; a tokenizer already in out_dir must be the same file. loss:
     * NULL for the model's own cross entropy; else the loss of each micro-batch from the
     * student's logits [B, T, V] (on the tape), its inputs [B, T] and its targets [B, T].
     * Not with tensor_parallel > 1 (the logits are split by vocabulary there). */
    const char *tokenizer_file;
    fm_tensor *(*loss)(void *ctx, fm_tensor *logits, fm_tensor *x, fm_tensor *y);
    void *loss_ctx;
    /* A model.safetensors (fm_gpt_save_hf's names, the config's shapes) to start from
     * instead of the seed's initialization: fine-tuning, e.g. of a pruned model. A resumed
     * run takes its checkpoint's weights instead. */
    const char *init_weights;
} fm_gpt_train_opts;
FM_API fm_gpt_train_opts fm_gpt_train_defaults(void);
/* final_* (may be NULL) receive the last training and validation losses. */
FM_API fm_status fm_gpt_train(const fm_gpt_train_opts *o, double *final_train_loss, double *final_val_loss);
typedef struct fm_gpt_train_result {
    double train_loss, val_loss;  /* last training loss, last validation loss (NAN: none yet) */
    int64_t steps;                /* optimizer steps done in total (a resumed run counts from 0) */
    double train_seconds;         /* this invocation's training loop */
    double tokens_per_second;
    double data_seconds;          /* time spent cutting batches out of the token file */
    double loss_scale;            /* fp16: the scaler's scale at the end; else 1 */
    int64_t skipped_steps;        /* fp16: steps skipped for inf/NaN gradients (this invocation) */
    size_t peak_memory_bytes;     /* allocator peak during training */
    int64_t num_params;
    int64_t total_steps;          /* the run's length (steps, or what epochs made of it) */
    char memory_report_json[1024];/* peak by category (fm_memory_report_json) */
    char memory_report_text[1024];
    fm_dist_report dist;          /* world size, communication time and bytes (world_size 1: none) */
} fm_gpt_train_result;
/* fm_gpt_train with the whole result (res may be NULL). */
FM_API fm_status fm_gpt_train_ex(const fm_gpt_train_opts *o, fm_gpt_train_result *res);
/* Loads out_dir's config.json + model.safetensors (+ tokenizer.txt when tok != NULL). */
FM_API fm_gpt *fm_gpt_load_dir(const char *dir, fm_tokenizer **tok);

/* ---- GPT recipes: .ini files with [model] type = gpt ----
 * [model] type, arch, n_layer, n_head, n_kv_head, n_embd, block_size, ffn_hidden,
 * dropout, bias; [tokenizer] kind, vocab_size; [data] corpus, val_fraction;
 * [train] batch_size, steps, warmup, lr, min_lr, weight_decay, beta1, beta2,
 * grad_clip, eval_every, eval_batches, ckpt_every, log_every, sample_tokens, seed,
 * keep_checkpoints, divergence_factor (each range-checked: a bad value names the
 * key, the value and the range);
 * [recipe] name, description (informational). */
typedef struct fm_gpt_recipe {
    fm_gpt_train_opts opts; /* fm_gpt_train_defaults() with the recipe's keys applied */
    char *corpus;           /* [data] corpus when the recipe names one (opts.corpus points here) */
} fm_gpt_recipe;
/* Reads a recipe. An unknown key, a value that is not a number where one is
 * expected, an unknown arch or tokenizer kind, or a type other than gpt is
 * FM_ERR_INVALID "PATH: line N: what"; an unreadable file FM_ERR_IO. Nothing to
 * free on failure. */
FM_API fm_status fm_gpt_recipe_load(const char *path, fm_gpt_recipe *out);
FM_API void fm_gpt_recipe_free(fm_gpt_recipe *r);
/* Whether path is a readable .ini whose [model] type is gpt. */
FM_API bool fm_gpt_recipe_is_gpt(const char *path);

#ifdef __cplusplus
}
#endif
#endif
