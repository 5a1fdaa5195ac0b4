/* Knowledge distillation (fathom/distill.h): the loss, composed of
 * differentiable ops so backward comes from their rules, and the run: a teacher
 * model beside the recipe trainer, whose loss hook calls the teacher on each
 * micro-batch. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/distill.h"
#include "fathom/gpt.h"

void fm_distill_options_init(fm_distill_options *d) {
    d->temperature = 2;
    d->alpha = 0.5;
}

static fm_status check_args(double temperature, double alpha) {
    if (!(temperature >= FM_DISTILL_TEMPERATURE_MIN && temperature <= FM_DISTILL_TEMPERATURE_MAX))
        return fm_set_error(FM_ERR_INVALID, "distill: the temperature must be in [%g, %g], got %g", FM_DISTILL_TEMPERATURE_MIN,
                            FM_DISTILL_TEMPERATURE_MAX, temperature);
    if (!(alpha >= 0 && alpha <= 1))
        return fm_set_error(FM_ERR_INVALID, "distill: alpha (the weight of the soft targets) must be in [0, 1], got %g", alpha);
    return FM_OK;
}

/* alpha * T^2 * KL(softmax(t/T) || softmax(s/T)), KL summed over classes, mean over the batch */
static fm_tensor *soft_part(fm_tensor *s, fm_tensor *t, double temperature, double alpha) {
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *tc = t->dtype == s->dtype ? fm_tensor_retain(t) : fm_to_dtype(t, s->dtype);
    fm_tensor *tt = tc ? fm_mul_scalar(tc, 1 / temperature) : NULL;
    fm_tensor *pt = tt ? fm_softmax(tt, 1) : NULL, *lpt = tt ? fm_log_softmax(tt, 1) : NULL;
    fm_set_grad_enabled(prev);
    fm_tensor *st = pt && lpt ? fm_mul_scalar(s, 1 / temperature) : NULL;
    fm_tensor *lps = st ? fm_log_softmax(st, 1) : NULL;
    fm_tensor *d = lps ? fm_sub(lpt, lps) : NULL;
    fm_tensor *pd = d ? fm_mul(pt, d) : NULL;
    fm_tensor *sum = pd ? fm_sum(pd, 0, NULL, false) : NULL;
    fm_tensor *out = sum ? fm_mul_scalar(sum, alpha * temperature * temperature / (double)s->shape[0]) : NULL;
    fm_tensor_release_n(9, tc, tt, pt, lpt, st, lps, d, pd, sum);
    return out;
}

/* fm_kd_loss with the hard part's ignored label (-100 for classifiers, -1 for GPT targets) */
static fm_tensor *kd_loss(fm_tensor *s, fm_tensor *t, fm_tensor *y, double temperature, double alpha,
                          double label_smoothing, int64_t ignore) {
    if (check_args(temperature, alpha)) return NULL;
    char s1[96], s2[96];
    if (!s || !t || s->ndim != 2 || t->ndim != 2 || s->shape[0] != t->shape[0] || s->shape[1] != t->shape[1]) {
        fm_set_error(FM_ERR_INVALID, "distill: the student's logits %s and the teacher's %s must both be [N, classes]",
                     s ? fm_shape_str(s->ndim, s->shape, s1, sizeof s1) : "(none)",
                     t ? fm_shape_str(t->ndim, t->shape, s2, sizeof s2) : "(none)");
        return NULL;
    }
    if (s->shape[0] == 0) { fm_set_error(FM_ERR_INVALID, "distill: an empty batch"); return NULL; }
    if (alpha < 1 && !y) { fm_set_error(FM_ERR_INVALID, "distill: alpha < 1 needs the hard labels"); return NULL; }
    fm_tensor *soft = alpha > 0 ? soft_part(s, t, temperature, alpha) : NULL;
    if (alpha > 0 && !soft) return NULL;
    if (alpha == 1) return soft;
    fm_tensor *ce = fm_cross_entropy(s, y, ignore, label_smoothing, FM_REDUCE_MEAN);
    fm_tensor *hard = ce ? fm_mul_scalar(ce, 1 - alpha) : NULL;
    fm_tensor *out = hard && soft ? fm_add(soft, hard) : fm_tensor_retain(hard);
    fm_tensor_release_n(3, soft, ce, hard);
    return out;
}

fm_tensor *fm_kd_loss(fm_tensor *s, fm_tensor *t, fm_tensor *y, double temperature, double alpha, double label_smoothing) {
    return kd_loss(s, t, y, temperature, alpha, label_smoothing, -100);
}

