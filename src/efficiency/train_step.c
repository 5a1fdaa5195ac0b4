/* The optimizer step shared by every trainer (fathom/train_step.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "fathom/profile.h" /* the "optimizer" span */
#include "fathom/train_step.h"

void fm_train_step_init(fm_train_step *s, const fm_efficiency_opts *eo, fm_optim *opt, int n_params,
                        fm_tensor *const *params, fm_train_loss_fn loss_fn, void *loss_ctx) {
    memset(s, 0, sizeof *s);
    s->eo = eo;
    s->opt = opt;
    s->n_params = n_params;
    s->params = params;
    s->loss_fn = loss_fn;
    s->loss_ctx = loss_ctx;
    s->grad_norm = NAN;
    s->loss_weight = 1.0;
    s->stepped = true;
    s->loss_min = NAN;
    fm_grad_scaler_init(&s->scaler, eo->loss_scaling);
}

/* Micro-batch k of n along dim 0 (near-equal parts, the first ones one larger). */
static fm_tensor *micro(fm_tensor *t, int k, int n, int64_t *rows) {
    int64_t N = t->shape[0], base = N / n, extra = N % n;
    int64_t start = k * base + (k < extra ? k : extra);
    *rows = base + (k < extra);
    if (n == 1) return fm_tensor_retain(t);
    return fm_narrow(t, 0, start, *rows);
}

/* Forward and backward of one micro-batch; takes over x and y. */
/* acc += loss * weight, on the loss's device in f64 (no host read: on a GPU a read
 * waits for the queued work, which would stall the copy of the next batch every
 * micro-batch). The f64 widening, product and sum are the host's double
 * arithmetic of `sum += item(loss) * weight`, so the figure read once per step
 * is the same bits. */
static fm_status add_loss(fm_tensor **acc, fm_tensor *loss, double weight) {
    /* the sum lives where the loss is (with tensor parallelism planned on `meta`, the model's
     * device rather than eo->device); it starts at 0.0, as the host's sum did */
    if (!*acc && !(*acc = fm_tensor_zeros(0, NULL, FM_F64, fm_tensor_device(loss)))) return fm_last_status();
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *l64 = fm_to_dtype(loss, FM_F64);
    fm_tensor *term = l64 && weight != 1.0 ? fm_mul_scalar(l64, weight) : fm_tensor_retain(l64);
    fm_tensor *sum = term ? fm_add(*acc, term) : NULL;
    fm_set_grad_enabled(prev);
    fm_tensor_release_n(2, l64, term);
    if (!sum) return fm_last_status();
    fm_tensor_release(*acc);
    *acc = sum;
    return FM_OK;
}

static fm_status micro_step(fm_train_step *s, fm_tensor *x, fm_tensor *y, double weight, fm_tensor **loss_sum) {
    fm_status st = FM_OK;
    const fm_device dev = s->eo->device;
    if (!fm_device_eq(x->storage->device, dev) || !fm_device_eq(y->storage->device, dev)) {
        /* the loader's batch, on the host, goes where the model is */
        fm_tensor *xd = fm_tensor_to(x, dev), *yd = xd ? fm_tensor_to(y, dev) : NULL;
        fm_tensor_release_n(2, x, y);
        if (!yd) { fm_tensor_release(xd); return fm_last_status(); }
        x = xd;
        y = yd;
    }
    if (s->hooks && s->hooks->to_device && (st = s->hooks->to_device(s->hooks->user, &x, &y))) {
        fm_tensor_release_n(2, x, y);
        return st;
    }
    fm_dtype ac = fm_autocast_set(s->eo->precision);
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_ACTIVATIONS);
    fm_tensor *loss = s->loss_fn(s->loss_ctx, x, y);
    fm_memory_tag_pop(mc);
    fm_autocast_set(ac);
    fm_tensor_release_n(2, x, y);
    if (!loss) return fm_last_status();
    if ((st = add_loss(loss_sum, loss, weight))) { fm_tensor_release(loss); return st; }
    const double w = weight * s->loss_weight;
    fm_tensor *l = w != 1.0 ? fm_mul_scalar(loss, w) : fm_tensor_retain(loss);
    fm_tensor *sl = l ? fm_grad_scaler_scale(&s->scaler, l) : NULL;
    /* backward's temporaries; the engine tags the leaves' gradients itself */
    mc = fm_memory_tag_push(FM_MEM_ACTIVATIONS);
    st = sl ? fm_backward(sl, NULL, false) : fm_last_status();
    fm_memory_tag_pop(mc);
    fm_tensor_release_n(3, loss, l, sl);
    return st;
}

fm_status fm_train_step_backward(fm_train_step *s, fm_tensor *x, fm_tensor *y, double *loss) {
    const int n = s->eo->grad_accum > 1 ? s->eo->grad_accum : 1;
    const int64_t N = x->shape[0];
    /* the micro-batches' weighted losses, summed where the model is and read once */
    fm_tensor *sum = NULL;
    fm_status st = FM_OK;
    fm_optim_zero_grad(s->opt);
    for (int k = 0; k < n && st == FM_OK; k++) {
        int64_t rows = 0;
        fm_tensor *xs = micro(x, k, n, &rows), *ys = micro(y, k, n, &rows);
        if (rows == 0) { fm_tensor_release_n(2, xs, ys); continue; } /* a last batch smaller than grad_accum */
        if (!xs || !ys) { fm_tensor_release_n(2, xs, ys); st = fm_last_status(); break; }
        if (s->hooks && s->hooks->micro_begin && (st = s->hooks->micro_begin(s->hooks->user, k, n))) {
            fm_tensor_release_n(2, xs, ys);
            break;
        }
        st = micro_step(s, xs, ys, n == 1 ? 1.0 : (double)rows / (double)N, &sum);
    }
    *loss = st != FM_OK ? NAN : sum ? fm_tensor_item(sum) : 0.0; /* the step's one host read of the loss */
    fm_tensor_release(sum);
    if (st == FM_OK && s->hooks && s->hooks->after_backward) st = s->hooks->after_backward(s->hooks->user, s->opt);
    return st;
}

