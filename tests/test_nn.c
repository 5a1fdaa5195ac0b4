/* Modules: parameter names, train/eval modes, seeded initialization, forward
 * values, gradients reaching every parameter, and shape errors reported when a
 * stack is built rather than when data flows. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "core/parallel.h" /* shut the pool down for valgrind */
#include "fathom/autograd.h"
#include "fathom/nn.h"

static fm_module *small_cnn(fm_rng *rng) {
    fm_module *m = fm_nn_sequential();
    fm_sequential_add(m, fm_nn_conv2d(1, 4, 3, 1, 1, true, rng));
    fm_sequential_add(m, fm_nn_batchnorm2d(4, 1e-5, 0.1));
    fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU));
    fm_sequential_add(m, fm_nn_maxpool2d(2, 0, 0));
    fm_sequential_add(m, fm_nn_simple(FM_MOD_FLATTEN));
    fm_sequential_add(m, fm_nn_dropout(0.5, rng));
    fm_sequential_add(m, fm_nn_linear(4 * 4 * 4, 3, true, rng));
    return m;
}

static void test_names_and_shapes(void) {
    fm_rng rng;
    fm_rng_init(&rng, 7);
    fm_module *outer = fm_nn_sequential();
    fm_module *features = small_cnn(&rng);
    CHECK(fm_sequential_add_named(outer, "features", features) == FM_OK);
    CHECK(fm_sequential_add_named(outer, "head", fm_nn_simple(FM_MOD_TANH)) == FM_OK);
    CHECK(fm_sequential_add_named(outer, "head", fm_nn_simple(FM_MOD_TANH)) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("already exists");
    fm_named_list p, s;
    CHECK(fm_module_parameters(outer, &p) == FM_OK);
    CHECK(p.n == 6);
    const char *want[6] = {"features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias",
                           "features.6.weight", "features.6.bias"};
    for (int i = 0; i < 6 && i < p.n; i++) CHECK_MSG(!strcmp(p.items[i].name, want[i]), "%s", p.items[i].name);
    /* biases and norm weights are excluded from weight decay; conv/linear weights are not */
    CHECK(!p.items[0].no_decay && p.items[1].no_decay && p.items[2].no_decay && !p.items[4].no_decay);
    CHECK(fm_module_state(outer, &s) == FM_OK);
    CHECK(s.n == 9);
    CHECK(fm_named_list_find(&s, "features.1.running_mean") >= 0);
    CHECK(fm_named_list_find(&s, "features.1.running_var") >= 0);
    CHECK(fm_named_list_find(&s, "features.1.num_batches_tracked") >= 0);
    CHECK(fm_module_num_params(outer) == 4 * 9 + 4 + 4 + 4 + 64 * 3 + 3);
    fm_named_list_free(&p);
    fm_named_list_free(&s);

    int on;
    int64_t out[FM_MAX_DIMS], in[4] = {2, 1, 8, 8};
    CHECK(fm_module_infer_shape(outer, 4, in, &on, out) == FM_OK);
    CHECK(on == 2 && out[0] == 2 && out[1] == 3);
    int64_t bad[4] = {2, 3, 8, 8};
    CHECK(fm_module_infer_shape(outer, 4, bad, &on, out) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("layer features: layer 0");
    CHECK_ERR_CONTAINS("conv2d 1->4 k3 s1 p1 expects input [N, 1, H, W], got [2, 3, 8, 8]");
    int64_t small[4] = {2, 1, 6, 6}; /* flatten gives 36, linear wants 64 */
    CHECK(fm_module_infer_shape(outer, 4, small, &on, out) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("layer 6");
    CHECK_ERR_CONTAINS("linear 64->3 expects input [..., 64]");
    fm_module_free(outer);

    /* a conv after flatten */
    fm_module *m = fm_nn_sequential();
    fm_sequential_add(m, fm_nn_simple(FM_MOD_FLATTEN));
    fm_sequential_add(m, fm_nn_conv2d(1, 2, 3, 1, 0, true, NULL));
    CHECK(fm_module_infer_shape(m, 4, in, &on, out) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("layer 1: conv2d 1->2 k3 s1 p0 expects input [N, 1, H, W], got [2, 64]");
    fm_module_free(m);

    CHECK(fm_nn_linear(0, 3, true, NULL) == NULL);
    CHECK_ERR_CONTAINS("in_features 0");
    CHECK(fm_nn_dropout(1.5, NULL) == NULL);
    CHECK_ERR_CONTAINS("dropout");
    CHECK(fm_nn_simple(FM_MOD_LINEAR) == NULL);
}

static void test_init_seeded(void) {
    fm_rng a, b, c;
    fm_rng_init(&a, 5);
    fm_rng_init(&b, 5);
    fm_rng_init(&c, 6);
    fm_module *la = fm_nn_linear(256, 128, true, &a), *lb = fm_nn_linear(256, 128, true, &b),
              *lc = fm_nn_linear(256, 128, true, &c);
    fm_named_list pa, pb, pc;
    fm_module_parameters(la, &pa);
    fm_module_parameters(lb, &pb);
    fm_module_parameters(lc, &pc);
    int same = 1, diff = 0;
    for (int i = 0; i < 256 * 128; i++) {
        double x = fm_tensor_get(pa.items[0].tensor, i);
        same &= x == fm_tensor_get(pb.items[0].tensor, i);
        diff += x != fm_tensor_get(pc.items[0].tensor, i);
    }
    CHECK(same && diff > 1000);
    /* default (PyTorch) init: U(-1/sqrt(256), 1/sqrt(256)) */
    double mx = 0;
    for (int i = 0; i < 256 * 128; i++) mx = fmax(mx, fabs(fm_tensor_get(pa.items[0].tensor, i)));
    CHECK(mx <= 1.0 / 16 + 1e-7 && mx > 0.9 / 16);
    /* Kaiming-normal: std sqrt(2 / fan_in); Xavier-uniform: bound sqrt(6 / (fan_in + fan_out)) */
    CHECK(fm_module_init(la, FM_INIT_KAIMING, &a) == FM_OK);
    double ss = 0;
    for (int i = 0; i < 256 * 128; i++) ss += pow(fm_tensor_get(pa.items[0].tensor, i), 2);
    CHECK_NEAR(sqrt(ss / (256 * 128)), sqrt(2.0 / 256), 0.03);
    CHECK(fm_tensor_get(pa.items[1].tensor, 3) == 0.0);
    CHECK(fm_module_init(la, FM_INIT_XAVIER, &a) == FM_OK);
    mx = 0;
    for (int i = 0; i < 256 * 128; i++) mx = fmax(mx, fabs(fm_tensor_get(pa.items[0].tensor, i)));
    CHECK(mx <= sqrt(6.0 / 384) + 1e-6 && mx > 0.95 * sqrt(6.0 / 384));
    CHECK(fm_module_init(la, FM_INIT_NORMAL, &a) == FM_OK);
    ss = 0;
    for (int i = 0; i < 256 * 128; i++) ss += pow(fm_tensor_get(pa.items[0].tensor, i), 2);
    CHECK_NEAR(sqrt(ss / (256 * 128)), 0.02, 0.03);
    fm_named_list_free(&pa);
    fm_named_list_free(&pb);
    fm_named_list_free(&pc);
    fm_module_free(la);
    fm_module_free(lb);
    fm_module_free(lc);
}

static void test_forward_values(void) {
    /* linear: y = x W^T + b with known weights */
    fm_module *l = fm_nn_linear(2, 2, true, NULL);
    fm_named_list p;
    fm_module_parameters(l, &p);
    float w[4] = {1, 2, 3, 4}, bb[2] = {0.5f, -1};
    for (int i = 0; i < 4; i++) fm_tensor_set(p.items[0].tensor, i, w[i]);
    for (int i = 0; i < 2; i++) fm_tensor_set(p.items[1].tensor, i, bb[i]);
    float xv[2] = {1, -1};
    fm_tensor *x = fm_tensor_from_data(xv, 2, (int64_t[]){1, 2}, FM_F32);
    fm_tensor *y = fm_module_forward(l, x);
    CHECK(y && fm_tensor_get(y, 0) == -0.5 && fm_tensor_get(y, 1) == -2.0);
    fm_tensor_release_n(2, x, y);
    fm_named_list_free(&p);
    fm_module_free(l);

    /* activations and shape-preserving layers */
    float v[4] = {-2, -0.5f, 0.5f, 2};
    fm_tensor *t = fm_tensor_from_data(v, 2, (int64_t[]){2, 2}, FM_F32);
    struct { fm_module_kind k; double (*f)(double); } acts[] = {{FM_MOD_TANH, tanh}};
    fm_module *a = fm_nn_simple(acts[0].k);
    fm_tensor *ya = fm_module_forward(a, t);
    for (int i = 0; i < 4; i++) CHECK_NEAR(fm_tensor_get(ya, i), tanh(v[i]), 1e-6);
    fm_tensor_release(ya);
    fm_module_free(a);
    fm_module_kind kinds[] = {FM_MOD_RELU, FM_MOD_GELU, FM_MOD_SILU, FM_MOD_SIGMOID};
    for (int k = 0; k < 4; k++) {
        fm_module *m = fm_nn_simple(kinds[k]);
        fm_tensor *o = fm_module_forward(m, t);
        for (int i = 0; i < 4; i++) {
            double xi = v[i], want = kinds[k] == FM_MOD_RELU ? fmax(xi, 0)
                                    : kinds[k] == FM_MOD_GELU ? 0.5 * xi * (1 + erf(xi / sqrt(2)))
                                    : kinds[k] == FM_MOD_SILU ? xi / (1 + exp(-xi)) : 1 / (1 + exp(-xi));
            CHECK_NEAR(fm_tensor_get(o, i), want, 1e-5);
        }
        fm_tensor_release(o);
        fm_module_free(m);
    }
    fm_module *ln = fm_nn_layernorm(2, 1e-5), *rn = fm_nn_rmsnorm(2, 1e-6);
    fm_tensor *yl = fm_module_forward(ln, t), *yr = fm_module_forward(rn, t);
    CHECK_NEAR(fm_tensor_get(yl, 0), -1.0, 1e-3); /* row (-2, -0.5): normalized to (-1, 1) */
    CHECK_NEAR(fm_tensor_get(yr, 3), 2 / sqrt((0.25 + 4) / 2), 1e-4);
    fm_tensor_release_n(2, yl, yr);
    fm_module_free(ln);
    fm_module_free(rn);
    fm_tensor_release(t);

    /* embedding looks rows up */
    fm_module *e = fm_nn_embedding(5, 3, NULL);
    int64_t idx[2] = {4, 1};
    fm_tensor *ids = fm_tensor_from_data(idx, 1, (int64_t[]){2}, FM_I64);
    fm_tensor *ye = fm_module_forward(e, ids);
    fm_named_list pe;
    fm_module_parameters(e, &pe);
    CHECK(ye && ye->ndim == 2 && ye->shape[1] == 3);
    if (ye) CHECK(fm_tensor_get(ye, 0) == fm_tensor_get(pe.items[0].tensor, 12));
    fm_named_list_free(&pe);
    fm_tensor_release_n(2, ids, ye);
    fm_module_free(e);

    /* avg pool of a 4x4 ramp */
    fm_tensor *r = fm_tensor_arange(0, 16, 1, FM_F32);
    fm_tensor *r4 = fm_reshape(r, 4, (int64_t[]){1, 1, 4, 4});
    fm_module *ap = fm_nn_avgpool2d(2, 2, 0);
    fm_tensor *yp = fm_module_forward(ap, r4);
    CHECK(yp && yp->shape[2] == 2 && fm_tensor_get(yp, 0) == 2.5 && fm_tensor_get(yp, 3) == 12.5);
    fm_tensor_release_n(3, r, r4, yp);
    fm_module_free(ap);
}

static void test_modes_and_grads(void) {
    fm_rng rng;
    fm_rng_init(&rng, 3);
    fm_module *m = small_cnn(&rng);
    fm_tensor *x = fm_tensor_randn(4, (int64_t[]){4, 1, 8, 8}, FM_F32, &rng);
    CHECK(fm_module_is_training(m));
    /* training: dropout makes two passes differ; eval: identical and deterministic */
    fm_tensor *y1 = fm_module_forward(m, x), *y2 = fm_module_forward(m, x);
    int differ = 0;
    for (int i = 0; i < 12; i++) differ += fm_tensor_get(y1, i) != fm_tensor_get(y2, i);
    CHECK(differ > 0);
    fm_tensor_release_n(2, y1, y2);
    fm_named_list s;
    fm_module_state(m, &s);
    int k = fm_named_list_find(&s, "1.num_batches_tracked");
    CHECK(k >= 0 && fm_tensor_item(s.items[k].tensor) == 2);
    k = fm_named_list_find(&s, "1.running_mean");
    CHECK(k >= 0 && fm_tensor_get(s.items[k].tensor, 0) != 0.0); /* updated in training */
    fm_module_train(m, false);
    CHECK(!fm_module_is_training(fm_module_child(m, 5)));
    double rm = fm_tensor_get(s.items[k].tensor, 0);
    y1 = fm_module_forward(m, x);
    y2 = fm_module_forward(m, x);
    for (int i = 0; i < 12; i++) CHECK(fm_tensor_get(y1, i) == fm_tensor_get(y2, i));
    CHECK(fm_tensor_get(s.items[k].tensor, 0) == rm); /* eval leaves running stats alone */
    fm_tensor_release_n(2, y1, y2);
    fm_named_list_free(&s);

    /* every parameter gets a gradient of its own shape; zero_grad drops them */
    fm_module_train(m, true);
    fm_tensor *y = fm_module_forward(m, x);
    fm_tensor *loss = fm_sum(y, 0, NULL, false);
    CHECK(fm_backward(loss, NULL, false) == FM_OK);
    fm_named_list p;
    fm_module_parameters(m, &p);
    for (int i = 0; i < p.n; i++) {
        fm_tensor *g = p.items[i].tensor->grad;
        CHECK_MSG(g && fm_tensor_numel(g) == fm_tensor_numel(p.items[i].tensor), "%s", p.items[i].name);
    }
    fm_module_zero_grad(m);
    for (int i = 0; i < p.n; i++) CHECK(p.items[i].tensor->grad == NULL);
    fm_named_list_free(&p);
    fm_tensor_release_n(3, x, y, loss);

    /* a forward error names the layer */
    fm_tensor *bad = fm_tensor_zeros(4, (int64_t[]){2, 2, 8, 8}, FM_F32, FM_CPU);
    CHECK(fm_module_forward(m, bad) == NULL);
    CHECK_ERR_CONTAINS("layer 0 (conv2d 1->4");
    fm_tensor_release(bad);
    fm_module_free(m);
}

int main(void) {
    test_names_and_shapes();
    test_init_seeded();
    test_forward_values();
    test_modes_and_grads();
    fm_parallel_shutdown();
    TEST_DONE();
}
