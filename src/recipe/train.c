/* The trainer: runs a recipe (data, model, optimizer, schedule), checkpoints,
 * resumes, evaluates.
 *
 * Resume is bit-exact on CPU because everything that shapes the next step is
 * saved: weights and BatchNorm buffers (model.safetensors), optimizer moments
 * and step (train_state.safetensors), the data loader's position and seed, and
 * the dropout generator's (seed, offset). The schedule is a function of the
 * step alone. The files of a step are committed as one unit, out_dir/ckpt/step-N
 * with a MANIFEST of checksums (io/io_internal.h); both files also carry the
 * step, so even an old-layout pair from different moments is refused. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "fathom/autograd.h"
#include "fathom/io.h"
#include "fathom/memory.h" /* peak memory for the report */
#include "fathom/observe.h" /* TensorBoard events, progress lines */
#include "fathom/profile.h" /* --profile spans */
#include "fathom/recipe.h"
#include "core/parallel.h" /* fm_set_num_threads */
#include "fathom/amp.h"    /* fm_tensor_has_inf_nan */
#include "io/io_internal.h" /* checkpoint units */
#include "dist/dist_ckpt.h" /* ZeRO-1: each rank writes its shard of the optimizer state */
#include "fathom/train_step.h" /* the step every trainer runs */

void fm_train_options_init(fm_train_options *o) {
    memset(o, 0, sizeof *o);
    o->seed = -1;
    o->eff = fm_efficiency_defaults();
}

