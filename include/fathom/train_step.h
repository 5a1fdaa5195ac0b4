/* fathom/train_step.h: the optimizer step every trainer runs (`fathom train` for
 * classifier recipes, src/recipe, and for GPT recipes, src/gpt): micro-batches for
 * gradient accumulation, autocast, the fp16 loss scaler, backward, unscaling,
 * clipping and the optimizer, in one place, with the points a device or a
 * distributed-communication layer plugs into.
 *
 *   fm_train_step s;  fm_train_step_init(&s, &eo, opt, n, params, loss_fn, ctx);
 *   s.clip = 1.0;  s.hooks = &my_hooks;            (optional)
 *   per step:  fm_train_step_backward(&s, x, y, &loss)  -- forward + backward of every micro-batch
 *              (the trainer checks the loss here: a non-finite one stops before any update)
 *              fm_train_step_update(&s, &norm)          -- unscale, clip, optimizer, scaler update
 *
 * Each micro-batch is copied to eo->device when it is elsewhere (the model is moved
 * there by its trainer with fm_module_to / fm_gpt_to before the optimizer is made).
 * The hooks run in this order within a step:
 *   micro_begin(k, n) -> to_device(x, y) per micro-batch -> forward/backward -> after_backward (all micro-batches done,
 *   gradients still scaled: where a data-parallel all-reduce goes) -> unscale -> grads_ready
 *   (unscaled, before clipping: histograms) -> clip -> optimizer -> gradients freed -> after_update. */
#ifndef FATHOM_TRAIN_STEP_H
#define FATHOM_TRAIN_STEP_H
#include "fathom/export.h"
#include "fathom/amp.h"        /* fm_grad_scaler */
#include "fathom/efficiency.h" /* fm_efficiency_opts */
#include "fathom/io.h"         /* fm_kv_list */
#include "fathom/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The model's forward and loss on one micro-batch (x, y as given to the step, cut
 * along dim 0): returns the mean loss over its samples as a new scalar reference,
 * with the tape recorded, or NULL with the error set. */
typedef fm_tensor *(*fm_train_loss_fn)(void *ctx, fm_tensor *x, fm_tensor *y);

typedef struct fm_train_hooks {
    void *user;
    /* Replaces *x and *y (new references; release the old ones), after the step has
     * moved them to eo->device: e.g. a staged or asynchronous copy. NULL: none. */
    fm_status (*to_device)(void *user, fm_tensor **x, fm_tensor **y);
    /* Before micro-batch k of n (k = n - 1: the last, whose backward leaves the step's
     * final gradients; a data-parallel layer reduces only then). NULL: none. */
    fm_status (*micro_begin)(void *user, int k, int n);
    fm_status (*after_backward)(void *user, fm_optim *opt);
    fm_status (*grads_ready)(void *user, fm_optim *opt);
    fm_status (*after_update)(void *user, fm_optim *opt, bool stepped);
} fm_train_hooks;

typedef struct fm_train_step {
    const fm_efficiency_opts *eo;  /* precision, grad_accum, loss_scaling (borrowed) */
    fm_optim *opt;
    int n_params;
    fm_tensor *const *params;      /* what the scaler unscales (borrowed) */
    fm_train_loss_fn loss_fn;
    void *loss_ctx;
    double clip;                   /* > 0: clip the global norm to this; 0: off */
    double loss_weight;            /* multiplies the loss backward sees, not the one reported (1: none;
                                    * data parallel: this rank's share of an uneven batch) */
    bool want_norm;                /* compute the norm even without clipping (for logs) */
    const fm_train_hooks *hooks;   /* a device's or a data-parallel layer's (may be NULL) */
    /* the trainer's own look at the unscaled gradients before clipping (histograms);
     * called with loss_ctx after hooks->grads_ready; may be NULL */
    fm_status (*inspect_grads)(void *loss_ctx);
    fm_grad_scaler scaler;         /* on when eo->loss_scaling; saved by fm_train_step_state_save */
    double divergence_factor;      /* > 0: fm_train_step_check_loss stops the run on a loss over this x
                                    * its running minimum (floored at 0.01); 0: no divergence check */
    double loss_min;               /* the running minimum of the checked losses (NaN: none yet) */
    /* the last step */
    double grad_norm;              /* NAN when not computed */
    bool stepped;                  /* false when fp16 found inf/NaN gradients and skipped */
} fm_train_step;

