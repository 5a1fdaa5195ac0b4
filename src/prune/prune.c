/* Pruning of classifier models (fathom/prune.h): the layer walk, unstructured
 * magnitude pruning with masks, saving a pruned model directory as one unit, and
 * `fathom prune`'s whole run (load, prune, optional fine-tuning, write). Channel
 * pruning is prune_channels.c. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fathom/autograd.h"
#include "fathom/gpt.h"
#include "fathom/io.h"
#include "core/parallel.h" /* fm_set_num_threads: a GPT's fine-tuning threads */
#include "io/io_internal.h" /* fm_dir_begin, fm_dir_commit */
#include "prune/prune_internal.h"

void fm_prune_options_init(fm_prune_options *o) {
    memset(o, 0, sizeof *o);
    o->sparsity = 0.5;
}

void prune_layer_name(const prune_layer *L, int i, char *buf, size_t n) {
    char d[80];
    snprintf(buf, n, "%d %s", i, fm_module_describe(L[i].mod, d, sizeof d));
}

fm_status prune_layers(const fm_recipe *r, fm_module *m, prune_layer **out, int *n) {
    *out = NULL;
    *n = 0;
    int nc = fm_module_num_children(m);
    if (fm_module_get_kind(m) != FM_MOD_SEQUENTIAL || nc != r->n_layers)
        return fm_set_error(FM_ERR_INVALID, "prune: the model is not the recipe's stack of %d layers", r->n_layers);
    prune_layer *L = calloc((size_t)nc + 1, sizeof *L);
    if (!L) return fm_set_error(FM_ERR_OOM, "out of host memory");
    int nd = r->input_ndim + 1;
    int64_t shape[FM_MAX_DIMS] = {1};
    for (int i = 0; i < r->input_ndim; i++) shape[i + 1] = r->input_shape[i];
    for (int i = 0; i < nc; i++) {
        L[i].mod = fm_module_child(m, i);
        L[i].kind = fm_module_get_kind(L[i].mod);
        L[i].in_ndim = nd;
        memcpy(L[i].in, shape, sizeof shape);
        if (fm_module_infer_shape(L[i].mod, L[i].in_ndim, L[i].in, &nd, shape) != FM_OK) { free(L); return fm_last_status(); }
    }
    *out = L;
    *n = nc;
    return FM_OK;
}

fm_module *prune_clone(const fm_recipe *r, fm_module *m) {
    fm_rng rng;
    fm_rng_init(&rng, 0); /* the weights are overwritten: any seed */
    fm_module *c = fm_recipe_build_model(r, &rng);
    fm_named_list a = {0}, b = {0};
    fm_status st = c ? fm_module_state(m, &a) : fm_last_status();
    if (st == FM_OK) st = fm_module_state(c, &b);
    for (int i = 0; st == FM_OK && i < b.n; i++) {
        int k = fm_named_list_find(&a, b.items[i].name);
        st = k < 0 ? fm_set_error(FM_ERR_INVALID, "prune: '%s' is missing", b.items[i].name)
                   : fm_copy_(b.items[i].tensor, a.items[k].tensor);
    }
    fm_named_list_free(&a);
    fm_named_list_free(&b);
    if (st) { fm_module_free(c); return NULL; }
    fm_module_train(c, false);
    return c;
}

/* ---------------- unstructured ---------------- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Zeroes in mask[] the k smallest of v[0..n) (ties: the first ones in order). */
static fm_status select_smallest(const float *v, int64_t n, int64_t k, float *mask) {
    for (int64_t i = 0; i < n; i++) mask[i] = 1;
    if (k <= 0) return FM_OK;
    float *s = malloc((size_t)n * sizeof *s);
    if (!s) return fm_set_error(FM_ERR_OOM, "out of host memory");
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_float);
    float t = s[k - 1];
    free(s);
    int64_t less = 0;
    for (int64_t i = 0; i < n; i++) less += v[i] < t;
    int64_t eq = k - less;
    for (int64_t i = 0; i < n; i++)
        if (v[i] < t || (v[i] == t && eq-- > 0)) mask[i] = 0;
    return FM_OK;
}

static int64_t count_nonzero(const float *v, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += v[i] != 0;
    return c;
}

/* The weights of every linear and conv2d layer, as |w| in one host buffer. */
typedef struct mag_set {
    int n;
    int layer[FM_PRUNE_MAX_LAYERS];
    fm_tensor *w[FM_PRUNE_MAX_LAYERS];
    int64_t off[FM_PRUNE_MAX_LAYERS + 1];
    float *abs, *mask;
} mag_set;