void fm_train_result_free(fm_train_result *r) {
    if (!r) return;
    free(r->losses);
    r->losses = NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------- data ---------------- */

/* dataset = csv: the file's rows, the label column (by header name or number; default the last) as
 * the labels. */
static fm_dataset *csv_dataset(const fm_recipe *r, const char *path) {
    fm_csv_options co;
    fm_csv_options_init(&co);
    co.label_index = -1;
    const char *lc = r->label_column;
    if (lc[0]) {
        char *end;
        errno = 0;
        long v = strtol(lc, &end, 10);
        if (errno == 0 && end != lc && !*end && v >= INT_MIN + 1 && v <= INT_MAX) co.label_index = (int)v;
        else co.label_name = lc;
    }
    fm_tensor *x = NULL, *y = NULL;
    if (fm_csv_read(path, &co, &x, &y) != FM_OK) return NULL;
    fm_dataset *d = fm_dataset_from_tensors(x, y);
    fm_tensor_release_n(2, x, y);
    return d;
}

/* A recipe whose first layer is an embedding takes token ids: the data's values, checked and made
 * I64 (images are refused: they are floats, and their transforms are for images). Takes over d. */
static fm_dataset *token_dataset(const fm_recipe *r, fm_dataset *d, const char *path) {
    const fm_transforms *tf = &r->transforms;
    fm_tensor *ids = NULL;
    if (strcmp(r->dataset, "csv"))
        fm_set_error(FM_ERR_INVALID, "%s: the first layer, '%s', takes token ids, but dataset = %s gives images "
                     "(floats): give the ids as a table with dataset = csv, train_csv, test_csv and label_column in "
                     "[data]", r->path, r->layers[0].spec, r->dataset);
    else if (tf->normalize_channels || tf->crop_padding || tf->hflip)
        fm_set_error(FM_ERR_INVALID, "%s: normalize, crop_padding and hflip are image transforms, but the first layer, "
                     "'%s', takes token ids: remove them from [data]", r->path, r->layers[0].spec);
    else
        ids = fm_recipe_token_ids(r, fm_dataset_x(d), path);
    fm_dataset *out = ids ? fm_dataset_from_tensors(ids, fm_dataset_y(d)) : NULL;
    fm_tensor_release(ids);
    fm_dataset_release(d);
    return out;
}

fm_dataset *fm_recipe_dataset(const fm_recipe *r, fm_data_split split, const char *data_dir) {
    fm_dataset *d = NULL;
    const char *what = r->path;
    if (!strcmp(r->dataset, "csv")) {
        const char *p = data_dir ? data_dir : split == FM_SPLIT_TRAIN ? r->train_csv : r->test_csv;
        if (!p[0]) {
            fm_set_error(FM_ERR_INVALID, "%s: no %s set (give %s in [data])", r->path,
                         split == FM_SPLIT_TRAIN ? "training" : "test", split == FM_SPLIT_TRAIN ? "train_csv" : "test_csv");
            return NULL;
        }
        d = csv_dataset(r, what = p);
    } else if (!strcmp(r->dataset, "idx") && !data_dir) {
        const char *im = split == FM_SPLIT_TRAIN ? r->train_images : r->test_images;
        const char *lb = split == FM_SPLIT_TRAIN ? r->train_labels : r->test_labels;
        if (!im[0] || !lb[0]) {
            fm_set_error(FM_ERR_INVALID, "%s: no %s set (give test_images and test_labels in [data])", r->path,
                         split == FM_SPLIT_TRAIN ? "training" : "test");
            return NULL;
        }
        d = fm_dataset_idx(im, lb);
    } else {
        const char *dir = data_dir ? data_dir : r->data_dir[0] ? r->data_dir : NULL;
        if (!dir && !strcmp(r->dataset, "mnist")) dir = "/usr/share/datasets/mnist";
        d = fm_dataset_fashion_mnist(dir, split);
    }
    if (!d) return NULL;
    int64_t lim = split == FM_SPLIT_TRAIN ? r->limit : r->test_limit;
    if (lim > 0 && lim < fm_dataset_size(d)) {
        fm_dataset *s = fm_dataset_slice(d, 0, lim);
        fm_dataset_release(d);
        d = s;
    }
    return d && fm_recipe_token_vocab(r) > 0 ? token_dataset(r, d, what) : d;
}

static fm_status check_input_shape(const fm_recipe *r, fm_dataset *d) {
    fm_tensor *x = fm_dataset_x(d);
    bool ok = x->ndim == r->input_ndim + 1;
    for (int i = 0; ok && i < r->input_ndim; i++) ok = x->shape[i + 1] == r->input_shape[i];
    if (ok) return FM_OK;
    char s1[96], s2[96];
    return fm_set_error(FM_ERR_INVALID, "%s: the data's samples have shape %s but the recipe's model.input is %s", r->path,
                        fm_shape_str(x->ndim - 1, x->shape + 1, s1, sizeof s1),
                        fm_shape_str(r->input_ndim, r->input_shape, s2, sizeof s2));
}

/* ---------------- evaluation ---------------- */

fm_status fm_evaluate(fm_module *model, fm_dataset *d, const fm_transforms *tf, int64_t batch_size, double *accuracy,
                      double *loss) {
    return fm_evaluate_progress(model, d, tf, batch_size, accuracy, loss, NULL);
}

fm_status fm_evaluate_progress(fm_module *model, fm_dataset *d, const fm_transforms *tf, int64_t batch_size,
                               double *accuracy, double *loss, FILE *log) {
    if (!fm_dataset_y(d)) return fm_set_error(FM_ERR_INVALID, "evaluate: the data set has no labels");
    fm_loader_options lo;
    fm_loader_options_init(&lo);
    lo.batch_size = batch_size > 0 ? batch_size : 1000;
    if (tf) lo.transforms.normalize_channels = tf->normalize_channels;
    if (tf) memcpy(lo.transforms.mean, tf->mean, sizeof lo.transforms.mean);
    if (tf) memcpy(lo.transforms.std, tf->std, sizeof lo.transforms.std);
    fm_dataloader *l = fm_dataloader_create(d, &lo);
    if (!l) return fm_last_status();
    bool was_training = fm_module_is_training(model);
    fm_named_list ps = {0};
    fm_device dev = FM_CPU; /* where the model's parameters are */
    if (fm_module_parameters(model, &ps) == FM_OK && ps.n > 0) dev = ps.items[0].tensor->storage->device;
    fm_named_list_free(&ps);
    fm_module_train(model, false);
    bool prev = fm_set_grad_enabled(false);
    fm_status st = FM_OK;
    int64_t correct = 0, total = 0, done = 0;
    double loss_sum = 0;
    fm_progress *prog = fm_progress_begin("eval", fm_dataloader_num_batches(l), "samples",
                                          log ? FM_PROGRESS_AUTO : FM_PROGRESS_QUIET, log);
    for (;;) {
        fm_batch b;
        if ((st = fm_dataloader_next(l, &b)) != FM_OK || !b.x) break;
        /* the batch goes to the model's device; the predictions come back to the host */
        fm_tensor *x = fm_tensor_to(b.x, dev), *y = x ? fm_tensor_to(b.y, dev) : NULL;
        fm_tensor *logits = y ? fm_module_forward(model, x) : NULL;
        fm_tensor *ls = logits ? fm_cross_entropy(logits, y, -100, 0.0, FM_REDUCE_SUM) : NULL;
        fm_tensor *pd = logits ? fm_argmax(logits, 1, false) : NULL, *pred = pd ? fm_tensor_to(pd, FM_CPU) : NULL;
        if (!ls || !pred) { fm_tensor_release_n(6, x, y, logits, ls, pd, pred); st = fm_last_status(); break; }
        loss_sum += fm_tensor_item(ls);
        const int64_t *p = fm_tensor_data(pred);
        for (int64_t i = 0; i < b.size; i++) correct += p[i] == (int64_t)fm_tensor_get(b.y, i);
        total += b.size;
        fm_tensor_release_n(6, x, y, logits, ls, pd, pred);
        fm_progress_update(prog, ++done, total, loss_sum / (double)total);
    }
    fm_progress_end(prog);
    fm_set_grad_enabled(prev);
    fm_module_train(model, was_training);
    fm_dataloader_free(l);
    if (st == FM_OK) {
        if (accuracy) *accuracy = total ? (double)correct / (double)total : 0;
        if (loss) *loss = total ? loss_sum / (double)total : 0;
    }
    return st;
}

/* ---------------- checkpoints ---------------- */

typedef struct trainer {
    const fm_recipe *r;
    fm_module *model;
    fm_optim *opt;
    fm_dataloader *loader;
    fm_rng drop_rng;
    fm_train_step ts;  /* accumulation, autocast, loss scaler, clip, optimizer */
    fm_tensor **params; /* what the scaler unscales */
    int n_params;
    int64_t step;
    int64_t last_good; /* step of the newest committed checkpoint; -1: none */
    bool poisoned;     /* a checkpoint was refused: non-finite weights or moments */
    FILE *log;
    fm_named_list masks;   /* pruning masks (host, owned): after every step, saved with every checkpoint */
    fm_train_hooks hooks;  /* the step's hooks: after_update applies the masks */
    fm_dist_trainer *dt; /* data parallel (NULL: this process alone) */
    fm_dist *dist;       /* its communicator (with dt) */
    int rank, world;     /* rank 0 writes the checkpoints (ZeRO-1: every rank its shard too) */
    bool zero;           /* ZeRO-1: dt holds the optimizer state, sharded */
    fm_batch_stage *stage; /* a device other than the cpu: the next batch, uploaded one step ahead */
    fm_batch staged;       /* the staged batch's index and size (its tensors are in stage) */
} trainer;

/* The loader's position as the steps see it: a batch staged ahead (never past its
 * epoch's end) has not been trained on yet, so it is not counted as delivered. */
static fm_status loader_state(const trainer *t, fm_dataloader_state *ls) {
    fm_status st = fm_dataloader_state_get(t->loader, ls);
    if (st == FM_OK) ls->batch -= fm_batch_stage_count(t->stage);
    return st;
}

/* The optimizer that steps (ZeRO-1: this rank's shard of it). */
static fm_optim *opt_of(trainer *t) { return t->dt ? fm_dist_trainer_optim(t->dt) : t->opt; }

/* The whole optimizer state, as checkpoints name it (ZeRO-1: gathered, on every rank). */
static fm_status opt_state(trainer *t, fm_named_list *out) {
    if (t->dt) return fm_dist_trainer_full_state(t->dt, out);
    fm_status st = fm_optim_init_state(t->opt);
    return st ? st : fm_optim_state(t->opt, out);
}

static fm_status meta_i64(fm_kv_list *m, const char *k, int64_t v) {
    char b[32];
    snprintf(b, sizeof b, "%" PRId64, v);
    return fm_kv_set(m, k, b);
}

static fm_status meta_u64(fm_kv_list *m, const char *k, uint64_t v) {
    char b[32];
    snprintf(b, sizeof b, "%" PRIu64, v);
    return fm_kv_set(m, k, b);
}

/* Non-finite weights, buffers or optimizer moments are never committed. */
static fm_status check_finite(const fm_named_list *l, const char *what, int64_t step) {
    for (int i = 0; i < l->n; i++)
        if (fm_tensor_has_inf_nan(l->items[i].tensor))
            return fm_set_error(FM_ERR_STATE, "%s '%s' became non-finite (NaN or inf) by step %" PRId64, what,
                                l->items[i].name, step);
    return FM_OK;
}

static fm_status save_metadata(trainer *t, fm_kv_list *meta, fm_kv_list *smeta) {
    fm_dataloader_state ls;
    fm_status st = loader_state(t, &ls);
    if (st) return st;
    if (ls.batch >= fm_dataloader_num_batches(t->loader)) { ls.epoch++; ls.batch = 0; }
    if ((st = fm_kv_set(meta, "format", "fathom-model-1")) || (st = fm_kv_set(meta, "fathom.recipe", t->r->text)) ||
        (st = meta_i64(meta, "fathom.step", t->step)))
        return st;
    if ((st = fm_kv_set(smeta, "format", "fathom-train-state-1")) || (st = meta_i64(smeta, "step", t->step)) ||
        (st = meta_i64(smeta, "optimizer_step", fm_optim_get_step(opt_of(t)))) ||
        (st = fm_kv_set(smeta, "optimizer", fm_optim_kind_name(t->r->optim.kind))) ||
        (st = meta_u64(smeta, "loader_seed", ls.seed)) || (st = meta_i64(smeta, "loader_epoch", ls.epoch)) ||
        (st = meta_i64(smeta, "loader_batch", ls.batch)) || (st = meta_i64(smeta, "loader_samples", ls.num_samples)) ||
        (st = meta_i64(smeta, "loader_batch_size", ls.batch_size)) ||
        (st = meta_u64(smeta, "dropout_rng_seed", t->drop_rng.seed)) ||
        (st = meta_u64(smeta, "dropout_rng_offset", t->drop_rng.offset)) ||
        (st = meta_u64(smeta, "global_rng_seed", fm_rng_global()->seed)))
        return st;
    /* the fp16 scaler and the loss's running minimum: a resumed run goes on as an uninterrupted one */
    if ((st = fm_train_step_state_save(&t->ts, smeta))) return st;
    return meta_u64(smeta, "global_rng_offset", fm_rng_global()->offset);
}

/* ZeRO-1's unit (dist_ckpt_save, src/dist/dist_ckpt.h): every rank writes its own shard of the
 * optimizer state as it is (zero-shard-R-of-N, nothing gathered); rank 0 the model, the recipe,
 * the masks and train_state.safetensors, which holds the metadata only (with zero_world_size). */
static fm_status write_sharded(void *ctx, const char *tmp, bool *nonfinite) {
    trainer *t = ctx;
    if (!tmp) return FM_OK; /* rank 0 could not open the unit */
    char path[PATH_MAX + 64], name[64];
    dist_ckpt_file(name, sizeof name, "zero-shard", t->rank, t->world);
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    fm_status st = fm_zero_save_shard(fm_dist_trainer_zero(t->dt), path, nonfinite);
    if (st == FM_OK && *nonfinite)
        st = fm_set_error(FM_ERR_STATE, "optimizer state (rank %d's ZeRO-1 shard) became non-finite (NaN or inf) by step "
                          "%" PRId64, t->rank, t->step);
    if (st || t->rank != 0) return st;
    fm_kv_list meta = {0}, smeta = {0};
    fm_named_list state = {0}, none = {0};
    fm_io_chunk c = {t->r->text, strlen(t->r->text)};
    if ((st = fm_module_state(t->model, &state)) == FM_OK && (st = check_finite(&state, "weight", t->step)))
        *nonfinite = true;
    snprintf(name, sizeof name, "%d", t->world);
    if (st == FM_OK && (st = save_metadata(t, &meta, &smeta)) == FM_OK) st = fm_kv_set(&smeta, "zero_world_size", name);
    if (st == FM_OK) {
        snprintf(path, sizeof path, "%s/train_state.safetensors", tmp);
        st = fm_safetensors_save(path, &none, &smeta);
    }
    if (st == FM_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        st = fm_safetensors_save(path, &state, &meta);
    }
    if (st == FM_OK) {
        snprintf(path, sizeof path, "%s/recipe.ini", tmp);
        st = fm_atomic_write(path, 1, &c);
    }
    if (st == FM_OK && t->masks.n) {
        snprintf(path, sizeof path, "%s/%s", tmp, FM_PRUNE_MASKS_FILE);
        st = fm_safetensors_save(path, &t->masks, NULL);
    }
    fm_kv_free(&meta);
    fm_kv_free(&smeta);
    fm_named_list_free(&state);
    return st;
}

/* One checkpoint unit (io/io_internal.h): model, optimizer state with the data
 * position and RNGs, and the recipe, committed together as out_dir/ckpt/step-N
 * and linked to out_dir/{model.safetensors,train_state.safetensors,recipe.ini}.
 * ZeRO-1: each rank's shard of the optimizer state instead (write_sharded). */
static fm_status save_checkpoint(trainer *t, const char *out_dir) {
    static const char *const names[] = {"train_state.safetensors", "model.safetensors", "recipe.ini", FM_PRUNE_MASKS_FILE};
    if (t->zero) {
        static const char *const kinds[] = {"zero-shard"};
        dist_ckpt_unit u = {.d = t->dist, .out_dir = out_dir, .step = t->step, .n_common = t->masks.n ? 4 : 3,
                            .common = names, .n_kinds = 1, .kinds = kinds, .keep = t->r->keep_checkpoints,
                            .log = t->log, .write = write_sharded, .ctx = t};
        bool poisoned = false;
        fm_status st = dist_ckpt_save(&u, &poisoned);
        if (poisoned) t->poisoned = true;
        if (st == FM_OK) t->last_good = t->step;
        return st;
    }
    char path[PATH_MAX];
    fm_kv_list meta = {0}, smeta = {0};
    fm_named_list state = {0}, ostate = {0};
    fm_ckpt_tx tx;
    memset(&tx, 0, sizeof tx);
    fm_status st;
    if ((st = fm_module_state(t->model, &state)) != FM_OK) goto done;
    if ((st = opt_state(t, &ostate)) != FM_OK) goto done;
    if (t->rank != 0) goto done; /* rank 0 writes; the others only took part in gathering the state */
    if ((st = check_finite(&state, "weight", t->step)) || (st = check_finite(&ostate, "optimizer state", t->step))) {
        t->poisoned = true;
        goto done;
    }
    if ((st = save_metadata(t, &meta, &smeta))) goto done;
    if ((st = fm_ckpt_begin(&tx, out_dir, t->step))) goto done;
    fm_io_chunk c = {t->r->text, strlen(t->r->text)};
    if ((st = fm_safetensors_save(fm_ckpt_path(&tx, names[0], path, sizeof path), &ostate, &smeta)) ||
        (st = fm_safetensors_save(fm_ckpt_path(&tx, names[1], path, sizeof path), &state, &meta)) ||
        (st = fm_atomic_write(fm_ckpt_path(&tx, names[2], path, sizeof path), 1, &c)) ||
        (t->masks.n && (st = fm_safetensors_save(fm_ckpt_path(&tx, names[3], path, sizeof path), &t->masks, NULL)))) {
        fm_ckpt_abort(&tx);
        fm_error_prefix("checkpoint of step %" PRId64 " not written; the previous checkpoints in %s/ckpt are unchanged",
                        t->step, out_dir);
        goto done;
    }
    st = fm_ckpt_commit(&tx, t->masks.n ? 4 : 3, names, t->r->keep_checkpoints, t->log);
    if (st == FM_OK) t->last_good = t->step;
done:
    fm_kv_free(&meta);
    fm_kv_free(&smeta);
    fm_named_list_free(&state);
    fm_named_list_free(&ostate);
    return st;
}

static bool meta_get_i64(const fm_kv_list *m, const char *k, int64_t *v) {
    const char *s = fm_kv_get(m, k);
    if (!s) return false;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end) return false;
    *v = x;
    return true;
}