fm_tensor *fm_kd_loss_tokens(fm_tensor *s, fm_tensor *t, fm_tensor *y, double temperature, double alpha) {
    char s1[96], s2[96];
    if (!s || !t || s->ndim != 3 || t->ndim != 3 || s->shape[0] != t->shape[0] || s->shape[1] != t->shape[1] ||
        s->shape[2] != t->shape[2]) {
        fm_set_error(FM_ERR_INVALID, "distill: the student's logits %s and the teacher's %s must both be [B, T, vocab] (a "
                     "teacher with another vocabulary cannot teach this student)",
                     s ? fm_shape_str(s->ndim, s->shape, s1, sizeof s1) : "(none)",
                     t ? fm_shape_str(t->ndim, t->shape, s2, sizeof s2) : "(none)");
        return NULL;
    }
    const int64_t n = s->shape[0] * s->shape[1], v = s->shape[2];
    fm_tensor *s2d = fm_reshape(s, 2, (int64_t[]){n, v});
    /* under autocast the logits may be bf16/fp16: the softmaxes and KL run in f32 */
    fm_tensor *s32 = s2d && (s2d->dtype == FM_BF16 || s2d->dtype == FM_F16) ? fm_to_dtype(s2d, FM_F32)
                                                                              : fm_tensor_retain(s2d);
    fm_tensor *t2d = fm_reshape(t, 2, (int64_t[]){n, v});
    fm_tensor *y1 = y ? fm_reshape(y, 1, (int64_t[]){n}) : NULL;
    fm_tensor *out = s32 && t2d && (y1 || !y) ? kd_loss(s32, t2d, y1, temperature, alpha, 0.0, -1) : NULL;
    fm_tensor_release_n(4, s2d, s32, t2d, y1);
    return out;
}

typedef struct kd_ctx {
    fm_module *teacher;
    double temperature, alpha, label_smoothing;
} kd_ctx;

/* the trainer's loss hook: the teacher's logits of the same micro-batch, off the tape */
static fm_tensor *kd_loss_fn(void *ctx, fm_tensor *logits, fm_tensor *x, fm_tensor *y) {
    kd_ctx *k = ctx;
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *t = fm_module_forward(k->teacher, x);
    fm_set_grad_enabled(prev);
    if (!t) { fm_error_prefix("distill: the teacher's forward"); return NULL; }
    fm_tensor *loss = fm_kd_loss(logits, t, y, k->temperature, k->alpha, k->label_smoothing);
    fm_tensor_release(t);
    return loss;
}

/* [1, classes] of a model on the recipe's input shape */
static fm_status classes_of(fm_module *m, const fm_recipe *r, int64_t *classes) {
    int64_t in[FM_MAX_DIMS] = {1}, out[FM_MAX_DIMS];
    int nd;
    for (int i = 0; i < r->input_ndim; i++) in[i + 1] = r->input_shape[i];
    fm_status st = fm_module_infer_shape(m, r->input_ndim + 1, in, &nd, out);
    *classes = st == FM_OK && nd == 2 ? out[1] : -1;
    return st;
}

/* The teacher must read the student's inputs as it was trained to and predict the same classes. */
static fm_status check_teacher(const char *dir, const fm_recipe *tr, fm_module *tm, const fm_recipe *sr) {
    char s1[96], s2[96];
    if (tr->input_ndim != sr->input_ndim || memcmp(tr->input_shape, sr->input_shape, (size_t)sr->input_ndim * sizeof *sr->input_shape))
        return fm_set_error(FM_ERR_INVALID, "distill: the teacher %s takes inputs %s but the student's recipe gives %s", dir,
                            fm_shape_str(tr->input_ndim, tr->input_shape, s1, sizeof s1),
                            fm_shape_str(sr->input_ndim, sr->input_shape, s2, sizeof s2));
    const fm_transforms *a = &tr->transforms, *b = &sr->transforms;
    if (a->normalize_channels != b->normalize_channels ||
        memcmp(a->mean, b->mean, sizeof a->mean) || memcmp(a->std, b->std, sizeof a->std))
        return fm_set_error(FM_ERR_INVALID, "distill: the teacher %s was trained with normalize = %g %g but the student's "
                            "recipe has %g %g; give the student the teacher's normalize line", dir, a->mean[0], a->std[0],
                            b->mean[0], b->std[0]);
    fm_rng rng;
    fm_rng_init(&rng, 0);
    fm_module *sm = fm_recipe_build_model(sr, &rng);
    int64_t ct = -1, cs = -1;
    fm_status st = sm ? classes_of(tm, tr, &ct) : fm_last_status();
    if (st == FM_OK) st = classes_of(sm, sr, &cs);
    fm_module_free(sm);
    if (st == FM_OK && ct != cs)
        st = fm_set_error(FM_ERR_INVALID, "distill: the teacher %s predicts %lld classes but the student %lld", dir,
                          (long long)ct, (long long)cs);
    return st;
}