static fm_status mag_collect(const prune_layer *L, int n, mag_set *ms) {
    memset(ms, 0, sizeof *ms);
    for (int i = 0; i < n; i++) {
        if (L[i].kind != FM_MOD_LINEAR && L[i].kind != FM_MOD_CONV2D) continue;
        if (ms->n == FM_PRUNE_MAX_LAYERS) return fm_set_error(FM_ERR_UNSUPPORTED, "prune: more than %d layers", FM_PRUNE_MAX_LAYERS);
        fm_named_list ps = {0};
        fm_status st = fm_module_parameters(L[i].mod, &ps);
        int k = st ? -1 : fm_named_list_find(&ps, "weight");
        ms->w[ms->n] = k >= 0 ? ps.items[k].tensor : NULL; /* borrowed from the module */
        fm_named_list_free(&ps);
        if (!ms->w[ms->n]) return st ? st : fm_set_error(FM_ERR_INVALID, "prune: layer %d has no weight", i);
        ms->layer[ms->n] = i;
        ms->off[ms->n + 1] = ms->off[ms->n] + fm_tensor_numel(ms->w[ms->n]);
        ms->n++;
    }
    if (ms->n == 0) return fm_set_error(FM_ERR_INVALID, "prune: the model has no linear or conv2d layer to prune");
    int64_t total = ms->off[ms->n];
    ms->abs = malloc((size_t)total * sizeof *ms->abs);
    ms->mask = malloc((size_t)total * sizeof *ms->mask);
    if (!ms->abs || !ms->mask) return fm_set_error(FM_ERR_OOM, "out of host memory");
    for (int j = 0; j < ms->n; j++) {
        fm_status st = fm_tensor_copy_to_host(ms->w[j], ms->abs + ms->off[j], FM_F32);
        if (st) return st;
    }
    for (int64_t i = 0; i < total; i++) ms->abs[i] = fabsf(ms->abs[i]);
    return FM_OK;
}

/* Masks for the weights of `c` (a clone of the model), applied to it. */
static fm_status prune_unstructured(const prune_layer *L, int n, fm_module *c, const fm_prune_options *o,
                                    fm_named_list *masks, fm_prune_report *rep) {
    mag_set ms;
    fm_status st = mag_collect(L, n, &ms);
    int64_t total = ms.off[ms.n];
    if (st == FM_OK && o->global) st = select_smallest(ms.abs, total, (int64_t)llround(o->sparsity * (double)total), ms.mask);
    for (int j = 0; st == FM_OK && !o->global && j < ms.n; j++) {
        int64_t nj = ms.off[j + 1] - ms.off[j];
        st = select_smallest(ms.abs + ms.off[j], nj, (int64_t)llround(o->sparsity * (double)nj), ms.mask + ms.off[j]);
    }
    for (int j = 0; st == FM_OK && j < ms.n; j++) {
        fm_tensor *w = ms.w[j];
        fm_tensor *mk = fm_tensor_from_data(ms.mask + ms.off[j], w->ndim, w->shape, FM_F32);
        char name[32];
        snprintf(name, sizeof name, "%d.weight", ms.layer[j]);
        st = mk ? fm_named_list_push(masks, name, mk, false, false) : fm_last_status();
        fm_tensor_release(mk);
        fm_prune_layer_report *lr = &rep->layers[rep->n_layers++];
        prune_layer_name(L, ms.layer[j], lr->name, sizeof lr->name);
        int64_t nj = ms.off[j + 1] - ms.off[j];
        lr->before = count_nonzero(ms.abs + ms.off[j], nj);
        lr->after = 0;
        for (int64_t i = ms.off[j]; i < ms.off[j + 1]; i++) lr->after += ms.abs[i] != 0 && ms.mask[i] != 0;
    }
    free(ms.abs);
    free(ms.mask);
    return st ? st : fm_module_apply_masks(c, masks);
}

/* ---------------- the entry point ---------------- */

static void count_params(fm_module *m, int64_t *total, int64_t *zeros) {
    fm_named_list ps = {0};
    *total = *zeros = 0;
    if (fm_module_parameters(m, &ps) != FM_OK) return;
    for (int i = 0; i < ps.n; i++) {
        int64_t nn = fm_tensor_numel(ps.items[i].tensor);
        *total += nn;
        for (int64_t j = 0; j < nn; j++) *zeros += fm_tensor_get(ps.items[i].tensor, j) == 0;
    }
    fm_named_list_free(&ps);
}

