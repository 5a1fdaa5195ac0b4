/* `fathom plan --model <recipe>`: the peak memory of fathom's own CPU training
 * run for a recipe, from the trainer's model and steps run on the meta device
 * (plan_step.c; no data, the CPU allocator's block sizes).
 *
 * This file covers the layer-list recipes `fathom train` runs
 * (src/recipe/train.c): the meta step, plus what lives on the host outside it
 * (the data sets and the loader's batch buffers, from the idx headers); and the
 * shared parts (recipe detection, rendering). plan_fathom_gpt.c covers GPT
 * recipes. tests/test_plan_fathom.c runs the real trainer and compares. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <ini.h>
#include <jansson.h>
#include <zlib.h>

#include "core/memory_internal.h"
#include "fathom/recipe.h"
#include "plan/plan_fathom.h"

void fm_plan_run_defaults(fm_plan_run_opts *o) {
    memset(o, 0, sizeof *o);
    o->precision = FM_PLAN_FP32;
    o->eval = 1;
    o->grad_accum = 1;
}

void fm_plan_run_free(fm_plan_run *r) {
    if (!r) return;
    free(r->explain);
    r->explain = NULL;
}

/* ---------------- what kind of recipe ---------------- */

static int is_regular(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int fm_plan_is_recipe(const char *model) {
    if (!model || !*model) return 0;
    size_t n = strlen(model);
    if (n > 4 && !strcmp(model + n - 4, ".ini")) return 1;
    struct stat st;
    if (stat(model, &st) == 0) return 0; /* an existing model file or directory */
    char path[PATH_MAX];
    return fm_recipe_resolve(model, path, sizeof path) && is_regular(path);
}

static int gpt_key(void *user, const char *section, const char *key, const char *value) {
    if (!strcmp(section, "model") && !strcmp(key, "type")) *(int *)user = !strcmp(value, "gpt") ? 1 : 2;
    return 1;
}

/* ---------------- layer-list recipes ---------------- */

fm_dtype plan_fathom_dtype(fm_plan_precision p) { return p == FM_PLAN_BF16 ? FM_BF16 : p == FM_PLAN_FP16 ? FM_F16 : FM_F32; }

void plan_fathom_fill(fm_plan_run *out, const plan_step_mem *m, double data, double batch) {
    const size_t *at = m->at_peak_cat;
    out->params = m->params;
    out->peak = (double)m->peak + data - batch;
    out->resident = (double)m->resident + data - batch;
    out->weights = (double)at[FM_MEM_WEIGHTS];
    out->gradients = (double)at[FM_MEM_GRADIENTS];
    out->optimizer = (double)at[FM_MEM_OPTIMIZER];
    out->activations = (double)at[FM_MEM_ACTIVATIONS];
    /* untagged: the step's batch (data: the loader's buffers stand for it, or
     * the GPT's batch itself) and the rest (the loss scaler, norms, copies) */
    double other = (double)at[FM_MEM_OTHER], b = (double)m->batch < other ? (double)m->batch : other;
    out->data = data > 0 ? data : b;
    out->workspace = other - b;
    snprintf(out->peak_at, sizeof out->peak_at, "%s", m->peak_at);
}

static const char *shape_txt(int nd, const int64_t *s, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[N");
    for (int i = 0; i < nd && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, ", %lld", (long long)s[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

static int64_t prod(int nd, const int64_t *s) {
    int64_t p = 1;
    for (int i = 0; i < nd; i++) p *= s[i];
    return p;
}

/* Samples and image size of an idx file (gz or plain) from its header alone. */
static int idx_count(const char *path, int64_t *count, int64_t *h, int64_t *w) {
    gzFile f = gzopen(path, "rb");
    if (!f) return 0;
    unsigned char hd[16];
    int got = gzread(f, hd, sizeof hd);
    gzclose(f);
    if (got < 8 || hd[0] || hd[1]) return 0;
    int ndim = hd[3];
    if (ndim < 1 || got < 4 + 4 * ndim) return 0;
    uint32_t d[3] = {0, 1, 1};
    for (int i = 0; i < ndim && i < 3; i++)
        d[i] = (uint32_t)hd[4 + 4 * i] << 24 | (uint32_t)hd[5 + 4 * i] << 16 | (uint32_t)hd[6 + 4 * i] << 8 | hd[7 + 4 * i];
    *count = d[0];
    if (h) *h = d[1];
    if (w) *w = d[2];
    return 1;
}

/* The idx image file of a split, found as fm_dataset_fashion_mnist finds it. */
static int find_split(const fm_recipe *r, int test, char *img, size_t cap) {
    if (!strcmp(r->dataset, "idx") && !r->data_dir[0]) {
        const char *p = test ? r->test_images : r->train_images;
        if (!p[0]) return 0;
        snprintf(img, cap, "%s", p);
        return 1;
    }
    const char *dir = r->data_dir[0] ? r->data_dir : !strcmp(r->dataset, "mnist") ? "/usr/share/datasets/mnist" : FM_FASHION_MNIST_DIR;
    const char *pre = test ? "t10k" : "train";
    snprintf(img, cap, "%s/%s-images-idx3-ubyte", dir, pre);
    if (is_regular(img)) return 1;
    snprintf(img, cap, "%s/%s-images-idx3-ubyte.gz", dir, pre);
    return is_regular(img);
}

/* Samples held in memory for a split: the whole file (a `limit` only narrows a view of it). */
static int64_t split_samples(const fm_recipe *r, int test, char *note, size_t note_cap) {
    char img[1100];
    int64_t n = 0, h = 0, w = 0;
    if (find_split(r, test, img, sizeof img) && idx_count(img, &n, &h, &w)) return n;
    int64_t def = test ? 10000 : 60000;
    if (strcmp(r->dataset, "idx")) {
        size_t k = strlen(note);
        snprintf(note + k, note_cap - k, "%s%s split not found: %lld samples assumed (the published size)", k ? "; " : "",
                 test ? "test" : "training", (long long)def);
        return def;
    }
    return -1;
}

/* Batch buffers the data loader allocates up front (fm_dataloader_create in
 * src/data/loader.c): one slot without workers, else a ring of 2 per worker,
 * at least 4 (the recipe sets no prefetch depth). */
static int loader_slots(int workers) {
    if (workers <= 0) return 1;
    return 2 * workers < 4 ? 4 : 2 * workers;
}

/* dataset = csv: the tables are read by the trainer's own reader (fm_recipe_dataset: the rows, a
 * header or not, token ids as I64 for an embedding-first recipe, each id checked), since neither the
 * row count nor the dtypes can be told from the file's size; what stays resident is its tensors. */
static fm_status csv_data(const fm_recipe *r, const fm_plan_run_opts *o, int64_t B, double *data, double *slot) {
    size_t d = 0, per_x = 0, per_y = 0;
    for (int test = 0; test <= (o->eval ? 1 : 0); test++) {
        fm_dataset *ds = fm_recipe_dataset(r, test ? FM_SPLIT_TEST : FM_SPLIT_TRAIN, NULL);
        if (!ds) return fm_last_status();
        fm_tensor *x = fm_dataset_x(ds), *y = fm_dataset_y(ds);
        int64_t n = fm_dataset_size(ds);
        d += fm_cpu_block_size(fm_tensor_nbytes(x)) + (y ? fm_cpu_block_size(fm_tensor_nbytes(y)) : 0);
        if (!test && n > 0) {
            per_x = fm_tensor_nbytes(x) / (size_t)n;
            per_y = y ? fm_tensor_nbytes(y) / (size_t)n : 0;
        }
        fm_dataset_release(ds);
    }
    *slot = (double)(fm_cpu_block_size((size_t)B * per_x) + fm_cpu_block_size((size_t)B * per_y));
    *data = (double)d + loader_slots(r->workers) * *slot;
    return FM_OK;
}

/* Bytes on the host outside the step, before the trainer resets its peak: the
 * data sets (u8 idx images become f32 [N, C, H, W], labels i64; the test split
 * too unless --no-eval) and the loader's batch buffers; each an allocator block. */
static fm_status host_data(const fm_recipe *r, const fm_plan_run_opts *o, int64_t B, fm_plan_run *out, double *data,
                           double *slot) {
    if (!strcmp(r->dataset, "csv")) return csv_data(r, o, B, data, slot);
    int64_t n_train = split_samples(r, 0, out->notes, sizeof out->notes);
    int64_t n_test = o->eval ? split_samples(r, 1, out->notes, sizeof out->notes) : 0;
    if (n_train < 0 || n_test < 0)
        return fm_set_error(FM_ERR_IO, "%s: cannot read the %s images' idx header to count the samples", r->path,
                            n_train < 0 ? "training" : "test");
    size_t sample = (size_t)prod(r->input_ndim, r->input_shape);
    size_t d = fm_cpu_block_size((size_t)n_train * sample * 4) + fm_cpu_block_size((size_t)n_train * 8);
    if (o->eval) d += fm_cpu_block_size((size_t)n_test * sample * 4) + fm_cpu_block_size((size_t)n_test * 8);
    *slot = (double)(fm_cpu_block_size((size_t)B * sample * 4) + fm_cpu_block_size((size_t)B * 8));
    *data = (double)d + loader_slots(r->workers) * *slot;
    return FM_OK;
}

/* The trainer's option checks (fm_train): block checkpointing on a net with
 * convolution blocks, else none; precision and accumulation as for any model. */
static fm_status seq_options(const fm_recipe *r, const fm_plan_run_opts *o, int64_t B, plan_step_opts *so) {
    plan_step_defaults(so);
    so->dev = (fm_device){FM_DEV_META, 0};
    so->batch = B;
    so->precision = plan_fathom_dtype(o->precision);
    so->checkpointing = (fm_checkpointing)o->checkpointing;
    so->grad_accum = o->grad_accum > 1 ? o->grad_accum : 1;
    fm_efficiency_opts eo = fm_efficiency_defaults();
    eo.precision = so->precision;
    eo.grad_accum = so->grad_accum;
    eo.loss_scaling = so->precision == FM_F16;
    eo.checkpointing = so->checkpointing == FM_CKPT_BLOCKS && fm_recipe_num_blocks(r) > 0 ? FM_CKPT_NONE : so->checkpointing;
    return fm_efficiency_validate(&eo, false, (int)B);
}

static fm_status plan_sequential(const char *path, const fm_plan_run_opts *o, int explain, fm_plan_run *out) {
    fm_recipe r;
    if (fm_recipe_load(path, &r) != FM_OK) return fm_last_status();
    int64_t B = o->batch > 0 ? o->batch : r.batch_size;
    plan_step_opts so;
    plan_sb log = {0};
    plan_step_mem m;
    double data = 0, slot = 0;
    snprintf(out->path, sizeof out->path, "%s", r.path);
    snprintf(out->name, sizeof out->name, "%s", r.name);
    snprintf(out->trainer, sizeof out->trainer, "sequential");
    out->opts = *o;
    out->batch = B;
    fm_status st = seq_options(&r, o, B, &so);
    if (st == FM_OK) st = host_data(&r, o, B, out, &data, &slot);
    if (explain) so.log = &log;
    if (st == FM_OK) st = plan_step_recipe(&r, &so, &m);
    if (st == FM_OK) {
        char s1[96];
        size_t k = (size_t)snprintf(out->model, sizeof out->model, "%d layers, input %s, %s", r.n_layers,
                                    shape_txt(r.input_ndim, r.input_shape, s1, sizeof s1), fm_optim_kind_name(r.optim.kind));
        if (r.optim.kind == FM_OPTIM_SGD && r.optim.momentum > 0 && k < sizeof out->model)
            snprintf(out->model + k, sizeof out->model - k, " with momentum");
        plan_fathom_fill(out, &m, data, slot);
    }
    if (st == FM_OK && explain) {
        char b1[32], b2[32];
        plan_sb hdr = {0};
        plan_sb_printf(&hdr, "`fathom train %s%s --batch %lld`: on the host %s of data sets and %d loader batch buffers of "
                       "%s; the model and its steps run on the meta device (no data; the CPU allocator's block sizes), "
                       "each kernel with the bytes live after it (without the host data) and the peak so far:\n", r.path,
                       o->eval ? "" : " --no-eval", (long long)B, fm_format_bytes((size_t)(data - loader_slots(r.workers) * slot), b1, sizeof b1),
                       loader_slots(r.workers), fm_format_bytes((size_t)slot, b2, sizeof b2));
        plan_sb_printf(&hdr, "%s", log.buf ? log.buf : "");
        out->explain = plan_sb_take(&hdr);
    }
    free(log.buf);
    fm_recipe_free(&r);
    return st;
}

/* ---------------- entry point and output ---------------- */

/* "1.25 MiB" */
static const char *mib(double bytes, char *buf, int cap) {
    if (bytes < 1024) snprintf(buf, (size_t)cap, "%.0f B", bytes);
    else if (bytes < 1024.0 * 1024) snprintf(buf, (size_t)cap, "%.1f KiB", bytes / 1024);
    else snprintf(buf, (size_t)cap, "%.2f MiB", bytes / (1024.0 * 1024));
    return buf;
}

fm_status fm_plan_run_recipe(const char *recipe, const fm_plan_run_opts *o, int explain, fm_plan_run *out) {
    memset(out, 0, sizeof *out);
    fm_plan_run_opts def;
    if (!o) { fm_plan_run_defaults(&def); o = &def; }
    if (!recipe || !*recipe) return fm_set_error(FM_ERR_INVALID, "plan: no recipe given");
    if (o->batch < 0 || o->grad_accum < 0 || o->checkpointing < 0 || o->checkpointing > 2)
        return fm_set_error(FM_ERR_INVALID, "plan: batch, grad_accum and checkpointing out of range");
    if (o->ranks < 0 || o->ranks > 65536 || o->tensor_parallel < 0 || o->tensor_parallel > 1024 || o->zero < 0 || o->zero > 1)
        return fm_set_error(FM_ERR_INVALID, "plan: --ranks, --tensor-parallel or --zero out of range (ranks 1..65536, "
                            "tensor parallel 1..1024, zero 0 or 1 for a recipe)");
    if (o->precision != FM_PLAN_FP32 && o->precision != FM_PLAN_BF16 && o->precision != FM_PLAN_FP16)
        return fm_set_error(FM_ERR_INVALID, "plan: fathom trains in fp32, bf16 or fp16 (not %s)", fm_plan_precision_name(o->precision));
    char path[PATH_MAX];
    bool builtin = fm_recipe_resolve(recipe, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (builtin)
            return fm_set_error(FM_ERR_IO, "no built-in recipe named '%s' (looked for %s; `fathom recipes` lists them)", recipe, path);
        return fm_set_error(FM_ERR_IO, "cannot open recipe %s: %s", path, strerror(errno));
    }
    int type = 0;
    int rc = ini_parse_file(f, gpt_key, &type);
    fclose(f);
    if (rc > 0) return fm_set_error(FM_ERR_FORMAT, "%s:%d: expected 'key = value', '[section]' or a comment", path, rc);
    if (type != 1 && (o->ranks > 1 || o->tensor_parallel > 1 || o->zero))
        return fm_set_error(FM_ERR_INVALID, "plan: --ranks, --tensor-parallel and --zero are planned for GPT recipes "
                            "([model] type = gpt); a layer-list recipe's rank trains its part of the batch: plan it "
                            "with --batch (the batch / ranks)");
    fm_status st = type == 1 ? plan_fathom_gpt(path, o, explain, out) : plan_sequential(path, o, explain, out);
    if (st) fm_plan_run_free(out);
    return st;
}

char *fm_plan_run_render_text(const fm_plan_run *r) {
    plan_sb sb = {0};
    char b[32];
    plan_sb_printf(&sb, "fathom plan: recipe %s (%s): %lld parameters, %s\n", r->name, r->path, (long long)r->params, r->model);
    plan_sb_printf(&sb, "job: fathom train on the CPU, %s, batch %lld", fm_plan_precision_name(r->opts.precision),
                   (long long)r->batch);
    if (!strcmp(r->trainer, "gpt")) {
        static const char *ck[] = {"none", "blocks", "selective"};
        plan_sb_printf(&sb, ", checkpointing %s, grad-accum %d", ck[r->opts.checkpointing], r->opts.grad_accum > 1 ? r->opts.grad_accum : 1);
        const int T = r->opts.tensor_parallel > 1 ? r->opts.tensor_parallel : 1, N = r->opts.ranks > T ? r->opts.ranks : T;
        if (N > 1)
            plan_sb_printf(&sb, "\none rank of %d (tensor parallel %d x data parallel %d%s): its part of the batch, %lld "
                           "windows (validation: whole batches of %lld)", N, T, N / T, r->opts.zero ? ", ZeRO-1" : "",
                           (long long)(r->batch / (N / T)), (long long)r->batch);
        if (N > 1 && T > 1) plan_sb_printf(&sb, ", its 1/%d of the split parameters", T);
        if (N > 1 && r->opts.zero) plan_sb_printf(&sb, ", its 1/%d of the optimizer state", N / T);
    } else {
        plan_sb_printf(&sb, ", %s", r->opts.eval ? "test set loaded for the final evaluation" : "--no-eval");
        if (r->opts.grad_accum > 1) plan_sb_printf(&sb, ", grad-accum %d", r->opts.grad_accum);
        if (r->opts.checkpointing == 1) plan_sb_printf(&sb, ", checkpointing blocks");
    }
    plan_sb_printf(&sb, "\nMemory at the peak (fathom's CPU allocator, bytes in use):\n");
    struct { const char *n; double v; } rows[] = {
        {"weights", r->weights}, {"gradients", r->gradients}, {"optimizer state", r->optimizer},
        {"activations + backward", r->activations}, {"other (untagged)", r->workspace}, {"data set + batches", r->data},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        plan_sb_printf(&sb, "  %-28s %12s\n", rows[i].n, mib(rows[i].v, b, sizeof b));
    plan_sb_printf(&sb, "  %-28s %12s\n", "= allocated", mib(r->peak, b, sizeof b));
    plan_sb_printf(&sb, "  (before the first step: %s)\n", mib(r->resident, b, sizeof b));
    plan_sb_printf(&sb, "fathom CPU run: peak %s allocated (%.0f bytes; `fathom train --json` reports it as "
                   "memory.peak_allocated), reached at %s\n", mib(r->peak, b, sizeof b), r->peak, r->peak_at);
    if (r->notes[0]) plan_sb_printf(&sb, "Note: %s\n", r->notes);
    return plan_sb_take(&sb);
}

char *fm_plan_run_render_json(const fm_plan_run *r) {
    json_t *j = json_object(), *mem = json_object(), *job = json_object();
    if (!j || !mem || !job) { json_decref(j); json_decref(mem); json_decref(job); fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    static const char *ck[] = {"none", "blocks", "selective"};
    json_object_set_new(j, "recipe", json_string(r->name));
    json_object_set_new(j, "path", json_string(r->path));
    json_object_set_new(j, "trainer", json_string(r->trainer));
    json_object_set_new(j, "model", json_string(r->model));
    json_object_set_new(j, "params", json_integer(r->params));
    json_object_set_new(job, "device", json_string("cpu"));
    json_object_set_new(job, "precision", json_string(fm_plan_precision_name(r->opts.precision)));
    json_object_set_new(job, "batch", json_integer(r->batch));
    json_object_set_new(job, "checkpointing", json_string(ck[r->opts.checkpointing]));
    json_object_set_new(job, "grad_accum", json_integer(r->opts.grad_accum > 1 ? r->opts.grad_accum : 1));
    json_object_set_new(job, "eval", json_boolean(r->opts.eval));
    if (!strcmp(r->trainer, "gpt")) { /* the figures are one rank's */
        const int T = r->opts.tensor_parallel > 1 ? r->opts.tensor_parallel : 1, N = r->opts.ranks > T ? r->opts.ranks : T;
        json_object_set_new(job, "ranks", json_integer(N));
        json_object_set_new(job, "tensor_parallel", json_integer(T));
        json_object_set_new(job, "zero", json_integer(r->opts.zero));
        json_object_set_new(job, "batch_per_rank", json_integer(r->batch / (N / T)));
    }
    json_object_set_new(j, "job", job);
    json_object_set_new(mem, "weights", json_integer((json_int_t)r->weights));
    json_object_set_new(mem, "gradients", json_integer((json_int_t)r->gradients));
    json_object_set_new(mem, "optimizer", json_integer((json_int_t)r->optimizer));
    json_object_set_new(mem, "activations", json_integer((json_int_t)r->activations));
    json_object_set_new(mem, "workspace", json_integer((json_int_t)r->workspace));
    json_object_set_new(mem, "data", json_integer((json_int_t)r->data));
    json_object_set_new(mem, "allocated", json_integer((json_int_t)r->peak));
    json_object_set_new(mem, "resident_before_training", json_integer((json_int_t)r->resident));
    json_object_set_new(j, "memory", mem);
    json_object_set_new(j, "fathom_cpu_peak_bytes", json_integer((json_int_t)r->peak));
    json_object_set_new(j, "peak_at", json_string(r->peak_at));
    if (r->notes[0]) json_object_set_new(j, "notes", json_string(r->notes));
    char *s = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!s) fm_set_error(FM_ERR_OOM, "out of host memory");
    return s;
}

char *fm_plan_run_render_explain(const fm_plan_run *r) {
    plan_sb sb = {0};
    plan_sb_printf(&sb, "%s", r->explain ? r->explain : "(no replay recorded)\n");
    char *text = fm_plan_run_render_text(r);
    if (text) plan_sb_printf(&sb, "\n%s", text);
    free(text);
    return plan_sb_take(&sb);
}