fm_status fm_distill(const char *teacher_dir, const fm_recipe *student, const fm_distill_options *d,
                     const fm_train_options *opt, fm_train_result *res) {
    memset(res, 0, sizeof *res);
    res->test_accuracy = -1;
    fm_distill_options dd;
    if (!d) { fm_distill_options_init(&dd); d = &dd; }
    fm_status st = check_args(d->temperature, d->alpha);
    if (st) return st;
    fm_recipe tr;
    fm_module *tm = NULL;
    if ((st = fm_model_load(teacher_dir, &tr, &tm))) { fm_error_prefix("distill: the teacher"); return st; }
    fm_train_options o;
    if (opt) o = *opt;
    else fm_train_options_init(&o);
    st = check_teacher(teacher_dir, &tr, tm, student);
    if (st == FM_OK && o.eff.device.type != FM_DEV_CPU) st = fm_module_to(tm, o.eff.device);
    if (st == FM_OK) {
        fm_module_train(tm, false);
        kd_ctx k = {tm, d->temperature, d->alpha, student->label_smoothing};
        o.loss = kd_loss_fn;
        o.loss_ctx = &k;
        if (o.log)
            fprintf(o.log, "fathom: distilling %s (%lld parameters) into %s at temperature %g, alpha %g\n", teacher_dir,
                    (long long)fm_module_num_params(tm), student->name, d->temperature, d->alpha);
        st = fm_train(student, &o, res);
    }
    fm_module_free(tm);
    fm_recipe_free(&tr);
    return st;
}

/* ---- GPT students: per-token soft targets through the GPT trainer's loss hook ---- */

typedef struct gpt_kd_ctx {
    fm_gpt *teacher;
    double temperature, alpha;
} gpt_kd_ctx;

static fm_tensor *gpt_kd_loss_fn(void *ctx, fm_tensor *logits, fm_tensor *x, fm_tensor *y) {
    gpt_kd_ctx *k = ctx;
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *t = fm_gpt_forward(k->teacher, x, NULL, NULL);
    fm_set_grad_enabled(prev);
    if (!t) { fm_error_prefix("distill: the teacher's forward"); return NULL; }
    fm_tensor *loss = fm_kd_loss_tokens(logits, t, y, k->temperature, k->alpha);
    fm_tensor_release(t);
    return loss;
}

fm_status fm_gpt_distill(const char *teacher_dir, const fm_gpt_train_opts *student, const fm_distill_options *d,
                         fm_gpt_train_result *res) {
    fm_distill_options dd;
    if (!d) { fm_distill_options_init(&dd); d = &dd; }
    fm_status st = check_args(d->temperature, d->alpha);
    if (st) return st;
    if (student->tensor_parallel > 1)
        return fm_set_error(FM_ERR_INVALID, "distill: a GPT student cannot be distilled with --tensor-parallel %d (its logits "
                            "are split by vocabulary); distill without tensor parallelism", student->tensor_parallel);
    fm_tokenizer *tok = NULL;
    fm_gpt *tm = fm_gpt_load_dir(teacher_dir, &tok);
    if (!tm) { fm_error_prefix("distill: the teacher"); return fm_last_status(); }
    fm_tokenizer_free(tok); /* loaded to check it fits the model; the trainer reads the file itself */
    const fm_gpt_config *tc = fm_gpt_get_config(tm);
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.txt", teacher_dir);
    if (tc->block_size < student->model.block_size)
        st = fm_set_error(FM_ERR_INVALID, "distill: the teacher %s reads at most %d tokens (block_size) but the student's "
                          "windows are %d; give the student block_size <= %d", teacher_dir, tc->block_size,
                          student->model.block_size, tc->block_size);
    if (st == FM_OK && student->eff.device.type != FM_DEV_CPU) st = fm_gpt_to(tm, student->eff.device);
    if (st == FM_OK) {
        fm_gpt_train_mode(tm, false);
        gpt_kd_ctx k = {tm, d->temperature, d->alpha};
        fm_gpt_train_opts o = *student;
        o.tokenizer_file = tok_path;
        o.loss = gpt_kd_loss_fn;
        o.loss_ctx = &k;
        if (!o.quiet)
            fprintf(stderr, "fathom: distilling %s (%lld parameters, vocab %d) into a %d-layer, %d-wide GPT at temperature "
                    "%g, alpha %g; the student uses the teacher's tokenizer\n", teacher_dir,
                    (long long)fm_gpt_num_params(tm), tc->vocab_size, o.model.n_layer, o.model.n_embd, d->temperature,
                    d->alpha);
        st = fm_gpt_train_ex(&o, res);
    }
    fm_gpt_free(tm);
    return st;
}