fm_status fm_prune_classifier(const fm_recipe *r, fm_module *m, const fm_prune_options *o, fm_recipe *out_recipe,
                              fm_module **out_model, fm_named_list *masks, fm_prune_report *rep) {
    memset(rep, 0, sizeof *rep);
    memset(masks, 0, sizeof *masks);
    masks->owns_tensors = true;
    *out_model = NULL;
    memset(out_recipe, 0, sizeof *out_recipe);
    if (!(o->sparsity >= 0 && o->sparsity < 1))
        return fm_set_error(FM_ERR_INVALID, "prune: sparsity %g is outside [0, 1): give the fraction of weights to remove, "
                            "e.g. 0.5", o->sparsity);
    prune_layer *L;
    int n;
    fm_status st = prune_layers(r, m, &L, &n);
    if (st) return st;
    bool prev = fm_set_grad_enabled(false);
    if (o->kind == FM_PRUNE_CHANNELS) {
        st = prune_channels(r, m, L, n, o, out_recipe, out_model, rep);
    } else if ((st = fm_recipe_parse(r->text, r->path, out_recipe)) == FM_OK) {
        *out_model = prune_clone(out_recipe, m);
        st = *out_model ? prune_unstructured(L, n, *out_model, o, masks, rep) : fm_last_status();
    }
    fm_set_grad_enabled(prev);
    free(L);
    if (st == FM_OK) {
        count_params(m, &rep->params_before, &rep->zeros_before);
        count_params(*out_model, &rep->params_after, &rep->zeros_after);
        return FM_OK;
    }
    fm_module_free(*out_model);
    *out_model = NULL;
    fm_recipe_free(out_recipe);
    fm_named_list_free(masks);
    return st;
}

/* ---------------- writing ---------------- */

static fm_status write_model_files(const char *dir, const fm_recipe *r, fm_module *m, const fm_named_list *masks) {
    char path[PATH_MAX + 40];
    fm_named_list state = {0};
    fm_kv_list meta = {0};
    fm_status st = fm_module_state(m, &state);
    if (st == FM_OK && !(st = fm_kv_set(&meta, "format", "fathom-model-1")) && !(st = fm_kv_set(&meta, "fathom.recipe", r->text)) &&
        !(st = fm_kv_set(&meta, "fathom.step", "0"))) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        st = fm_safetensors_save(path, &state, &meta);
    }
    if (st == FM_OK) {
        snprintf(path, sizeof path, "%s/recipe.ini", dir);
        st = fm_atomic_write(path, 1, (fm_io_chunk[]){{r->text, strlen(r->text)}});
    }
    if (st == FM_OK && masks && masks->n) {
        snprintf(path, sizeof path, "%s/%s", dir, FM_PRUNE_MASKS_FILE);
        st = fm_safetensors_save(path, masks, NULL);
    }
    fm_kv_free(&meta);
    fm_named_list_free(&state);
    return st;
}