static bool meta_get_u64(const fm_kv_list *m, const char *k, uint64_t *v) {
    const char *s = fm_kv_get(m, k);
    if (!s) return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || end == s || *end) return false;
    *v = x;
    return true;
}

static fm_status load_checkpoint(trainer *t, const char *dir, int64_t manifest_step) {
    char path[PATH_MAX + 32];
    fm_kv_list meta = {0}, smeta = {0};
    fm_named_list state = {0}, ostate = {0}, saved = {0};
    fm_status st;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((st = fm_module_state(t->model, &state)) != FM_OK) goto done;
    if ((st = fm_safetensors_load_into(path, &state, &meta)) != FM_OK) goto done;
    snprintf(path, sizeof path, "%s/train_state.safetensors", dir);
    if ((st = fm_safetensors_load(path, &saved, &smeta)) != FM_OK) goto done;
    int64_t mstep, sstep, ostep, ep, bt, ns, bs;
    fm_dataloader_state ls;
    fm_rng dr, gr;
    if (!meta_get_i64(&meta, "fathom.step", &mstep) || !meta_get_i64(&smeta, "step", &sstep) ||
        !meta_get_i64(&smeta, "optimizer_step", &ostep) || !meta_get_u64(&smeta, "loader_seed", &ls.seed) ||
        !meta_get_i64(&smeta, "loader_epoch", &ep) || !meta_get_i64(&smeta, "loader_batch", &bt) ||
        !meta_get_i64(&smeta, "loader_samples", &ns) || !meta_get_i64(&smeta, "loader_batch_size", &bs) ||
        !meta_get_u64(&smeta, "dropout_rng_seed", &dr.seed) || !meta_get_u64(&smeta, "dropout_rng_offset", &dr.offset) ||
        !meta_get_u64(&smeta, "global_rng_seed", &gr.seed) || !meta_get_u64(&smeta, "global_rng_offset", &gr.offset)) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: training-state metadata is missing or malformed", dir);
        goto done;
    }
    if (mstep != sstep) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: model.safetensors is at step %" PRId64 " but train_state.safetensors at "
                          "step %" PRId64 " (an interrupted checkpoint); cannot resume exactly", dir, mstep, sstep);
        goto done;
    }
    if (manifest_step >= 0 && sstep != manifest_step) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: the files are at step %" PRId64 " but the MANIFEST says %" PRId64, dir, sstep,
                          manifest_step);
        goto done;
    }
    const char *okind = fm_kv_get(&smeta, "optimizer");
    if (!okind || strcmp(okind, fm_optim_kind_name(t->r->optim.kind))) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: the checkpoint was written by optimizer '%s' but the recipe uses '%s'", dir,
                          okind ? okind : "?", fm_optim_kind_name(t->r->optim.kind));
        goto done;
    }
    /* ZeRO-1 shards (zero-shard-R-of-N): this rank's own in the same sharding, else all of them
     * put together and resharded (dist_ckpt_load_zero); train_state holds the metadata only */
    const int zw = dist_ckpt_world(dir, "zero-shard");
    if (zw > 0) {
        const char *w = fm_kv_get(&smeta, "zero_world_size");
        if (!w || atoi(w) != zw || saved.n)
            st = fm_set_error(FM_ERR_FORMAT, "%s: zero_world_size is %s and it holds %d tensors, but the checkpoint holds "
                              "ZeRO-1 shards of %d ranks (expected their number and no tensors)", path, w ? w : "missing",
                              saved.n, zw);
        else st = dist_ckpt_load_zero(dir, zw, t->rank, t->world, t->dt, t->opt);
        if (st) goto done;
    }
    if (zw == 0 && (st = opt_state(t, &ostate)) != FM_OK) goto done;
    char s1[96], s2[96];
    for (int i = 0; i < ostate.n && st == FM_OK; i++) {
        int k = fm_named_list_find(&saved, ostate.items[i].name);
        fm_tensor *dst = ostate.items[i].tensor;
        if (k < 0) {
            st = fm_set_error(FM_ERR_FORMAT, "%s: optimizer state '%s' is missing", path, ostate.items[i].name);
        } else if (fm_tensor_numel(saved.items[k].tensor) != fm_tensor_numel(dst) ||
                   saved.items[k].tensor->ndim != dst->ndim) {
            st = fm_set_error(FM_ERR_FORMAT, "%s: optimizer state '%s' has shape %s but the model needs %s", path,
                              ostate.items[i].name,
                              fm_shape_str(saved.items[k].tensor->ndim, saved.items[k].tensor->shape, s1, sizeof s1),
                              fm_shape_str(dst->ndim, dst->shape, s2, sizeof s2));
        } else {
            st = fm_copy_(dst, saved.items[k].tensor);
        }
    }
    if (st == FM_OK && zw == 0 && saved.n != ostate.n)
        st = fm_set_error(FM_ERR_FORMAT, "%s: %d optimizer state tensors but the model needs %d", path, saved.n, ostate.n);
    if (st == FM_OK && zw == 0 && t->zero) st = fm_dist_trainer_load_full_state(t->dt, &ostate); /* this rank's part */
    if (st) goto done;
    ls.epoch = ep;
    ls.batch = bt;
    ls.num_samples = ns;
    ls.batch_size = bs;
    if ((st = fm_dataloader_state_set(t->loader, &ls)) != FM_OK) {
        fm_error_prefix("%s: cannot restore the data position (was the batch size or data set changed?)", dir);
        goto done;
    }
    fm_optim_set_step(opt_of(t), ostep);
    if ((st = fm_train_step_state_load(&t->ts, &smeta))) goto done;
    t->step = sstep;
    t->drop_rng = dr; /* the file has rank 0's (the job's) seed: this rank's is made from it */
    t->drop_rng.seed = fm_dist_rank_seed(dr.seed, t->rank);
    *fm_rng_global() = gr;
