/* The training step's traffic between host and device (fathom/train_step.h),
 * observed on the checked test device, whose backend counts its copies and
 * kernels (src/backend/check):
 *  - batches go up one step ahead (fm_batch_stage): batch N+1's upload is issued
 *    before step N's first kernel, and compute is ordered after it (the wait) only
 *    when step N+1 takes it; losses are the CPU's bit for bit; both trainers use it
 *    (the recipe trainer: every batch through the stage, and its checkpoints, which
 *    record the loader's position, are the CPU run's bytes although the loader is a
 *    batch ahead);
 *  - the step's loss is summed on the device over the micro-batches and read by
 *    the host once per step (one device-to-host copy per fm_train_step_backward,
 *    with grad accumulation and with the bf16 loss, fm_cross_entropy_lowp, which
 *    used to read its targets and every block's sum on the host);
 *  - that figure is the bits of the host's old sum (item(loss) * weight added in
 *    double per micro-batch), and the CPU's and check's losses are equal. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/check/check_memory.h"
#include "fathom/autograd.h"
#include "fathom/gpt.h"
#include "fathom/ops.h"
#include "fathom/optim.h"
#include "fathom/recipe.h"
#include "fathom/train_step.h"
#include "test_util.h"

#include "synth_idx.h"

static const fm_device CHK = {FM_DEV_CHECK, 0};

typedef struct gpt_ctx {
    fm_gpt *m;
    bool record;        /* read each micro-batch's loss on the host (the old way) */
    int64_t batch_rows; /* rows of the whole batch (the weights' denominator) */
    double host_sum;    /* sum of item(loss) * rows / batch_rows, as the step used to add it */
    int n_micro;
} gpt_ctx;

static fm_tensor *gpt_loss(void *ctx, fm_tensor *x, fm_tensor *y) {
    gpt_ctx *c = ctx;
    fm_tensor *loss = NULL, *logits = fm_gpt_forward(c->m, x, y, &loss);
    fm_tensor_release(logits);
    if (loss && c->record) {
        double w = c->batch_rows == x->shape[0] ? 1.0 : (double)x->shape[0] / (double)c->batch_rows;
        c->host_sum += fm_tensor_item(loss) * w;
    }
    c->n_micro++;
    return loss;
}

static fm_gpt *small_gpt(fm_device dev) {
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_LLAMA);
    c.n_layer = 2; c.n_head = 4; c.n_kv_head = 2; c.n_embd = 32; c.ffn_hidden = 96;
    c.block_size = 12; c.vocab_size = 48; c.dropout = 0;
    fm_rng r;
    fm_rng_init(&r, 7);
    fm_gpt *m = fm_gpt_new(&c, &r);
    CHECK_MSG(m && fm_gpt_to(m, dev) == FM_OK, "%s", fm_last_error());
    return m;
}

/* AdamW (lr 3e-3, weight decay 0.01) over m's parameters, which also go to params[]. */
static fm_optim *gpt_adamw(fm_gpt *m, fm_tensor *params[64], int *np) {
    fm_optim_config cfg = fm_optim_default_config(FM_OPTIM_ADAMW);
    cfg.lr = 3e-3;
    fm_optim *o = fm_optim_new(&cfg);
    int g = fm_optim_add_group(o, 0.01);
    const fm_named_list *ps = m ? fm_gpt_parameters(m) : NULL;
    for (int i = 0; ps && i < ps->n && *np < 64; i++) {
        CHECK(fm_optim_add_param(o, g, ps->items[i].name, ps->items[i].tensor) == FM_OK);
        params[(*np)++] = ps->items[i].tensor;
    }
    return o;
}

/* Three steps of a 5-row batch (grad_accum 3: micro-batches of 2, 2 and 1 rows) on dev
 * at the precision; losses[] per step, and the device-to-host copies per backward. */
