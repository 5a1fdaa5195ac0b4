/* The trainer end to end on a small synthetic idx data set: it learns; resume
 * continues the identical loss curve bit for bit (N steps straight vs N/2 +
 * resume + N/2, across an epoch boundary, with dropout and BatchNorm); and each
 * bad input fails with a clear message: malformed recipe (file:line), unknown
 * layer, shape-incompatible stack (at build time), missing data set (with the
 * install hint), NaN loss (stops, keeps the last good checkpoint). The step's
 * own checks and checkpoint state (fm_train_step_check_loss / _state_save /
 * _state_load), which both trainers use: divergence over the running minimum,
 * the round trip of the loss scaler and minimum, and damaged values refused. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "core/parallel.h"
#include "fathom/io.h"
#include "fathom/recipe.h"
#include "fathom/train_step.h"

#include "synth_idx.h"

static char dir[256];

/* 4 classes of 8x8 images: a bright 4x4 quadrant (the class) on noise. */
static void make_split(const char *name, int n, uint32_t seed) { synth_quadrants(dir, name, n, seed); }

static char recipe_text[4096];

static void make_recipe(const char *optimizer_lines, const char *extra_train) {
    snprintf(recipe_text, sizeof recipe_text,
             "# synthetic test recipe\n"
             "[data]\n"
             "dataset = idx\n"
             "train_images = %s/train-images\n"
             "train_labels = %s/train-labels\n"
             "test_images = %s/test-images\n"
             "test_labels = %s/test-labels\n"
             "normalize = 0.3 0.25\n"
             "workers = 1\n"
             "[model]\n"
             "input = 1 8 8\n"
             "layer = conv2d 4 3 padding=1\n"
             "layer = batchnorm2d\n"
             "layer = relu\n"
             "layer = maxpool2d 2\n"
             "layer = flatten\n"
             "layer = dropout 0.2\n"
             "layer = linear 16\n"
             "layer = gelu\n"
             "layer = linear 4\n"
             "[train]\n"
             "epochs = 3\n"
             "batch = 32\n"
             "seed = 11\n"
             "%s"
             "[optimizer]\n"
             "%s"
             "[schedule]\n"
             "name = cosine\n"
             "warmup_steps = 3\n"
             "min_lr = 0.0001\n",
             dir, dir, dir, dir, extra_train, optimizer_lines);
}

static void test_learns_and_resumes(const char *opt_lines) {
    make_recipe(opt_lines, "");
    fm_recipe r;
    CHECK(fm_recipe_parse(recipe_text, "synthetic.ini", &r) == FM_OK);
    fm_train_options o;
    fm_train_result straight, first, second, full;
    char da[300], db[300];
    snprintf(da, sizeof da, "%s/a", dir);
    snprintf(db, sizeof db, "%s/b", dir);

    /* a full run learns the task */
    fm_train_options_init(&o);
    CHECK(fm_train(&r, &o, &full) == FM_OK);
    CHECK_MSG(full.test_accuracy > 0.9, "accuracy %g", full.test_accuracy);
    CHECK(full.epochs == 3 && full.steps == 18 && full.n_losses == 18);
    CHECK(full.losses[17] < full.losses[0]);

    /* N = 10 steps straight (an epoch has 6 batches, so this crosses a boundary) */
    fm_train_options_init(&o);
    o.max_steps = 10;
    o.skip_eval = true;
    o.out_dir = da;
    CHECK(fm_train(&r, &o, &straight) == FM_OK);
    CHECK(straight.n_losses == 10);
    /* the first 10 steps of the full run are the same steps */
    for (int i = 0; i < 10 && i < straight.n_losses; i++) CHECK(straight.losses[i] == full.losses[i]);
    /* 5 steps, checkpoint, resume for the other 5 */
    o.max_steps = 5;
    o.out_dir = db;
    CHECK(fm_train(&r, &o, &first) == FM_OK);
    o.max_steps = 10;
    o.out_dir = NULL;
    o.resume_dir = db;
    CHECK(fm_train(&r, &o, &second) == FM_OK);
    CHECK(first.n_losses == 5 && second.n_losses == 5 && second.first_step == 5);
    for (int i = 0; i < 5 && i < first.n_losses; i++) CHECK_MSG(first.losses[i] == straight.losses[i], "step %d", i);
    for (int i = 0; i < 5 && i < second.n_losses; i++)
        CHECK_MSG(second.losses[i] == straight.losses[5 + i], "step %d: %.17g vs %.17g", 5 + i, second.losses[i],
                  straight.losses[5 + i]);
    /* and the saved weights are byte-identical */
    fm_named_list wa, wb;
    char pa[320], pb[320];
    snprintf(pa, sizeof pa, "%s/model.safetensors", da);
    snprintf(pb, sizeof pb, "%s/model.safetensors", db);
    CHECK(fm_safetensors_load(pa, &wa, NULL) == FM_OK && fm_safetensors_load(pb, &wb, NULL) == FM_OK);
    CHECK(wa.n == wb.n && wa.n == 11);
    for (int i = 0; i < wa.n && i < wb.n; i++) {
        size_t n = fm_tensor_nbytes(wa.items[i].tensor);
        CHECK_MSG(n == fm_tensor_nbytes(wb.items[i].tensor) &&
                  !memcmp(fm_tensor_data(wa.items[i].tensor), fm_tensor_data(wb.items[i].tensor), n),
                  "%s differs", wa.items[i].name);
    }
    fm_named_list_free(&wa);
    fm_named_list_free(&wb);

    /* the saved model loads by itself and evaluates */
    fm_recipe r2;
    fm_module *m;
    CHECK(fm_model_load(da, &r2, &m) == FM_OK);
    fm_dataset *test = fm_recipe_dataset(&r2, FM_SPLIT_TEST, NULL);
    double acc = -1, loss = -1;
    CHECK(test && fm_evaluate(m, test, &r2.transforms, 16, &acc, &loss) == FM_OK);
    CHECK(acc >= 0 && acc <= 1 && loss > 0);
    fm_dataset_release(test);
    fm_module_free(m);
    fm_recipe_free(&r2);

    fm_train_result_free(&full);
    fm_train_result_free(&straight);
    fm_train_result_free(&first);
    fm_train_result_free(&second);
    fm_recipe_free(&r);
}

