/* fathom/amp.h: automatic mixed precision (autocast), as in torch.autocast.
 *
 * While a low-precision dtype (FM_BF16 or FM_F16) is set on the calling thread,
 * each op treats its float inputs as the prec column of fathom/ops.def says:
 * matmul and linear, conv2d and attention cast them to that dtype and compute
 * with f32 accumulation, returning low-precision results, so the activations
 * they save for backward take half the memory; binary elementwise ops accept
 * mixed float dtypes and promote to the wider one; softmax, norms and losses
 * compute in f32; the rest run in their inputs' dtypes. Master weights stay f32:
 * gradients flow back through the casts as f32. Outside autocast, mixed dtypes
 * remain an error. (The policy is applied in src/amp/autocast.c.) */
#ifndef FATHOM_AMP_H
#define FATHOM_AMP_H
#include "fathom/export.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FM_F32 turns autocast off. Returns the previous setting (for nesting). */
FM_API fm_dtype fm_autocast_set(fm_dtype dt);
FM_API fm_dtype fm_autocast_get(void);
/* Parses "fp32" | "bf16" | "fp16" (also "f32", "float32", "bfloat16", "f16", "float16"). */
FM_API fm_status fm_precision_parse(const char *s, fm_dtype *out);
FM_API const char *fm_precision_name(fm_dtype dt); /* "fp32" | "bf16" | "fp16" */

/* ---- dynamic loss scaling for fp16 (PyTorch GradScaler semantics) ----
 * Usage per step, with any optimizer:
 *   fm_tensor *sl = fm_grad_scaler_scale(&gs, loss);  fm_backward(sl, ...);
 *   fm_grad_scaler_unscale(&gs, n, params);           (grads /= scale, checks inf/NaN)
 *   if (fm_grad_scaler_should_step(&gs)) fm_optim_step(opt);
 *   fm_grad_scaler_update(&gs);                       (backs off or grows the scale)
 * unscale may come before clipping; update() without unscale() unscales first.
 * Gradient accumulation: scale every micro-batch's loss, unscale once. */
typedef struct fm_grad_scaler {
    bool enabled;            /* false: scale 1, never skips (fp32/bf16) */
    double scale;            /* 65536 */
    double growth_factor;    /* 2 */
    double backoff_factor;   /* 0.5 */
    int growth_interval;     /* 2000 clean steps */
    int growth_tracker;      /* clean steps since the last change */
    int warn_after;          /* warn on stderr after this many consecutive skips (0: never) */
    bool quiet;              /* no warning (tests) */
    /* state of the current step */
    bool unscaled, found_inf;
    /* reported */
    int64_t n_steps, n_skipped, n_consecutive_skipped;
    bool warned;
} fm_grad_scaler;
FM_API void fm_grad_scaler_init(fm_grad_scaler *s, bool enabled);
/* loss * scale (a new reference; a new ref to loss when disabled). */
FM_API fm_tensor *fm_grad_scaler_scale(fm_grad_scaler *s, fm_tensor *loss);
/* Divides every .grad in place by the scale (inverse computed in f64) and records
 * whether any is inf/NaN. Parameters without .grad are skipped. */
FM_API fm_status fm_grad_scaler_unscale(fm_grad_scaler *s, int n, fm_tensor *const *params);
FM_API bool fm_grad_scaler_should_step(const fm_grad_scaler *s);
/* Ends the step: inf/NaN -> skipped, scale *= backoff, tracker reset; else after
 * growth_interval clean steps scale *= growth (if finite). */
FM_API void fm_grad_scaler_update(fm_grad_scaler *s);
/* true if any element of t is inf or NaN (float tensors; any device with ops). */
FM_API bool fm_tensor_has_inf_nan(fm_tensor *t);

/* ---- low-precision weight copies ----
 * Writes src (f32) into dst (bf16 or f16, same shape, contiguous). With
 * stochastic rounding (bf16 only) each element rounds up with probability equal
 * to its distance from the lower bf16 neighbour, from Philox draws at rng's
 * offset (advanced by the element count), so repeated small updates are not
 * lost to round-to-nearest. rng NULL: the global generator. */
FM_API fm_status fm_amp_copy_lowp_(fm_tensor *dst, fm_tensor *src, bool stochastic, fm_rng *rng);
/* The scalar rule used above: r is a uniform 32-bit draw (its low 16 bits are used). */
FM_API uint16_t fm_f32_to_bf16_stochastic(float f, uint32_t r);

#ifdef __cplusplus
}
#endif
#endif