static void run_steps(fm_device dev, fm_dtype prec, int accum, bool record, double losses[3], double host[3],
                      unsigned long long d2h[3]) {
    fm_gpt *m = small_gpt(dev);
    fm_tensor *params[64];
    int np = 0;
    fm_optim *o = gpt_adamw(m, params, &np);
    fm_efficiency_opts eo = fm_efficiency_defaults();
    eo.precision = prec;
    eo.grad_accum = accum;
    eo.device = dev;
    gpt_ctx ctx = {m, record, 5, 0, 0};
    fm_train_step ts;
    fm_train_step_init(&ts, &eo, o, np, params, gpt_loss, &ctx);
    for (int s = 0; m && s < 3; s++) {
        int64_t ids[5 * 12], tg[5 * 12];
        for (int i = 0; i < 60; i++) { ids[i] = (i * 7 + 3 * s + 1) % 48; tg[i] = (i * 5 + s + 2) % 48; }
        fm_tensor *x = fm_tensor_from_data(ids, 2, (int64_t[]){5, 12}, FM_I64);
        fm_tensor *y = fm_tensor_from_data(tg, 2, (int64_t[]){5, 12}, FM_I64);
        fm_check_counts c0, c1;
        ctx.host_sum = 0;
        ctx.n_micro = 0;
        fm_check_counts_get(&c0);
        CHECK_MSG(fm_train_step_backward(&ts, x, y, &losses[s]) == FM_OK, "%s", fm_last_error());
        fm_check_counts_get(&c1);
        CHECK(ctx.n_micro == accum);
        d2h[s] = c1.d2h - c0.d2h;
        host[s] = ctx.host_sum;
        CHECK_MSG(fm_train_step_update(&ts) == FM_OK, "%s", fm_last_error());
        fm_tensor_release_n(2, x, y);
    }
    fm_optim_free(o);
    fm_gpt_free(m);
}