static void expect_parse_error(const char *text, const char *needle) {
    fm_recipe r;
    CHECK_MSG(fm_recipe_parse(text, "bad.ini", &r) == FM_ERR_FORMAT, "parsed: %s", text);
    CHECK_ERR_CONTAINS(needle);
}

static void expect_build_error(const char *layers, const char *needle) {
    char text[1024];
    snprintf(text, sizeof text, "[model]\ninput = 1 8 8\n%s", layers);
    fm_recipe r;
    CHECK(fm_recipe_parse(text, "bad.ini", &r) == FM_OK);
    fm_module *m = fm_recipe_build_model(&r, NULL);
    CHECK_MSG(m == NULL, "built: %s", layers);
    fm_module_free(m);
    CHECK_ERR_CONTAINS(needle);
    fm_recipe_free(&r);
}

static void test_bad_recipes(void) {
    expect_parse_error("[model]\ninput = 1 8 8\nlayer = linear 4\n[train]\nepochs = many\n",
                       "bad.ini:5: train.epochs: expected a number of epochs >= 1, at most 2147483647, got 'many'");
    expect_parse_error("[model]\ninput = 1 8 8\nthis line has no equals sign\n", "bad.ini:3: expected 'key = value'");
    expect_parse_error("[modle]\ninput = 1\n", "bad.ini:2: unknown section [modle]");
    expect_parse_error("[train]\nbatchsize = 3\n", "bad.ini:2: unknown key 'batchsize' in [train]");
    expect_parse_error("[optimizer]\nname = lamb\n", "bad.ini:2: optimizer.name: expected sgd, adam or adamw");
    expect_parse_error("[train]\nepochs = 2\n", "needs 'input = ...'");
    /* an embedding takes the data's token ids: only as the first layer (it parsed anywhere before) */
    expect_parse_error("[model]\ninput = 8\nlayer = linear 4\nlayer = embedding 16 3\n",
                       "bad.ini:4: layer 'embedding 16 3' comes after 1 other layer, but an embedding takes the token ids");
    expect_parse_error("[model]\ninput = 8\nlayer = embedding 16 3\nlayer = flatten\nlayer = embedding\t9 2\n",
                       "' comes after 2 other layers, but an embedding takes the token ids");
    CHECK_ERR_CONTAINS("bad.ini:5: layer 'embedding");
    fm_recipe ok;
    CHECK(fm_recipe_parse("[model]\ninput = 8\nlayer = embedding 16 3\nlayer = embeddingx\n", "ok.ini", &ok) == FM_OK);
    fm_recipe_free(&ok); /* a layer named otherwise is refused by name when the model is built, not here */
    fm_recipe r;
    CHECK(fm_recipe_load("/nonexistent/x.ini", &r) == FM_ERR_IO);
    CHECK_ERR_CONTAINS("cannot open recipe /nonexistent/x.ini");
    CHECK(fm_recipe_load("no-such-recipe", &r) == FM_ERR_IO);
    CHECK_ERR_CONTAINS("no built-in recipe named 'no-such-recipe'");

    expect_build_error("layer = flatten\nlayer = conv3d 4 3\n", "bad.ini:4: unknown layer 'conv3d' (expected one of: linear");
    expect_build_error("layer = flatten\nlayer = conv2d 4 3\n",
                       "bad.ini:4: layer 'conv2d 4 3' expects input [N, C, H, W] but the previous layers give [1, 64]");
    expect_build_error("layer = conv2d 4 3\nlayer = linear 10\n",
                       "bad.ini:4: layer 'linear 10' expects input [N, features] but the previous layers give [1, 4, 6, 6]");
    expect_build_error("layer = maxpool2d 4\nlayer = maxpool2d 4\nlayer = flatten\nlayer = linear 2\n",
                       "bad.ini:4: layer 1 ('maxpool2d 4') does not fit");
    expect_build_error("layer = flatten\nlayer = linear 32 10\n",
                       "bad.ini:4: layer 1 ('linear 32 10') does not fit: linear 32->10 expects input [..., 32]");
    expect_build_error("layer = conv2d 4 3\n", "the model's output is [1, 4, 6, 6]");
    expect_build_error("layer = embedding 10\n", "bad.ini:3: layer 'embedding 10': embedding takes 2 numbers, got 1");

    /* the built-in recipes parse and build */
    const char *names[2] = {"fashion-cnn", "fashion-mlp"};
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(fm_recipe_load(names[i], &r) == FM_OK, "%s: %s", names[i], fm_last_error());
        fm_module *m = fm_recipe_build_model(&r, NULL);
        CHECK(m != NULL);
        fm_module_free(m);
        fm_recipe_free(&r);
    }
}

