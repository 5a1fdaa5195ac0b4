/* Efficiency features: GradScaler semantics (growth, back-off, skipped steps,
 * an overflow storm with its warning, fp16 gradients rescued from underflow),
 * gradient accumulation equal to the full batch, zero system allocations per
 * training step after warm-up, the autocast policy for norms/softmax/losses/
 * attention, stochastic rounding, the checkpointing switch, and clear errors for
 * bad option combinations and limits too small for the weights. */
#include "core/parallel.h"
#include "efficiency/efficiency_internal.h"
#include "fathom/efficiency.h"
#include "fathom/fathom.h"
#include "fathom/optim.h"
#include "test_util.h"

/* ---- a 2-layer MLP from fm_linear directly ---- */
typedef struct mlp { fm_tensor *w1, *b1, *w2, *b2; } mlp;

static fm_tensor *param(fm_rng *r, int ndim, const int64_t *shape, double std) {
    fm_tensor *t = fm_tensor_randn(ndim, shape, FM_F32, r), *s = fm_mul_scalar(t, std);
    fm_tensor_release(t);
    fm_tensor_requires_grad_(s, true);
    return s;
}

static mlp mlp_new(fm_rng *r, int in, int hid, int out) {
    mlp m;
    m.w1 = param(r, 2, (int64_t[]){hid, in}, 0.3);
    m.b1 = param(r, 1, (int64_t[]){hid}, 0.1);
    m.w2 = param(r, 2, (int64_t[]){out, hid}, 0.3);
    m.b2 = param(r, 1, (int64_t[]){out}, 0.1);
    return m;
}
static void mlp_free(mlp *m) { fm_tensor_release_n(4, m->w1, m->b1, m->w2, m->b2); }
static void mlp_zero(mlp *m) {
    fm_tensor_zero_grad(m->w1); fm_tensor_zero_grad(m->b1); fm_tensor_zero_grad(m->w2); fm_tensor_zero_grad(m->b2);
}

/* mean cross-entropy of the MLP on (x, y), multiplied by mult */
static fm_tensor *mlp_loss(mlp *m, fm_tensor *x, fm_tensor *y, double mult) {
    fm_tensor *h = fm_linear(x, m->w1, m->b1), *a = h ? fm_gelu(h) : NULL;
    fm_tensor *o = a ? fm_linear(a, m->w2, m->b2) : NULL;
    fm_tensor *l = o ? fm_cross_entropy(o, y, -100, 0, FM_REDUCE_MEAN) : NULL;
    fm_tensor *s = l ? fm_mul_scalar(l, mult) : NULL;
    fm_tensor_release_n(4, h, a, o, l);
    return s;
}

static double rel_err(fm_tensor *a, fm_tensor *b) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < fm_tensor_numel(b); i++) {
        double d = fabs(fm_tensor_get(a, i) - fm_tensor_get(b, i)), v = fabs(fm_tensor_get(b, i));
        if (d > num) num = d;
        if (v > den) den = v;
    }
    return den > 0 ? num / den : num;
}

static void test_grad_accum(void) {
    fm_rng r;
    fm_rng_init(&r, 11);
    mlp m = mlp_new(&r, 32, 64, 10);
    fm_tensor *x = fm_tensor_randn(2, (int64_t[]){64, 32}, FM_F32, &r);
    int64_t lab[64];
    for (int i = 0; i < 64; i++) lab[i] = (i * 7) % 10;
    fm_tensor *y = fm_tensor_from_data(lab, 1, (int64_t[]){64}, FM_I64);
    fm_tensor *l = mlp_loss(&m, x, y, 1.0);
    CHECK(fm_backward(l, NULL, false) == FM_OK);
    fm_tensor *full[4] = {fm_clone(m.w1->grad), fm_clone(m.b1->grad), fm_clone(m.w2->grad), fm_clone(m.b2->grad)};
    mlp_zero(&m);
    for (int k = 0; k < 4; k++) { /* 4 x 16 with the loss scaled by 1/4: gradients accumulate in .grad */
        fm_tensor *xs = fm_narrow(x, 0, 16 * k, 16), *ys = fm_narrow(y, 0, 16 * k, 16);
        fm_tensor *ls = mlp_loss(&m, xs, ys, 0.25);
        CHECK(ls && fm_backward(ls, NULL, false) == FM_OK);
        fm_tensor_release_n(3, xs, ys, ls);
    }
    fm_tensor *acc[4] = {m.w1->grad, m.b1->grad, m.w2->grad, m.b2->grad};
    for (int i = 0; i < 4; i++) {
        double e = rel_err(acc[i], full[i]);
        CHECK_MSG(e <= 1e-6, "param %d: relative difference %g", i, e);
    }
    fm_tensor_release_n(7, full[0], full[1], full[2], full[3], x, y, l);
    mlp_free(&m);
}

/* A warmed-up step (forward, backward, clip, AdamW, zero_grad) makes no system
 * allocation: every block comes from the cache. */