static bool same(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_loss_read_once(void) {
    const fm_dtype precs[2] = {FM_F32, FM_BF16};
    for (int p = 0; p < 2; p++)
        for (int accum = 1; accum <= 3; accum += 2) {
            double cpu[3], chk[3], rec[3], host[3], h0[3];
            unsigned long long d0[3], d1[3], d2[3];
            run_steps(FM_CPU, precs[p], accum, false, cpu, h0, d0);
            run_steps(CHK, precs[p], accum, false, chk, h0, d1);
            run_steps(CHK, precs[p], accum, true, rec, host, d2);
            const char *pn = fm_dtype_name(precs[p]);
            for (int s = 0; s < 3; s++) {
                CHECK_MSG(isfinite(cpu[s]) && cpu[s] > 0, "%s accum %d step %d: loss %g", pn, accum, s, cpu[s]);
                CHECK_MSG(same(cpu[s], chk[s]), "%s accum %d step %d: cpu loss %.17g, check %.17g", pn, accum, s,
                          cpu[s], chk[s]);
                /* the device-summed figure is the host's old per-micro-batch sum, bit for bit */
                CHECK_MSG(same(rec[s], host[s]) && same(rec[s], chk[s]),
                          "%s accum %d step %d: step's loss %.17g, host sum %.17g, unrecorded run %.17g", pn, accum, s,
                          rec[s], host[s], chk[s]);
                /* one host read of device memory per step: the loss */
                CHECK_MSG(d1[s] == 1, "%s accum %d step %d: %llu device-to-host copies in the step's forward and "
                          "backward (want 1: the loss, once)", pn, accum, s, d1[s]);
                CHECK(d0[s] == 0); /* nothing on the cpu goes through the check device */
                /* reading each micro-batch's loss on the host (the old way) is visible in the count */
                CHECK_MSG(d2[s] == (unsigned long long)accum + 1, "%s accum %d: %llu copies with per-micro-batch reads",
                          pn, accum, d2[s]);
            }
        }
}

/* ---- the stage's order ---- */

typedef struct order_ctx {
    int step, steps;
    fm_check_counts at_begin[8], at_end[8];
} order_ctx;

static fm_status order_begin(void *user, int k, int n) {
    order_ctx *o = user;
    (void)n;
    if (k == 0) fm_check_counts_get(&o->at_begin[o->step]);
    return FM_OK;
}
static fm_status order_end(void *user, fm_optim *opt, bool stepped) {
    order_ctx *o = user;
    (void)opt;
    (void)stepped;
    fm_check_counts_get(&o->at_end[o->step]);
    return FM_OK;
}

static void make_batch(int s, fm_tensor **x, fm_tensor **y) {
    int64_t ids[5 * 12], tg[5 * 12];
    for (int i = 0; i < 60; i++) { ids[i] = (i * 11 + 5 * s + 1) % 48; tg[i] = (i * 3 + s + 7) % 48; }
    *x = fm_tensor_from_data(ids, 2, (int64_t[]){5, 12}, FM_I64);
    *y = fm_tensor_from_data(tg, 2, (int64_t[]){5, 12}, FM_I64);
}

/* 4 steps on dev; staged: through fm_batch_stage as the trainers drive it (take N,
 * put N+1, run step N), else the host batch handed to the step. */
static void staged_run(fm_device dev, bool staged, double losses[4], order_ctx *oc) {
    fm_gpt *m = small_gpt(dev);
    fm_tensor *params[64];
    int np = 0;
    fm_optim *o = gpt_adamw(m, params, &np);
    fm_efficiency_opts eo = fm_efficiency_defaults();
    eo.device = dev;
    eo.grad_accum = 2;
    gpt_ctx ctx = {m, false, 5, 0, 0};
    fm_train_step ts;
    fm_train_step_init(&ts, &eo, o, np, params, gpt_loss, &ctx);
    fm_train_hooks hooks = {.user = oc, .micro_begin = order_begin, .after_update = order_end};
    ts.hooks = &hooks;
    fm_batch_stage *st = staged ? fm_batch_stage_new(dev) : NULL;
    CHECK_MSG(!staged || st, "%s", fm_last_error());
    fm_tensor *hx, *hy, *x = NULL, *y = NULL;
    if (st) {
        make_batch(0, &hx, &hy);
        CHECK(fm_batch_stage_put(st, hx, hy) == FM_OK);
        fm_tensor_release_n(2, hx, hy);
    }
    for (int s = 0; m && s < 4; s++) {
        oc->step = s;
        if (st) {
            CHECK_MSG(fm_batch_stage_take(st, &x, &y) == FM_OK, "%s", fm_last_error());
            CHECK(x && fm_device_eq(fm_tensor_device(x), dev) && fm_device_eq(fm_tensor_device(y), dev));
            if (s + 1 < 4) {
                make_batch(s + 1, &hx, &hy);
                CHECK(fm_batch_stage_put(st, hx, hy) == FM_OK);
                fm_tensor_release_n(2, hx, hy); /* the stage keeps nothing of the host batch */
            }
        } else {
            make_batch(s, &x, &y);
        }
        CHECK_MSG(fm_train_step_backward(&ts, x, y, &losses[s]) == FM_OK, "%s", fm_last_error());
        CHECK_MSG(fm_train_step_update(&ts) == FM_OK, "%s", fm_last_error());
        fm_tensor_release_n(2, x, y);
    }
    CHECK(fm_batch_stage_count(st) == 0);
    fm_batch_stage_free(st);
    fm_optim_free(o);
    fm_gpt_free(m);
}

static void test_stage_order(void) {
    double cpu[4], chk[4], plain[4];
    order_ctx a, b, c;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    staged_run(FM_CPU, false, cpu, &a);
    staged_run(CHK, false, plain, &c);
    fm_check_counts c0, c1;
    fm_check_counts_get(&c0);
    staged_run(CHK, true, chk, &b);
    fm_check_counts_get(&c1);
    for (int s = 0; s < 4; s++) {
        CHECK_MSG(same(cpu[s], chk[s]) && same(cpu[s], plain[s]), "step %d: cpu %.17g, check staged %.17g, plain %.17g",
                  s, cpu[s], chk[s], plain[s]);
        /* at step s's first kernel, batches 0..s+1 (x and y each) have been issued and only
         * batches 0..s waited for: batch s+1's upload precedes step s's compute */
        const unsigned long long issued = 2ull * (unsigned long long)(s + 2 < 4 ? s + 2 : 4) + c0.h2d_ahead;
        const unsigned long long waited = 2ull * (unsigned long long)(s + 1) + c0.waits;
        CHECK_MSG(b.at_begin[s].h2d_ahead == issued && b.at_begin[s].waits == waited,
                  "step %d begins with %llu uploads issued (want %llu) and %llu waited (want %llu)", s,
                  b.at_begin[s].h2d_ahead - c0.h2d_ahead, issued - c0.h2d_ahead, b.at_begin[s].waits - c0.waits,
                  waited - c0.waits);
        /* and step s's compute ran after that, before batch s+2 was issued */
        CHECK(b.at_end[s].kernels > b.at_begin[s].kernels && b.at_end[s].h2d_ahead == b.at_begin[s].h2d_ahead);
        /* the plain path makes no staged uploads */
        CHECK(c.at_end[s].h2d_ahead == c.at_begin[s].h2d_ahead);
    }
    CHECK(c1.h2d_ahead - c0.h2d_ahead == 8 && c1.waits - c0.waits == 8);
    /* bad use: the cpu needs no stage; taking from an empty one */
    CHECK(fm_batch_stage_new(FM_CPU) == NULL);
    CHECK_ERR_CONTAINS("the cpu needs none");
    CHECK(fm_batch_stage_new((fm_device){FM_DEV_CHECK, 9}) == NULL);
    CHECK_ERR_CONTAINS("check:9 does not exist");
    fm_batch_stage *st = fm_batch_stage_new(CHK);
    fm_tensor *x, *y;
    CHECK(st && fm_batch_stage_take(st, &x, &y) == FM_ERR_STATE && !x && !y);
    CHECK_ERR_CONTAINS("no batch staged");
    /* a staged batch never taken is dropped by free (no leak: valgrind/ASan) */
    fm_tensor *hx, *hy;
    make_batch(0, &hx, &hy);
    CHECK(fm_batch_stage_put(st, hx, hy) == FM_OK && fm_batch_stage_count(st) == 1);
    fm_tensor_release_n(2, hx, hy);
    fm_batch_stage_free(st);
}

/* ---- the recipe trainer through the stage ---- */

static char g_dir[256];

static void recipe_run(fm_device dev, const char *out, fm_train_result *res) {
    char text[2048];
    snprintf(text, sizeof text,
             "[data]\ndataset = idx\ntrain_images = %s/train-images\ntrain_labels = %s/train-labels\n"
             "test_images = %s/test-images\ntest_labels = %s/test-labels\nnormalize = 0.3 0.25\nworkers = 1\n"
             "[model]\ninput = 1 8 8\nlayer = flatten\nlayer = linear 16\nlayer = relu\nlayer = linear 4\n"
             "[train]\nepochs = 3\nbatch = 32\nseed = 5\ncheckpoint_every = 2\nkeep_checkpoints = 20\n"
             "[optimizer]\nname = adamw\nlr = 0.01\n",
             g_dir, g_dir, g_dir, g_dir);
    fm_recipe r;
    CHECK(fm_recipe_parse(text, "stage.ini", &r) == FM_OK);
    fm_train_options o;
    fm_train_options_init(&o);
    o.max_steps = 11; /* 5 batches an epoch: crosses two epoch ends, checkpoints with a batch staged */
    o.skip_eval = true;
    o.out_dir = out;
    o.eff.device = dev;
    CHECK_MSG(fm_train(&r, &o, res) == FM_OK, "%s", fm_last_error());
    fm_recipe_free(&r);
}

static bool same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) eq = false;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