static void test_missing_dataset(void) {
    const char *text = "[data]\ndataset = fashion-mnist\npath = /nonexistent/fmnist\n"
                       "[model]\ninput = 1 28 28\nlayer = flatten\nlayer = linear 10\n";
    fm_recipe r;
    CHECK(fm_recipe_parse(text, "missing.ini", &r) == FM_OK);
    fm_train_result res;
    CHECK(fm_train(&r, NULL, &res) == FM_ERR_IO);
    CHECK_ERR_CONTAINS("apt-get install dataset-fashion-mnist");
    fm_train_result_free(&res);
    fm_recipe_free(&r);
}

static void test_nan_loss(void) {
    make_recipe("name = sgd\nlr = 1e30\n", "checkpoint_every = 1\n");
    fm_recipe r;
    CHECK(fm_recipe_parse(recipe_text, "nan.ini", &r) == FM_OK);
    char dn[300];
    snprintf(dn, sizeof dn, "%s/nan", dir);
    fm_train_options o;
    fm_train_options_init(&o);
    o.out_dir = dn;
    fm_train_result res;
    CHECK(fm_train(&r, &o, &res) == FM_ERR_STATE);
    CHECK_ERR_CONTAINS("the loss became");
    /* the first checkpoint (step 1) already holds the weights that gave the loss, and none
     * is older, so nothing is set aside and the message says so (4696814) */
    CHECK_ERR_CONTAINS("holds the weights that gave this loss, and no earlier one is kept");
    /* that checkpoint is there, loads, and holds finite weights */
    fm_recipe r2;
    fm_module *m;
    CHECK(fm_model_load(dn, &r2, &m) == FM_OK);
    if (m) {
        fm_named_list p;
        fm_module_parameters(m, &p);
        for (int i = 0; i < p.n; i++)
            for (int64_t k = 0; k < fm_tensor_numel(p.items[i].tensor); k++)
                if (!isfinite(fm_tensor_get(p.items[i].tensor, k))) { CHECK_MSG(0, "%s is not finite", p.items[i].name); break; }
        fm_named_list_free(&p);
        fm_module_free(m);
        fm_recipe_free(&r2);
    }
    fm_train_result_free(&res);
    fm_recipe_free(&r);
}

/* The cross-entropy loss of a recipe model whose first layer is an embedding, on ids x. */
static double emb_loss(fm_module *m, fm_tensor *x, fm_tensor *y) {
    fm_tensor *lg = fm_module_forward(m, x), *l = lg ? fm_cross_entropy(lg, y, -100, 0.0, FM_REDUCE_MEAN) : NULL;
    double v = l ? fm_tensor_item(l) : NAN;
    fm_tensor_release_n(2, lg, l);
    return v;
}

