/* fathom/recipe.h: training runs described by a recipe file, and the trainer.
 *
 * A recipe is an INI file (parsed with libinih) holding the data set and its
 * transforms, the model's layers, the optimizer, the schedule, epochs, batch
 * size and seed; see data/recipes/fashion-cnn.ini for a commented example.
 * Built-in recipes ship in <datadir>/recipes and are found by name. Parse
 * errors name the file and line and say what was expected.
 *
 * A trained model directory holds model.safetensors (weights + buffers; the
 * recipe text is embedded in its metadata so the directory is self-contained),
 * train_state.safetensors (optimizer moments, step, data position, RNG) and a
 * copy of the recipe as recipe.ini. */
#ifndef FATHOM_RECIPE_H
#define FATHOM_RECIPE_H
#include "fathom/export.h"
#include <stdio.h>

#include "fathom/data.h"
#include "fathom/dist.h" /* data parallel: fm_dist, fm_dist_report */
#include "fathom/efficiency.h" /* precision, gradient accumulation, memory options */
#include "fathom/nn.h"
#include "fathom/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FM_RECIPE_MAX_LAYERS 64

typedef struct fm_recipe_layer {
    char spec[192]; /* "conv2d 32 3 padding=1" */
    int line;
} fm_recipe_layer;

typedef struct fm_recipe {
    char path[512];    /* file it came from ("<string>" when parsed from memory) */
    char name[64];     /* base name without .ini */
    char *text;        /* the file's text (owned), embedded in saved models */
    /* [data] */
    char dataset[32];  /* fashion-mnist | mnist | idx | csv */
    char data_dir[512];
    char train_images[512], train_labels[512], test_images[512], test_labels[512];
    /* dataset = csv: numeric tables, one sample a row (token ids for a model whose first layer
     * is an embedding); label_column: a header name or a column number (negative: from the
     * end; default the last) */
    char train_csv[512], test_csv[512], label_column[64];
    int64_t limit, test_limit; /* use only the first N samples (0: all) */
    fm_transforms transforms;
    int workers;
    /* [model] */
    int input_ndim;    /* without the batch dim */
    int64_t input_shape[FM_MAX_DIMS - 1];
    int n_layers;
    fm_recipe_layer layers[FM_RECIPE_MAX_LAYERS];
    fm_init_kind init;
    /* [train] */
    int epochs;
    int64_t batch_size;
    uint64_t seed;
    double label_smoothing;
    double clip_grad_norm; /* 0: off */
    int64_t checkpoint_every; /* steps; 0: at the end of every epoch */
    int threads;       /* 0: the library default */
    int keep_checkpoints;     /* newest complete checkpoints kept in out_dir/ckpt (default 2) */
    double divergence_factor; /* stop when a loss exceeds this x its running minimum (at least
                               * 0.01); 0: off; default 1e3 */
    /* [optimizer] [schedule] */
    fm_optim_config optim;
    fm_lr_schedule sched;  /* total_steps is filled in by the trainer when 0 */
} fm_recipe;

/* `name_or_path`: a built-in name ("fashion-cnn") or a path to an .ini file. */
FM_API fm_status fm_recipe_load(const char *name_or_path, fm_recipe *out);
FM_API fm_status fm_recipe_parse(const char *text, const char *path, fm_recipe *out);
FM_API void fm_recipe_free(fm_recipe *r);
/* Directory of the built-in recipes: $FATHOM_DATA/recipes, else the source
 * tree's data/recipes, else the installed share/fathom/recipes. */
FM_API const char *fm_recipe_dir(char *buf, size_t n);
/* The file a recipe argument names: a path as given (it contains '/' or ends in
 * .ini), else <fm_recipe_dir>/<name>.ini. Returns true when the argument is a
 * built-in name rather than a path. Every command resolves recipes this way. */
FM_API bool fm_recipe_resolve(const char *name_or_path, char *buf, size_t n);

/* Builds the model, checking every layer's shape against the input shape: an
 * incompatible stack fails here, naming the recipe line and the shapes. */
FM_API fm_module *fm_recipe_build_model(const fm_recipe *r, fm_rng *rng);
/* A recipe whose first layer is `embedding V D` takes token ids, not images: V; 0 for any
 * other recipe. */
FM_API int64_t fm_recipe_token_vocab(const fm_recipe *r);
/* x (any dtype) as the I64 token ids such a recipe's model takes: every value must be a whole
 * number in [0, V), else NULL with an error naming `what` (a file), the sample, the position
 * and the value. A new reference; a recipe without an embedding first is an error. */
FM_API fm_tensor *fm_recipe_token_ids(const fm_recipe *r, fm_tensor *x, const char *what);
/* The model's checkpointing blocks: its pooling layers (fm_module_num_blocks of the
 * built model), so `--checkpointing blocks` can be checked before anything is built. */
FM_API int fm_recipe_num_blocks(const fm_recipe *r);

