/* Knowledge distillation (fathom/distill.h):
 *  - fm_kd_loss's value against a direct double-precision evaluation of
 *    alpha T^2 KL(p_t || p_s) + (1 - alpha) CE, for several T and alpha;
 *  - its gradient against central finite differences (f64, tests/gradcheck.h);
 *  - fm_distill runs through the one trainer: with alpha 0 it reproduces
 *    fm_train's loss curve bit for bit; with alpha 0.9 the curve differs and the
 *    student learns the synthetic task;
 *  - bad input: temperature <= 0, alpha outside [0, 1], a missing teacher, a
 *    teacher of another input shape, class count or normalization. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "gradcheck.h"
#include "fathom/distill.h"

#include "synth_idx.h"

static char dir[256];

/* 4 classes of 8x8 images: a bright 4x4 quadrant (the class) on noise. */
static void make_split(const char *name, int n, uint32_t seed) { synth_quadrants(dir, name, n, seed); }

static void recipe(char *buf, size_t n, const char *input, const char *normalize, const char *layers) {
    snprintf(buf, n,
             "[data]\ndataset = idx\ntrain_images = %s/train-images\ntrain_labels = %s/train-labels\n"
             "test_images = %s/test-images\ntest_labels = %s/test-labels\nnormalize = %s\nworkers = 1\n"
             "[model]\ninput = %s\n%s"
             "[train]\nepochs = 1\nbatch = 32\nseed = 7\n[optimizer]\nname = adamw\nlr = 0.01\n",
             dir, dir, dir, dir, normalize, input, layers);
}

/* ---------------- the loss ---------------- */

static double ref_kd(const double *s, const double *t, const int64_t *y, int n, int c, double T, double alpha) {
    double kl = 0, ce = 0;
    for (int i = 0; i < n; i++) {
        double ms = -INFINITY, mt = -INFINITY, zs = 0, zt = 0, z1 = 0, m1 = -INFINITY;
        for (int j = 0; j < c; j++) { ms = fmax(ms, s[i * c + j] / T); mt = fmax(mt, t[i * c + j] / T); m1 = fmax(m1, s[i * c + j]); }
        for (int j = 0; j < c; j++) { zs += exp(s[i * c + j] / T - ms); zt += exp(t[i * c + j] / T - mt); z1 += exp(s[i * c + j] - m1); }
        for (int j = 0; j < c; j++) {
            double lpt = t[i * c + j] / T - mt - log(zt), lps = s[i * c + j] / T - ms - log(zs);
            kl += exp(lpt) * (lpt - lps);
        }
        ce += -(s[i * c + y[i]] - m1 - log(z1));
    }
    return alpha * T * T * kl / n + (1 - alpha) * ce / n;
}

typedef struct kd_case { fm_tensor *t, *y; double T, alpha; } kd_case;
static fm_tensor *kd_fn(fm_tensor **in, void *ctx) {
    kd_case *k = ctx;
    return fm_kd_loss(in[0], k->t, k->y, k->T, k->alpha, 0);
}

static void test_loss(void) {
    enum { N = 5, C = 6 };
    fm_rng g;
    fm_rng_init(&g, 42);
    int64_t sh[2] = {N, C}, n1 = N;
    fm_tensor *s = fm_tensor_randn(2, sh, FM_F64, &g), *t = fm_tensor_randn(2, sh, FM_F64, &g);
    fm_tensor *s3 = fm_mul_scalar(s, 3), *t3 = fm_mul_scalar(t, 3); /* spread out: softmaxes far from uniform */
    int64_t yv[N] = {0, 5, 2, 2, 4};
    fm_tensor *y = fm_tensor_from_data(yv, 1, &n1, FM_I64);
    double sv[N * C], tv[N * C];
    fm_tensor_copy_to_host(s3, sv, FM_F64);
    fm_tensor_copy_to_host(t3, tv, FM_F64);
    const double Ts[] = {1, 2, 4, 10}, As[] = {0, 0.5, 0.9, 1};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            fm_tensor *l = fm_kd_loss(s3, t3, y, Ts[i], As[j], 0);
            CHECK(l != NULL);
            if (!l) continue;
            double ref = ref_kd(sv, tv, yv, N, C, Ts[i], As[j]);
            CHECK_MSG(fabs(fm_tensor_item(l) - ref) <= 1e-12 * (1 + fabs(ref)), "T %g alpha %g: %.15g vs %.15g", Ts[i], As[j],
                      fm_tensor_item(l), ref);
            fm_tensor_release(l);
        }
    /* KL of a distribution with itself is 0: alpha 1, t = s */
    fm_tensor *l = fm_kd_loss(s3, s3, NULL, 3, 1, 0);
    CHECK(l && fabs(fm_tensor_item(l)) < 1e-12);
    fm_tensor_release(l);
    /* gradients by finite differences */
    fm_tensor_requires_grad_(s3, true);
    for (int j = 0; j < 4; j++) {
        kd_case k = {t3, y, j == 3 ? 1 : 2.5, As[j]};
        char name[64];
        snprintf(name, sizeof name, "kd_loss alpha %g", As[j]);
        fm_tensor *in[1] = {s3};
        CHECK(gradcheck(name, kd_fn, 1, in, &k, 1e-6, 1e-6));
    }
    /* bad arguments */
    CHECK(fm_kd_loss(s3, t3, y, 0, 0.5, 0) == NULL);
    CHECK_ERR_CONTAINS("temperature");
    CHECK(fm_kd_loss(s3, t3, y, 2, 1.5, 0) == NULL);
    CHECK_ERR_CONTAINS("alpha");
    CHECK(fm_kd_loss(s3, y, y, 2, 0.5, 0) == NULL);
    CHECK_ERR_CONTAINS("[N, classes]");
    CHECK(fm_kd_loss(s3, t3, NULL, 2, 0.5, 0) == NULL);
    CHECK_ERR_CONTAINS("hard labels");
    fm_tensor_release_n(5, s, t, s3, t3, y);
}