/* A recipe whose first layer is an embedding trains through its table: the gradient of the loss
 * with respect to the table (the scatter-add of the output gradient into the rows of the ids seen,
 * a repeated id adding once per occurrence) equals central differences of the loss, element by
 * element; a row no id names gets exactly 0, and the ids, made from the data's values, get no
 * gradient. The data's values become ids only when they are whole numbers in [0, V). */
static void test_embedding_recipe_grad(const char *model) {
    fm_recipe r;
    CHECK(fm_recipe_parse(model, "emb.ini", &r) == FM_OK);
    CHECK(fm_recipe_token_vocab(&r) == 7);
    fm_rng rng;
    fm_rng_init(&rng, 11);
    fm_module *m = fm_recipe_build_model(&r, &rng);
    CHECK(m != NULL);
    if (!m) { fm_recipe_free(&r); return; }
    /* row 4 is named by no id; rows 0, 2, 5 several times */
    const float v[15] = {0, 1, 2, 3, 5, 5, 5, 0, 6, 1, 2, 2, 3, 0, 6};
    fm_tensor *xf = fm_tensor_from_data(v, 2, (int64_t[]){3, 5}, FM_F32);
    fm_tensor *x = fm_recipe_token_ids(&r, xf, "ids");
    fm_tensor *y = fm_tensor_from_data((int64_t[]){0, 3, 1}, 1, (int64_t[]){3}, FM_I64);
    CHECK(x && x->dtype == FM_I64 && fm_tensor_get(x, 8) == 6);
    fm_named_list ps = {0};
    CHECK(fm_module_parameters(m, &ps) == FM_OK);
    int k = fm_named_list_find(&ps, "0.weight");
    CHECK(k >= 0);
    fm_tensor *w = k >= 0 ? ps.items[k].tensor : NULL;
    fm_tensor *lg = x ? fm_module_forward(m, x) : NULL, *l = lg ? fm_cross_entropy(lg, y, -100, 0.0, FM_REDUCE_MEAN) : NULL;
    CHECK(l && fm_backward(l, NULL, false) == FM_OK);
    fm_tensor_release_n(2, lg, l);
    CHECK(w && w->grad && x && x->grad == NULL);
    double worst = 0, row4 = 0, gsum = 0;
    bool prev = fm_set_grad_enabled(false);
    for (int64_t i = 0; w && w->grad && i < 21; i++) {
        const double w0 = fm_tensor_get(w, i), eps = 1e-2, g = fm_tensor_get(w->grad, i);
        fm_tensor_set(w, i, w0 + eps);
        const double lp = emb_loss(m, x, y);
        fm_tensor_set(w, i, w0 - eps);
        const double lm = emb_loss(m, x, y);
        fm_tensor_set(w, i, w0);
        const double num = (lp - lm) / (2 * eps), err = fabs(num - g) / (1e-3 + fabs(num));
        if (err > worst) worst = err;
        if (i / 3 == 4) row4 += fabs(g);
        gsum += fabs(g);
    }
    fm_set_grad_enabled(prev);
    printf("embedding recipe (%s): table gradient against central differences (eps 1e-2, f32): worst relative error %.2e\n",
           strstr(model, "meanpool") ? "meanpool" : "flatten", worst);
    CHECK_MSG(worst < 2e-2, "embedding table gradient against central differences: worst relative error %g", worst);
    CHECK_MSG(row4 == 0 && gsum > 1e-3, "row 4 (no id names it) has gradient %g; all rows %g", row4, gsum);
    /* values that are no ids of the table */
    const float bad[3][2] = {{1, 7}, {2.5f, 0}, {-1, 0}};
    const char *want[3] = {"sample 0, position 1: 7 is not a token id", "sample 0, position 0: 2.5 is not",
                           "sample 0, position 0: -1 is not"};
    for (int i = 0; i < 3; i++) {
        fm_tensor *b = fm_tensor_from_data(bad[i], 2, (int64_t[]){1, 2}, FM_F32), *ids = fm_recipe_token_ids(&r, b, "bad.csv");
        CHECK(ids == NULL);
        CHECK_ERR_CONTAINS(want[i]);
        fm_tensor_release_n(2, b, ids);
    }
    fm_named_list_free(&ps);
    fm_tensor_release_n(3, xf, x, y);
    fm_module_free(m);
    fm_recipe_free(&r);
}