done:
    fm_kv_free(&meta);
    fm_kv_free(&smeta);
    fm_named_list_free(&state);
    fm_named_list_free(&ostate);
    fm_named_list_free(&saved);
    if (st) fm_error_prefix("resuming from %s", dir);
    return st;
}

/* ---------------- the loop ---------------- */

static fm_status push_loss(fm_train_result *res, double v) {
    if ((res->n_losses & (res->n_losses - 1)) == 0) {
        int64_t cap = res->n_losses ? 2 * res->n_losses : 64;
        if (cap < 64) cap = 64;
        double *p = realloc(res->losses, (size_t)cap * sizeof *p);
        if (!p) return fm_set_error(FM_ERR_OOM, "out of host memory");
        res->losses = p;
    }
    res->losses[res->n_losses++] = v;
    return FM_OK;
}

/* The loop's state, shared by the pieces of fm_train. */
typedef struct train_run {
    trainer t;
    fm_recipe r; /* a shallow copy with the overrides applied; text stays the caller's */
    const fm_train_options *opt;
    fm_train_result *res;
    FILE *log;
    const char *out_dir;
    fm_dataset *train, *test;
    fm_tb_writer *tb;
    fm_progress *prog;
    int64_t nb, epoch, epoch_steps, prog_done, prog_items;
    int64_t skipped0; /* the scaler's skip count when this invocation started */
    double t0, t_epoch, epoch_loss, last_epoch_loss;
} train_run;

/* The run cannot go on: says why, and where the last good checkpoint is. */
static fm_status stopped(train_run *u, const char *why) {
    char w[600];
    snprintf(w, sizeof w, "%s", why);
    int64_t good = u->t.last_good;
    if (good >= 0 && u->out_dir)
        return fm_set_error(FM_ERR_STATE, "%s at step %" PRId64 " (epoch %" PRId64 "); training stopped. The last good "
                            "checkpoint (step %" PRId64 ") in %s/ckpt is untouched; try a lower learning rate or "
                            "clip_grad_norm", w, u->t.step, u->epoch + 1, good, u->out_dir);
    return fm_set_error(FM_ERR_STATE, "%s at step %" PRId64 " (epoch %" PRId64 "); training stopped before any checkpoint "
                        "was written; try a lower learning rate or clip_grad_norm", w, u->t.step, u->epoch + 1);
}

/* A loss that fails its check was computed on the weights the last step left. When
 * the newest checkpoint is of that step, it holds those very weights: rank 0 sets it
 * aside (OUT/ckpt/step-N.diverged, out of --resume's way) and the one before it is
 * the last good one. */
static fm_status loss_stopped(train_run *u, const char *why) {
    if (!u->out_dir || u->t.last_good < 0 || u->t.last_good != u->t.step || u->t.rank != 0) return stopped(u, why);
    char moved[PATH_MAX + 64];
    int64_t prev = fm_ckpt_set_aside(u->out_dir, u->t.step, moved, sizeof moved, u->log);
    if (prev < 0)
        return fm_set_error(FM_ERR_STATE, "%s at step %" PRId64 " (epoch %" PRId64 "); training stopped. The checkpoint "
                            "of step %" PRId64 " in %s/ckpt holds the weights that gave this loss, and no earlier one "
                            "is kept to go back to (keep_checkpoints): resuming from it starts from those weights; try "
                            "a lower learning rate or clip_grad_norm", why, u->t.step, u->epoch + 1, u->t.step,
                            u->out_dir);
    return fm_set_error(FM_ERR_STATE, "%s at step %" PRId64 " (epoch %" PRId64 "); training stopped. The checkpoint of "
                        "step %" PRId64 " holds the weights that gave this loss: moved to %s, out of --resume's way. The "
                        "last good checkpoint (step %" PRId64 ") in %s/ckpt is untouched, and %s/ links to it again; try "
                        "a lower learning rate or clip_grad_norm", why, u->t.step, u->epoch + 1, u->t.step, moved, prev,
                        u->out_dir, u->out_dir);
}

static fm_status save(train_run *u) {
    fm_status st = save_checkpoint(&u->t, u->out_dir);
    if (st && u->t.poisoned) return stopped(u, fm_last_error());
    return st;
}

static fm_status step_init(train_run *u);