static void test_zero_system_allocs(fm_dtype precision, bool preallocate) {
    if (preallocate) {
        fm_memory_config c = {FM_MEMORY_PREALLOCATE, 32 << 20, 0, 0};
        CHECK_MSG(fm_memory_configure(FM_CPU, &c) == FM_OK, "%s", fm_last_error());
    }
    fm_rng r;
    fm_rng_init(&r, 12);
    mlp m = mlp_new(&r, 64, 128, 10);
    fm_optim_config oc = fm_optim_default_config(FM_OPTIM_ADAMW);
    fm_optim *opt = fm_optim_new(&oc);
    fm_tensor *ps[4] = {m.w1, m.b1, m.w2, m.b2};
    const char *names[4] = {"w1", "b1", "w2", "b2"};
    int grp = fm_optim_add_group(opt, 0.01);
    for (int i = 0; i < 4; i++) CHECK(fm_optim_add_param(opt, grp, names[i], ps[i]) == FM_OK);
    fm_tensor *x = fm_tensor_randn(2, (int64_t[]){32, 64}, FM_F32, &r);
    int64_t lab[32];
    for (int i = 0; i < 32; i++) lab[i] = i % 10;
    fm_tensor *y = fm_tensor_from_data(lab, 1, (int64_t[]){32}, FM_I64);
    fm_grad_scaler gs;
    fm_grad_scaler_init(&gs, precision == FM_F16);
    uint64_t before = 0;
    double first = 0, last = 0;
    for (int step = 0; step < 12; step++) {
        if (step == 4) { fm_memory_stats s; fm_memory_stats_get(FM_CPU, &s); before = s.n_system_allocs; }
        fm_dtype prev = fm_autocast_set(precision);
        fm_tensor *l = mlp_loss(&m, x, y, 1.0);
        fm_autocast_set(prev);
        fm_tensor *sl = fm_grad_scaler_scale(&gs, l);
        CHECK(sl && fm_backward(sl, NULL, false) == FM_OK);
        CHECK(fm_grad_scaler_unscale(&gs, 4, ps) == FM_OK);
        CHECK(fm_optim_clip_grad_norm(opt, 1.0, NULL) == FM_OK);
        if (fm_grad_scaler_should_step(&gs)) CHECK(fm_optim_step(opt) == FM_OK);
        fm_grad_scaler_update(&gs);
        fm_optim_zero_grad(opt);
        if (step == 0) first = fm_tensor_item(l);
        last = fm_tensor_item(l);
        fm_tensor_release_n(2, l, sl);
    }
    fm_memory_stats s;
    fm_memory_stats_get(FM_CPU, &s);
    CHECK_MSG(s.n_system_allocs == before, "%s%s: %llu system allocations in 8 warm steps", fm_precision_name(precision),
              preallocate ? " preallocate" : "", (unsigned long long)(s.n_system_allocs - before));
    CHECK_MSG(last < first, "%s: loss %g -> %g", fm_precision_name(precision), first, last);
    CHECK(gs.n_skipped == 0);
    fm_optim_free(opt);
    fm_tensor_release_n(2, x, y);
    mlp_free(&m);
    if (preallocate) {
        fm_memory_config g = {FM_MEMORY_GROW, 0, 0, 0};
        CHECK_MSG(fm_memory_configure(FM_CPU, &g) == FM_OK, "%s", fm_last_error());
    }
}

static void test_scaler(void) {
    fm_grad_scaler gs;
    fm_grad_scaler_init(&gs, true);
    CHECK(gs.scale == 65536.0 && gs.growth_interval == 2000 && gs.backoff_factor == 0.5 && gs.growth_factor == 2.0);
    fm_tensor *p = fm_tensor_full(1, (int64_t[]){5}, 1.0, FM_F32, FM_CPU);
    fm_tensor_requires_grad_(p, true);
    fm_tensor *ps[1] = {p};
    /* clean steps: unscale divides exactly; growth after 2000 */
    for (int i = 0; i < 2000; i++) {
        fm_tensor *l = fm_sum(p, 0, NULL, false), *sl = fm_grad_scaler_scale(&gs, l);
        fm_backward(sl, NULL, false);
        fm_grad_scaler_unscale(&gs, 1, ps);
        if (i == 0) CHECK(fm_tensor_get(p->grad, 3) == 1.0);
        CHECK(fm_grad_scaler_should_step(&gs));
        fm_grad_scaler_update(&gs);
        fm_tensor_zero_grad(p);
        fm_tensor_release_n(2, l, sl);
        if (i == 1998) CHECK(gs.scale == 65536.0);
    }
    CHECK(gs.scale == 131072.0 && gs.growth_tracker == 0);
    /* overflow storm: every step has an inf gradient */
    gs.quiet = true;
    for (int i = 0; i < 30; i++) {
        fm_tensor *g = fm_tensor_full(1, (int64_t[]){5}, i % 2 ? INFINITY : NAN, FM_F32, FM_CPU);
        fm_tensor_release(p->grad);
        p->grad = g;
        CHECK(fm_grad_scaler_unscale(&gs, 1, ps) == FM_OK);
        CHECK(!fm_grad_scaler_should_step(&gs));
        fm_grad_scaler_update(&gs);
    }
    CHECK(gs.n_skipped == 30 && gs.n_consecutive_skipped == 30 && gs.warned);
    CHECK(gs.scale == 131072.0 / (double)(1u << 30));
    CHECK(fm_grad_scaler_unscale(&gs, 1, ps) == FM_OK);
    CHECK(fm_grad_scaler_unscale(&gs, 1, ps) == FM_ERR_STATE); /* twice in one step */
    CHECK_ERR_CONTAINS("twice");
    fm_grad_scaler_update(&gs);
    /* a clean step ends the storm */
    fm_tensor_zero_grad(p);
    fm_tensor *l = fm_sum(p, 0, NULL, false), *sl = fm_grad_scaler_scale(&gs, l);
    fm_backward(sl, NULL, false);
    fm_grad_scaler_unscale(&gs, 1, ps);
    CHECK(fm_grad_scaler_should_step(&gs));
    fm_grad_scaler_update(&gs);
    CHECK(gs.n_consecutive_skipped == 0 && gs.n_skipped == 31);
    fm_tensor_release_n(3, l, sl, p);
    /* disabled (bf16/fp32): scale 1 and never skips */
    fm_grad_scaler_init(&gs, false);
    CHECK(gs.scale == 1.0 && fm_grad_scaler_should_step(&gs));
    fm_tensor *bad = fm_tensor_full(1, (int64_t[]){2}, NAN, FM_F32, FM_CPU);
    CHECK(fm_tensor_has_inf_nan(bad));
    fm_tensor *full = fm_tensor_full(2, (int64_t[]){2, 3}, 1.0, FM_F64, FM_CPU), *bad_t = fm_transpose(full, 0, 1);
    CHECK(!fm_tensor_has_inf_nan(bad_t)); /* strided path through the ops */
    fm_tensor_release_n(3, bad, full, bad_t);
}