/* The loss check and the state both trainers checkpoint through fm_train_step. */
static void test_step_state(void) {
    fm_efficiency_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.precision = FM_F16;
    eo.grad_accum = 1;
    eo.loss_scaling = true;
    fm_train_step a, b;
    fm_train_step_init(&a, &eo, NULL, 0, NULL, NULL, NULL);
    a.divergence_factor = 10;
    char why[200] = "";
    CHECK(isnan(a.loss_min));
    CHECK(fm_train_step_check_loss(&a, 2.0, why, sizeof why) && a.loss_min == 2.0);
    CHECK(fm_train_step_check_loss(&a, 0.5, why, sizeof why) && a.loss_min == 0.5);
    CHECK(fm_train_step_check_loss(&a, 4.9, why, sizeof why) && a.loss_min == 0.5); /* under 10 x 0.5 */
    CHECK(fm_train_step_check_loss(&a, NAN, why, sizeof why)); /* fp16: the scaler skips the step */
    CHECK(!fm_train_step_check_loss(&a, 5.1, why, sizeof why));
    CHECK(strstr(why, "the loss diverged: 5.1 is over 10 x its running minimum 0.5 (divergence_factor)") != NULL);
    a.scaler.scale = 2048;
    a.scaler.growth_tracker = 17;
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    CHECK(fm_train_step_state_save(&a, &meta) == FM_OK);
    CHECK(meta.n == 3);
    fm_train_step_init(&b, &eo, NULL, 0, NULL, NULL, NULL);
    CHECK(fm_train_step_state_load(&b, &meta) == FM_OK);
    CHECK(b.scaler.scale == 2048 && b.scaler.growth_tracker == 17 && b.loss_min == 0.5);
    /* without the scaler (fp32) a non-finite loss stops the run, and the scaler's keys are neither
     * written nor applied */
    fm_efficiency_opts e32 = eo;
    e32.precision = FM_F32;
    e32.loss_scaling = false;
    fm_train_step c;
    fm_train_step_init(&c, &e32, NULL, 0, NULL, NULL, NULL);
    CHECK(!fm_train_step_check_loss(&c, INFINITY, why, sizeof why) && strstr(why, "the loss became inf"));
    CHECK(fm_train_step_state_load(&c, &meta) == FM_OK && c.scaler.scale != 2048 && c.loss_min == 0.5);
    fm_kv_list m2;
    memset(&m2, 0, sizeof m2);
    CHECK(fm_train_step_state_save(&c, &m2) == FM_OK && m2.n == 1 && fm_kv_get(&m2, "loss_scale") == NULL);
    fm_kv_free(&m2);
    /* damaged values: refused, named, and nothing applied */
    static const char *const bad[][3] = {{"loss_min", "abc", "loss_min is 'abc'"},
                                         {"loss_min", "nan", "loss_min is 'nan'"},
                                         {"loss_min", "1e999", "loss_min is '1e999'"},
                                         {"loss_scale", "-4", "loss_scale -4 must be > 0"},
                                         {"loss_scale_growth_tracker", "1e30", "loss_scale_growth_tracker 1e+30"},
                                         {"loss_scale_growth_tracker", "2.5", "a whole number"},
                                         {"loss_scale", "", "loss_scale is ''"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fm_kv_list m3;
        memset(&m3, 0, sizeof m3);
        CHECK(fm_kv_set(&m3, bad[i][0], bad[i][1]) == FM_OK);
        fm_train_step_init(&b, &eo, NULL, 0, NULL, NULL, NULL);
        CHECK(fm_train_step_state_load(&b, &m3) == FM_ERR_FORMAT);
        CHECK_ERR_CONTAINS(bad[i][2]);
        CHECK(isnan(b.loss_min) && b.scaler.scale == 65536 && b.scaler.growth_tracker == 0);
        fm_kv_free(&m3);
    }
    fm_kv_free(&meta);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/fathom_test_train_%d", (int)getpid());
    CHECK(fm_mkdir_p(dir) == FM_OK);
    make_split("train", 192, 1);
    make_split("test", 64, 2);
    test_learns_and_resumes("name = adamw\nlr = 0.01\nweight_decay = 0.01\n");
    test_learns_and_resumes("name = sgd\nlr = 0.05\nmomentum = 0.9\nnesterov = true\n");
    test_bad_recipes();
    test_embedding_recipe_grad("[model]\ninput = 5\nlayer = embedding 7 3\nlayer = layernorm\nlayer = flatten\nlayer = linear 4\n");
    /* the bag of words: the mean of the token vectors (every id's row gets 1/5 of its share) */
    test_embedding_recipe_grad("[model]\ninput = 5\nlayer = embedding 7 3\nlayer = meanpool\nlayer = linear 4\n");
    test_missing_dataset();
    test_nan_loss();
    test_step_state();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    fm_parallel_shutdown();
    TEST_DONE();
}
