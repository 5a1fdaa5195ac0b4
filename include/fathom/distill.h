/* fathom/distill.h: knowledge distillation (`fathom distill`, docs/DEPLOY.md).
 *
 * A student classifier (a recipe) is trained by the one trainer (fm_train, hence
 * fm_train_step) against the soft targets of a trained teacher as well as the
 * hard labels, with the loss of Hinton et al. (2015):
 *
 *   loss = alpha * T^2 * KL(softmax(t / T) || softmax(s / T)) + (1 - alpha) * CE(s, y)
 *
 * s and t are the student's and the teacher's logits of the same batch; the KL
 * divergence is summed over classes and averaged over the batch (PyTorch's
 * KLDivLoss "batchmean"); T^2 keeps the soft part's gradient on the scale of the
 * hard part's as T grows. The teacher runs in evaluation mode, without a tape. */
#ifndef FATHOM_DISTILL_H
#define FATHOM_DISTILL_H
#include "fathom/export.h"
#include "fathom/gpt.h"
#include "fathom/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The loss above for logits s [N, C] (with its tape), teacher logits t [N, C] (treated as
 * constants) and labels y [N] (class indices; may be NULL when alpha is 1). T in
 * [FM_DISTILL_TEMPERATURE_MIN, FM_DISTILL_TEMPERATURE_MAX], alpha in
 * [0, 1]; label_smoothing applies to the hard part. A new scalar reference, or NULL. */
FM_API fm_tensor *fm_kd_loss(fm_tensor *s, fm_tensor *t, fm_tensor *y, double temperature, double alpha,
                             double label_smoothing);

/* The same per token, for language models: s and t [B, T, V] (s with its tape), y [B, T]
 * next-token ids (-1: ignored by the hard part; may be NULL when alpha is 1). The KL is
 * summed over the vocabulary and averaged over the B*T positions; the hard part is the
 * mean cross entropy over the positions not ignored. bf16/fp16 logits are widened to f32
 * first. A new scalar reference, or NULL. */
FM_API fm_tensor *fm_kd_loss_tokens(fm_tensor *s, fm_tensor *t, fm_tensor *y, double temperature, double alpha);

/* The temperatures fm_kd_loss takes: below 0.01 the scaled logits overflow float, above
 * 1000 T^2 does (the loss is multiplied by it). */
#define FM_DISTILL_TEMPERATURE_MIN 0.01
#define FM_DISTILL_TEMPERATURE_MAX 1000.0

typedef struct fm_distill_options {
    double temperature; /* default 2 */
    double alpha;       /* weight of the soft targets; default 0.5 (docs/DEPLOY.md: measured better than 4, 0.9) */
} fm_distill_options;
FM_API void fm_distill_options_init(fm_distill_options *d);

/* Trains `student` (a classifier recipe) as fm_train does, with the distillation loss
 * against the model in teacher_dir (a `fathom train` model directory, or a pruned one).
 * The teacher must take the student's input shape and normalization and predict the same
 * number of classes; it runs on the training device (opt->eff.device). */
FM_API fm_status fm_distill(const char *teacher_dir, const fm_recipe *student, const fm_distill_options *d,
                            const fm_train_options *opt, fm_train_result *res);

/* A GPT student (student: the options of `fathom train` for a GPT recipe) trained by the
 * GPT trainer (fm_gpt_train_ex) with fm_kd_loss_tokens against the GPT in teacher_dir (a
 * `fathom train` GPT directory). The student encodes its corpus with the teacher's
 * tokenizer.txt, so both predict over one vocabulary; its block_size must not exceed the
 * teacher's. The teacher runs in evaluation mode on the training device. Not with
 * tensor parallelism. */
FM_API fm_status fm_gpt_distill(const char *teacher_dir, const fm_gpt_train_opts *student, const fm_distill_options *d,
                                fm_gpt_train_result *res);

#ifdef __cplusplus
}
#endif
#endif