/* fp16: tiny gradients underflow without scaling and survive with it. */
static void test_fp16_underflow(void) {
    fm_rng r;
    fm_rng_init(&r, 13);
    mlp m = mlp_new(&r, 16, 32, 4);
    fm_tensor *x = fm_tensor_randn(2, (int64_t[]){8, 16}, FM_F32, &r);
    fm_tensor *y = fm_tensor_from_data((int64_t[]){0, 1, 2, 3, 0, 1, 2, 3}, 1, (int64_t[]){8}, FM_I64);
    fm_tensor *ps[4] = {m.w1, m.b1, m.w2, m.b2};
    fm_tensor *l = mlp_loss(&m, x, y, 1e-6);
    fm_backward(l, NULL, false);
    fm_tensor *ref = fm_clone(m.w1->grad);
    fm_tensor_release(l);
    mlp_zero(&m);
    double err[2];
    for (int k = 0; k < 2; k++) {
        fm_grad_scaler gs;
        fm_grad_scaler_init(&gs, k == 1);
        fm_dtype prev = fm_autocast_set(FM_F16);
        l = mlp_loss(&m, x, y, 1e-6);
        fm_autocast_set(prev);
        fm_tensor *sl = fm_grad_scaler_scale(&gs, l);
        fm_backward(sl, NULL, false);
        fm_grad_scaler_unscale(&gs, 4, ps);
        CHECK(m.w1->grad && m.w1->grad->dtype == FM_F32);
        err[k] = m.w1->grad ? rel_err(m.w1->grad, ref) : 1;
        fm_grad_scaler_update(&gs);
        mlp_zero(&m);
        fm_tensor_release_n(2, l, sl);
    }
    CHECK_MSG(err[0] > 0.1 && err[1] < 0.01, "unscaled %g, scaled %g", err[0], err[1]);
    fm_tensor_release_n(3, x, y, ref);
    mlp_free(&m);
}

static void test_policy(void) {
    fm_rng r;
    fm_rng_init(&r, 14);
    fm_tensor *x = fm_tensor_randn(3, (int64_t[]){2, 4, 8}, FM_F32, &r), *xb = fm_to_dtype(x, FM_BF16);
    fm_tensor *xr = fm_to_dtype(xb, FM_F32); /* the same values in f32 */
    fm_tensor *ref_ln = fm_layer_norm(xr, 1, NULL, NULL, 1e-5), *ref_sm = fm_softmax(xr, -1);
    fm_tensor *q = fm_reshape(xr, 4, (int64_t[]){1, 2, 4, 8}), *qb = fm_to_dtype(q, FM_BF16);
    fm_tensor *ref_at = fm_scaled_dot_product_attention(q, q, q, true, 0);
    fm_dtype prev = fm_autocast_set(FM_BF16);
    fm_tensor *ln = fm_layer_norm(xb, 1, NULL, NULL, 1e-5), *rms = fm_rms_norm(xb, NULL, 1e-5);
    fm_tensor *sm = fm_softmax(xb, -1), *at = fm_scaled_dot_product_attention(qb, qb, qb, true, 0);
    fm_tensor *lg = fm_reshape(xb, 2, (int64_t[]){8, 8});
    fm_tensor *tg = fm_tensor_from_data((int64_t[]){0, 1, 2, 3, 4, 5, 6, 7}, 1, (int64_t[]){8}, FM_I64);
    fm_tensor *ce = fm_cross_entropy(lg, tg, -100, 0, FM_REDUCE_MEAN);
    fm_autocast_set(prev);
    CHECK_MSG(ln && rms && sm && at && ce, "%s", fm_last_error());
    if (ln && sm && at && ce && rms) {
        CHECK(ln->dtype == FM_F32 && rms->dtype == FM_F32 && sm->dtype == FM_F32 && ce->dtype == FM_F32);
        CHECK(rel_err(ln, ref_ln) < 1e-6 && rel_err(sm, ref_sm) < 1e-6);
        /* attention stays in bf16 storage (f32 math inside): only the output rounding differs */
        CHECK(at->dtype == FM_BF16);
        CHECK_MSG(rel_err(at, ref_at) < 8e-3, "attention bf16 vs f32: %g", rel_err(at, ref_at));
    }
    /* outside autocast low precision is still refused by f32-only kernels, with a message */
    fm_tensor *no = fm_layer_norm(xb, 1, NULL, NULL, 1e-5);
    CHECK(no == NULL);
    fm_tensor_release_n(14, x, xb, xr, ref_ln, ref_sm, q, qb, ref_at, ln, rms, sm, at, lg, ce);
    fm_tensor_release_n(2, no, tg);
}