/* fine-tuning: the model starts from the given tensors, every one of them */
static fm_status load_init_state(fm_module *m, const fm_named_list *init) {
    fm_named_list state = {0};
    fm_status st = fm_module_state(m, &state);
    char s1[96], s2[96];
    for (int i = 0; st == FM_OK && i < state.n; i++) {
        fm_tensor *dst = state.items[i].tensor;
        int k = fm_named_list_find(init, state.items[i].name);
        fm_tensor *src = k >= 0 ? init->items[k].tensor : NULL;
        if (!src)
            st = fm_set_error(FM_ERR_INVALID, "the starting weights lack '%s'", state.items[i].name);
        else if (src->ndim != dst->ndim || memcmp(src->shape, dst->shape, (size_t)dst->ndim * sizeof *dst->shape))
            st = fm_set_error(FM_ERR_INVALID, "the starting weight '%s' has shape %s but the recipe's model needs %s",
                              state.items[i].name, fm_shape_str(src->ndim, src->shape, s1, sizeof s1),
                              fm_shape_str(dst->ndim, dst->shape, s2, sizeof s2));
        else
            st = fm_copy_(dst, src);
    }
    fm_named_list_free(&state);
    return st;
}

/* The pruning masks (host copies, owned) go on for the whole run; applied once now. */
static fm_status set_masks(trainer *t, const fm_named_list *masks) {
    fm_named_list_free(&t->masks);
    memset(&t->masks, 0, sizeof t->masks);
    t->masks.owns_tensors = true;
    fm_status st = FM_OK;
    for (int i = 0; st == FM_OK && i < masks->n; i++) {
        fm_tensor *h = fm_tensor_to(masks->items[i].tensor, FM_CPU);
        st = h ? fm_named_list_push(&t->masks, masks->items[i].name, h, false, false) : fm_last_status();
        fm_tensor_release(h);
    }
    return st ? st : fm_module_apply_masks(t->model, &t->masks);
}

/* after_update: pruned weights stay zero */
static fm_status masks_after_update(void *user, fm_optim *opt, bool stepped) {
    (void)opt;
    trainer *t = user;
    return stepped ? fm_module_apply_masks(t->model, &t->masks) : FM_OK;
}

/* Data parallel (a world of more than one, or --zero): the batch splits evenly over the
 * ranks, and the step gets the gradient buckets or the sharded optimizer. */
static fm_status dist_init(train_run *u) {
    fm_dist *d = u->opt->dist;
    if (!d && u->opt->zero)
        return fm_set_error(FM_ERR_INVALID, "--zero 1 shards the optimizer state across MPI ranks: start the job with "
                            "mpirun -np N (N >= 2)");
    if (!d || (u->t.world < 2 && !u->opt->zero && !fm_dist_uses_nccl(d))) return FM_OK; /* NCCL: even alone (smoke test) */
    if (u->r.batch_size % u->t.world)
        return fm_set_error(FM_ERR_INVALID, "the batch (%lld) does not split evenly over %d ranks: give --batch a multiple "
                            "of %d", (long long)u->r.batch_size, u->t.world, u->t.world);
    if (u->opt->eff.grad_accum > u->r.batch_size / u->t.world)
        return fm_set_error(FM_ERR_INVALID, "--grad-accum %d is more than the %lld samples each of the %d ranks gets per "
                            "batch", u->opt->eff.grad_accum, (long long)(u->r.batch_size / u->t.world), u->t.world);
    if (!(u->t.dt = fm_dist_trainer_new(d, &u->t.ts, u->opt->zero, u->opt->bucket_bytes))) return fm_last_status();
    u->t.zero = u->opt->zero == 1;
    u->t.dist = d;
    return FM_OK;
}

/* Data, model, memory check, optimizer and loader. */
static fm_status train_setup(train_run *u) {
    fm_recipe *r = &u->r;
    fm_rng init_rng;
    fm_rng_init(&init_rng, r->seed);
    /* dropout: every rank its own masks (rank 0's generator is one process's) */
    fm_rng_init(&u->t.drop_rng, fm_dist_rank_seed(r->seed ^ 0x9e3779b97f4a7c15ull, u->t.rank));
    fm_manual_seed(r->seed + 1);
    fm_status st;
    u->train = fm_recipe_dataset(r, FM_SPLIT_TRAIN, NULL);
    if (!u->train || (st = check_input_shape(r, u->train)) != FM_OK) return fm_last_status();
    /* the test set is rank 0's to evaluate */
    if (!u->opt->skip_eval && u->t.rank == 0 && !(u->test = fm_recipe_dataset(r, FM_SPLIT_TEST, NULL)))
        return fm_last_status();
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_WEIGHTS);
    u->t.model = fm_recipe_build_model(r, &init_rng);
    fm_memory_tag_pop(mc);
    if (!u->t.model) return fm_last_status();
    fm_module_set_rng(u->t.model, &u->t.drop_rng);
    u->res->num_params = fm_module_num_params(u->t.model);
    if (u->opt->init_state && (st = load_init_state(u->t.model, u->opt->init_state))) return st;
    if (u->opt->masks && (st = set_masks(&u->t, u->opt->masks))) return st;
    /* the model goes to its device before the optimizer makes its state there */
    if (u->opt->eff.device.type != FM_DEV_CPU && (st = fm_module_to(u->t.model, u->opt->eff.device))) return st;
    /* the memory options, and whether weights + gradients + optimizer state fit the limit,
     * before the optimizer or anything else is made */
    const fm_efficiency_opts *eo = &u->opt->eff;
    int slots = r->optim.kind == FM_OPTIM_SGD ? (r->optim.momentum > 0) : 2;
    if ((st = fm_efficiency_apply_memory(eo)) ||
        (st = fm_efficiency_check_fits_zero(eo, u->res->num_params, slots, u->opt->zero ? u->t.world : 1,
                                            false /* ZeRO-1's checkpoints write each rank's shard */)))
        return st;
    u->t.opt = fm_optim_new(&r->optim);
    if (!u->t.opt || fm_optim_add_params(u->t.opt, u->t.model) != FM_OK) return fm_last_status();
    if ((st = step_init(u)) || (st = dist_init(u))) return st;
    fm_loader_options lo;
    fm_loader_options_init(&lo);
    lo.batch_size = r->batch_size;
    lo.shuffle = true;
    lo.seed = r->seed;
    lo.drop_last = false;
    lo.workers = r->workers;
    lo.transforms = r->transforms;
    lo.shard_index = u->t.rank; /* every rank walks the same batches and takes its part of each */
    lo.shard_count = u->t.world;
    if (!(u->t.loader = fm_dataloader_create(u->train, &lo))) return fm_last_status();
    u->nb = fm_dataloader_num_batches(u->t.loader);
    if (eo->device.type != FM_DEV_CPU && !(u->t.stage = fm_batch_stage_new(eo->device))) return fm_last_status();
    if (u->opt->steps > 0) { /* a step count: the schedule spans it, the epochs follow */
        r->epochs = (int)((u->opt->steps + u->nb - 1) / u->nb);
        r->sched.total_steps = u->opt->steps;
    }
    if (r->sched.total_steps <= 0) r->sched.total_steps = u->nb * r->epochs;
    return FM_OK;
}

