/* Optimizers: SGD (momentum, Nesterov, L2), Adam and AdamW (decoupled decay).
 *
 * This file keeps the parameter list, the state and the step's scalars (bias
 * corrections, group decay); the update itself is a kernel (ops.def OPTIM_STEP,
 * the CPU's in src/backend/cpu/optim_cpu.c), dispatched per parameter to the
 * device the parameter lives on, with its state made on that device too. The
 * gradient norm is per-block sums of squares (SUM_SQ_BLOCKS) added here in a
 * fixed order, so it is the same bits for any thread count and device. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/dispatch.h" /* fm_dispatch of the optimizer kernels */
#include "fathom/autograd.h"
#include "fathom/optim.h"

typedef struct opt_param {
    char *name;
    fm_tensor *p;
    int group;
    fm_tensor *buf1, *buf2; /* SGD: momentum_buffer; Adam: exp_avg, exp_avg_sq (f32 for a 16-bit p) */
    fm_tensor *master;      /* bf16/f16 p: its f32 master copy, which the update runs on */
    bool initialized;       /* SGD momentum: the first step copies the gradient */
} opt_param;

struct fm_optim {
    fm_optim_config cfg;
    int64_t step;
    int n_groups;
    double group_wd[16];
    int n, cap;
    opt_param *params;
    fm_status (*norm_reduce)(double *sum_sq, void *ctx); /* sharded gradients: the global sum */
    void *norm_ctx;
};

fm_optim_config fm_optim_default_config(fm_optim_kind kind) {
    fm_optim_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.lr = kind == FM_OPTIM_SGD ? 0.01 : 1e-3;
    c.weight_decay = kind == FM_OPTIM_ADAMW ? 0.01 : 0.0;
    c.beta1 = 0.9;
    c.beta2 = 0.999;
    c.eps = 1e-8;
    return c;
}

static const char *kind_names[] = {"sgd", "adam", "adamw"};

fm_status fm_optim_kind_parse(const char *name, fm_optim_kind *out) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, kind_names[i])) { *out = (fm_optim_kind)i; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "unknown optimizer '%s' (expected sgd, adam or adamw)", name);
}

const char *fm_optim_kind_name(fm_optim_kind kind) { return (unsigned)kind < 3 ? kind_names[kind] : "?"; }

fm_optim *fm_optim_new(const fm_optim_config *cfg) {
    if (!cfg) { fm_set_error(FM_ERR_INVALID, "optim_new: config is NULL"); return NULL; }
    if ((unsigned)cfg->kind > FM_OPTIM_ADAMW) { fm_set_error(FM_ERR_INVALID, "optim_new: unknown kind %d", (int)cfg->kind); return NULL; }
    if (!(cfg->lr >= 0) || !(cfg->weight_decay >= 0) || !(cfg->momentum >= 0) || !(cfg->eps >= 0) ||
        !(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1)) {
        fm_set_error(FM_ERR_INVALID,
                     "optim_new: lr %g, weight_decay %g, momentum %g and eps %g must be >= 0; betas (%g, %g) in [0, 1)",
                     cfg->lr, cfg->weight_decay, cfg->momentum, cfg->eps, cfg->beta1, cfg->beta2);
        return NULL;
    }
    if (cfg->nesterov && (cfg->momentum <= 0 || cfg->dampening != 0)) {
        fm_set_error(FM_ERR_INVALID, "optim_new: Nesterov momentum needs momentum > 0 and dampening 0");
        return NULL;
    }
    fm_optim *o = calloc(1, sizeof *o);
    if (!o) { fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    o->cfg = *cfg;
    return o;
}

void fm_optim_free(fm_optim *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        free(o->params[i].name);
        fm_tensor_release_n(4, o->params[i].p, o->params[i].buf1, o->params[i].buf2, o->params[i].master);
    }
    free(o->params);
    free(o);
}

int fm_optim_add_group(fm_optim *o, double weight_decay) {
    if (o->n_groups >= 16) { fm_set_error(FM_ERR_INVALID, "optim: at most 16 parameter groups"); return -1; }
    if (!(weight_decay >= 0)) { fm_set_error(FM_ERR_INVALID, "optim: weight_decay %g must be >= 0", weight_decay); return -1; }
    o->group_wd[o->n_groups] = weight_decay;
    return o->n_groups++;
}