static void test_stochastic_rounding(void) {
    enum { N = 200000 };
    float v = 1.0f + 1.0f / 512; /* a quarter of the way from 1 to the next bf16 (1 + 1/128) */
    fm_tensor *src = fm_tensor_full(1, (int64_t[]){N}, v, FM_F32, FM_CPU);
    fm_tensor *dst = fm_tensor_empty(1, (int64_t[]){N}, FM_BF16, FM_CPU);
    fm_rng r;
    fm_rng_init(&r, 15);
    CHECK(fm_amp_copy_lowp_(dst, src, true, &r) == FM_OK);
    CHECK(r.offset == N / 4);
    double mean = 0;
    for (int i = 0; i < N; i++) mean += fm_tensor_get(dst, i);
    mean /= N;
    CHECK_MSG(fabs(mean - v) < 2e-4, "stochastic mean %.6f vs %.6f", mean, (double)v);
    CHECK(fm_amp_copy_lowp_(dst, src, false, NULL) == FM_OK); /* nearest: always 1 */
    CHECK(fm_tensor_get(dst, 17) == 1.0);
    CHECK(fm_f32_to_bf16_stochastic(INFINITY, 0xFFFF) == fm_f32_to_bf16(INFINITY));
    CHECK(fm_f32_to_bf16_stochastic(3.3895314e38f, 0xFFFF) == fm_f32_to_bf16(3.3895314e38f)); /* no overflow to inf */
    fm_tensor *h = fm_tensor_empty(1, (int64_t[]){N}, FM_F16, FM_CPU);
    CHECK(fm_amp_copy_lowp_(h, src, true, NULL) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("bf16");
    CHECK(fm_amp_copy_lowp_(src, src, false, NULL) == FM_ERR_INVALID);
    fm_tensor_release_n(3, src, dst, h);
}

typedef struct seg_ctx { fm_tensor *w; } seg_ctx;
static fm_status seg(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    seg_ctx *c = ctx;
    fm_tensor *h = fm_linear(in[0], c->w, NULL), *d = h ? fm_dropout(h, 0.3, true, NULL) : NULL;
    out[0] = d ? fm_gelu(d) : NULL;
    fm_tensor_release_n(2, h, d);
    return out[0] ? FM_OK : fm_last_status();
}

static void test_segment_switch(void) {
    fm_rng r;
    fm_rng_init(&r, 16);
    seg_ctx c = {param(&r, 2, (int64_t[]){16, 16}, 0.3)};
    fm_tensor *x = param(&r, 2, (int64_t[]){4, 16}, 1.0); /* a block input is an activation that requires grad */
    fm_tensor *g[3] = {0};
    fm_checkpointing modes[3] = {FM_CKPT_NONE, FM_CKPT_BLOCKS, FM_CKPT_SELECTIVE};
    double loss[3];
    for (int k = 0; k < 3; k++) {
        fm_efficiency_opts o = fm_efficiency_defaults();
        o.checkpointing = modes[k];
        fm_manual_seed(99);
        fm_tensor *out = NULL;
        CHECK(fm_efficiency_segment(&o, FM_CKPT_BLOCKS, seg, &c, 1, &x, 1, &out) == FM_OK);
        fm_tensor *s = fm_sum(out, 0, NULL, false);
        loss[k] = fm_tensor_item(s);
        CHECK_MSG(fm_backward(s, NULL, false) == FM_OK, "%s", fm_last_error());
        CHECK(c.w->grad != NULL);
        g[k] = c.w->grad ? fm_clone(c.w->grad) : NULL;
        fm_tensor_zero_grad(x);
        fm_tensor_zero_grad(c.w);
        fm_tensor_release_n(2, out, s);
    }
    CHECK(loss[0] == loss[1] && loss[0] == loss[2]);
    CHECK(g[0] && g[1] && g[2] && rel_err(g[1], g[0]) == 0 && rel_err(g[2], g[0]) == 0);
    fm_tensor_release_n(5, g[0], g[1], g[2], x, c.w);
}

/* f for fm_linear_recompute: layer norm with parameters from ctx, then dropout */
typedef struct ln_ctx { fm_tensor *w, *b; } ln_ctx;
static fm_status ln_drop(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    ln_ctx *c = ctx;
    fm_tensor *h = fm_layer_norm(in[0], 1, c->w, c->b, 1e-5);
    out[0] = h ? fm_dropout(h, 0.25, true, NULL) : NULL;
    fm_tensor_release(h);
    return out[0] ? FM_OK : fm_last_status();
}

/* fm_efficiency_linear against fm_linear(f(x)): without checkpointing under
 * autocast it is linear_lowp (the weight's low-precision copy is not kept), with
 * selective it recomputes f; both must give the plain linear's loss and
 * gradients bit for bit, in f32 and bf16, with dropout inside f replayed. */
static void test_linear_recompute(void) {
    fm_rng r;
    fm_rng_init(&r, 17);
    ln_ctx c = {param(&r, 1, (int64_t[]){24}, 1.0), param(&r, 1, (int64_t[]){24}, 0.2)};
    fm_tensor *w = param(&r, 2, (int64_t[]){40, 24}, 0.2), *b = param(&r, 1, (int64_t[]){40}, 0.1);
    fm_tensor *x = param(&r, 3, (int64_t[]){2, 6, 24}, 1.0);
    fm_tensor *ts[5] = {c.w, c.b, w, b, x};
    fm_dtype precs[2] = {FM_F32, FM_BF16};
    for (int pi = 0; pi < 2; pi++) {
        fm_tensor *grads[3][5];
        double loss[3];
        size_t wcopy[3];
        for (int k = 0; k < 3; k++) { /* 0: plain fm_linear, 1: efficiency_linear, 2: selective */
            fm_efficiency_opts o = fm_efficiency_defaults();
            o.checkpointing = k == 2 ? FM_CKPT_SELECTIVE : FM_CKPT_NONE;
            fm_manual_seed(5);
            fm_memory_stats m0, m1;
            fm_memory_stats_get(FM_CPU, &m0);
            fm_dtype prev = fm_autocast_set(precs[pi]);
            fm_tensor *y = NULL;
            if (k == 0) {
                fm_tensor *h = NULL;
                if (ln_drop(&x, &c, &h) == FM_OK) y = fm_linear(h, w, b);
                fm_tensor_release(h);
            } else {
                y = fm_efficiency_linear(&o, ln_drop, &c, 1, &x, w, b);
            }
            fm_autocast_set(prev);
            fm_memory_stats_get(FM_CPU, &m1);
            wcopy[k] = m1.by_category[FM_MEM_WEIGHTS] - m0.by_category[FM_MEM_WEIGHTS];
            CHECK_MSG(y != NULL, "%s", fm_last_error());
            if (!y) return;
            CHECK(y->dtype == precs[pi]);
            fm_tensor *sq = fm_mul(y, y), *s = fm_sum(sq, 0, NULL, false);
            loss[k] = fm_tensor_item(s);
            CHECK_MSG(fm_backward(s, NULL, false) == FM_OK, "%s", fm_last_error());
            for (int i = 0; i < 5; i++) {
                CHECK(ts[i]->grad && ts[i]->grad->dtype == FM_F32);
                grads[k][i] = ts[i]->grad ? fm_clone(ts[i]->grad) : NULL;
                fm_tensor_zero_grad(ts[i]);
            }
            fm_tensor_release_n(3, y, sq, s);
        }
        CHECK_MSG(loss[1] == loss[0] && loss[2] == loss[0], "%s: losses %.9g %.9g %.9g", fm_precision_name(precs[pi]),
                  loss[0], loss[1], loss[2]);
        /* the plain linear keeps the bf16 weight copy (40x24x2 B, rounded up) until backward; the others none */
        if (pi) CHECK_MSG(wcopy[0] >= 40 * 24 * 2 && wcopy[1] == 0 && wcopy[2] == 0, "weight copies alive after forward: %zu %zu %zu",
                          wcopy[0], wcopy[1], wcopy[2]);
        for (int k = 1; k < 3; k++)
            for (int i = 0; i < 5; i++) {
                double e = grads[0][i] && grads[k][i] ? rel_err(grads[k][i], grads[0][i]) : 1;
                CHECK_MSG(e == 0, "%s %s tensor %d: differs from the plain linear by %g", fm_precision_name(precs[pi]),
                          k == 1 ? "efficiency_linear" : "selective", i, e);
            }
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < 5; i++) fm_tensor_release(grads[k][i]);
    }
    fm_tensor_release_n(5, c.w, c.b, w, b, x);
}