/* --resume: the newest complete checkpoint of the directory. */
static fm_status train_resume(train_run *u) {
    const char *dir = u->opt->resume_dir;
    FILE *msg = u->t.rank == 0 ? (u->log ? u->log : stderr) : NULL;
    if (u->t.rank == 0) fm_ckpt_clean_stale(dir, msg);
    fm_ckpt_found f;
    fm_ckpt_find(dir, &f, msg);
    if (!f.dir[0]) {
        char ck[PATH_MAX];
        snprintf(ck, sizeof ck, "%s/ckpt", dir);
        struct stat sb;
        if (stat(ck, &sb) != 0)
            return fm_set_error(FM_ERR_IO, "%s: nothing to resume (no ckpt/ and no model.safetensors with "
                                "train_state.safetensors); train without --resume to start", dir);
        if (msg) fprintf(msg, "no complete checkpoint in %s: training from step 0\n", ck);
        return FM_OK;
    }
    if (!msg) (void)0;
    else if (f.legacy) fprintf(msg, "resuming from %s (a checkpoint without a MANIFEST, written by an older fathom)\n", f.dir);
    else fprintf(msg, "resuming from %s (step %" PRId64 ")\n", f.dir, f.step);
    fm_status st = load_checkpoint(&u->t, f.dir, f.step);
    if (st == FM_OK && !u->opt->masks) { /* a pruned model's masks go on */
        fm_named_list mk;
        bool found;
        if ((st = fm_masks_load(f.dir, &mk, &found)) == FM_OK && found) st = set_masks(&u->t, &mk);
        fm_named_list_free(&mk);
    }
    if (u->t.world > 1 && u->opt->dist) { /* every rank resumed, or none trains: the others would wait for it */
        double bad = st ? 1 : 0;
        /* said now: the job may end (MPI_Abort from another rank) before this rank's error is printed */
        if (st) fprintf(stderr, "fathom: rank %d of %d: %s\n", u->t.rank, u->t.world, fm_last_error());
        if (fm_dist_allreduce_sum_f64(u->opt->dist, &bad, 1) != FM_OK) st = fm_last_status();
        else if (bad > 0 && st == FM_OK)
            st = fm_set_error(FM_ERR_STATE, "%.0f of the %d ranks could not resume from %s (their errors say why); "
                              "nothing was trained", bad, u->t.world, f.dir);
    }
    /* out_dir/ gets this checkpoint's files when the run writes there (a crash may
     * have come between a commit and its links) */
    if (st == FM_OK && u->t.rank == 0 && !strcmp(u->out_dir, dir)) st = fm_ckpt_relink(dir, &f);
    if (st == FM_OK) u->t.last_good = u->t.step;
    return st;
}

static void log_histograms(train_run *u) {
    fm_named_list ps = {0};
    if (fm_module_parameters(u->t.model, &ps) == FM_OK)
        for (int k = 0; k < ps.n; k++) {
            char tag[300];
            snprintf(tag, sizeof tag, "weights/%s", ps.items[k].name);
            fm_tb_add_histogram_tensor(u->tb, tag, u->t.step, ps.items[k].tensor);
        }
    fm_named_list_free(&ps);
}

/* The loader ran out: the epoch's line, its logs, and (checkpoint_every 0) its checkpoint. */
static fm_status end_of_epoch(train_run *u, bool *stop) {
    const fm_recipe *r = &u->r;
    fm_progress_end(u->prog);
    u->prog = NULL;
    u->last_epoch_loss = u->epoch_steps ? u->epoch_loss / (double)u->epoch_steps : u->last_epoch_loss;
    u->epoch++;
    double tn = now_s();
    if (u->log)
        fprintf(u->log, "epoch %" PRId64 "/%d  loss %.4f  lr %.3g  %.0f samples/s  (%.1f s)\n", u->epoch, r->epochs,
                u->last_epoch_loss, fm_optim_get_lr(opt_of(&u->t)),
                (double)u->epoch_steps * (double)r->batch_size / (tn - u->t_epoch), tn - u->t0);
    if (u->tb) {
        fm_tb_add_scalar(u->tb, "train/epoch_loss", u->t.step, u->last_epoch_loss);
        if (u->opt->hist_every > 0 && u->epoch % u->opt->hist_every == 0) log_histograms(u);
    }
    u->t_epoch = tn;
    u->epoch_loss = 0;
    u->epoch_steps = 0;
    if (u->epoch >= r->epochs) { *stop = true; return FM_OK; }
    if (u->out_dir && r->checkpoint_every == 0) return save(u);
    return FM_OK;
}

/* The loss of one micro-batch (fm_train_loss_fn). */
static fm_tensor *recipe_loss(void *ctx, fm_tensor *x, fm_tensor *y) {
    train_run *u = ctx;
    fm_tensor *logits = u->opt->eff.checkpointing == FM_CKPT_BLOCKS ? fm_module_forward_blocks(u->t.model, x)
                                                                    : fm_module_forward(u->t.model, x);
    fm_tensor *loss = !logits ? NULL
                      : u->opt->loss ? u->opt->loss(u->opt->loss_ctx, logits, x, y)
                                     : fm_cross_entropy(logits, y, -100, u->r.label_smoothing, FM_REDUCE_MEAN);
    fm_tensor_release(logits);
    return loss;
}

/* Gradients live only between backward and the next step: they are logged on the step
 * that ends an epoch whose weights get histograms, unscaled and before clipping, at the
 * step number the weights get. */
static fm_status grad_histograms(void *ctx) {
    train_run *u = ctx;
    if (!u->tb || u->opt->hist_every <= 0 || (u->epoch + 1) % u->opt->hist_every) return FM_OK;
    fm_dataloader_state ls;
    fm_named_list ps = {0};
    if (loader_state(&u->t, &ls) == FM_OK && ls.batch == u->nb &&
        fm_module_parameters(u->t.model, &ps) == FM_OK)
        fm_tb_add_histograms(u->tb, "grads", &ps, true, u->t.step + 1);
    fm_named_list_free(&ps);
    return FM_OK;
}

