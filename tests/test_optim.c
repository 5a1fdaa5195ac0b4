/* Optimizers and schedules against hand-computed updates (in f64, so the
 * references are exact to rounding): SGD with momentum, Nesterov and L2, Adam,
 * AdamW's decoupled decay, no-decay groups, global-norm clipping, zero_grad,
 * state names, and each schedule's values. */
#include <math.h>
#include <string.h>

#include "test_util.h"
#include "core/parallel.h"
#include "fathom/autograd.h"
#include "fathom/optim.h"

/* A leaf parameter with the given values and a gradient set to g. */
static fm_tensor *param(int n, const double *v, fm_dtype dt) {
    fm_tensor *p = fm_tensor_from_data(v, 1, (int64_t[]){n}, FM_F64);
    if (dt != FM_F64) {
        fm_tensor *q = fm_to_dtype(p, dt);
        fm_tensor_release(p);
        p = q;
    }
    fm_tensor_requires_grad_(p, true);
    return p;
}

static void set_grad(fm_tensor *p, int n, const double *g) {
    fm_tensor_zero_grad(p);
    fm_tensor *t = fm_tensor_from_data(g, 1, (int64_t[]){n}, FM_F64);
    p->grad = p->dtype == FM_F64 ? t : fm_to_dtype(t, p->dtype);
    if (p->dtype != FM_F64) fm_tensor_release(t);
}