/* fm_cross_entropy_lowp against the autocast cross-entropy (f32 copy of the
 * logits): the loss within one f32 rounding (it sums blocks of rows); the same gradient bits when the mean's 1/count is a
 * power of two, else within one bf16 rounding; several row blocks; and no f32
 * copy of the logits alive after forward. */
static void test_cross_entropy_lowp(void) {
    fm_rng r;
    fm_rng_init(&r, 23);
    const int64_t V = 4096; /* 16 rows a block */
    CHECK(fm_cross_entropy_lowp_rows(V) == 16 && fm_cross_entropy_lowp_rows(512) == 128 && fm_cross_entropy_lowp_rows(50257) == 8);
    const int64_t Ns[2] = {64, 40};
    for (int ci = 0; ci < 2; ci++) {
        const int64_t N = Ns[ci];
        fm_tensor *x32 = fm_tensor_randn(2, (int64_t[]){N, V}, FM_F32, &r), *tg = fm_tensor_zeros(1, &N, FM_I64, FM_CPU);
        for (int64_t i = 0; i < N; i++) fm_tensor_set(tg, i, ci && i % 7 == 3 ? -1.0 : (double)((i * 131) % V)); /* some ignored */
        fm_tensor *x = fm_to_dtype(x32, FM_BF16);
        fm_tensor_requires_grad_(x, true);
        double loss[2];
        fm_tensor *g[2];
        size_t kept[2];
        for (int k = 0; k < 2; k++) {
            fm_memory_stats m0, m1;
            fm_memory_stats_get(FM_CPU, &m0);
            fm_dtype prev = fm_autocast_set(FM_BF16);
            fm_tensor *l = k ? fm_cross_entropy_lowp(x, tg, -1, 0.1) : fm_cross_entropy(x, tg, -1, 0.1, FM_REDUCE_MEAN);
            fm_autocast_set(prev);
            fm_memory_stats_get(FM_CPU, &m1);
            kept[k] = m1.allocated - m0.allocated;
            CHECK_MSG(l && l->dtype == FM_F32, "%s", fm_last_error());
            if (!l) return;
            loss[k] = fm_tensor_item(l);
            fm_tensor *l3 = fm_mul_scalar(l, 3.0); /* a gradient other than 1 reaches the loss */
            CHECK_MSG(fm_backward(l3, NULL, false) == FM_OK, "%s", fm_last_error());
            CHECK(x->grad && x->grad->dtype == FM_BF16);
            g[k] = x->grad ? fm_clone(x->grad) : NULL;
            fm_tensor_zero_grad(x);
            fm_tensor_release_n(2, l, l3);
        }
        CHECK_MSG(fabs(loss[1] - loss[0]) <= 0x1p-23 * fabs(loss[0]), "N %lld: loss %.9g vs %.9g", (long long)N, loss[0], loss[1]);
        CHECK_MSG(kept[0] >= (size_t)(N * V * 4) && kept[1] < 4096, "N %lld: bytes kept by forward %zu (f32 copy) vs %zu",
                  (long long)N, kept[0], kept[1]);
        int64_t diff = 0;
        double worst = 0;
        for (int64_t i = 0; g[0] && g[1] && i < N * V; i++) {
            double a = fm_tensor_get(g[0], i), b = fm_tensor_get(g[1], i);
            diff += a != b;
            double e = fabs(a - b) / (fabs(a) > 1e-30 ? fabs(a) : 1e-30);
            if (e > worst) worst = e;
        }
        if (ci == 0) CHECK_MSG(diff == 0, "N 64 (1/count = 2^-6): %lld gradient values differ", (long long)diff);
        else CHECK_MSG(worst <= 1.0 / 128, "N 40: worst relative difference %g (one bf16 rounding is 2^-8)", worst);
        fm_tensor_release_n(5, x32, tg, x, g[0], g[1]);
    }
}

