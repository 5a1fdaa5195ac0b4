/* fathom/optim.h: optimizers (SGD, Adam, AdamW) and learning-rate schedules.
 *
 * An optimizer holds parameters in groups; each group has its own weight decay
 * (fm_optim_add_params puts biases and normalization weights in a no-decay
 * group, as is usual). Its state (momentum buffers, Adam moments, step count)
 * is exposed as named tensors so checkpoints can save and restore it exactly.
 * A schedule is a pure function of the step, so resuming needs only the step. */
#ifndef FATHOM_OPTIM_H
#define FATHOM_OPTIM_H
#include "fathom/export.h"
#include "fathom/nn.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fm_optim_kind { FM_OPTIM_SGD = 0, FM_OPTIM_ADAM, FM_OPTIM_ADAMW } fm_optim_kind;

typedef struct fm_optim_config {
    fm_optim_kind kind;
    double lr;
    double weight_decay;  /* SGD/Adam: L2 added to the gradient; AdamW: decoupled */
    double momentum;      /* SGD */
    double dampening;     /* SGD */
    bool nesterov;        /* SGD */
    double beta1, beta2, eps; /* Adam/AdamW */
} fm_optim_config;

/* Sensible defaults for a kind (PyTorch's: lr 1e-3, betas 0.9/0.999, eps 1e-8,
 * AdamW weight decay 0.01, SGD momentum 0). */
FM_API fm_optim_config fm_optim_default_config(fm_optim_kind kind);
FM_API fm_status fm_optim_kind_parse(const char *name, fm_optim_kind *out);
FM_API const char *fm_optim_kind_name(fm_optim_kind kind);

typedef struct fm_optim fm_optim;
typedef fm_optim fm_optimizer;
FM_API fm_optim *fm_optim_new(const fm_optim_config *cfg);
/* Short forms: an optimizer over all of m's parameters (no decay on biases/norms). */
FM_API fm_optim *fm_optim_sgd(fm_module *m, double lr, double momentum, double weight_decay);
FM_API fm_optim *fm_optim_adamw(fm_module *m, double lr, double beta1, double beta2, double eps, double weight_decay);
FM_API void fm_optim_free(fm_optim *o);
/* A group with its own weight decay; returns its index or -1. */
FM_API int fm_optim_add_group(fm_optim *o, double weight_decay);
/* Adds one parameter (f32, f64, bf16 or f16, contiguous, requires grad) to a
 * group. The name keys its state in checkpoints. The optimizer keeps a reference.
 * A bf16/f16 parameter gets an f32 master copy (made from it when the state is
 * first made) and f32 moments: each step updates the master in f32 from the
 * widened gradient and writes the parameter as the master rounded to nearest even,
 * so the master follows the path of an f32 parameter fed the same gradients. The
 * master is the truth from then on: a parameter changed behind the optimizer's
 * back is overwritten at the next step (load checkpoints through fm_optim_state). */
FM_API fm_status fm_optim_add_param(fm_optim *o, int group, const char *name, fm_tensor *p);
/* All of a module's parameters: group 0 gets the config's weight decay, group 1
 * (biases, norm weights: fm_named_tensor.no_decay) gets none. */
FM_API fm_status fm_optim_add_params(fm_optim *o, fm_module *m);

/* One update with the current learning rate. Parameters without .grad are skipped. */
FM_API fm_status fm_optim_step(fm_optim *o);
FM_API void fm_optim_zero_grad(fm_optim *o);
FM_API void fm_optim_set_lr(fm_optim *o, double lr);
FM_API double fm_optim_get_lr(const fm_optim *o);
FM_API int64_t fm_optim_get_step(const fm_optim *o);
FM_API void fm_optim_set_step(fm_optim *o, int64_t step);
/* Scales all gradients so their global L2 norm is at most max_norm; *total_norm
 * (may be NULL) receives the norm before clipping (inf/nan when a grad is). */
FM_API fm_status fm_optim_clip_grad_norm(fm_optim *o, double max_norm, double *total_norm);
/* State tensors, named "<param>.<slot>" (slot: momentum_buffer, exp_avg, exp_avg_sq,
 * and master_weight for a bf16/f16 parameter: its f32 master copy).
 * Borrowed: they stay the optimizer's. Buffers are created on first use, so
 * call after one step or fm_optim_init_state(). */
FM_API fm_status fm_optim_init_state(fm_optim *o);
FM_API fm_status fm_optim_state(fm_optim *o, fm_named_list *out);

/* Inspection, for a layer that builds another optimizer from this one's setup
 * (ZeRO-1 in src/dist shards the parameters of a full optimizer). */
FM_API const fm_optim_config *fm_optim_get_config(const fm_optim *o);
FM_API int fm_optim_param_count(const fm_optim *o);
/* Parameter i (in the order added): its name and tensor (borrowed) and its group's weight decay. */
FM_API fm_status fm_optim_param_at(const fm_optim *o, int i, const char **name, fm_tensor **p, double *weight_decay);
/* An optimizer that holds a part of the gradients (a shard) needs the global norm
 * for clipping: fn replaces *sum_sq, the local sum of squared gradient elements,
 * with the sum over every part. NULL: local (the default). */
FM_API void fm_optim_set_norm_reduce(fm_optim *o, fm_status (*fn)(double *sum_sq, void *ctx), void *ctx);

/* ---- learning-rate schedules ---- */
typedef enum fm_sched_kind { FM_SCHED_CONSTANT = 0, FM_SCHED_STEP, FM_SCHED_WARMUP, FM_SCHED_COSINE } fm_sched_kind;
typedef struct fm_lr_schedule {
    fm_sched_kind kind;
    double base_lr;
    int64_t warmup_steps; /* linear ramp from 0 to base_lr (all kinds) */
    int64_t total_steps;  /* cosine: the step where min_lr is reached */
    int64_t step_size;    /* step: multiply by gamma every step_size steps */
    double gamma;
    double min_lr;        /* cosine floor */
} fm_lr_schedule;
FM_API fm_status fm_sched_kind_parse(const char *name, fm_sched_kind *out);
FM_API const char *fm_sched_kind_name(fm_sched_kind kind);
/* Learning rate for the update at `step` (0-based). */
FM_API double fm_lr_at(const fm_lr_schedule *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