typedef struct fm_train_options {
    int epochs;          /* > 0 overrides the recipe */
    int64_t batch_size;  /* > 0 overrides */
    double lr;           /* > 0 overrides */
    int64_t seed;        /* >= 0 overrides */
    int threads;         /* > 0 overrides */
    const char *out_dir; /* where the model goes (NULL: no saving) */
    const char *resume_dir; /* continue from this directory's checkpoint */
    int64_t max_steps;   /* > 0: stop (and checkpoint) after this many steps in total */
    bool skip_eval;      /* no test-set evaluation at the end */
    FILE *log;           /* progress lines (NULL: quiet) */
    const char *profile_path; /* Chrome trace of the run (NULL: no profiling) */
    const char *logdir;  /* TensorBoard event files (NULL: none) */
    int hist_every;      /* histograms of weights and gradients every N epochs (0: never) */
    int64_t steps;       /* > 0: train this many optimizer steps in all (the schedule spans them and
                          * the epochs follow: ceil(steps / batches per epoch)); overrides epochs */
    /* precision (autocast of the forward; fp16 adds the dynamic loss scaler, saved in
     * checkpoints), gradient accumulation (each batch cut into grad_accum micro-batches) and
     * the allocator's limit and mode, checked before anything is read: the weights, gradients
     * and optimizer state must fit the limit. Checkpointing must be none for these models. */
    fm_efficiency_opts eff;
    /* fine-tuning (fathom prune --finetune): the model starts from these tensors (named as
     * fm_module_state names them; every one must be given, with the model's shapes) instead
     * of its random initialization. NULL: none. Borrowed. */
    const fm_named_list *init_state;
    /* 0/1 masks, named as the parameters they multiply: applied once before training and
     * after every optimizer step (the step's after_update hook), so pruned weights stay zero,
     * and saved in every checkpoint (prune_masks.safetensors) so that a --resume keeps them;
     * a resumed directory's own masks are used when this is NULL. Borrowed. */
    const fm_named_list *masks;
    /* the loss of one micro-batch from the model's logits (distillation, fathom/distill.h):
     * a new scalar reference with the tape recorded, or NULL with the error set. NULL: cross
     * entropy with the recipe's label smoothing. */
    fm_tensor *(*loss)(void *ctx, fm_tensor *logits, fm_tensor *x, fm_tensor *y);
    void *loss_ctx;
    /* Data parallel over the ranks of `dist` (NULL or a world of one: this process alone).
     * batch_size stays the whole batch over all ranks, cut in near-equal parts per rank;
     * every rank runs fm_train with the same recipe and options; rank 0 alone writes
     * checkpoints and the model (the caller gives the others no log, logdir or profile).
     * zero: 1 shards the optimizer state (ZeRO-1). bucket_bytes: 0 for 25 MiB. */
    fm_dist *dist;
    int zero;
    size_t bucket_bytes;
} fm_train_options;
FM_API void fm_train_options_init(fm_train_options *o);

typedef struct fm_train_result {
    double test_accuracy; /* -1 when not evaluated */
    double test_loss;
    double final_loss;    /* mean training loss over the last epoch's steps */
    int epochs;
    int64_t steps;
    int64_t samples;
    double train_seconds, samples_per_second;
    size_t peak_memory_bytes;
    int64_t num_params;
    char model_path[600];
    double *losses;       /* per step of this run (owned; free with fm_train_result_free) */
    int64_t n_losses;
    int64_t first_step;   /* global step index of losses[0] */
    double data_wait_seconds; /* time the training loop waited for batches */
    char memory_report_json[1024]; /* peak memory by category (JSON object text) */
    char memory_report_text[1024];
    double loss_scale;    /* fp16: the scaler's scale at the end; else 1 */
    int64_t skipped_steps; /* fp16: steps skipped for inf/NaN gradients (this invocation) */
    fm_dist_report dist;  /* world size, communication time and bytes (world_size 1: none) */
} fm_train_result;
FM_API void fm_train_result_free(fm_train_result *r);

FM_API fm_status fm_train(const fm_recipe *r, const fm_train_options *opt, fm_train_result *res);

/* The file of a model directory that holds pruning masks (fathom/prune.h). */
#define FM_PRUNE_MASKS_FILE "prune_masks.safetensors"
/* Multiplies each parameter named in `masks` by its mask, in place and off the tape
 * (a mask on another device or dtype is converted for the call). An unknown name or a
 * shape that differs is an error, and nothing after it is changed. */
FM_API fm_status fm_module_apply_masks(fm_module *m, const fm_named_list *masks);
/* Reads DIR/prune_masks.safetensors into `out` (a list that owns its tensors); *found
 * tells whether the file exists (a missing one is no error, and leaves `out` empty). */
FM_API fm_status fm_masks_load(const char *dir, fm_named_list *out, bool *found);

/* A saved model: the recipe embedded in model.safetensors and the weights. */
FM_API fm_status fm_model_load(const char *model_dir, fm_recipe *recipe_out, fm_module **model_out);
/* Accuracy and mean loss of a model on a labeled data set (eval mode, no grad);
 * `tf` (may be NULL) is applied to the inputs; only its normalization is used. */
FM_API fm_status fm_evaluate(fm_module *model, fm_dataset *d, const fm_transforms *tf, int64_t batch_size, double *accuracy,
                      double *loss);
/* The same with a progress line on `log` (a terminal: one redrawn line; otherwise plain
 * periodic lines; NULL: none), as fm_progress shows training. */
FM_API fm_status fm_evaluate_progress(fm_module *model, fm_dataset *d, const fm_transforms *tf, int64_t batch_size,
                               double *accuracy, double *loss, FILE *log);
/* A split of the recipe's data set (data_dir, when not NULL, overrides its directory; for
 * dataset = csv it is the CSV file to read). A recipe whose first layer is an embedding gets
 * its values as I64 token ids, each checked (fm_recipe_token_ids): only from dataset = csv, and
 * without image transforms. */
FM_API fm_dataset *fm_recipe_dataset(const fm_recipe *r, fm_data_split split, const char *data_dir);

#ifdef __cplusplus
}
#endif
#endif