/* bf16 attention: the lowp wrapper widens a slice of the batch at a time (an
 * eighth). The batch of 10 (slices of 2) must give, bit for bit, what each batch
 * element alone gives (one slice, the whole tensor widened), forward and backward,
 * and the forward must be the f32 kernel's output narrowed. */
static fm_tensor *detached_leaf(fm_tensor *t) {
    fm_tensor *c = fm_clone(t);
    fm_tensor_requires_grad_(c, true);
    return c;
}

static void test_attention_lowp_slices(void) {
    fm_rng r;
    fm_rng_init(&r, 29);
    const int64_t B = 10, sh[4] = {B, 2, 12, 8};
    fm_tensor *lp[4];
    for (int i = 0; i < 4; i++) { /* q, k, v and the output's weights c */
        fm_tensor *t = fm_tensor_randn(4, sh, FM_F32, &r);
        lp[i] = fm_to_dtype(t, FM_BF16);
        fm_tensor_release(t);
        if (i < 3) fm_tensor_requires_grad_(lp[i], true);
    }
    fm_dtype prev = fm_autocast_set(FM_BF16);
    fm_tensor *y = fm_scaled_dot_product_attention(lp[0], lp[1], lp[2], true, 0.0);
    fm_tensor *p = y ? fm_mul(y, lp[3]) : NULL, *s = p ? fm_sum(p, 0, NULL, false) : NULL;
    fm_memory_stats m0, m1;
    fm_memory_reset_peak(FM_CPU);
    fm_memory_stats_get(FM_CPU, &m0);
    CHECK_MSG(s && fm_backward(s, NULL, false) == FM_OK, "%s", fm_last_error());
    fm_memory_stats_get(FM_CPU, &m1);
    fm_autocast_set(prev);
    fm_tensor_release_n(2, p, s);
    if (!y) return;
    /* the whole batch widened at once would be 8 f32 copies of 1920 values (8 KiB each
     * once rounded) for the scratch alone; by slices the whole backward stays below */
    CHECK_MSG(m1.allocated_peak - m0.allocated < 8 * 8192, "backward peak %zu B above its start",
              (size_t)(m1.allocated_peak - m0.allocated));
    /* forward against the f32 kernel */
    fm_tensor *q32 = fm_to_dtype(lp[0], FM_F32), *k32 = fm_to_dtype(lp[1], FM_F32), *v32 = fm_to_dtype(lp[2], FM_F32);
    bool pg = fm_set_grad_enabled(false);
    fm_tensor *y32 = fm_scaled_dot_product_attention(q32, k32, v32, true, 0.0), *yn = y32 ? fm_to_dtype(y32, FM_BF16) : NULL;
    fm_set_grad_enabled(pg);
    int64_t dy = 0, dg = 0, n1 = fm_tensor_numel(y) / B;
    for (int64_t i = 0; yn && i < B * n1; i++) dy += fm_tensor_get(yn, i) != fm_tensor_get(y, i);
    fm_tensor_release_n(5, q32, k32, v32, y32, yn);
    /* each batch element alone */
    for (int64_t b = 0; b < B; b++) {
        fm_tensor *e[4];
        for (int i = 0; i < 4; i++) {
            fm_tensor *v = fm_narrow(lp[i], 0, b, 1);
            pg = fm_set_grad_enabled(false);
            e[i] = i < 3 ? detached_leaf(v) : fm_clone(v);
            fm_set_grad_enabled(pg);
            fm_tensor_release(v);
        }
        prev = fm_autocast_set(FM_BF16);
        fm_tensor *ye = fm_scaled_dot_product_attention(e[0], e[1], e[2], true, 0.0);
        fm_tensor *pe = ye ? fm_mul(ye, e[3]) : NULL, *se = pe ? fm_sum(pe, 0, NULL, false) : NULL;
        CHECK_MSG(se && fm_backward(se, NULL, false) == FM_OK, "%s", fm_last_error());
        fm_autocast_set(prev);
        for (int64_t i = 0; ye && i < n1; i++) {
            dy += fm_tensor_get(ye, i) != fm_tensor_get(y, b * n1 + i);
            for (int j = 0; j < 3; j++)
                dg += e[j]->grad && lp[j]->grad ? fm_tensor_get(e[j]->grad, i) != fm_tensor_get(lp[j]->grad, b * n1 + i) : 1;
        }
        fm_tensor_release_n(7, ye, pe, se, e[0], e[1], e[2], e[3]);
    }
    CHECK_MSG(dy == 0 && dg == 0, "bf16 attention by batch slices: %lld output and %lld gradient values differ", (long long)dy,
              (long long)dg);
    fm_tensor_release(y);
    for (int i = 0; i < 4; i++) fm_tensor_release(lp[i]);
}