FM_API void fm_train_step_init(fm_train_step *s, const fm_efficiency_opts *eo, fm_optim *opt, int n_params,
                               fm_tensor *const *params, fm_train_loss_fn loss_fn, void *loss_ctx);
/* Zeroes the gradients, then forward and backward over eo->grad_accum micro-batches of x
 * and y (dim 0 cut in near-equal parts; each loss weighted by its share of the samples,
 * so the gradients are those of the mean over the whole batch). *loss gets that mean,
 * summed on eo->device in f64 and read once: the step's only wait for the device. */
FM_API fm_status fm_train_step_backward(fm_train_step *s, fm_tensor *x, fm_tensor *y, double *loss);
/* Unscale, clip, the optimizer step (skipped for fp16 inf/NaN) and the scaler's update. */
FM_API fm_status fm_train_step_update(fm_train_step *s);
/* The check every trainer runs on the step's loss between backward and update. Returns
 * false, with why (a sentence, no trailing period) in why[0..why_size), when the run
 * must stop: the loss is not finite (without the fp16 scaler, which skips such steps),
 * or it is over divergence_factor x its running minimum. Otherwise true, and loss_min
 * follows the loss. */
FM_API bool fm_train_step_check_loss(fm_train_step *s, double loss, char *why, size_t why_size);
/* What a resumed run needs to go on exactly as an uninterrupted one, to and from a
 * checkpoint's metadata: the fp16 scaler's scale and growth tracker (when the scaler is
 * on; keys loss_scale, loss_scale_growth_tracker) and the loss's running minimum
 * (loss_min, when there is one). Loading leaves what is absent as it is (older
 * checkpoints, or an fp32 run resuming an fp16 one); a value that is present and not a
 * valid number is an FM_ERR_FORMAT naming the key. */
FM_API fm_status fm_train_step_state_save(const fm_train_step *s, fm_kv_list *meta);
FM_API fm_status fm_train_step_state_load(fm_train_step *s, const fm_kv_list *meta);

/* Batches uploaded one step ahead (src/efficiency/stage.c), for a device other than the
 * cpu. A trainer takes batch N (on the device), puts batch N+1, then runs step N: put
 * copies the host batch into the backend's staging memory (CUDA: page-locked) and queues
 * its upload (CUDA: on the copy stream, which compute does not wait for yet), so the
 * upload overlaps step N's compute; take orders the compute queued afterwards after the
 * upload (an event: the host does not wait) and hands over the device tensors (new
 * references). put's x and y may be overwritten or released when it returns. The loss
 * is read once per step (fm_train_step_backward), the only wait in a step. */
typedef struct fm_batch_stage fm_batch_stage;
FM_API fm_batch_stage *fm_batch_stage_new(fm_device dev); /* NULL (error set) for the cpu or a bad device */
FM_API fm_status fm_batch_stage_put(fm_batch_stage *s, const fm_tensor *x, const fm_tensor *y);
FM_API fm_status fm_batch_stage_take(fm_batch_stage *s, fm_tensor **x, fm_tensor **y); /* oldest first */
FM_API int fm_batch_stage_count(const fm_batch_stage *s);                             /* staged, not taken */
FM_API void fm_batch_stage_clear(fm_batch_stage *s);                                  /* drops staged batches */
FM_API void fm_batch_stage_free(fm_batch_stage *s);

#ifdef __cplusplus
}
#endif
#endif