static void test_recipe_trainer_staged(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/fathom_stage_XXXXXX");
    if (!mkdtemp(g_dir)) { CHECK(0); return; }
    synth_quadrants(g_dir, "train", 160, 3);
    synth_quadrants(g_dir, "test", 64, 4);
    char da[300], db[300];
    snprintf(da, sizeof da, "%s/cpu", g_dir);
    snprintf(db, sizeof db, "%s/check", g_dir);
    fm_train_result a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    recipe_run(FM_CPU, da, &a);
    fm_check_counts c0, c1;
    fm_check_counts_get(&c0);
    recipe_run(CHK, db, &b);
    fm_check_counts_get(&c1);
    CHECK(a.n_losses == 11 && b.n_losses == 11);
    for (int i = 0; i < a.n_losses && i < b.n_losses; i++)
        CHECK_MSG(same(a.losses[i], b.losses[i]), "step %d: cpu %.17g, check %.17g", i, a.losses[i], b.losses[i]);
    /* every batch went up through the stage (x and y), each waited for once */
    CHECK_MSG(c1.h2d_ahead - c0.h2d_ahead == 22 && c1.waits - c0.waits == 22, "%llu staged uploads, %llu waits (want 22)",
              c1.h2d_ahead - c0.h2d_ahead, c1.waits - c0.waits);
    /* the checkpoints (loader position included) are the CPU's bytes, also those written
     * while the next batch was already staged */
    const int steps[] = {2, 4, 6, 8, 10, 11};
    const char *files[] = {"train_state.safetensors", "model.safetensors"};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++)
        for (int f = 0; f < 2; f++) {
            char pa[400], pb[400];
            snprintf(pa, sizeof pa, "%s/ckpt/step-%08d/%s", da, steps[i], files[f]);
            snprintf(pb, sizeof pb, "%s/ckpt/step-%08d/%s", db, steps[i], files[f]);
            CHECK_MSG(access(pa, R_OK) == 0 && same_file(pa, pb), "%s and %s differ (or are missing)", pa, pb);
        }
    fm_train_result_free(&a);
    fm_train_result_free(&b);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (!getenv("KEEP")) CHECK(system(cmd) == 0);
}