/* The bias gradient of a bf16/fp16 linear: a sum over rows of a low-precision
 * matrix, now by the kernel's unit-stride column loop. Each column must be the
 * f64 sum in row order, rounded through f32, as the strided loop gave. */
static void test_lowp_column_sum(void) {
    fm_rng r;
    fm_rng_init(&r, 31);
    fm_dtype dts[2] = {FM_BF16, FM_F16};
    for (int di = 0; di < 2; di++) {
        fm_tensor *a32 = fm_tensor_randn(2, (int64_t[]){300, 70}, FM_F32, &r), *a = fm_to_dtype(a32, dts[di]);
        fm_tensor *s = fm_sum(a, 1, (int[]){0}, true);
        CHECK_MSG(s && s->dtype == dts[di], "%s", fm_last_error());
        int64_t bad = 0;
        for (int64_t c = 0; s && c < 70; c++) {
            double acc = 0;
            for (int64_t k = 0; k < 300; k++) acc += fm_tensor_get(a, k * 70 + c);
            fm_tensor *one = fm_tensor_scalar((float)acc, FM_F32), *lo = one ? fm_to_dtype(one, dts[di]) : NULL;
            bad += !lo || fm_tensor_get(lo, 0) != fm_tensor_get(s, c);
            fm_tensor_release_n(2, one, lo);
        }
        CHECK_MSG(bad == 0, "%s column sums: %lld of 70 differ from the row-order f64 sum", fm_dtype_name(dts[di]), (long long)bad);
        fm_tensor_release_n(3, a32, a, s);
    }
}

/* checkpointing under bf16 autocast recomputes in bf16: the same gradients bitwise */
static void test_checkpoint_autocast(void) {
    fm_rng r;
    fm_rng_init(&r, 18);
    seg_ctx c = {param(&r, 2, (int64_t[]){16, 16}, 0.3)};
    fm_tensor *x = param(&r, 2, (int64_t[]){4, 16}, 1.0);
    fm_tensor *g[2] = {0};
    for (int k = 0; k < 2; k++) {
        fm_efficiency_opts o = fm_efficiency_defaults();
        o.checkpointing = k ? FM_CKPT_BLOCKS : FM_CKPT_NONE;
        fm_manual_seed(3);
        fm_dtype prev = fm_autocast_set(FM_BF16);
        fm_tensor *out = NULL;
        fm_status st = fm_efficiency_segment(&o, FM_CKPT_BLOCKS, seg, &c, 1, &x, 1, &out);
        fm_autocast_set(prev);
        CHECK(st == FM_OK && out && out->dtype == FM_BF16);
        fm_tensor *s = out ? fm_sum(out, 0, NULL, false) : NULL;
        CHECK_MSG(s && fm_backward(s, NULL, false) == FM_OK, "%s", fm_last_error());
        g[k] = c.w->grad ? fm_clone(c.w->grad) : NULL;
        fm_tensor_zero_grad(c.w);
        fm_tensor_zero_grad(x);
        fm_tensor_release_n(2, out, s);
    }
    CHECK(g[0] && g[1] && rel_err(g[1], g[0]) == 0);
    fm_tensor_release_n(4, g[0], g[1], x, c.w);
}