fm_status fm_optim_add_param(fm_optim *o, int group, const char *name, fm_tensor *p) {
    if (group < 0 || group >= o->n_groups)
        return fm_set_error(FM_ERR_INVALID, "optim: group %d does not exist (add it with fm_optim_add_group)", group);
    if (!p || !fm_tensor_is_contiguous(p) ||
        (p->dtype != FM_F32 && p->dtype != FM_F64 && p->dtype != FM_BF16 && p->dtype != FM_F16))
        return fm_set_error(FM_ERR_INVALID, "optim: parameter '%s' must be a contiguous f32/f64/bf16/f16 tensor%s%s", name,
                            p ? ", not " : "", p ? fm_dtype_name(p->dtype) : "");
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->params[i].name, name))
            return fm_set_error(FM_ERR_INVALID, "optim: parameter '%s' added twice", name);
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 16;
        opt_param *np = realloc(o->params, (size_t)cap * sizeof *np);
        if (!np) return fm_set_error(FM_ERR_OOM, "out of host memory");
        o->params = np;
        o->cap = cap;
    }
    opt_param *q = &o->params[o->n];
    memset(q, 0, sizeof *q);
    q->name = strdup(name);
    if (!q->name) return fm_set_error(FM_ERR_OOM, "out of host memory");
    q->p = fm_tensor_retain(p);
    q->group = group;
    o->n++;
    return FM_OK;
}

fm_status fm_optim_add_params(fm_optim *o, fm_module *m) {
    fm_named_list l;
    if (fm_module_parameters(m, &l) != FM_OK) return fm_last_status();
    int g_decay = -1, g_none = -1;
    fm_status st = FM_OK;
    for (int i = 0; i < l.n && st == FM_OK; i++) {
        int *g = l.items[i].no_decay ? &g_none : &g_decay;
        if (*g < 0) *g = fm_optim_add_group(o, l.items[i].no_decay ? 0.0 : o->cfg.weight_decay);
        st = *g < 0 ? fm_last_status() : fm_optim_add_param(o, *g, l.items[i].name, l.items[i].tensor);
    }
    fm_named_list_free(&l);
    return st;
}

static fm_optim *optim_for(fm_module *m, const fm_optim_config *c) {
    if (!m) { fm_set_error(FM_ERR_INVALID, "optim: module is NULL"); return NULL; }
    fm_optim *o = fm_optim_new(c);
    if (o && fm_optim_add_params(o, m) != FM_OK) { fm_optim_free(o); return NULL; }
    return o;
}

fm_optim *fm_optim_sgd(fm_module *m, double lr, double momentum, double weight_decay) {
    fm_optim_config c = fm_optim_default_config(FM_OPTIM_SGD);
    c.lr = lr;
    c.momentum = momentum;
    c.weight_decay = weight_decay;
    return optim_for(m, &c);
}

fm_optim *fm_optim_adamw(fm_module *m, double lr, double beta1, double beta2, double eps, double weight_decay) {
    fm_optim_config c = fm_optim_default_config(FM_OPTIM_ADAMW);
    c.lr = lr;
    c.beta1 = beta1;
    c.beta2 = beta2;
    c.eps = eps;
    c.weight_decay = weight_decay;
    return optim_for(m, &c);
}

static bool low_precision(const fm_tensor *p) { return p->dtype == FM_BF16 || p->dtype == FM_F16; }

/* Called with gradients off (the master is a cast of a leaf that requires grad). */
static fm_status ensure_state(fm_optim *o, opt_param *q) {
    if (low_precision(q->p) && !q->master && !(q->master = fm_to_dtype(q->p, FM_F32))) return fm_last_status();
    fm_tensor *like = q->master ? q->master : q->p; /* moments in f32 for a 16-bit parameter */
    bool adam = o->cfg.kind != FM_OPTIM_SGD;
    if (!adam && o->cfg.momentum == 0) return FM_OK;
    if (!q->buf1) q->buf1 = fm_tensor_zeros_like(like);
    if (adam && !q->buf2) q->buf2 = fm_tensor_zeros_like(like);
    if (!q->buf1 || (adam && !q->buf2)) return fm_last_status();
    return FM_OK;
}

fm_status fm_optim_init_state(fm_optim *o) {
    bool prev = fm_set_grad_enabled(false);
    fm_status st = FM_OK;
    for (int i = 0; i < o->n && st == FM_OK; i++) st = ensure_state(o, &o->params[i]);
    fm_set_grad_enabled(prev);
    return st;
}