/* Per token ([B, T, V]): the KL over every position, the hard part over the targets not
 * ignored (-1), against ref_kd on the flattened rows. */
static fm_tensor *kd_tokens_fn(fm_tensor **in, void *ctx) {
    kd_case *k = ctx;
    return fm_kd_loss_tokens(in[0], k->t, k->y, k->T, k->alpha);
}

static void test_loss_tokens(void) {
    enum { B = 2, T = 3, V = 5, N = B * T };
    fm_rng g;
    fm_rng_init(&g, 7);
    int64_t sh[3] = {B, T, V}, ysh[2] = {B, T};
    fm_tensor *s0 = fm_tensor_randn(3, sh, FM_F64, &g), *t0 = fm_tensor_randn(3, sh, FM_F64, &g);
    fm_tensor *s = fm_mul_scalar(s0, 2), *t = fm_mul_scalar(t0, 2);
    int64_t yv[N] = {1, 4, -1, 0, 3, 3};
    fm_tensor *y = fm_tensor_from_data(yv, 2, ysh, FM_I64);
    double sv[N * V], tv[N * V], sk[N * V];
    int64_t yk[N];
    fm_tensor_copy_to_host(s, sv, FM_F64);
    fm_tensor_copy_to_host(t, tv, FM_F64);
    int kept = 0;
    for (int i = 0; i < N; i++)
        if (yv[i] >= 0) { memcpy(sk + kept * V, sv + i * V, V * sizeof *sk); yk[kept++] = yv[i]; }
    const double Ts[] = {1, 3}, As[] = {0, 0.4, 1};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            fm_tensor *l = fm_kd_loss_tokens(s, t, y, Ts[i], As[j]);
            CHECK(l != NULL);
            if (!l) continue;
            double ref = ref_kd(sv, tv, yv, N, V, Ts[i], 1) * As[j] + (1 - As[j]) * ref_kd(sk, sk, yk, kept, V, 1, 0);
            CHECK_MSG(fabs(fm_tensor_item(l) - ref) <= 1e-12 * (1 + fabs(ref)), "tokens T %g alpha %g: %.15g vs %.15g",
                      Ts[i], As[j], fm_tensor_item(l), ref);
            fm_tensor_release(l);
        }
    fm_tensor_requires_grad_(s, true);
    kd_case k = {t, y, 2, 0.6};
    fm_tensor *in[1] = {s};
    CHECK(gradcheck("kd_loss_tokens", kd_tokens_fn, 1, in, &k, 1e-6, 1e-6));
    /* another vocabulary is refused, naming both shapes */
    int64_t sh2[3] = {B, T, V + 1};
    fm_tensor *w = fm_tensor_randn(3, sh2, FM_F64, &g);
    CHECK(fm_kd_loss_tokens(s, w, y, 2, 0.5) == NULL);
    CHECK_ERR_CONTAINS("another vocabulary");
    fm_tensor_release_n(6, s0, t0, s, t, y, w);
}

/* ---------------- through the trainer ---------------- */

static const char *cnn =
    "layer = conv2d 8 3 padding=1\nlayer = batchnorm2d\nlayer = relu\nlayer = maxpool2d 2\n"
    "layer = flatten\nlayer = linear 32\nlayer = relu\nlayer = linear 4\n";
static const char *mlp = "layer = flatten\nlayer = linear 8\nlayer = relu\nlayer = linear 4\n";

