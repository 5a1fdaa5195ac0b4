/* Dynamic loss scaling (PyTorch GradScaler semantics) and low-precision weight
 * copies with optional stochastic rounding.
 *
 * Why a scaler: fp16 has 5 exponent bits, so small gradients flush to zero; the
 * loss is multiplied by a large power of two before backward and the gradients
 * divided by it afterwards. An inf/NaN means the scale was too large: the step is
 * skipped and the scale halved. Because the scale is a power of two, scaling and
 * unscaling are exact in binary floating point. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fathom/amp.h"
#include "fathom/ops.h"

void fm_grad_scaler_init(fm_grad_scaler *s, bool enabled) {
    memset(s, 0, sizeof *s);
    s->enabled = enabled;
    s->scale = enabled ? 65536.0 : 1.0;
    s->growth_factor = 2.0;
    s->backoff_factor = 0.5;
    s->growth_interval = 2000;
    s->warn_after = 10;
}

fm_tensor *fm_grad_scaler_scale(fm_grad_scaler *s, fm_tensor *loss) {
    if (!loss) { fm_set_error(FM_ERR_INVALID, "grad scaler: loss is NULL"); return NULL; }
    if (!s->enabled) return fm_tensor_retain(loss);
    /* a low-precision loss would overflow when scaled: scale in f32 */
    fm_tensor *l32 = loss->dtype == FM_F16 || loss->dtype == FM_BF16 ? fm_to_dtype(loss, FM_F32) : fm_tensor_retain(loss);
    fm_tensor *y = l32 ? fm_mul_scalar(l32, s->scale) : NULL;
    fm_tensor_release(l32);
    return y;
}

bool fm_tensor_has_inf_nan(fm_tensor *t) {
    if (!t || !fm_dtype_is_float(t->dtype)) return false;
    if (t->storage->device.type == FM_DEV_CPU && fm_tensor_is_contiguous(t) && (t->dtype == FM_F32 || t->dtype == FM_F64)) {
        int64_t n = fm_tensor_numel(t);
        if (t->dtype == FM_F32) {
            const float *d = fm_tensor_data(t);
            for (int64_t i = 0; i < n; i++) if (!isfinite(d[i])) return true;
        } else {
            const double *d = fm_tensor_data(t);
            for (int64_t i = 0; i < n; i++) if (!isfinite(d[i])) return true;
        }
        return false;
    }
    /* any device: inf and NaN both propagate through a sum of absolute values
     * computed in f64 (no finite f32 data can overflow it) */
    fm_tensor *w = fm_to_dtype(t, FM_F64), *a = w ? fm_abs(w) : NULL, *sm = a ? fm_sum(a, 0, NULL, false) : NULL;
    bool bad = sm ? !isfinite(fm_tensor_item(sm)) : true;
    fm_tensor_release_n(3, w, a, sm);
    return bad;
}

static fm_status unscale_one(fm_tensor *g, double inv, bool *found) {
    if (g->storage->device.type == FM_DEV_CPU && fm_tensor_is_contiguous(g) && (g->dtype == FM_F32 || g->dtype == FM_F64)) {
        int64_t n = fm_tensor_numel(g);
        bool bad = false;
        if (g->dtype == FM_F32) {
            float *d = fm_tensor_data(g), fi = (float)inv; /* exact: inv is a power of two */
            for (int64_t i = 0; i < n; i++) { bad |= !isfinite(d[i]); d[i] *= fi; }
        } else {
            double *d = fm_tensor_data(g);
            for (int64_t i = 0; i < n; i++) { bad |= !isfinite(d[i]); d[i] *= inv; }
        }
        *found |= bad;
        return FM_OK;
    }
    *found |= fm_tensor_has_inf_nan(g);
    fm_tensor *m = fm_mul_scalar(g, inv);
    fm_status st = m ? fm_copy_(g, m) : fm_last_status();
    fm_tensor_release(m);
    return st;
}

