/* fathom/prune.h: pruning of trained classifier models (`fathom prune`, docs/DEPLOY.md).
 *
 * Two kinds:
 *  - unstructured: the smallest-magnitude weights of every linear and conv2d layer
 *    are set to zero, per layer or with one threshold over all of them (global).
 *    The 0/1 masks go with the model (prune_masks.safetensors in its directory)
 *    and the trainer multiplies them in after every optimizer step, so zeros stay
 *    zero through fine-tuning and through a later `fathom train --resume`.
 *  - structured (channels): whole conv2d output channels and linear output
 *    neurons are removed. The tensors shrink: the layer's rows, the batch norm's
 *    entries that follow it, and the next layer's input columns (for a linear
 *    layer after flatten, the channel's H*W block of features). The result is a
 *    smaller model of the same kind: its recipe text names the new sizes, and
 *    predict, eval, compile and train take it as any other.
 *
 * A channel's score is the L1 norm of its filter, times |gamma| / sqrt(var + eps)
 * of the batch norm that follows it when there is one (its gain at inference).
 * The lowest-scoring channels go. A layer is prunable when its output reaches
 * exactly one next linear/conv2d layer through channel-wise layers only
 * (batchnorm2d, activations, pooling, dropout, flatten); the classifier's last
 * layer never is. */
#ifndef FATHOM_PRUNE_H
#define FATHOM_PRUNE_H
#include "fathom/export.h"
#include "fathom/gpt.h"
#include "fathom/nn.h"
#include "fathom/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FM_PRUNE_HEADS: GPT attention heads (fm_prune_gpt); FM_PRUNE_CHANNELS on a GPT: MLP neurons */
typedef enum fm_prune_kind { FM_PRUNE_UNSTRUCTURED = 0, FM_PRUNE_CHANNELS, FM_PRUNE_HEADS } fm_prune_kind;

typedef struct fm_prune_options {
    double sparsity;    /* the fraction removed, in [0, 1) */
    fm_prune_kind kind;
    bool global;        /* one ranking over all layers instead of `sparsity` in each (scores are
                         * divided by their layer's mean for channels, so layers compare) */
    bool keep_shape;    /* channels: zero the pruned channels' weights (their filters, and the next
                         * layer's columns that read them) instead of removing them: "the masked
                         * original", which the shrunk model must equal */
} fm_prune_options;
FM_API void fm_prune_options_init(fm_prune_options *o);

#define FM_PRUNE_MAX_LAYERS 64
typedef struct fm_prune_layer_report {
    char name[96];         /* "0 conv2d 1->32 k3 s1 p1" */
    int64_t before, after; /* unstructured: nonzero weights; channels: output channels */
} fm_prune_layer_report;

typedef struct fm_prune_report {
    int n_layers;
    fm_prune_layer_report layers[FM_PRUNE_MAX_LAYERS];
    int64_t params_before, params_after;  /* parameters of the model (all of them) */
    int64_t zeros_before, zeros_after;    /* exact zeros among them */
} fm_prune_report;

/* Prunes model `m` (built from recipe `r`, e.g. by fm_model_load): *out_recipe gets the
 * recipe of the result (new text, with the shrunk sizes, when structured; free with
 * fm_recipe_free), *out_model a new model, and `masks` (unstructured; empty otherwise) one
 * 0/1 f32 tensor per pruned weight, named as the parameter. `m` is not changed. */
FM_API fm_status fm_prune_classifier(const fm_recipe *r, fm_module *m, const fm_prune_options *o, fm_recipe *out_recipe,
                                     fm_module **out_model, fm_named_list *masks, fm_prune_report *rep);

/* Writes a model directory (model.safetensors with the recipe embedded, recipe.ini, and
 * prune_masks.safetensors when masks has entries) as one unit: into OUT.tmp.PID, then
 * renamed to `dir`. `dir` must not exist (or be an empty directory). */
FM_API fm_status fm_prune_save(const char *dir, const fm_recipe *r, fm_module *m, const fm_named_list *masks);

/* Structured pruning of a GPT (src/prune/prune_gpt.c): kind FM_PRUNE_HEADS removes
 * round(sparsity * n) attention heads of every block (n: heads; with grouped-query
 * attention, key/value groups with their query heads), scored by the Frobenius norm of
 * each head's value-to-output map; FM_PRUNE_CHANNELS removes round(sparsity * ffn_hidden)
 * MLP neurons of every block, scored by the norms of their input rows and output column.
 * At least one group and one neuron stay. *out is a new, smaller GPT (head_dim set for
 * heads); `m` is not changed. Per layer only (the config has one width for all blocks):
 * o->global is refused, as are unstructured pruning and keep_shape. */
FM_API fm_status fm_prune_gpt(fm_gpt *m, const fm_prune_options *o, fm_gpt **out, fm_prune_report *rep);

/* `fathom prune`: loads in_dir, prunes, fine-tunes for `finetune_steps` optimizer steps
 * when > 0 (the recipe's data, optimizer and schedule; `topt` may set batch, lr, seed,
 * threads and log; masks applied after each step), and writes out_dir atomically
 * (refused when it is in_dir or holds anything). Masks already in in_dir are kept. */
/* A GPT directory (config.json + model.safetensors + tokenizer.txt + tokens.bin, as
 * `fathom train` writes it) goes through fm_prune_gpt; the output is a GPT directory with
 * the same tokenizer and token file, fine-tuned by the GPT trainer from the pruned weights
 * when finetune_steps > 0 (topt's batch, lr and seed; its log NULL: quiet). */
FM_API fm_status fm_prune_dir(const char *in_dir, const char *out_dir, const fm_prune_options *o, int64_t finetune_steps,
                              const fm_train_options *topt, fm_prune_report *rep, fm_train_result *tres);

#ifdef __cplusplus
}
#endif
#endif