static void test_sgd(void) {
    double v[2] = {1.0, -2.0}, g1[2] = {0.5, 1.0}, g2[2] = {-1.0, 0.25};
    /* plain SGD with L2: p -= lr (g + wd p) */
    fm_optim_config c = fm_optim_default_config(FM_OPTIM_SGD);
    c.lr = 0.1;
    c.weight_decay = 0.01;
    fm_optim *o = fm_optim_new(&c);
    fm_tensor *p = param(2, v, FM_F64);
    int g = fm_optim_add_group(o, c.weight_decay);
    CHECK(fm_optim_add_param(o, g, "p", p) == FM_OK);
    CHECK(fm_optim_add_param(o, g, "p", p) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("added twice");
    set_grad(p, 2, g1);
    CHECK(fm_optim_step(o) == FM_OK);
    CHECK_NEAR(fm_tensor_get(p, 0), 1.0 - 0.1 * (0.5 + 0.01 * 1.0), 1e-15);
    CHECK_NEAR(fm_tensor_get(p, 1), -2.0 - 0.1 * (1.0 + 0.01 * -2.0), 1e-15);
    fm_optim_free(o);
    fm_tensor_release(p);

    /* momentum 0.9, Nesterov, two steps, by hand */
    c.weight_decay = 0;
    c.momentum = 0.9;
    c.nesterov = true;
    o = fm_optim_new(&c);
    p = param(2, v, FM_F64);
    g = fm_optim_add_group(o, 0);
    fm_optim_add_param(o, g, "p", p);
    double ref[2] = {v[0], v[1]}, buf[2];
    for (int s = 0; s < 2; s++) {
        const double *gg = s ? g2 : g1;
        set_grad(p, 2, gg);
        CHECK(fm_optim_step(o) == FM_OK);
        for (int i = 0; i < 2; i++) {
            buf[i] = s ? 0.9 * buf[i] + gg[i] : gg[i];
            ref[i] -= 0.1 * (gg[i] + 0.9 * buf[i]);
        }
    }
    CHECK_NEAR(fm_tensor_get(p, 0), ref[0], 1e-14);
    CHECK_NEAR(fm_tensor_get(p, 1), ref[1], 1e-14);
    fm_named_list st;
    CHECK(fm_optim_state(o, &st) == FM_OK);
    CHECK(st.n == 1 && !strcmp(st.items[0].name, "p.momentum_buffer"));
    if (st.n) CHECK_NEAR(fm_tensor_get(st.items[0].tensor, 0), buf[0], 1e-15);
    fm_named_list_free(&st);
    /* zero_grad drops the gradients */
    fm_optim_zero_grad(o);
    CHECK(p->grad == NULL);
    fm_optim_free(o);
    fm_tensor_release(p);

    c.momentum = 0;
    CHECK(fm_optim_new(&c) == NULL);
    CHECK_ERR_CONTAINS("Nesterov");
    c.nesterov = false;
    c.lr = -1;
    CHECK(fm_optim_new(&c) == NULL);
    CHECK_ERR_CONTAINS("lr -1");
}

static void adam_ref(bool decoupled, double lr, double wd, double *p, double *m, double *v, const double *g, int t, int n) {
    for (int i = 0; i < n; i++) {
        double gi = g[i];
        if (decoupled) p[i] *= 1 - lr * wd;
        else gi += wd * p[i];
        m[i] = 0.9 * m[i] + 0.1 * gi;
        v[i] = 0.999 * v[i] + 0.001 * gi * gi;
        double mh = m[i] / (1 - pow(0.9, t)), vh = v[i] / (1 - pow(0.999, t));
        p[i] -= lr * mh / (sqrt(vh) + 1e-8);
    }
}

static void test_adam(void) {
    double v0[3] = {0.5, -1.0, 2.0};
    double gs[3][3] = {{0.1, -0.2, 0.3}, {0.05, 0.4, -0.3}, {-0.2, 0.1, 0.0}};
    for (int decoupled = 0; decoupled < 2; decoupled++) {
        fm_optim_config c = fm_optim_default_config(decoupled ? FM_OPTIM_ADAMW : FM_OPTIM_ADAM);
        c.lr = 0.01;
        c.weight_decay = 0.1;
        for (int f32 = 0; f32 < 2; f32++) {
            fm_optim *o = fm_optim_new(&c);
            fm_tensor *p = param(3, v0, f32 ? FM_F32 : FM_F64);
            fm_optim_add_param(o, fm_optim_add_group(o, c.weight_decay), "w", p);
            double ref[3] = {v0[0], v0[1], v0[2]}, m[3] = {0}, vv[3] = {0};
            for (int s = 0; s < 3; s++) {
                set_grad(p, 3, gs[s]);
                CHECK(fm_optim_step(o) == FM_OK);
                adam_ref(decoupled, 0.01, 0.1, ref, m, vv, gs[s], s + 1, 3);
            }
            for (int i = 0; i < 3; i++) CHECK_NEAR(fm_tensor_get(p, i), ref[i], f32 ? 1e-6 : 1e-13);
            CHECK(fm_optim_get_step(o) == 3);
            fm_named_list st;
            fm_optim_state(o, &st);
            CHECK(st.n == 2 && !strcmp(st.items[0].name, "w.exp_avg") && !strcmp(st.items[1].name, "w.exp_avg_sq"));
            if (st.n == 2) CHECK_NEAR(fm_tensor_get(st.items[1].tensor, 1), vv[1], f32 ? 1e-6 : 1e-15);
            fm_named_list_free(&st);
            fm_optim_free(o);
            fm_tensor_release(p);
        }
    }
}

static void test_groups_and_clip(void) {
    /* AdamW on a module: with zero gradients only decay acts, and only on the weight */
    fm_rng rng;
    fm_rng_init(&rng, 1);
    fm_module *l = fm_nn_linear(3, 2, true, &rng);
    fm_optim_config c = fm_optim_default_config(FM_OPTIM_ADAMW);
    c.lr = 0.1;
    c.weight_decay = 0.5;
    fm_optim *o = fm_optim_new(&c);
    CHECK(fm_optim_add_params(o, l) == FM_OK);
    fm_named_list p;
    fm_module_parameters(l, &p);
    double w0 = fm_tensor_get(p.items[0].tensor, 0), b0 = fm_tensor_get(p.items[1].tensor, 0);
    for (int i = 0; i < 2; i++) {
        fm_tensor *t = p.items[i].tensor;
        t->grad = fm_tensor_zeros(t->ndim, t->shape, FM_F32, FM_CPU);
    }
    CHECK(fm_optim_step(o) == FM_OK);
    CHECK_NEAR(fm_tensor_get(p.items[0].tensor, 0), w0 * (1 - 0.1 * 0.5), 1e-6);
    CHECK(fm_tensor_get(p.items[1].tensor, 0) == b0);

    /* clip by global norm: grads (3, 4) and (12) have norm 13 */
    fm_zero_(p.items[0].tensor->grad);
    fm_zero_(p.items[1].tensor->grad);
    fm_tensor_set(p.items[0].tensor->grad, 0, 3);
    fm_tensor_set(p.items[0].tensor->grad, 1, 4);
    fm_tensor_set(p.items[1].tensor->grad, 0, 12);
    double norm;
    CHECK(fm_optim_clip_grad_norm(o, 1.3, &norm) == FM_OK);
    CHECK_NEAR(norm, 13.0, 1e-12);
    CHECK_NEAR(fm_tensor_get(p.items[0].tensor->grad, 1), 0.4, 1e-6);
    CHECK_NEAR(fm_tensor_get(p.items[1].tensor->grad, 0), 1.2, 1e-6);
    CHECK(fm_optim_clip_grad_norm(o, 100, &norm) == FM_OK); /* below the limit: unchanged */
    CHECK_NEAR(fm_tensor_get(p.items[1].tensor->grad, 0), 1.2, 1e-6);
    CHECK(fm_optim_clip_grad_norm(o, 0, NULL) == FM_ERR_INVALID);
    fm_optim_zero_grad(o);
    CHECK(p.items[0].tensor->grad == NULL && p.items[1].tensor->grad == NULL);
    CHECK(fm_optim_add_param(o, 7, "x", p.items[0].tensor) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("group 7 does not exist");
    fm_named_list_free(&p);
    fm_optim_free(o);
    fm_module_free(l);
}

static void test_schedules(void) {
    fm_lr_schedule s;
    memset(&s, 0, sizeof s);
    s.base_lr = 1.0;
    s.kind = FM_SCHED_CONSTANT;
    CHECK(fm_lr_at(&s, 0) == 1.0 && fm_lr_at(&s, 1000) == 1.0);
    s.kind = FM_SCHED_STEP;
    s.step_size = 10;
    s.gamma = 0.5;
    CHECK(fm_lr_at(&s, 9) == 1.0 && fm_lr_at(&s, 10) == 0.5 && fm_lr_at(&s, 25) == 0.25);
    s.kind = FM_SCHED_WARMUP;
    s.warmup_steps = 4;
    CHECK(fm_lr_at(&s, 0) == 0.25 && fm_lr_at(&s, 3) == 1.0 && fm_lr_at(&s, 100) == 1.0);
    s.kind = FM_SCHED_COSINE;
    s.total_steps = 104;
    s.min_lr = 0.1;
    CHECK(fm_lr_at(&s, 1) == 0.5);
    CHECK_NEAR(fm_lr_at(&s, 4), 1.0, 1e-15);
    CHECK_NEAR(fm_lr_at(&s, 54), 0.55, 1e-12); /* halfway: mean of base and min */
    CHECK_NEAR(fm_lr_at(&s, 104), 0.1, 1e-15);
    CHECK_NEAR(fm_lr_at(&s, 500), 0.1, 1e-15);
    fm_sched_kind k;
    CHECK(fm_sched_kind_parse("cosine", &k) == FM_OK && k == FM_SCHED_COSINE);
    CHECK(fm_sched_kind_parse("linear", &k) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("unknown schedule 'linear'");
}

/* The global norm over many blocks (two parameters, 3 * 8192 + 5 and 7 elements):
 * against a long-double reference, the same bits with 1 and 2 threads, and the
 * clipped gradients scaled by max_norm / norm. */
static void test_clip_large(void) {
    fm_rng rng;
    fm_rng_init(&rng, 4);
    const int64_t n0 = 3 * 8192 + 5, n1 = 7;
    fm_tensor *a = fm_tensor_zeros(1, &n0, FM_F32, FM_CPU), *b = fm_tensor_zeros(1, &n1, FM_F64, FM_CPU);
    fm_tensor_requires_grad_(a, true);
    fm_tensor_requires_grad_(b, true);
    fm_optim_config c = fm_optim_default_config(FM_OPTIM_SGD);
    fm_optim *o = fm_optim_new(&c);
    int grp = fm_optim_add_group(o, 0.0);
    CHECK(fm_optim_add_param(o, grp, "a", a) == FM_OK && fm_optim_add_param(o, grp, "b", b) == FM_OK);
    double norms[2];
    long double ref = 0;
    for (int run = 0; run < 2; run++) {
        fm_set_num_threads(run == 0 ? 2 : 1);
        fm_tensor_release(a->grad);
        fm_tensor_release(b->grad);
        fm_rng_init(&rng, 4);
        a->grad = fm_tensor_randn(1, &n0, FM_F32, &rng);
        b->grad = fm_tensor_randn(1, &n1, FM_F64, &rng);
        if (run == 0) {
            for (int64_t i = 0; i < n0; i++) ref += (long double)fm_tensor_get(a->grad, i) * fm_tensor_get(a->grad, i);
            for (int64_t i = 0; i < n1; i++) ref += (long double)fm_tensor_get(b->grad, i) * fm_tensor_get(b->grad, i);
        }
        double g0 = fm_tensor_get(a->grad, 9000);
        CHECK(fm_optim_clip_grad_norm(o, 1.0, &norms[run]) == FM_OK);
        CHECK_NEAR(fm_tensor_get(a->grad, 9000), g0 / (norms[run] + 1e-6), 1e-7);
    }
    CHECK(norms[0] == norms[1]);
    CHECK_NEAR(norms[0], sqrtl(ref), 1e-12 * norms[0]);
    fm_set_num_threads(2);
    fm_optim_free(o);
    fm_tensor_release_n(2, a, b);
}

/* A one-parameter optimizer (kind, lr 1e-3 as set, decay 0.1, momentum 0.9 for SGD). */
static fm_optim *one_param_opt(fm_optim_kind kind, double lr, fm_tensor *p) {
    fm_optim_config c = fm_optim_default_config(kind);
    c.lr = lr;
    c.weight_decay = 0.1;
    c.momentum = kind == FM_OPTIM_SGD ? 0.9 : 0;
    fm_optim *o = fm_optim_new(&c);
    int g = fm_optim_add_group(o, c.weight_decay);
    CHECK(fm_optim_add_param(o, g, "w", p) == FM_OK);
    return o;
}

static bool bytes_equal(const fm_tensor *a, const fm_tensor *b) {
    return a && b && a->dtype == b->dtype && fm_tensor_numel(a) == fm_tensor_numel(b) &&
           !memcmp(fm_tensor_data(a), fm_tensor_data(b), (size_t)fm_tensor_numel(a) * fm_dtype_size(a->dtype));
}

static fm_tensor *state_slot(fm_optim *o, const char *name) {
    fm_named_list l;
    fm_tensor *t = NULL;
    if (fm_optim_state(o, &l) != FM_OK) return NULL;
    for (int i = 0; i < l.n; i++)
        if (!strcmp(l.items[i].name, name)) t = fm_tensor_retain(l.items[i].tensor);
    fm_named_list_free(&l);
    return t;
}

/* bf16/f16 parameters keep an f32 master in the optimizer state. For SGD with
 * momentum and AdamW, with clipping: the master is bit for bit the parameter of an f32
 * run fed the same 16-bit gradients, the parameter is the master rounded (bitwise
 * fm_to_dtype of it), the moments are f32, the state is named
 * w.{exp_avg,exp_avg_sq,momentum_buffer,master_weight}, and a new optimizer loaded from
 * that state continues exactly. Updates smaller than half a bf16 ulp accumulate in the
 * master until they move the parameter (without a master they would all be lost). */
static void test_master_weights(void) {
    const int64_t n = 9000; /* two sum-of-squares blocks */
    fm_dtype dts[2] = {FM_BF16, FM_F16};
    fm_optim_kind kinds[2] = {FM_OPTIM_SGD, FM_OPTIM_ADAMW};
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 2; k++) {
            fm_rng r;
            fm_rng_init(&r, 30 + 2 * d + k);
            fm_tensor *f = fm_tensor_randn(1, &n, FM_F32, &r);
            fm_tensor *p16 = fm_to_dtype(f, dts[d]), *p32 = fm_to_dtype(p16, FM_F32);
            fm_tensor_requires_grad_(p16, true);
            fm_tensor_requires_grad_(p32, true);
            fm_optim *o16 = one_param_opt(kinds[k], 1e-2, p16), *o32 = one_param_opt(kinds[k], 1e-2, p32), *o2 = NULL;
            fm_tensor *p2 = NULL;
            for (int step = 0; step < 6; step++) {
                if (step == 3) { /* a checkpoint: a new parameter and optimizer loaded from the state */
                    bool ge = fm_set_grad_enabled(false);
                    p2 = fm_clone(p16); /* a separate leaf with the same bits */
                    fm_set_grad_enabled(ge);
                    fm_tensor_requires_grad_(p2, true);
                    o2 = one_param_opt(kinds[k], 1e-2, p2);
                    fm_named_list a, b;
                    CHECK(fm_optim_init_state(o2) == FM_OK);
                    CHECK(fm_optim_state(o16, &a) == FM_OK && fm_optim_state(o2, &b) == FM_OK);
                    CHECK(a.n == b.n && a.n == (kinds[k] == FM_OPTIM_SGD ? 2 : 3));
                    for (int i = 0; i < a.n && i < b.n; i++) {
                        CHECK(!strcmp(a.items[i].name, b.items[i].name));
                        CHECK(fm_copy_(b.items[i].tensor, a.items[i].tensor) == FM_OK);
                    }
                    fm_optim_set_step(o2, fm_optim_get_step(o16));
                    fm_named_list_free(&a);
                    fm_named_list_free(&b);
                }
                fm_tensor *gf = fm_tensor_randn(1, &n, FM_F32, &r);
                fm_tensor *g16 = fm_to_dtype(gf, dts[d]);
                p16->grad = fm_tensor_retain(g16);
                p32->grad = fm_to_dtype(g16, FM_F32);
                if (p2) p2->grad = fm_to_dtype(gf, dts[d]); /* its own copy: clipping scales in place */
                double n16, n32, n2;
                /* the norm of a 16-bit gradient is that of its exact f32 widening */
                CHECK(fm_optim_clip_grad_norm(o32, 1e30, &n32) == FM_OK && fm_optim_clip_grad_norm(o16, 50.0, &n16) == FM_OK);
                CHECK(n16 == n32 && n16 > 50.0); /* 9000 unit normals: norm ~95, so clipping acts */
                if (o2) CHECK(fm_optim_clip_grad_norm(o2, 50.0, &n2) == FM_OK && n2 == n16);
                /* the f32 run gets the clipped 16-bit gradient, widened */
                fm_tensor_release(p32->grad);
                p32->grad = fm_to_dtype(p16->grad, FM_F32);
                CHECK(fm_optim_step(o16) == FM_OK && fm_optim_step(o32) == FM_OK);
                if (o2) CHECK(fm_optim_step(o2) == FM_OK);
                fm_optim_zero_grad(o16);
                fm_optim_zero_grad(o32);
                if (o2) fm_optim_zero_grad(o2);
                fm_tensor_release_n(2, gf, g16);
            }
            fm_tensor *master = state_slot(o16, "w.master_weight"), *m1 = state_slot(o16, kinds[k] == FM_OPTIM_SGD ? "w.momentum_buffer" : "w.exp_avg");
            CHECK(master && master->dtype == FM_F32 && m1 && m1->dtype == FM_F32);
            fm_tensor *rounded = master ? fm_to_dtype(master, dts[d]) : NULL;
            CHECK(bytes_equal(master, p32));
            CHECK(bytes_equal(p16, rounded));
            CHECK(p2 && bytes_equal(p2, p16));
            fm_tensor *master2 = o2 ? state_slot(o2, "w.master_weight") : NULL;
            CHECK(bytes_equal(master2, master));
            fm_optim_free(o16);
            fm_optim_free(o32);
            fm_optim_free(o2);
            fm_tensor_release_n(8, f, p16, p32, p2, master, m1, rounded, master2);
        }
}

/* bf16 1.0 has an ulp of 2^-7: plain SGD steps of 1e-3 are each below half of it, so an
 * in-place bf16 update would never move; the master accumulates them (1 - k 1e-3) and
 * the parameter follows once the master rounds below 1 (bf16 ulp 2^-8 there). */
static void test_master_small_steps(void) {
    fm_tensor *p = fm_tensor_full(1, (int64_t[]){1}, 1.0, FM_BF16, FM_CPU);
    fm_tensor_requires_grad_(p, true);
    fm_optim_config c = fm_optim_default_config(FM_OPTIM_SGD);
    c.lr = 1e-3;
    fm_optim *o = fm_optim_new(&c);
    CHECK(fm_optim_add_param(o, fm_optim_add_group(o, 0), "w", p) == FM_OK);
    for (int k = 1; k <= 5; k++) {
        p->grad = fm_tensor_full(1, (int64_t[]){1}, 1.0, FM_BF16, FM_CPU);
        CHECK(fm_optim_step(o) == FM_OK);
        fm_optim_zero_grad(o);
        fm_tensor *m = state_slot(o, "w.master_weight");
        double want = 1.0;
        for (int j = 0; j < k; j++) want = (double)(float)(want - (double)(float)1e-3); /* the f32 chain */
        CHECK(m && fm_tensor_get(m, 0) == want);
        /* 1 - k 1e-3 rounds to 1.0 while k < 2 (0.998 is nearer 0.99609 than 1 from k = 2) */
        CHECK(fm_tensor_get(p, 0) == (k < 2 ? 1.0 : 0.99609375));
        fm_tensor_release(m);
    }
    fm_optim_free(o);
    fm_tensor_release(p);
}

int main(void) {
    test_sgd();
    test_clip_large();
    test_adam();
    test_groups_and_clip();
    test_schedules();
    test_master_weights();
    test_master_small_steps();
    fm_parallel_shutdown();
    TEST_DONE();
}