fm_status fm_grad_scaler_unscale(fm_grad_scaler *s, int n, fm_tensor *const *params) {
    if (n < 0 || (n && !params)) return fm_set_error(FM_ERR_INVALID, "grad scaler: bad parameter list");
    if (s->unscaled) return fm_set_error(FM_ERR_STATE, "grad scaler: unscale called twice in one step (call update first)");
    s->unscaled = true;
    if (!s->enabled) return FM_OK;
    double inv = 1.0 / s->scale; /* f64, as PyTorch */
    for (int i = 0; i < n; i++) {
        fm_tensor *g = params[i] ? params[i]->grad : NULL;
        if (!g) continue;
        fm_status st = unscale_one(g, inv, &s->found_inf);
        if (st != FM_OK) return st;
    }
    return FM_OK;
}

bool fm_grad_scaler_should_step(const fm_grad_scaler *s) { return !s->enabled || !s->found_inf; }

void fm_grad_scaler_update(fm_grad_scaler *s) {
    s->n_steps++;
    if (s->enabled && s->found_inf) {
        s->n_skipped++;
        s->n_consecutive_skipped++;
        s->scale *= s->backoff_factor;
        if (s->scale < 1e-30) s->scale = 1e-30; /* keep it positive even in a pathological storm */
        s->growth_tracker = 0;
        if (s->warn_after > 0 && s->n_consecutive_skipped == s->warn_after && !s->quiet) {
            fprintf(stderr,
                    "fathom: warning: %lld consecutive steps skipped for inf/NaN gradients (loss scale now %g); "
                    "the model may be diverging: lower the learning rate or try --precision bf16\n",
                    (long long)s->n_consecutive_skipped, s->scale);
        }
        if (s->warn_after > 0 && s->n_consecutive_skipped >= s->warn_after) s->warned = true;
    } else if (s->enabled) {
        s->n_consecutive_skipped = 0;
        if (++s->growth_tracker >= s->growth_interval) {
            double g = s->scale * s->growth_factor;
            if (isfinite(g)) s->scale = g;
            s->growth_tracker = 0;
        }
    }
    s->found_inf = false;
    s->unscaled = false;
}

/* ---- low-precision copies ---- */

uint16_t fm_f32_to_bf16_stochastic(float f, uint32_t r) {
    if (!isfinite(f)) return fm_f32_to_bf16(f);
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t up = u + (r & 0xFFFFu); /* carries into the kept bits with probability (low bits)/65536 */
    uint32_t exp_up = (up >> 23) & 0xFF;
    if (exp_up == 0xFF) return fm_f32_to_bf16(f); /* would round to inf: use nearest instead */
    return (uint16_t)(up >> 16);
}

fm_status fm_amp_copy_lowp_(fm_tensor *dst, fm_tensor *src, bool stochastic, fm_rng *rng) {
    if (!dst || !src) return fm_set_error(FM_ERR_INVALID, "amp copy: NULL tensor");
    if (dst->dtype != FM_BF16 && dst->dtype != FM_F16)
        return fm_set_error(FM_ERR_INVALID, "amp copy: destination must be bf16 or fp16 (got %s)", fm_dtype_name(dst->dtype));
    if (stochastic && dst->dtype != FM_BF16)
        return fm_set_error(FM_ERR_INVALID, "amp copy: stochastic rounding is for bf16 destinations (got %s)", fm_dtype_name(dst->dtype));
    if (!stochastic) return fm_copy_(dst, src);
    if (src->dtype != FM_F32 || fm_tensor_numel(src) != fm_tensor_numel(dst) || !fm_tensor_is_contiguous(src) ||
        !fm_tensor_is_contiguous(dst) || src->storage->device.type != FM_DEV_CPU || dst->storage->device.type != FM_DEV_CPU)
        return fm_set_error(FM_ERR_INVALID, "amp copy: stochastic rounding needs contiguous CPU f32 -> bf16 tensors of equal size");
    if (!rng) rng = fm_rng_global();
    const float *s = fm_tensor_data(src);
    uint16_t *d = fm_tensor_data(dst);
    int64_t n = fm_tensor_numel(src);
    uint64_t base = rng->offset;
    for (int64_t i = 0; i < n; i += 4) {
        uint32_t r[4];
        uint64_t ctr = base + (uint64_t)(i / 4);
        fm_philox4x32(rng->seed, 0x5352u /* "SR" stream */, ctr, r);
        for (int k = 0; k < 4 && i + k < n; k++) d[i + k] = fm_f32_to_bf16_stochastic(s[i + k], r[k]);
    }
    rng->offset += (uint64_t)((n + 3) / 4);
    return FM_OK;
}
