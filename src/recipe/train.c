/* The trainer: runs a recipe (data, model, optimizer, schedule), checkpoints,
 * resumes, evaluates.
 *
 * Resume is bit-exact on CPU because everything that shapes the next step is
 * saved: weights and BatchNorm buffers (model.safetensors), optimizer moments
 * and step (train_state.safetensors), the data loader's position and seed, and
 * the dropout generator's (seed, offset). The schedule is a function of the
 * step alone. Both files carry the step, so a directory whose two files come
 * from different moments (a crash between the two renames) is refused. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fathom/autograd.h"
#include "fathom/io.h"
#include "fathom/memory.h" /* peak memory for the report */
#include "fathom/observe.h" /* TensorBoard events, progress lines */
#include "fathom/profile.h" /* --profile spans */
#include "fathom/recipe.h"
#include "core/parallel.h" /* fm_set_num_threads */

void fm_train_options_init(fm_train_options *o) {
    memset(o, 0, sizeof *o);
    o->seed = -1;
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

fm_dataset *fm_recipe_dataset(const fm_recipe *r, fm_data_split split, const char *data_dir) {
    fm_dataset *d = NULL;
    if (!strcmp(r->dataset, "idx") && !data_dir) {
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
    return d;
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
        fm_tensor *logits = fm_module_forward(model, b.x);
        fm_tensor *ls = logits ? fm_cross_entropy(logits, b.y, -100, 0.0, FM_REDUCE_SUM) : NULL;
        fm_tensor *pred = logits ? fm_argmax(logits, 1, false) : NULL;
        if (!ls || !pred) { fm_tensor_release_n(3, logits, ls, pred); st = fm_last_status(); break; }
        loss_sum += fm_tensor_item(ls);
        const int64_t *p = fm_tensor_data(pred);
        for (int64_t i = 0; i < b.size; i++) correct += p[i] == (int64_t)fm_tensor_get(b.y, i);
        total += b.size;
        fm_tensor_release_n(3, logits, ls, pred);
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
    int64_t step;
} trainer;

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

static fm_status save_checkpoint(trainer *t, const char *dir) {
    char path[PATH_MAX];
    fm_status st = fm_mkdir_p(dir);
    if (st) return st;
    fm_dataloader_state ls;
    if ((st = fm_dataloader_state_get(t->loader, &ls)) != FM_OK) return st;
    if (ls.batch >= fm_dataloader_num_batches(t->loader)) { ls.epoch++; ls.batch = 0; }
    fm_kv_list meta = {0}, smeta = {0};
    fm_named_list state = {0}, ostate = {0};
    if ((st = fm_module_state(t->model, &state)) != FM_OK) goto done;
    if ((st = fm_optim_init_state(t->opt)) != FM_OK || (st = fm_optim_state(t->opt, &ostate)) != FM_OK) goto done;
    if ((st = fm_kv_set(&meta, "format", "fathom-model-1")) || (st = fm_kv_set(&meta, "fathom.recipe", t->r->text)) ||
        (st = meta_i64(&meta, "fathom.step", t->step)))
        goto done;
    if ((st = fm_kv_set(&smeta, "format", "fathom-train-state-1")) || (st = meta_i64(&smeta, "step", t->step)) ||
        (st = meta_i64(&smeta, "optimizer_step", fm_optim_get_step(t->opt))) ||
        (st = fm_kv_set(&smeta, "optimizer", fm_optim_kind_name(t->r->optim.kind))) ||
        (st = meta_u64(&smeta, "loader_seed", ls.seed)) || (st = meta_i64(&smeta, "loader_epoch", ls.epoch)) ||
        (st = meta_i64(&smeta, "loader_batch", ls.batch)) || (st = meta_i64(&smeta, "loader_samples", ls.num_samples)) ||
        (st = meta_i64(&smeta, "loader_batch_size", ls.batch_size)) ||
        (st = meta_u64(&smeta, "dropout_rng_seed", t->drop_rng.seed)) ||
        (st = meta_u64(&smeta, "dropout_rng_offset", t->drop_rng.offset)) ||
        (st = meta_u64(&smeta, "global_rng_seed", fm_rng_global()->seed)) ||
        (st = meta_u64(&smeta, "global_rng_offset", fm_rng_global()->offset)))
        goto done;
    /* state first, model second: the model file is what eval/predict read, and a
     * failure on either leaves the previous model file in place */
    snprintf(path, sizeof path, "%s/train_state.safetensors", dir);
    if ((st = fm_safetensors_save(path, &ostate, &smeta)) != FM_OK) goto done;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((st = fm_safetensors_save(path, &state, &meta)) != FM_OK) goto done;
    snprintf(path, sizeof path, "%s/recipe.ini", dir);
    fm_io_chunk c = {t->r->text, strlen(t->r->text)};
    st = fm_atomic_write(path, 1, &c);
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

static fm_status load_checkpoint(trainer *t, const char *dir) {
    char path[PATH_MAX];
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
    const char *okind = fm_kv_get(&smeta, "optimizer");
    if (!okind || strcmp(okind, fm_optim_kind_name(t->r->optim.kind))) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: the checkpoint was written by optimizer '%s' but the recipe uses '%s'", dir,
                          okind ? okind : "?", fm_optim_kind_name(t->r->optim.kind));
        goto done;
    }
    if ((st = fm_optim_init_state(t->opt)) != FM_OK || (st = fm_optim_state(t->opt, &ostate)) != FM_OK) goto done;
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
    if (st == FM_OK && saved.n != ostate.n)
        st = fm_set_error(FM_ERR_FORMAT, "%s: %d optimizer state tensors but the model needs %d", path, saved.n, ostate.n);
    if (st) goto done;
    ls.epoch = ep;
    ls.batch = bt;
    ls.num_samples = ns;
    ls.batch_size = bs;
    if ((st = fm_dataloader_state_set(t->loader, &ls)) != FM_OK) {
        fm_error_prefix("%s: cannot restore the data position (was the batch size or data set changed?)", dir);
        goto done;
    }
    fm_optim_set_step(t->opt, ostep);
    t->step = sstep;
    t->drop_rng = dr;
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

fm_status fm_train(const fm_recipe *rin, const fm_train_options *opt, fm_train_result *res) {
    fm_train_options defo;
    if (!opt) { fm_train_options_init(&defo); opt = &defo; }
    memset(res, 0, sizeof *res);
    res->test_accuracy = -1;
    fm_recipe r = *rin; /* a shallow copy with the overrides applied; text stays rin's */
    if (opt->epochs > 0) r.epochs = opt->epochs;
    if (opt->batch_size > 0) r.batch_size = opt->batch_size;
    if (opt->lr > 0) r.optim.lr = r.sched.base_lr = opt->lr;
    if (opt->seed >= 0) r.seed = (uint64_t)opt->seed;
    if (opt->threads > 0) r.threads = opt->threads;
    if (r.threads > 0) fm_set_num_threads(r.threads);
    FILE *log = opt->log;

    trainer t;
    memset(&t, 0, sizeof t);
    fm_tb_writer *tb = NULL;
    fm_progress *prog = NULL;
    int64_t prog_done = 0, prog_items = 0;
    t.r = &r;
    fm_dataset *train = NULL, *test = NULL;
    fm_status st = FM_OK;
    fm_rng init_rng;
    fm_rng_init(&init_rng, r.seed);
    fm_rng_init(&t.drop_rng, r.seed ^ 0x9e3779b97f4a7c15ull);
    fm_manual_seed(r.seed + 1);

    train = fm_recipe_dataset(&r, FM_SPLIT_TRAIN, NULL);
    if (!train || (st = check_input_shape(&r, train)) != FM_OK) { st = fm_last_status(); goto done; }
    if (!opt->skip_eval) {
        test = fm_recipe_dataset(&r, FM_SPLIT_TEST, NULL);
        if (!test) { st = fm_last_status(); goto done; }
    }
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_WEIGHTS);
    t.model = fm_recipe_build_model(&r, &init_rng);
    fm_memory_tag_pop(mc);
    if (!t.model) { st = fm_last_status(); goto done; }
    fm_module_set_rng(t.model, &t.drop_rng);
    res->num_params = fm_module_num_params(t.model);
    t.opt = fm_optim_new(&r.optim);
    if (!t.opt || (st = fm_optim_add_params(t.opt, t.model)) != FM_OK) { st = fm_last_status(); goto done; }
    fm_loader_options lo;
    fm_loader_options_init(&lo);
    lo.batch_size = r.batch_size;
    lo.shuffle = true;
    lo.seed = r.seed;
    lo.drop_last = false;
    lo.workers = r.workers;
    lo.transforms = r.transforms;
    t.loader = fm_dataloader_create(train, &lo);
    if (!t.loader) { st = fm_last_status(); goto done; }
    int64_t nb = fm_dataloader_num_batches(t.loader);
    if (r.sched.total_steps <= 0) r.sched.total_steps = nb * r.epochs;
    if (opt->resume_dir && (st = load_checkpoint(&t, opt->resume_dir)) != FM_OK) goto done;
    const char *out_dir = opt->out_dir ? opt->out_dir : opt->resume_dir;
    res->first_step = t.step;
    if (log)
        fprintf(log, "fathom: training %s: %" PRId64 " parameters, %" PRId64 " samples, %d epochs of %" PRId64
                     " batches of %" PRId64 ", %s lr %g%s\n",
                r.name, res->num_params, fm_dataset_size(train), r.epochs, nb, r.batch_size,
                fm_optim_kind_name(r.optim.kind), r.optim.lr, opt->resume_dir ? " (resumed)" : "");

    if (opt->profile_path && (st = fm_profiler_start(opt->profile_path)) != FM_OK) goto done;
    if (opt->logdir && !(tb = fm_tb_writer_open(opt->logdir))) { st = fm_last_status(); goto done; }
    fm_memory_reset_peak(FM_CPU);
    double t0 = now_s(), epoch_loss = 0, last_epoch_loss = NAN, t_epoch = t0;
    int64_t epoch_steps = 0, last_good = -1;
    fm_module_train(t.model, true);
    fm_dataloader_state ls0;
    fm_dataloader_state_get(t.loader, &ls0);
    int64_t epoch = ls0.epoch;
    bool stop = epoch >= r.epochs || (opt->max_steps > 0 && t.step >= opt->max_steps);
    while (!stop) {
        fm_batch b;
        if (!prog) {
            char label[64];
            snprintf(label, sizeof label, "epoch %" PRId64 "/%d", epoch + 1, r.epochs);
            prog = fm_progress_begin(label, nb, "samples", log ? FM_PROGRESS_AUTO : FM_PROGRESS_QUIET, log);
            prog_done = prog_items = 0;
        }
        fm_profile_push("step", "step");
        fm_profile_push("next batch", "data");
        st = fm_dataloader_next(t.loader, &b);
        fm_profile_pop();
        if (st != FM_OK) { fm_profile_pop(); goto done; }
        if (!b.x) { /* end of an epoch */
            fm_profile_pop();
            fm_progress_end(prog);
            prog = NULL;
            last_epoch_loss = epoch_steps ? epoch_loss / (double)epoch_steps : last_epoch_loss;
            epoch++;
            double tn = now_s();
            if (log)
                fprintf(log, "epoch %" PRId64 "/%d  loss %.4f  lr %.3g  %.0f samples/s  (%.1f s)\n", epoch, r.epochs,
                        last_epoch_loss, fm_optim_get_lr(t.opt),
                        (double)epoch_steps * (double)r.batch_size / (tn - t_epoch), tn - t0);
            if (tb) {
                fm_tb_add_scalar(tb, "train/epoch_loss", t.step, last_epoch_loss);
                if (opt->hist_every > 0 && epoch % opt->hist_every == 0) {
                    fm_named_list ps = {0};
                    if (fm_module_parameters(t.model, &ps) == FM_OK)
                        for (int k = 0; k < ps.n; k++) {
                            char tag[300];
                            snprintf(tag, sizeof tag, "weights/%s", ps.items[k].name);
                            fm_tb_add_histogram_tensor(tb, tag, t.step, ps.items[k].tensor);
                        }
                    fm_named_list_free(&ps);
                }
            }
            t_epoch = tn;
            epoch_loss = 0;
            epoch_steps = 0;
            if (epoch >= r.epochs) break;
            if (out_dir && r.checkpoint_every == 0) {
                if ((st = save_checkpoint(&t, out_dir)) != FM_OK) goto done;
                last_good = t.step;
            }
            continue;
        }
        fm_optim_set_lr(t.opt, fm_lr_at(&r.sched, t.step));
        double t_step0 = now_s();
        fm_mem_category mprev = fm_memory_tag_push(FM_MEM_ACTIVATIONS);
        fm_tensor *logits = fm_module_forward(t.model, b.x);
        fm_tensor *loss = logits ? fm_cross_entropy(logits, b.y, -100, r.label_smoothing, FM_REDUCE_MEAN) : NULL;
        fm_memory_tag_pop(mprev);
        if (!loss) { fm_tensor_release(logits); fm_profile_pop(); st = fm_last_status(); goto done; }
        double lv = fm_tensor_item(loss);
        if (!isfinite(lv)) {
            fm_tensor_release_n(2, logits, loss);
            fm_profile_pop();
            if (last_good >= 0 || opt->resume_dir)
                st = fm_set_error(FM_ERR_STATE, "the loss became %g at step %" PRId64 " (epoch %" PRId64 "); training "
                                  "stopped. The last good checkpoint (step %" PRId64 ") is in %s; try a lower learning "
                                  "rate or clip_grad_norm", lv, t.step, epoch + 1,
                                  last_good >= 0 ? last_good : res->first_step, out_dir);
            else
                st = fm_set_error(FM_ERR_STATE, "the loss became %g at step %" PRId64 " (epoch %" PRId64 "); training "
                                  "stopped before any checkpoint was written; try a lower learning rate or "
                                  "clip_grad_norm", lv, t.step, epoch + 1);
            goto done;
        }
        mprev = fm_memory_tag_push(FM_MEM_ACTIVATIONS); /* temporaries; leaf gradients are tagged by the engine */
        st = fm_backward(loss, NULL, false);
        fm_memory_tag_pop(mprev);
        fm_tensor_release_n(2, logits, loss);
        if (st) { fm_profile_pop(); goto done; }
        if (tb && opt->hist_every > 0 && (epoch + 1) % opt->hist_every == 0) {
            /* gradients live only between backward and zero_grad: log them on the step that ends an
             * epoch whose weights get histograms, before clipping, at the step number the weights get */
            fm_dataloader_state ls;
            fm_named_list ps = {0};
            if (fm_dataloader_state_get(t.loader, &ls) == FM_OK && ls.batch == nb && fm_module_parameters(t.model, &ps) == FM_OK)
                fm_tb_add_histograms(tb, "grads", &ps, true, t.step + 1);
            fm_named_list_free(&ps);
        }
        fm_profile_push("optimizer", "optimizer");
        mprev = fm_memory_tag_push(FM_MEM_OPTIMIZER);
        double gnorm = NAN;
        if (r.clip_grad_norm > 0) st = fm_optim_clip_grad_norm(t.opt, r.clip_grad_norm, &gnorm);
        else if (tb && (t.step + 1) % 10 == 0) st = fm_optim_clip_grad_norm(t.opt, INFINITY, &gnorm); /* the norm for the logs; never scales */
        if (st == FM_OK) st = fm_optim_step(t.opt);
        fm_optim_zero_grad(t.opt);
        fm_memory_tag_pop(mprev);
        fm_profile_pop();
        fm_profile_pop(); /* step */
        if (st) goto done;
        t.step++;
        prog_done++;
        prog_items += b.size;
        fm_progress_update(prog, prog_done, prog_items, lv);
        if (tb && t.step % 10 == 0) {
            double dt = now_s() - t_step0;
            fm_memory_stats mst;
            fm_tb_add_scalar(tb, "train/loss", t.step, lv);
            fm_tb_add_scalar(tb, "train/lr", t.step, fm_optim_get_lr(t.opt));
            if (dt > 0) fm_tb_add_scalar(tb, "train/throughput", t.step, (double)b.size / dt);
            if (gnorm == gnorm) fm_tb_add_scalar(tb, "train/grad_norm", t.step, gnorm);
            if (fm_memory_stats_get(FM_CPU, &mst) == FM_OK) fm_tb_add_scalar(tb, "memory/allocated_bytes", t.step, (double)mst.allocated);
        }
        res->samples += b.size;
        epoch_loss += lv;
        epoch_steps++;
        if ((st = push_loss(res, lv)) != FM_OK) goto done;
        if (out_dir && r.checkpoint_every > 0 && t.step % r.checkpoint_every == 0) {
            if ((st = save_checkpoint(&t, out_dir)) != FM_OK) goto done;
            last_good = t.step;
        }
        if (opt->max_steps > 0 && t.step >= opt->max_steps) break;
    }
    res->train_seconds = now_s() - t0;
    if (epoch_steps) last_epoch_loss = epoch_loss / (double)epoch_steps;
    res->final_loss = last_epoch_loss;
    res->epochs = (int)epoch;
    res->steps = t.step;
    res->samples_per_second = res->train_seconds > 0 ? (double)res->samples / res->train_seconds : 0;
    fm_memory_stats ms;
    if (fm_memory_stats_get(FM_CPU, &ms) == FM_OK) res->peak_memory_bytes = ms.allocated_peak;
    res->data_wait_seconds = fm_dataloader_wait_seconds(t.loader);
    fm_memory_report mrep;
    if (fm_memory_report_get(FM_CPU, &mrep) == FM_OK) {
        fm_memory_report_json(&mrep, res->memory_report_json, sizeof res->memory_report_json);
        fm_memory_report_format(&mrep, res->memory_report_text, sizeof res->memory_report_text);
    }
    if (out_dir) {
        if ((st = save_checkpoint(&t, out_dir)) != FM_OK) goto done;
        snprintf(res->model_path, sizeof res->model_path, "%s/model.safetensors", out_dir);
    }
    if (test) {
        if ((st = check_input_shape(&r, test)) != FM_OK) goto done;
        st = fm_evaluate_progress(t.model, test, &r.transforms, 1000, &res->test_accuracy, &res->test_loss, log);
        if (st == FM_OK && tb) {
            fm_tb_add_scalar(tb, "val/accuracy", t.step, res->test_accuracy);
            fm_tb_add_scalar(tb, "val/loss", t.step, res->test_loss);
        }
        if (st == FM_OK && log)
            fprintf(log, "test accuracy %.2f%%  test loss %.4f  (%" PRId64 " samples)\n", 100 * res->test_accuracy,
                    res->test_loss, fm_dataset_size(test));
    }
done:
    fm_progress_end(prog);
    if (tb) {
        fm_status cst = fm_tb_writer_close(tb);
        if (st == FM_OK) st = cst;
    }
    if (opt->profile_path) {
        fm_status pst = fm_profiler_stop();
        if (st == FM_OK) st = pst;
    }
    fm_dataloader_free(t.loader);
    fm_optim_free(t.opt);
    fm_module_free(t.model);
    fm_dataset_release(train);
    fm_dataset_release(test);
    return st;
}

/* ---------------- loading a saved model ---------------- */

fm_status fm_model_load(const char *model_dir, fm_recipe *recipe_out, fm_module **model_out) {
    char path[PATH_MAX];
    size_t ln = strlen(model_dir);
    if (ln > 12 && !strcmp(model_dir + ln - 12, ".safetensors")) snprintf(path, sizeof path, "%s", model_dir);
    else snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    *model_out = NULL;
    fm_named_list all;
    fm_kv_list meta = {0};
    if (fm_safetensors_load(path, &all, &meta) != FM_OK) return fm_last_status();
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
    fm_named_list_free(&state);
    if (st) { fm_module_free(m); fm_recipe_free(recipe_out); return st; }
    fm_module_train(m, false);
    *model_out = m;
    return FM_OK;
}