static void test_options(void) {
    fm_efficiency_opts o = fm_efficiency_defaults();
    CHECK(fm_efficiency_validate(&o, false, 64) == FM_OK);
    fm_dtype dt;
    CHECK(fm_precision_parse("bf16", &dt) == FM_OK && dt == FM_BF16);
    CHECK(fm_precision_parse("int8", &dt) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("fp32, bf16 or fp16");
    fm_checkpointing ck;
    CHECK(fm_checkpointing_parse("selective", &ck) == FM_OK && ck == FM_CKPT_SELECTIVE);
    CHECK(fm_checkpointing_parse("all", &ck) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("none, blocks or selective");
    o.grad_accum = 0;
    CHECK(fm_efficiency_validate(&o, true, 64) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("--grad-accum must be at least 1");
    o.grad_accum = 3;
    CHECK(fm_efficiency_validate(&o, true, 64) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("--batch 64 is not divisible by --grad-accum 3");
    o = fm_efficiency_defaults();
    o.checkpointing = FM_CKPT_BLOCKS;
    CHECK(fm_efficiency_validate(&o, false, 64) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("needs a model with blocks");
    CHECK(fm_efficiency_validate(&o, true, 64) == FM_OK);
    o = fm_efficiency_defaults();
    o.precision = FM_BF16;
    o.loss_scaling = true;
    CHECK(fm_efficiency_validate(&o, true, 64) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("needs no scaler");
    o.precision = FM_F16;
    CHECK(fm_efficiency_validate(&o, true, 64) == FM_OK);
    o.stochastic_rounding = true;
    CHECK(fm_efficiency_validate(&o, true, 64) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("--stochastic-rounding needs --precision bf16");
    o = fm_efficiency_defaults();
    o.precision = FM_I32;
    CHECK(fm_efficiency_validate(&o, true, 64) == FM_ERR_INVALID);
    o = fm_efficiency_defaults();
    o.prealloc_bytes = 1 << 20;
    CHECK(fm_efficiency_validate(&o, true, 64) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("needs --memory-mode preallocate");
    o.memory_mode = FM_MEMORY_PREALLOCATE;
    o.memory_limit = 1 << 19;
    CHECK(fm_efficiency_validate(&o, true, 64) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("larger than --memory-limit");
    CHECK(fm_efficiency_validate(NULL, true, 64) == FM_ERR_INVALID);
    /* a limit too small for the weights: a clear error before training */
    o = fm_efficiency_defaults();
    o.memory_limit = 1 << 20;
    CHECK(fm_efficiency_check_fits(&o, 1000000, 2) == FM_ERR_OOM);
    CHECK_ERR_CONTAINS("cannot hold the model before training starts: 1000000 parameters need 3.81 MiB");
    CHECK(fm_efficiency_check_fits(&o, 10000, 2) == FM_OK);
    /* ZeRO-1 over 2 ranks, AdamW, 10,000 parameters: 16 bytes a parameter unsharded; 12
     * sharded with checkpoints that write the shard as it is; 16 when a checkpoint gathers
     * the whole state next to the weights (4 + 8 + this rank's 4) */
    o.memory_limit = 10000 * 16;
    CHECK(fm_efficiency_check_fits(&o, 10000, 2) == FM_OK);
    CHECK(fm_efficiency_check_fits_zero(&o, 10000, 2, 2, true) == FM_OK);
    o.memory_limit = 10000 * 16 - 1;
    CHECK(fm_efficiency_check_fits(&o, 10000, 2) == FM_ERR_OOM);
    CHECK(fm_efficiency_check_fits_zero(&o, 10000, 2, 2, true) == FM_ERR_OOM);
    CHECK_ERR_CONTAINS("the whole state a checkpoint gathers");
    o.memory_limit = 10000 * 12;
    CHECK(fm_efficiency_check_fits_zero(&o, 10000, 2, 2, false) == FM_OK);
    o.memory_limit = 10000 * 12 - 1;
    CHECK(fm_efficiency_check_fits_zero(&o, 10000, 2, 2, false) == FM_ERR_OOM);
    CHECK_ERR_CONTAINS("its checkpoints write that shard as it is");
    o.memory_limit = 10000 * 10; /* 4 ranks: 8 + 2 */
    CHECK(fm_efficiency_check_fits_zero(&o, 10000, 2, 4, false) == FM_OK);
    CHECK(fm_efficiency_check_fits_zero(&o, 10000, 2, 4, true) == FM_ERR_OOM);
    o.memory_limit = 0;
    CHECK(fm_efficiency_check_fits(&o, 1000000000, 2) == FM_OK); /* no limit */
    /* apply: preallocate through the options, then back to grow */
    o.memory_mode = FM_MEMORY_PREALLOCATE;
    o.prealloc_bytes = 4 << 20;
    CHECK_MSG(fm_efficiency_apply_memory(&o) == FM_OK, "%s", fm_last_error());
    fm_memory_stats s;
    fm_memory_stats_get(FM_CPU, &s);
    CHECK(s.mode == FM_MEMORY_PREALLOCATE && s.arena_bytes == (4u << 20));
    o = fm_efficiency_defaults();
    CHECK(fm_efficiency_apply_memory(&o) == FM_OK);
}

int main(void) {
    test_options();
    test_scaler();
    test_grad_accum();
    test_zero_system_allocs(FM_F32, false);
    test_zero_system_allocs(FM_BF16, false);
    test_zero_system_allocs(FM_F16, false);
    test_zero_system_allocs(FM_F32, true);
    test_fp16_underflow();
    test_policy();
    test_stochastic_rounding();
    test_segment_switch();
    test_linear_recompute();
    test_checkpoint_autocast();
    test_cross_entropy_lowp();
    test_attention_lowp_slices();
    test_lowp_column_sum();
    fm_parallel_shutdown();
    TEST_DONE();
}