/* One parameter's update, on its device: the state was made there (ensure_state). */
static fm_status step_param(fm_optim *o, opt_param *q, fm_tensor *g, int64_t t) {
    fm_optim_step_attrs a = {
        .kind = (int)o->cfg.kind, .nesterov = o->cfg.nesterov, .first = !q->initialized,
        .lr = o->cfg.lr, .wd = o->group_wd[q->group], .momentum = o->cfg.momentum, .dampening = o->cfg.dampening,
        .beta1 = o->cfg.beta1, .beta2 = o->cfg.beta2, .eps = o->cfg.eps,
        .bc1 = 1.0 - pow(o->cfg.beta1, (double)t), .bc2 = 1.0 - pow(o->cfg.beta2, (double)t),
    };
    if (!q->master) {
        fm_op_call c = {.op = FM_OP_OPTIM_STEP, .n_in = 4, .n_out = 0, .in = {q->p, g, q->buf1, q->buf2}, .attrs = &a};
        return fm_dispatch(&c);
    }
    /* 16-bit parameter: the f32 update on the master, then p = round(master) */
    fm_tensor *g32 = fm_to_dtype(g, FM_F32);
    if (!g32) return fm_last_status();
    fm_op_call c = {.op = FM_OP_OPTIM_STEP, .n_in = 4, .n_out = 0, .in = {q->master, g32, q->buf1, q->buf2}, .attrs = &a};
    fm_status st = fm_dispatch(&c);
    fm_tensor_release(g32);
    return st ? st : fm_copy_(q->p, q->master);
}

fm_status fm_optim_step(fm_optim *o) {
    int64_t t = o->step + 1;
    bool prev = fm_set_grad_enabled(false);
    fm_status st = FM_OK;
    for (int i = 0; i < o->n && st == FM_OK; i++) {
        opt_param *q = &o->params[i];
        fm_tensor *gr = q->p->grad;
        if (!gr) continue;
        if (gr->dtype != q->p->dtype || gr->ndim != q->p->ndim || fm_tensor_numel(gr) != fm_tensor_numel(q->p)) {
            st = fm_set_error(FM_ERR_INVALID, "optim: gradient of '%s' does not match the parameter", q->name);
            break;
        }
        fm_tensor *g = fm_contiguous(gr);
        if (!g || (st = ensure_state(o, q)) != FM_OK) { fm_tensor_release(g); st = fm_last_status(); break; }
        st = step_param(o, q, g, t);
        if (st == FM_OK) q->initialized = true;
        fm_tensor_release(g);
    }
    fm_set_grad_enabled(prev);
    if (st == FM_OK) o->step = t;
    return st;
}

void fm_optim_zero_grad(fm_optim *o) {
    for (int i = 0; i < o->n; i++) fm_tensor_zero_grad(o->params[i].p);
}

void fm_optim_set_lr(fm_optim *o, double lr) { o->cfg.lr = lr; }

const fm_optim_config *fm_optim_get_config(const fm_optim *o) { return o ? &o->cfg : NULL; }
int fm_optim_param_count(const fm_optim *o) { return o ? o->n : 0; }

fm_status fm_optim_param_at(const fm_optim *o, int i, const char **name, fm_tensor **p, double *weight_decay) {
    if (!o || i < 0 || i >= o->n) return fm_set_error(FM_ERR_INVALID, "optim: no parameter %d", i);
    if (name) *name = o->params[i].name;
    if (p) *p = o->params[i].p;
    if (weight_decay) *weight_decay = o->group_wd[o->params[i].group];
    return FM_OK;
}

void fm_optim_set_norm_reduce(fm_optim *o, fm_status (*fn)(double *sum_sq, void *ctx), void *ctx) {
    if (!o) return;
    o->norm_reduce = fn;
    o->norm_ctx = ctx;
}
double fm_optim_get_lr(const fm_optim *o) { return o->cfg.lr; }
int64_t fm_optim_get_step(const fm_optim *o) { return o->step; }

void fm_optim_set_step(fm_optim *o, int64_t step) {
    o->step = step;
    /* restored state: momentum buffers hold history, so no "first step" copy */
    for (int i = 0; i < o->n; i++) o->params[i].initialized = step > 0;
}

/* The sum of squares of one gradient: its blocks' sums (SUM_SQ_BLOCKS, on its
 * device) added in order on the host. (One serial double chain over every
 * gradient element was 14 ms of a 6-layer/384 GPT step: 4 cycles per element.) */