/* Token ids on a device are checked by the kernels, not read back by the model. */
static void test_bad_ids_on_device(void) {
    fm_gpt *m = small_gpt(CHK);
    int64_t ids[12], tg[12];
    for (int i = 0; i < 12; i++) { ids[i] = i; tg[i] = i + 1; }
    ids[3] = 70;
    fm_tensor *hx = fm_tensor_from_data(ids, 2, (int64_t[]){1, 12}, FM_I64), *hy = fm_tensor_from_data(tg, 2, (int64_t[]){1, 12}, FM_I64);
    fm_tensor *x = fm_tensor_to(hx, CHK), *y = fm_tensor_to(hy, CHK), *loss = NULL;
    CHECK(m && fm_gpt_forward(m, x, y, &loss) == NULL && !loss);
    CHECK_ERR_CONTAINS("index 70 at position 3 is out of range [0, 48)");
    fm_tensor_release_n(3, hx, x, y);
    ids[3] = 3;
    tg[5] = 48;
    hx = fm_tensor_from_data(ids, 2, (int64_t[]){1, 12}, FM_I64);
    fm_tensor_release(hy);
    hy = fm_tensor_from_data(tg, 2, (int64_t[]){1, 12}, FM_I64);
    x = fm_tensor_to(hx, CHK);
    y = fm_tensor_to(hy, CHK);
    fm_tensor *lg = m ? fm_gpt_forward(m, x, y, &loss) : NULL;
    CHECK(!loss);
    CHECK_ERR_CONTAINS("target 48 at position 5 is out of range [0, 48)");
    fm_tensor_release_n(6, hx, hy, x, y, lg, loss);
    fm_gpt_free(m);
}

int main(void) {
    test_bad_ids_on_device();
    test_stage_order();
    test_recipe_trainer_staged();
    test_loss_read_once();
    TEST_DONE();
}