/* out_dir may be written: it does not exist, or is an empty directory that is not in_dir */
static fm_status check_out_dir(const char *in_dir, const char *out_dir) {
    struct stat a, b;
    if (!out_dir || !*out_dir) return fm_set_error(FM_ERR_INVALID, "prune: no output directory");
    if (strlen(out_dir) > PATH_MAX - 64) return fm_set_error(FM_ERR_INVALID, "prune: output path too long");
    if (stat(out_dir, &b) != 0) return FM_OK;
    if (in_dir && stat(in_dir, &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return fm_set_error(FM_ERR_INVALID, "prune: the output directory %s is the input model; choose a new path "
                            "(the input is never overwritten)", out_dir);
    if (!S_ISDIR(b.st_mode) || !fm_dir_is_empty(out_dir)) /* checked before any work; fm_dir_begin again */
        return fm_set_error(FM_ERR_INVALID, "prune: %s already exists and is not an empty directory; not replacing it "
                            "(choose a new path)", out_dir);
    return FM_OK;
}

fm_status fm_prune_save(const char *dir, const fm_recipe *r, fm_module *m, const fm_named_list *masks) {
    fm_status st = check_out_dir(NULL, dir);
    fm_dir_tx tx;
    if (st == FM_OK) st = fm_dir_begin(&tx, dir, false, "prune");
    if (st) return st;
    if ((st = write_model_files(tx.tmp, r, m, masks))) { fm_dir_abort(&tx); return st; }
    return fm_dir_commit(&tx);
}

/* Fine-tunes the pruned model into the output's temporary directory, masks on,
 * then commits it as out_dir. */
static fm_status finetune(const char *out_dir, const fm_recipe *r, fm_module *m, const fm_named_list *masks, int64_t steps,
                          const fm_train_options *topt, fm_train_result *tres) {
    fm_train_options to;
    if (topt) to = *topt;
    else fm_train_options_init(&to);
    fm_named_list state = {0};
    fm_status st = fm_module_state(m, &state);
    fm_dir_tx tx;
    if (st == FM_OK && (st = fm_dir_begin(&tx, out_dir, false, "prune"))) fm_named_list_free(&state);
    if (st) return st;
    to.out_dir = tx.tmp;
    to.resume_dir = NULL;
    to.steps = steps;
    to.epochs = 0;
    to.max_steps = 0;
    to.init_state = &state;
    to.masks = masks && masks->n ? masks : NULL;
    st = fm_train(r, &to, tres);
    fm_named_list_free(&state);
    if (st) {
        fm_error_prefix("prune: fine-tuning");
        fm_dir_abort(&tx);
        return st;
    }
    return fm_dir_commit(&tx);
}

/* ANDs the masks found in the input directory into the new ones (same shapes: unstructured). */
static fm_status merge_masks(fm_named_list *masks, const fm_named_list *old, fm_module *m) {
    for (int i = 0; i < old->n; i++) {
        int k = fm_named_list_find(masks, old->items[i].name);
        if (k < 0) { /* a tensor the new pruning does not touch keeps its old mask */
            fm_status st = fm_named_list_push(masks, old->items[i].name, old->items[i].tensor, false, false);
            if (st) return st;
            continue;
        }
        fm_tensor *p = fm_mul(masks->items[k].tensor, old->items[i].tensor);
        if (!p) return fm_last_status();
        fm_tensor_release(masks->items[k].tensor);
        masks->items[k].tensor = p;
    }
    return fm_module_apply_masks(m, masks);
}

/* A binary file copied whole (the token file and tokenizer of a GPT directory). */
static fm_status copy_file(const char *from, const char *to) {
    fm_status st;
    const char *why;
    size_t n = 0;
    char *buf = fm_read_file(from, (size_t)16 << 30, &n, &st, &why);
    if (!buf) return fm_set_error(st, "prune: %s: %s", from, why);
    fm_io_chunk ch[1] = {{buf, n}};
    st = fm_atomic_write(to, 1, ch);
    free(buf);
    return st;
}

static bool in_dir_has(const char *dir, const char *name) {
    char p[PATH_MAX];
    struct stat sb;
    return snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The GPT trainer from the pruned weights in dir (its config.json, model.safetensors,
 * tokenizer.txt and tokens.bin), writing into dir. */
static fm_status finetune_gpt(const char *dir, const fm_gpt_config *c, int64_t steps, const fm_train_options *topt,
                              fm_train_result *tres) {
    char w[PATH_MAX + 32], tokens[PATH_MAX + 32];
    snprintf(w, sizeof w, "%s/model.safetensors", dir);
    snprintf(tokens, sizeof tokens, "%s/tokens.bin", dir);
    fm_gpt_train_opts to = fm_gpt_train_defaults();
    to.model = *c;
    to.out_dir = dir;
    to.corpus = tokens; /* named in messages only: the token file in dir is used as it is */
    to.init_weights = w;
    to.steps = steps;
    to.warmup = steps / 10;
    to.eval_every = to.ckpt_every = steps;
    to.log_every = steps / 10 > 0 ? steps / 10 : 1;
    if (topt && topt->batch_size > 0) to.batch_size = topt->batch_size;
    if (topt && topt->lr > 0) { to.lr = topt->lr; to.min_lr = topt->lr / 10; }
    else { to.lr = 3e-4; to.min_lr = 3e-5; } /* gentler than training from scratch: the weights are trained */
    if (topt && topt->seed >= 0) to.seed = (uint64_t)topt->seed;
    if (topt && topt->threads > 0) fm_set_num_threads(topt->threads);
    to.quiet = !topt || !topt->log;
    fm_gpt_train_result r;
    fm_status st = fm_gpt_train_ex(&to, &r);
    if (st) { fm_error_prefix("prune: fine-tuning"); return st; }
    if (tres) {
        tres->steps = r.steps;
        tres->final_loss = r.train_loss;
        tres->test_loss = r.val_loss;
        tres->test_accuracy = -1;
        tres->num_params = r.num_params;
        tres->train_seconds = r.train_seconds;
    }
    return FM_OK;
}

static fm_status prune_gpt_dir(const char *in_dir, const char *out_dir, const fm_prune_options *o, int64_t steps,
                               const fm_train_options *topt, fm_prune_report *rep, fm_train_result *tres) {
    fm_gpt *m = fm_gpt_load_dir(in_dir, NULL), *p = NULL;
    if (!m) return fm_last_status();
    fm_status st = fm_prune_gpt(m, o, &p, rep);
    fm_gpt_free(m);
    if (st) return st;
    if (steps > 0 && !in_dir_has(in_dir, "tokens.bin"))
        st = fm_set_error(FM_ERR_INVALID, "prune: --finetune needs %s/tokens.bin (the token file `fathom train` leaves "
                          "in a GPT directory) to train on; prune without --finetune, or from the training directory",
                          in_dir);
    fm_dir_tx tx;
    if (st == FM_OK) st = fm_dir_begin(&tx, out_dir, false, "prune");
    if (st) { fm_gpt_free(p); return st; }
    char a[PATH_MAX + 32], b[PATH_MAX + 32];
    snprintf(b, sizeof b, "%s/config.json", tx.tmp);
    st = fm_gpt_config_save(fm_gpt_get_config(p), b);
    snprintf(b, sizeof b, "%s/model.safetensors", tx.tmp);
    if (st == FM_OK) st = fm_gpt_save_hf(p, b);
    static const char *const files[] = {"tokenizer.txt", "tokens.bin"};
    for (int i = 0; i < 2 && st == FM_OK; i++) {
        if (i == 1 && !in_dir_has(in_dir, files[i])) continue;
        snprintf(a, sizeof a, "%s/%s", in_dir, files[i]);
        snprintf(b, sizeof b, "%s/%s", tx.tmp, files[i]);
        st = copy_file(a, b);
    }
    if (st == FM_OK && steps > 0) st = finetune_gpt(tx.tmp, fm_gpt_get_config(p), steps, topt, tres);
    fm_gpt_free(p);
    if (st) { fm_dir_abort(&tx); return st; }
    return fm_dir_commit(&tx);
}

fm_status fm_prune_dir(const char *in_dir, const char *out_dir, const fm_prune_options *o, int64_t finetune_steps,
                       const fm_train_options *topt, fm_prune_report *rep, fm_train_result *tres) {
    if (tres) memset(tres, 0, sizeof *tres);
    if (!(o->sparsity >= 0 && o->sparsity < 1))
        return fm_set_error(FM_ERR_INVALID, "prune: sparsity %g is outside [0, 1): give the fraction of weights to remove, "
                            "e.g. 0.5", o->sparsity);
    fm_status st = check_out_dir(in_dir, out_dir);
    if (st) return st;
    char p[PATH_MAX];
    struct stat sb;
    if (snprintf(p, sizeof p, "%s/graph.json", in_dir) < (int)sizeof p && stat(p, &sb) == 0)
        return fm_set_error(FM_ERR_INVALID, "prune: %s is an inference graph (graph.json), not a trained model; prune the "
                            "model directory it was made from (fathom train --out DIR)", in_dir);
    if (in_dir_has(in_dir, "config.json") && in_dir_has(in_dir, "model.safetensors"))
        return prune_gpt_dir(in_dir, out_dir, o, finetune_steps, topt, rep, tres);
    if (o->kind == FM_PRUNE_HEADS)
        return fm_set_error(FM_ERR_INVALID, "prune: --structured heads prunes the attention heads of a GPT; %s is not a GPT "
                            "directory (config.json + model.safetensors); prune a classifier with --structured channels",
                            in_dir);
    fm_recipe r, pr;
    fm_module *m = NULL, *pm = NULL;
    if ((st = fm_model_load(in_dir, &r, &m))) return st;
    fm_named_list old = {0}, masks = {0};
    bool found = false;
    st = fm_masks_load(in_dir, &old, &found);
    if (st == FM_OK && found && o->kind == FM_PRUNE_CHANNELS)
        st = fm_set_error(FM_ERR_UNSUPPORTED, "prune: %s holds unstructured masks (%s); channel pruning starts from a "
                          "model without them", in_dir, FM_PRUNE_MASKS_FILE);
    if (st == FM_OK && found && (st = fm_module_apply_masks(m, &old))) fm_error_prefix("prune: %s", in_dir);
    if (st == FM_OK && (st = fm_prune_classifier(&r, m, o, &pr, &pm, &masks, rep)) == FM_OK) {
        if (found) st = merge_masks(&masks, &old, pm);
        if (st == FM_OK && finetune_steps > 0) st = finetune(out_dir, &pr, pm, &masks, finetune_steps, topt, tres);
        else if (st == FM_OK) st = fm_prune_save(out_dir, &pr, pm, &masks);
        fm_module_free(pm);
        fm_recipe_free(&pr);
    }
    fm_named_list_free(&masks);
    fm_named_list_free(&old);
    fm_module_free(m);
    fm_recipe_free(&r);
    return st;
}