static fm_status grad_sum_sq(fm_tensor *g, double **blk, int64_t *cap, double *ss) {
    int64_t n = fm_tensor_numel(g), nb = (n + FM_SUM_SQ_BLOCK - 1) / FM_SUM_SQ_BLOCK;
    if (nb == 0) return FM_OK;
    if (nb > *cap) {
        double *nbuf = realloc(*blk, sizeof(double) * (size_t)nb);
        if (!nbuf) return fm_set_error(FM_ERR_OOM, "clip_grad_norm: out of memory for %lld block sums", (long long)nb);
        *blk = nbuf;
        *cap = nb;
    }
    fm_tensor *sums = fm_tensor_empty(1, &nb, FM_F64, fm_tensor_device(g));
    fm_tensor *x = low_precision(g) ? fm_to_dtype(g, FM_F32) : fm_tensor_retain(g); /* widening is exact */
    if (!sums || !x) { fm_tensor_release_n(2, sums, x); return fm_last_status(); }
    fm_op_call c = {.op = FM_OP_SUM_SQ_BLOCKS, .n_in = 1, .n_out = 1, .in = {x}, .out = {sums}};
    fm_status st = fm_dispatch(&c);
    if (st == FM_OK) st = fm_tensor_copy_to_host(sums, *blk, FM_F64);
    fm_tensor_release_n(2, sums, x);
    for (int64_t b = 0; st == FM_OK && b < nb; b++) *ss += (*blk)[b];
    return st;
}

fm_status fm_optim_clip_grad_norm(fm_optim *o, double max_norm, double *total_norm) {
    if (!(max_norm > 0)) return fm_set_error(FM_ERR_INVALID, "clip_grad_norm: max_norm %g must be > 0", max_norm);
    for (int i = 0; i < o->n; i++) {
        fm_tensor *g = o->params[i].p->grad;
        if (g && (!fm_tensor_is_contiguous(g) || (g->dtype != FM_F32 && g->dtype != FM_F64 && !low_precision(g))))
            return fm_set_error(FM_ERR_INVALID, "clip_grad_norm: gradient of '%s' is not a contiguous float tensor",
                                o->params[i].name);
    }
    double ss = 0, *blk = NULL;
    int64_t cap = 0;
    fm_status st = FM_OK;
    for (int i = 0; i < o->n && st == FM_OK; i++)
        if (o->params[i].p->grad) st = grad_sum_sq(o->params[i].p->grad, &blk, &cap, &ss);
    free(blk);
    if (st == FM_OK && o->norm_reduce) st = o->norm_reduce(&ss, o->norm_ctx);
    if (st != FM_OK) return st;
    double norm = sqrt(ss);
    if (total_norm) *total_norm = norm;
    if (!isfinite(norm) || norm <= max_norm) return FM_OK;
    fm_scale_attrs a = {max_norm / (norm + 1e-6)};
    for (int i = 0; i < o->n && st == FM_OK; i++) {
        fm_tensor *g = o->params[i].p->grad;
        if (!g) continue;
        /* a 16-bit gradient is scaled in f32 and rounded once, as PyTorch's mul_ does */
        fm_tensor *x = low_precision(g) ? fm_to_dtype(g, FM_F32) : fm_tensor_retain(g);
        if (!x) { st = fm_last_status(); break; }
        fm_op_call c = {.op = FM_OP_SCALE_INPLACE, .n_in = 1, .n_out = 0, .in = {x}, .attrs = &a};
        st = fm_dispatch(&c);
        if (st == FM_OK && x != g) st = fm_copy_(g, x);
        fm_tensor_release(x);
    }
    return st;
}

fm_status fm_optim_state(fm_optim *o, fm_named_list *out) {
    memset(out, 0, sizeof *out);
    bool adam = o->cfg.kind != FM_OPTIM_SGD;
    char name[600];
    for (int i = 0; i < o->n; i++) {
        opt_param *q = &o->params[i];
        if (q->buf1) {
            snprintf(name, sizeof name, "%s.%s", q->name, adam ? "exp_avg" : "momentum_buffer");
            if (fm_named_list_push(out, name, q->buf1, false, true)) goto fail;
        }
        if (q->buf2) {
            snprintf(name, sizeof name, "%s.exp_avg_sq", q->name);
            if (fm_named_list_push(out, name, q->buf2, false, true)) goto fail;
        }
        if (q->master) {
            snprintf(name, sizeof name, "%s.master_weight", q->name);
            if (fm_named_list_push(out, name, q->master, false, true)) goto fail;
        }
    }
    return FM_OK;
fail:
    fm_named_list_free(out);
    return fm_last_status();
}