static void test_distill(void) {
    char text[4096], tdir[300];
    fm_recipe tr, sr;
    recipe(text, sizeof text, "1 8 8", "0.3 0.25", cnn);
    CHECK(fm_recipe_parse(text, "teacher.ini", &tr) == FM_OK);
    snprintf(tdir, sizeof tdir, "%s/teacher", dir);
    fm_train_options o;
    fm_train_options_init(&o);
    o.out_dir = tdir;
    o.steps = 24;
    fm_train_result res, plain, d0, d9;
    CHECK_MSG(fm_train(&tr, &o, &res) == FM_OK, "%s", fm_last_error());
    CHECK_MSG(res.test_accuracy > 0.9, "teacher accuracy %g", res.test_accuracy);
    fm_train_result_free(&res);

    recipe(text, sizeof text, "1 8 8", "0.3 0.25", mlp);
    CHECK(fm_recipe_parse(text, "student.ini", &sr) == FM_OK);
    fm_train_options_init(&o);
    o.steps = 12;
    CHECK(fm_train(&sr, &o, &plain) == FM_OK);
    fm_distill_options dd = {4, 0};
    CHECK_MSG(fm_distill(tdir, &sr, &dd, &o, &d0) == FM_OK, "%s", fm_last_error());
    CHECK(d0.n_losses == plain.n_losses && d0.n_losses == 12);
    for (int i = 0; i < 12 && i < d0.n_losses; i++)
        CHECK_MSG(d0.losses[i] == plain.losses[i], "alpha 0, step %d: %.17g vs %.17g", i, d0.losses[i], plain.losses[i]);
    CHECK(d0.test_accuracy == plain.test_accuracy);
    dd.alpha = 0.9;
    o.steps = 40;
    CHECK_MSG(fm_distill(tdir, &sr, &dd, &o, &d9) == FM_OK, "%s", fm_last_error());
    CHECK(d9.n_losses == 40 && d9.losses[0] != plain.losses[0]);
    CHECK_MSG(d9.test_accuracy > 0.9, "distilled student accuracy %g", d9.test_accuracy);
    CHECK(d9.losses[39] < d9.losses[0]);
    fm_train_result_free(&plain);
    fm_train_result_free(&d0);
    fm_train_result_free(&d9);
    fm_recipe_free(&sr);

    /* bad input */
    fm_distill_options bad = {0, 0.5};
    recipe(text, sizeof text, "1 8 8", "0.3 0.25", mlp);
    CHECK(fm_recipe_parse(text, "student.ini", &sr) == FM_OK);
    CHECK(fm_distill(tdir, &sr, &bad, &o, &res) != FM_OK);
    CHECK_ERR_CONTAINS("temperature");
    bad.temperature = 2;
    bad.alpha = -0.1;
    CHECK(fm_distill(tdir, &sr, &bad, &o, &res) != FM_OK);
    CHECK_ERR_CONTAINS("alpha");
    bad.alpha = 0.5;
    char missing[300];
    snprintf(missing, sizeof missing, "%s/none", dir);
    CHECK(fm_distill(missing, &sr, &bad, &o, &res) != FM_OK);
    CHECK_ERR_CONTAINS("no such model directory");
    fm_recipe_free(&sr);
    recipe(text, sizeof text, "1 8 8", "0.5 0.25", mlp);
    CHECK(fm_recipe_parse(text, "student.ini", &sr) == FM_OK);
    CHECK(fm_distill(tdir, &sr, &bad, &o, &res) != FM_OK);
    CHECK_ERR_CONTAINS("normalize");
    fm_recipe_free(&sr);
    recipe(text, sizeof text, "1 8 8", "0.3 0.25", "layer = flatten\nlayer = linear 5\n");
    CHECK(fm_recipe_parse(text, "student.ini", &sr) == FM_OK);
    CHECK(fm_distill(tdir, &sr, &bad, &o, &res) != FM_OK);
    CHECK_ERR_CONTAINS("predicts 4 classes but the student 5");
    fm_recipe_free(&sr);
    recipe(text, sizeof text, "64", "0.3 0.25", "layer = linear 4\n");
    CHECK(fm_recipe_parse(text, "student.ini", &sr) == FM_OK);
    CHECK(fm_distill(tdir, &sr, &bad, &o, &res) != FM_OK);
    CHECK_ERR_CONTAINS("takes inputs");
    fm_recipe_free(&sr);
    fm_recipe_free(&tr);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/fathom_test_distill_%ld", (long)getpid());
    mkdir(dir, 0755);
    make_split("train", 128, 1);
    make_split("test", 64, 2);
    test_loss();
    test_loss_tokens();
    test_distill();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    TEST_DONE();
}