fm_status fm_train_step_update(fm_train_step *s) {
    const fm_train_hooks *h = s->hooks;
    fm_profile_push("optimizer", "optimizer");
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_OPTIMIZER);
    fm_status st = fm_grad_scaler_unscale(&s->scaler, s->n_params, s->params);
    if (st == FM_OK && h && h->grads_ready) st = h->grads_ready(h->user, s->opt);
    if (st == FM_OK && s->inspect_grads) st = s->inspect_grads(s->loss_ctx);
    s->grad_norm = NAN;
    s->stepped = fm_grad_scaler_should_step(&s->scaler);
    if (st == FM_OK && s->stepped && s->clip > 0) st = fm_optim_clip_grad_norm(s->opt, s->clip, &s->grad_norm);
    else if (st == FM_OK && s->stepped && s->want_norm) st = fm_optim_clip_grad_norm(s->opt, INFINITY, &s->grad_norm); /* never scales */
    if (st == FM_OK && s->stepped) st = fm_optim_step(s->opt);
    fm_optim_zero_grad(s->opt); /* the gradients are not kept through the next forward */
    fm_memory_tag_pop(mc);
    if (st == FM_OK) fm_grad_scaler_update(&s->scaler);
    if (st == FM_OK && h && h->after_update) st = h->after_update(h->user, s->opt, s->stepped);
    fm_profile_pop();
    return st;
}

bool fm_train_step_check_loss(fm_train_step *s, double lv, char *why, size_t n) {
    if (!isfinite(lv)) {
        if (s->scaler.enabled) return true; /* fp16: the scaler skips the step and lowers the scale */
        snprintf(why, n, "the loss became %g", lv);
        return false;
    }
    double f = s->divergence_factor, floor = s->loss_min > 0.01 ? s->loss_min : 0.01;
    if (f > 0 && isfinite(s->loss_min) && lv > f * floor) {
        snprintf(why, n, "the loss diverged: %g is over %g x its running minimum %g (divergence_factor)", lv, f,
                 s->loss_min);
        return false;
    }
    if (!(lv >= s->loss_min)) s->loss_min = lv;
    return true;
}

fm_status fm_train_step_state_save(const fm_train_step *s, fm_kv_list *meta) {
    char b[40];
    fm_status st = FM_OK;
    if (s->scaler.enabled) {
        snprintf(b, sizeof b, "%.17g", s->scaler.scale);
        st = fm_kv_set(meta, "loss_scale", b);
        snprintf(b, sizeof b, "%d", s->scaler.growth_tracker);
        if (!st) st = fm_kv_set(meta, "loss_scale_growth_tracker", b);
    }
    if (!st && isfinite(s->loss_min)) {
        snprintf(b, sizeof b, "%.17g", s->loss_min);
        st = fm_kv_set(meta, "loss_min", b);
    }
    return st;
}

/* meta[key] as a finite double (*found false when absent). */
static fm_status meta_real(const fm_kv_list *meta, const char *key, double *v, bool *found) {
    const char *t = fm_kv_get(meta, key);
    *found = t != NULL;
    if (!t) return FM_OK;
    char *e = NULL;
    errno = 0;
    *v = strtod(t, &e);
    if (e == t || *e || errno == ERANGE || !isfinite(*v))
        return fm_set_error(FM_ERR_FORMAT, "the training state's %s is '%.40s', not a finite number: the checkpoint is "
                            "damaged; resume from an earlier one or train afresh", key, t);
    return FM_OK;
}

fm_status fm_train_step_state_load(fm_train_step *s, const fm_kv_list *meta) {
    double scale = 0, tracker = 0, lmin = NAN;
    bool has_scale, has_tracker, has_min;
    fm_status st = meta_real(meta, "loss_scale", &scale, &has_scale);
    if (!st) st = meta_real(meta, "loss_scale_growth_tracker", &tracker, &has_tracker);
    if (!st) st = meta_real(meta, "loss_min", &lmin, &has_min);
    if (st) return st;
    /* the range is tested before the conversion to int */
    if ((has_scale && !(scale > 0)) || (has_tracker && !(tracker >= 0 && tracker <= INT32_MAX && tracker == floor(tracker))))
        return fm_set_error(FM_ERR_FORMAT, "the training state's loss scaler is out of range (loss_scale %g must be > 0, "
                            "loss_scale_growth_tracker %g a whole number in 0..%d): the checkpoint is damaged; resume "
                            "from an earlier one or train afresh", scale, tracker, INT32_MAX);
    if (s->scaler.enabled && has_scale) s->scaler.scale = scale;
    if (s->scaler.enabled && has_tracker) s->scaler.growth_tracker = (int)tracker;
    if (has_min) s->loss_min = lmin;
    return FM_OK;
}