/* The step every trainer runs (fathom/train_step.h), over this model's parameters. */
static fm_status step_init(train_run *u) {
    fm_named_list ps = {0};
    fm_status st = fm_module_parameters(u->t.model, &ps);
    if (st) return st;
    u->t.params = calloc((size_t)ps.n + 1, sizeof *u->t.params);
    if (!u->t.params) { fm_named_list_free(&ps); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
    for (int i = 0; i < ps.n; i++) u->t.params[i] = ps.items[i].tensor; /* borrowed: the model holds them */
    u->t.n_params = ps.n;
    fm_named_list_free(&ps);
    fm_train_step_init(&u->t.ts, &u->opt->eff, u->t.opt, u->t.n_params, u->t.params, recipe_loss, u);
    u->t.ts.scaler.quiet = u->log == NULL;
    u->t.ts.clip = u->r.clip_grad_norm;
    u->t.ts.divergence_factor = u->r.divergence_factor;
    u->t.ts.inspect_grads = grad_histograms;
    u->t.hooks.user = &u->t;
    u->t.hooks.after_update = masks_after_update;
    u->t.ts.hooks = &u->t.hooks;
    return FM_OK;
}

/* A loss that is not finite, or that exploded over its running minimum, ends the run. */
static fm_status check_loss(train_run *u, double lv) {
    char why[200];
    return fm_train_step_check_loss(&u->t.ts, lv, why, sizeof why) ? FM_OK : loss_stopped(u, why);
}

/* One training step on batch b, its logs and (checkpoint_every) its checkpoint. */
static fm_status train_step(train_run *u, const fm_batch *b, bool *stop) {
    const fm_recipe *r = &u->r;
    fm_optim *opt = opt_of(&u->t);
    fm_optim_set_lr(opt, fm_lr_at(&r->sched, u->t.step));
    double t_step0 = now_s(), lv = NAN;
    /* data parallel: b is this rank's part of the batch the loader walked */
    int64_t n = fm_dataset_size(u->train), left = n - b->index * r->batch_size;
    const int64_t rows = u->t.dt ? (left < r->batch_size ? left : r->batch_size) : b->size;
    if (u->t.dt) fm_dist_trainer_begin_step(u->t.dt, b->size, rows);
    fm_status st = fm_train_step_backward(&u->t.ts, b->x, b->y, &lv);
    if (st == FM_OK && u->t.dt) st = fm_dist_trainer_reduce_loss(u->t.dt, &lv, b->size, rows); /* the batch's mean */
    if (st == FM_OK) st = check_loss(u, lv);
    /* the norm for the logs (ZeRO-1: a collective, so on every rank alike) */
    u->t.ts.want_norm = (u->tb || u->t.zero) && (u->t.step + 1) % 10 == 0;
    if (st == FM_OK) st = fm_train_step_update(&u->t.ts);
    if (st) return st;
    double gnorm = u->t.ts.grad_norm;
    u->t.step++;
    u->prog_done++;
    u->prog_items += rows;
    fm_progress_update(u->prog, u->prog_done, u->prog_items, lv);
    if (u->tb && u->t.step % 10 == 0) {
        double dt = now_s() - t_step0;
        fm_memory_stats mst;
        fm_tb_add_scalar(u->tb, "train/loss", u->t.step, lv);
        fm_tb_add_scalar(u->tb, "train/lr", u->t.step, fm_optim_get_lr(opt));
        if (dt > 0) fm_tb_add_scalar(u->tb, "train/throughput", u->t.step, (double)rows / dt);
        if (gnorm == gnorm) fm_tb_add_scalar(u->tb, "train/grad_norm", u->t.step, gnorm);
        if (fm_memory_stats_get(u->opt->eff.device, &mst) == FM_OK)
            fm_tb_add_scalar(u->tb, "memory/allocated_bytes", u->t.step, (double)mst.allocated);
    }
    u->res->samples += rows;
    u->epoch_loss += lv;
    u->epoch_steps++;
    if ((st = push_loss(u->res, lv)) != FM_OK) return st;
    if (u->out_dir && r->checkpoint_every > 0 && u->t.step % r->checkpoint_every == 0 && (st = save(u))) return st;
    if (u->opt->max_steps > 0 && u->t.step >= u->opt->max_steps) *stop = true;
    if (u->opt->steps > 0 && u->t.step >= u->opt->steps) *stop = true;
    return FM_OK;
}

/* Whether the loader has handed out every batch of its epoch: a step count that
 * ends there has finished that epoch, and it is reported and counted as such. */
static bool epoch_consumed(const train_run *u) {
    fm_dataloader_state ls;
    return loader_state(&u->t, &ls) == FM_OK && ls.batch >= fm_dataloader_num_batches(u->t.loader);
}

/* The next batch on a device (u->t.stage): batch N, uploaded during step N - 1 (or
 * now, at the start of an epoch), then batch N + 1 fetched and its upload queued before
 * step N runs, so on a GPU the copy overlaps step N's compute. Not past the epoch's
 * end (its evaluation and checkpoint come between) nor past the run's last step.
 * b gets the device tensors (new references: the caller releases them). */
static fm_status next_staged(train_run *u, fm_batch *b) {
    trainer *t = &u->t;
    fm_status st;
    if (fm_batch_stage_count(t->stage) == 0) {
        if ((st = fm_dataloader_next(t->loader, b)) != FM_OK || !b->x) return st;
        if ((st = fm_batch_stage_put(t->stage, b->x, b->y))) return st;
    } else {
        *b = t->staged;
    }
    fm_tensor *x, *y;
    if ((st = fm_batch_stage_take(t->stage, &x, &y))) return st;
    b->x = x;
    b->y = y;
    fm_dataloader_state ls;
    const int64_t next = t->step + 1;
    const bool last = (u->opt->max_steps > 0 && next >= u->opt->max_steps) || (u->opt->steps > 0 && next >= u->opt->steps);
    if (!last && (st = fm_dataloader_state_get(t->loader, &ls)) == FM_OK && ls.batch < u->nb) {
        fm_batch nb;
        if ((st = fm_dataloader_next(t->loader, &nb)) == FM_OK && nb.x && (st = fm_batch_stage_put(t->stage, nb.x, nb.y)) == FM_OK)
            t->staged = nb;
    }
    if (st != FM_OK) fm_tensor_release_n(2, x, y);
    return st;
}

static fm_status train_loop(train_run *u) {
    const fm_recipe *r = &u->r;
    fm_dataloader_state ls0;
    fm_dataloader_state_get(u->t.loader, &ls0);
    u->epoch = ls0.epoch;
    bool stop = u->epoch >= r->epochs || (u->opt->max_steps > 0 && u->t.step >= u->opt->max_steps) ||
                (u->opt->steps > 0 && u->t.step >= u->opt->steps);
    fm_status st = FM_OK;
    while (!stop && st == FM_OK) {
        if (!u->prog) {
            char label[64];
            snprintf(label, sizeof label, "epoch %" PRId64 "/%d", u->epoch + 1, r->epochs);
            u->prog = fm_progress_begin(label, u->nb, "samples", u->log ? FM_PROGRESS_AUTO : FM_PROGRESS_QUIET, u->log);
            u->prog_done = u->prog_items = 0;
        }
        fm_batch b;
        /* the step span (its batch's wait included) is written only when there was a
         * batch: the fetch that finds the epoch's end is no step (`fathom profile` counts them) */
        double ps = fm_profiler_now_us();
        fm_profile_push("next batch", "data");
        st = u->t.stage ? next_staged(u, &b) : fm_dataloader_next(u->t.loader, &b);
        fm_profile_pop();
        if (st == FM_OK && b.x) {
            st = train_step(u, &b, &stop);
            fm_profile_span("step", "step", ps, fm_profiler_now_us() - ps, NULL);
            if (u->t.stage) fm_tensor_release_n(2, b.x, b.y);
        }
        if (st == FM_OK && !b.x) st = end_of_epoch(u, &stop);
        else if (st == FM_OK && stop && epoch_consumed(u)) st = end_of_epoch(u, &stop);
    }
    return st;
}

/* Results, the final checkpoint and the test-set evaluation. */
static fm_status train_finish(train_run *u) {
    fm_train_result *res = u->res;
    res->train_seconds = now_s() - u->t0;
    if (u->epoch_steps) u->last_epoch_loss = u->epoch_loss / (double)u->epoch_steps;
    res->final_loss = u->last_epoch_loss;
    res->epochs = (int)u->epoch;
    res->steps = u->t.step;
    res->samples_per_second = res->train_seconds > 0 ? (double)res->samples / res->train_seconds : 0;
    fm_memory_stats ms;
    if (fm_memory_stats_get(u->opt->eff.device, &ms) == FM_OK) res->peak_memory_bytes = ms.allocated_peak;
    res->data_wait_seconds = fm_dataloader_wait_seconds(u->t.loader);
    res->loss_scale = u->t.ts.scaler.scale;
    res->skipped_steps = u->t.ts.scaler.n_skipped - u->skipped0;
    fm_dist_trainer_report(u->t.dt, &res->dist);
    fm_memory_report mrep;
    if (fm_memory_report_get(u->opt->eff.device, &mrep) == FM_OK) {
        fm_memory_report_json(&mrep, res->memory_report_json, sizeof res->memory_report_json);
        fm_memory_report_format(&mrep, res->memory_report_text, sizeof res->memory_report_text);
    }
    fm_status st;
    if (u->out_dir) {
        if ((st = save(u)) != FM_OK) return st;
        snprintf(res->model_path, sizeof res->model_path, "%s/model.safetensors", u->out_dir);
    }
    if (!u->test) return FM_OK;
    if ((st = check_input_shape(&u->r, u->test)) != FM_OK) return st;
    st = fm_evaluate_progress(u->t.model, u->test, &u->r.transforms, 1000, &res->test_accuracy, &res->test_loss, u->log);
    if (st == FM_OK && u->tb) {
        fm_tb_add_scalar(u->tb, "val/accuracy", u->t.step, res->test_accuracy);
        fm_tb_add_scalar(u->tb, "val/loss", u->t.step, res->test_loss);
    }
    if (st == FM_OK && u->log)
        fprintf(u->log, "test accuracy %.2f%%  test loss %.4f  (%" PRId64 " samples)\n", 100 * res->test_accuracy,
                res->test_loss, fm_dataset_size(u->test));
    return st;
}

/* The allocator's out-of-memory advice names the GPT trainer's flags; this
 * trainer takes none of them, so it gets advice it can follow. */
static void plain_oom_advice(void) {
    const char *m = fm_last_error(), *p = strstr(m, " (try a smaller --batch");
    if (!p) return;
    char buf[1024];
    snprintf(buf, sizeof buf, "%.*s (try a smaller --batch, or a larger FATHOM_MEMORY_LIMIT)", (int)(p - m), m);
    fm_set_error(FM_ERR_OOM, "%s", buf);
}

fm_status fm_train(const fm_recipe *rin, const fm_train_options *opt, fm_train_result *res) {
    fm_train_options defo;
    if (!opt) { fm_train_options_init(&defo); opt = &defo; }
    memset(res, 0, sizeof *res);
    res->test_accuracy = -1;
    res->loss_scale = 1;
    fm_efficiency_opts ev = opt->eff; /* a conv net's blocks are checked here: the rest as for any model */
    if (ev.checkpointing == FM_CKPT_BLOCKS && fm_recipe_num_blocks(rin) > 0) ev.checkpointing = FM_CKPT_NONE;
    fm_status vst = fm_efficiency_validate(&ev, false, (int)(opt->batch_size > 0 ? opt->batch_size : rin->batch_size));
    if (vst) return vst;
    train_run *u = calloc(1, sizeof *u);
    if (!u) return fm_set_error(FM_ERR_OOM, "out of host memory");
    u->r = *rin;
    fm_recipe *r = &u->r;
    if (opt->epochs > 0) r->epochs = opt->epochs;
    if (opt->batch_size > 0) r->batch_size = opt->batch_size;
    if (opt->lr > 0) r->optim.lr = r->sched.base_lr = opt->lr;
    if (opt->seed >= 0) r->seed = (uint64_t)opt->seed;
    if (opt->threads > 0) r->threads = opt->threads;
    if (r->threads > 0) fm_set_num_threads(r->threads);
    u->opt = opt;
    u->res = res;
    u->log = u->t.log = opt->log;
    u->t.r = r;
    u->t.last_good = -1;
    u->last_epoch_loss = NAN;
    u->out_dir = opt->out_dir ? opt->out_dir : opt->resume_dir;
    u->t.rank = opt->dist ? fm_dist_rank(opt->dist) : 0;
    u->t.world = opt->dist ? fm_dist_size(opt->dist) : 1;
    fm_status st = train_setup(u);
    if (st == FM_OK && opt->resume_dir) st = train_resume(u);
    if (st == FM_OK && u->out_dir && u->t.rank == 0 && (!opt->resume_dir || strcmp(u->out_dir, opt->resume_dir)))
        fm_ckpt_clean_stale(u->out_dir, u->log ? u->log : stderr);
    if (st) goto done;
    res->first_step = u->t.step;
    if (u->log)
        fprintf(u->log, "fathom: training %s: %" PRId64 " parameters, %" PRId64 " samples, %d epochs of %" PRId64
                        " batches of %" PRId64 ", %s lr %g%s\n",
                r->name, res->num_params, fm_dataset_size(u->train), r->epochs, u->nb, r->batch_size,
                fm_optim_kind_name(r->optim.kind), r->optim.lr, opt->resume_dir ? " (resumed)" : "");
    if (u->log && u->t.dt)
        fprintf(u->log, "data parallel over %d ranks: %" PRId64 " samples of each batch per rank, %d thread%s each%s\n",
                u->t.world, r->batch_size / u->t.world, fm_num_threads(), fm_num_threads() == 1 ? "" : "s", u->t.zero ? ", optimizer state sharded (ZeRO-1)" : "");
    if (opt->profile_path && (st = fm_profiler_start(opt->profile_path)) != FM_OK) goto done;
    if (opt->logdir && !(u->tb = fm_tb_writer_open(opt->logdir))) { st = fm_last_status(); goto done; }
    fm_memory_reset_peak(u->opt->eff.device);
    u->skipped0 = u->t.ts.scaler.n_skipped;
    u->t0 = u->t_epoch = now_s();
    fm_module_train(u->t.model, true);
    if ((st = train_loop(u)) == FM_OK) st = train_finish(u);
done:
    fm_progress_end(u->prog);
    if (u->tb) {
        fm_status cst = fm_tb_writer_close(u->tb);
        if (st == FM_OK) st = cst;
    }
    if (opt->profile_path) {
        fm_status pst = fm_profiler_stop();
        if (st == FM_OK) st = pst;
    }
    fm_batch_stage_free(u->t.stage);
    fm_dataloader_free(u->t.loader);
    fm_dist_trainer_free(u->t.dt);
    fm_optim_free(u->t.opt);
    free(u->t.params);
    fm_named_list_free(&u->t.masks);
    fm_module_free(u->t.model);
    fm_dataset_release(u->train);
    fm_dataset_release(u->test);
    free(u);
    if (st == FM_ERR_OOM) plain_oom_advice();
    return st;
}

/* ---------------- loading a saved model ---------------- */

fm_status fm_model_load(const char *model_dir, fm_recipe *recipe_out, fm_module **model_out) {
    char path[PATH_MAX];
    size_t ln = strlen(model_dir);
    if (ln > 12 && !strcmp(model_dir + ln - 12, ".safetensors")) snprintf(path, sizeof path, "%s", model_dir);
    else snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    struct stat sb;
    char cfg[PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/config.json", model_dir);
    *model_out = NULL;
    if (stat(model_dir, &sb) != 0)
        return fm_set_error(FM_ERR_IO, "%s: no such model directory (%s); `fathom train RECIPE --out %s` makes one",
                            model_dir, strerror(errno), model_dir);
    if (S_ISDIR(sb.st_mode) && stat(cfg, &sb) == 0)
        return fm_set_error(FM_ERR_INVALID, "%s holds a GPT model (config.json), not a classifier: use `fathom generate "
                            "%s --prompt TEXT`", model_dir, model_dir);
    *model_out = NULL;
    fm_named_list all;
    fm_kv_list meta = {0};
    if (fm_safetensors_load(path, &all, &meta) != FM_OK) { fm_kv_free(&meta); return fm_last_status(); }
    fm_named_list_free(&all);
    const char *text = fm_kv_get(&meta, "fathom.recipe");
    if (!text) {
        fm_kv_free(&meta);
        return fm_set_error(FM_ERR_FORMAT, "%s: no fathom recipe in the metadata (not written by `fathom train`?)", path);
    }
    char rpath[PATH_MAX + 16];
    snprintf(rpath, sizeof rpath, "%s[recipe]", path);
    fm_status st = fm_recipe_parse(text, rpath, recipe_out);
    fm_kv_free(&meta);
    if (st) return st;
    fm_module *m = fm_recipe_build_model(recipe_out, NULL);
    fm_named_list state;
    if (!m || fm_module_state(m, &state) != FM_OK) {
        fm_module_free(m);
        fm_recipe_free(recipe_out);
        return fm_last_status();
    }
    st = fm_safetensors_load_into(path, &state, NULL);
    /* a model with NaN or inf weights (saved by something other than fathom's
     * trainer, which refuses to) would print garbage without a word */
    for (int i = 0; i < state.n && st == FM_OK; i++)
        if (fm_tensor_has_inf_nan(state.items[i].tensor))
            st = fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' holds NaN or inf values (from a diverged run?); refusing "
                              "to use it", path, state.items[i].name);
    fm_named_list_free(&state);
    if (st) { fm_module_free(m); fm_recipe_free(recipe_out); return st; }
    fm_module_train(m, false);
    *model_out = m;
    return FM_OK;
}
