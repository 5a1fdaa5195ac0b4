/* fathom/efficiency.h: the training-efficiency options behind --precision,
 * --grad-accum, --checkpointing and --memory-limit/--memory-mode, their
 * validation, and helpers a training loop calls at fixed places.
 *
 * How a training loop uses them (the GPT and generic `fathom train` loops):
 *   fm_efficiency_opts eo = fm_efficiency_defaults();  ...parse flags into eo...
 *   fm_efficiency_validate(&eo, is_transformer, batch);       before anything else
 *   fm_efficiency_apply_memory(&eo);                           allocator mode + limit
 *   fm_efficiency_check_fits(&eo, n_params, optimizer_slots); before training starts
 *   per optimizer step: for each of eo.grad_accum micro-batches of batch/grad_accum:
 *       prev = fm_autocast_set(eo.precision) (fp32: off); loss = forward(...);
 *       fm_autocast_set(prev); scaled = fm_grad_scaler_scale(&gs, loss * 1/grad_accum);
 *       fm_backward(scaled)
 *     then fm_grad_scaler_unscale, clip, if should_step: optimizer step; update.
 *   transformer blocks: fm_efficiency_segment(&eo, FM_CKPT_BLOCKS, block_fn, ...), all but
 *       the last block (backward needs its activations first: recomputing them saves nothing)
 *   selective: every linear whose input is a norm, GELU or the attention core:
 *       fm_efficiency_linear(&eo, f, ctx, n_in, inputs, w, b)  (f = that cheap part)
 *   memory report: tag allocations with fm_memory_tag_push (fathom/memory.h):
 *       WEIGHTS around model creation, OPTIMIZER around optimizer state creation,
 *       ACTIVATIONS around forward, GRADIENTS around backward; at the end print
 *       fm_memory_report_format() and put fm_memory_report_json() in --json. */
#ifndef FATHOM_EFFICIENCY_H
#define FATHOM_EFFICIENCY_H
#include "fathom/export.h"
#include "fathom/amp.h"
#include "fathom/autograd.h"
#include "fathom/memory.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fm_checkpointing { FM_CKPT_NONE = 0, FM_CKPT_BLOCKS = 1, FM_CKPT_SELECTIVE = 2 } fm_checkpointing;
FM_API fm_status fm_checkpointing_parse(const char *s, fm_checkpointing *out); /* none | blocks | selective */
FM_API const char *fm_checkpointing_name(fm_checkpointing c);

typedef struct fm_efficiency_opts {
    fm_dtype precision;           /* FM_F32 | FM_BF16 | FM_F16 */
    int grad_accum;               /* >= 1 micro-batches per step */
    fm_checkpointing checkpointing;
    bool loss_scaling;            /* dynamic loss scaling; default on for fp16 only */
    bool stochastic_rounding;     /* bf16 weight copies */
    size_t memory_limit;          /* 0: none (FATHOM_MEMORY_LIMIT still applies) */
    fm_memory_mode memory_mode;
    size_t prealloc_bytes;        /* preallocate: size, or */
    double prealloc_fraction;     /* fraction of the limit (or of physical memory) */
    int data_workers;             /* >= 0 */
    fm_device device;             /* where the model trains: the memory limit, mode and the fit check
                                   * apply to its allocator, and fm_train_step moves batches there */
} fm_efficiency_opts;
FM_API fm_efficiency_opts fm_efficiency_defaults(void);
/* Clear FM_ERR_INVALID errors for bad values and combinations: unknown precision,
 * grad_accum < 1 or not dividing the batch, checkpointing on a model that is not
 * a transformer, loss scaling with fp32 or bf16, stochastic rounding without
 * bf16, preallocation options in grow mode or larger than the limit. batch <= 0:
 * not checked. Call after the options are final (fp16 turns loss_scaling on). */
FM_API fm_status fm_efficiency_validate(const fm_efficiency_opts *o, bool is_transformer, int batch);
/* Configures o->device's allocator (mode, reserve, limit). */
FM_API fm_status fm_efficiency_apply_memory(const fm_efficiency_opts *o);
/* Before training starts: fails with FM_ERR_OOM and the numbers when o->device's memory
 * limit cannot hold weights + gradients + optimizer state (optimizer_slots f32
 * tensors per parameter: SGD 0-1, Adam/AdamW 2). */
FM_API fm_status fm_efficiency_check_fits(const fm_efficiency_opts *o, int64_t n_params, int optimizer_slots);
/* As fm_efficiency_check_fits, with the optimizer state sharded over state_shards ranks
 * (ZeRO-1: this rank holds 1/state_shards of it, rounded up; 1: all of it). Sharded, the
 * larger of the step (weights, gradients, this rank's state) and a checkpoint (weights,
 * this rank's state and the whole state, which a checkpoint gathers on every rank). */
FM_API fm_status fm_efficiency_check_fits_sharded(const fm_efficiency_opts *o, int64_t n_params, int optimizer_slots,
                                                  int state_shards);
/* As fm_efficiency_check_fits_sharded; ckpt_gathers = false for a run whose checkpoints
 * write each rank's shard as it is (no gather): then only the step counts (weights,
 * gradients, this rank's state; a checkpoint's copy of the shard is smaller than the
 * gradients it comes after), (8 + 4 x optimizer_slots / state_shards) bytes a parameter. */
FM_API fm_status fm_efficiency_check_fits_zero(const fm_efficiency_opts *o, int64_t n_params, int optimizer_slots,
                                               int state_shards, bool ckpt_gathers);
/* Runs fn through fm_checkpoint when o->checkpointing == level, else directly
 * (with the tape as usual). o may be NULL (direct). */
FM_API fm_status fm_efficiency_segment(const fm_efficiency_opts *o, fm_checkpointing level, fm_segment_fn fn, void *ctx,
                                int n_in, fm_tensor *const *inputs, int n_out, fm_tensor **outputs);

/* Selective recomputation: y = fm_linear(f(inputs), w, b) where f (one output:
 * a norm, GELU, the attention core) is run without keeping its output; backward
 * re-runs only f (same RNG draws and autocast) and applies the linear's gradient
 * directly, so the matmul is never repeated. Parameters f uses through ctx get
 * their gradients during that backward. At most 5 inputs; b may be NULL.
 * As with fm_checkpoint, ctx is used again during backward: it must outlive it
 * (keep it in the model, not on the forward's stack). */
FM_API fm_tensor *fm_linear_recompute(fm_segment_fn f, void *ctx, int n_in, fm_tensor *const *inputs, fm_tensor *w, fm_tensor *b);
/* fm_linear_recompute when o->checkpointing is selective (and grad mode is on),
 * else f then fm_linear with the tape as usual. */
FM_API fm_tensor *fm_efficiency_linear(const fm_efficiency_opts *o, fm_segment_fn f, void *ctx, int n_in,
                                fm_tensor *const *inputs, fm_tensor *w, fm_tensor *b);

#ifdef __cplusplus
}
#endif
#endif
