/* Graphs as models for the commands: making one from any model directory,
 * and running one as `fathom predict`, `eval` and `generate` run a trained
 * model (the classifier's recipe and the GPT's context size travel in the
 * graph's metadata; the GPT's tokenizer.txt is a file of the graph directory). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fathom/autograd.h"
#include "fathom/gpt.h"
#include "fathom/recipe.h"
#include "graph/graph_internal.h"

static bool file_exists(const char *dir, const char *name) {
    char p[4096];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The first layer that runs (through nested sequentials). */
static fm_module *first_leaf(fm_module *m) {
    while (m && fm_module_get_kind(m) == FM_MOD_SEQUENTIAL) m = fm_module_num_children(m) ? fm_module_child(m, 0) : NULL;
    return m;
}

/* An example input for tracing: normal floats, or for a model that starts with an
 * embedding (its input is token ids) i64 ids spread over [0, num), so the graph's and the
 * exported file's input is [batch, ...] int64. */
static fm_tensor *example_input(fm_module *m, const fm_recipe *r, fm_rng *rng) {
    int64_t shape[FM_MAX_DIMS] = {2};
    for (int i = 0; i < r->input_ndim; i++) shape[i + 1] = r->input_shape[i];
    fm_module *first = first_leaf(m);
    if (!first || fm_module_get_kind(first) != FM_MOD_EMBEDDING)
        return fm_tensor_randn(r->input_ndim + 1, shape, FM_F32, rng);
    const int64_t num = fm_module_get_hparams(first).a;
    fm_tensor *x = fm_tensor_empty(r->input_ndim + 1, shape, FM_I64, FM_CPU);
    for (int64_t i = 0; x && i < fm_tensor_numel(x); i++)
        ((int64_t *)fm_tensor_data(x))[i] = (7 * i + 3) % (num > 0 ? num : 1);
    return x;
}

static fm_graph *from_recipe_model(const char *dir) {
    fm_recipe r;
    fm_module *m = NULL;
    if (fm_model_load(dir, &r, &m) != FM_OK) return NULL;
    fm_rng rng;
    fm_rng_init(&rng, 1);
    fm_tensor *x = example_input(m, &r, &rng);
    fm_graph *g = x ? fm_graph_trace_module(m, x) : NULL;
    if (g && (fm_graph_set_meta(g, "model_kind", "classifier") || fm_graph_set_meta(g, "recipe", r.text ? r.text : "") ||
              fm_graph_set_meta(g, "dataset", r.dataset))) {
        fm_graph_free(g);
        g = NULL;
    }
    fm_tensor_release(x);
    fm_module_free(m);
    fm_recipe_free(&r);
    return g;
}

static fm_graph *from_gpt_dir(const char *dir) {
    fm_gpt *m = fm_gpt_load_dir(dir, NULL);
    fm_graph *g = m ? fm_graph_from_gpt(m) : NULL;
    fm_gpt_free(m);
    char p[4096];
    snprintf(p, sizeof p, "%s/tokenizer.txt", dir);
    if (g && fm_graph_attach_file(g, "tokenizer.txt", p)) { fm_graph_free(g); g = NULL; }
    return g;
}

fm_graph *fm_graph_from_model_dir(const char *dir) {
    struct stat sb;
    if (!dir || stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fm_set_error(FM_ERR_IO, "%s: not a directory", dir ? dir : "(null)");
        return NULL;
    }
    if (fm_graph_dir_is_graph(dir)) return fm_graph_load(dir);
    if (file_exists(dir, "config.json") && file_exists(dir, "model.safetensors")) return from_gpt_dir(dir);
    if (file_exists(dir, "model.safetensors")) return from_recipe_model(dir);
    fm_set_error(FM_ERR_INVALID, "%s is not a model directory: expected a trained model (`fathom train` writes model.safetensors) "
                 "or a graph directory (graph.json)", dir);
    return NULL;
}

fm_status fm_graph_classifier_recipe(const fm_graph *g, fm_recipe *r) {
    const char *kind = fm_graph_get_meta(g, "model_kind"), *text = fm_graph_get_meta(g, "recipe");
    if (!kind || strcmp(kind, "classifier") || !text)
        return fm_set_error(FM_ERR_INVALID, "this graph is not a classifier traced from a recipe model (model_kind '%s')", kind ? kind : "none");
    fm_status st = fm_recipe_parse(text, "<graph recipe>", r);
    if (st != FM_OK) fm_error_prefix("the graph's embedded recipe");
    return st;
}

fm_tensor *fm_graph_run1(const fm_graph *g, fm_tensor *x) {
    if (!g || fm_graph_num_inputs(g) != 1) {
        fm_set_error(FM_ERR_INVALID, "graph run: this graph takes %d inputs, not one", g ? fm_graph_num_inputs(g) : 0);
        return NULL;
    }
    fm_tensor **out = calloc((size_t)g->n_outputs, sizeof *out);
    if (!out) { fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    fm_tensor *y = NULL;
    if (fm_graph_run(g, &x, out) == FM_OK) {
        y = out[0];
        for (int i = 1; i < g->n_outputs; i++) fm_tensor_release(out[i]);
    }
    free(out);
    return y;
}

fm_status fm_graph_evaluate(const fm_graph *g, fm_dataset *d, const fm_transforms *tf, int64_t batch_size, double *accuracy,
                            double *loss, FILE *log) {
    if (!fm_dataset_y(d)) return fm_set_error(FM_ERR_INVALID, "evaluate: the data set has no labels");
    fm_loader_options lo;
    fm_loader_options_init(&lo);
    lo.batch_size = batch_size > 0 ? batch_size : 1000;
    if (tf) { /* normalization only, as fm_evaluate */
        lo.transforms.normalize_channels = tf->normalize_channels;
        memcpy(lo.transforms.mean, tf->mean, sizeof lo.transforms.mean);
        memcpy(lo.transforms.std, tf->std, sizeof lo.transforms.std);
    }
    fm_dataloader *l = fm_dataloader_create(d, &lo);
    if (!l) return fm_last_status();
    fm_status st = FM_OK;
    int64_t correct = 0, total = 0;
    double loss_sum = 0;
    if (log) fprintf(log, "eval: %lld batches\n", (long long)fm_dataloader_num_batches(l));
    for (;;) {
        fm_batch b;
        if ((st = fm_dataloader_next(l, &b)) != FM_OK || !b.x) break;
        /* the batch goes to the graph's device; the predictions come back to the host */
        fm_tensor *x = fm_tensor_to(b.x, g->device), *y = x ? fm_tensor_to(b.y, g->device) : NULL;
        fm_tensor *logits = y ? fm_graph_run1(g, x) : NULL;
        fm_tensor *ls = logits ? fm_cross_entropy(logits, y, -100, 0.0, FM_REDUCE_SUM) : NULL;
        fm_tensor *pd = logits ? fm_argmax(logits, 1, false) : NULL, *pred = pd ? fm_tensor_to(pd, FM_CPU) : NULL;
        if (!ls || !pred) { fm_tensor_release_n(6, x, y, logits, ls, pd, pred); st = fm_last_status(); break; }
        loss_sum += fm_tensor_item(ls);
        for (int64_t i = 0; i < b.size; i++) correct += (int64_t)fm_tensor_get(pred, i) == (int64_t)fm_tensor_get(b.y, i);
        total += b.size;
        fm_tensor_release_n(6, x, y, logits, ls, pd, pred);
    }
    fm_dataloader_free(l);
    if (st == FM_OK) {
        if (accuracy) *accuracy = total ? (double)correct / (double)total : 0;
        if (loss) *loss = total ? loss_sum / (double)total : 0;
    }
    return st;
}

fm_tensor *fm_graph_gpt_forward(const fm_graph *g, fm_tensor *tokens) {
    const char *kind = fm_graph_get_meta(g, "model_kind");
    const int n_io = fm_graph_num_inputs(g);
    if (!kind || strcmp(kind, "gpt") || n_io < 1 || n_io != fm_graph_num_outputs(g)) {
        fm_set_error(FM_ERR_INVALID, "this graph is not a GPT graph (model_kind '%s')", kind ? kind : "none");
        return NULL;
    }
    if (!tokens || tokens->ndim != 2) {
        fm_set_error(FM_ERR_INVALID, "GPT graph: tokens must be [batch, seq]");
        return NULL;
    }
    fm_tensor **in = calloc((size_t)n_io, sizeof *in), **res = calloc((size_t)n_io, sizeof *res);
    fm_status st = in && res ? FM_OK : fm_set_error(FM_ERR_OOM, "out of host memory");
    for (int i = 1; st == FM_OK && i < n_io; i++) { /* empty caches [B, KV, 0, D] */
        fm_graph_io io;
        fm_graph_input_info(g, i, &io);
        in[i] = fm_tensor_zeros(4, (int64_t[]){tokens->shape[0], io.shape[1], 0, io.shape[3]}, io.dtype, fm_graph_device(g));
        if (!in[i]) st = fm_last_status();
    }
    if (st == FM_OK) in[0] = fm_tensor_to(tokens, fm_graph_device(g));
    if (st == FM_OK && !in[0]) st = fm_last_status();
    if (st == FM_OK) st = fm_graph_run(g, in, res);
    fm_tensor *logits = st == FM_OK ? res[0] : NULL;
    for (int i = 0; i < n_io; i++) {
        if (in) fm_tensor_release(in[i]);
        if (res && i) fm_tensor_release(res[i]);
    }
    free(in);
    free(res);
    return logits;
}

/* The last position's logits of [1, T, V] into lg. */
static fm_status last_row(const fm_tensor *logits, float *lg) {
    const int64_t T = logits->shape[1], V = logits->shape[2];
    for (int64_t j = 0; j < V; j++) lg[j] = (float)fm_tensor_get(logits, (T - 1) * V + j);
    return FM_OK;
}

fm_status fm_graph_generate(const fm_graph *g, const int32_t *prompt, int n_prompt, int n_new, const fm_gpt_sample_params *p,
                            int32_t *out, int *out_n, bool *hit_limit, fm_gpt_token_fn cb, void *ctx) {
    return fm_graph_generate_ex(g, prompt, n_prompt, n_new, p, FM_F32, out, out_n, hit_limit, cb, ctx);
}

fm_status fm_graph_generate_ex(const fm_graph *g, const int32_t *prompt, int n_prompt, int n_new, const fm_gpt_sample_params *p,
                               fm_dtype kv_dtype, int32_t *out, int *out_n, bool *hit_limit, fm_gpt_token_fn cb, void *ctx) {
    if (out_n) *out_n = 0;
    if (hit_limit) *hit_limit = false;
    const char *kind = fm_graph_get_meta(g, "model_kind"), *bs = fm_graph_get_meta(g, "block_size"), *vs = fm_graph_get_meta(g, "vocab_size");
    if (!kind || strcmp(kind, "gpt") || !bs || !vs) return fm_set_error(FM_ERR_INVALID, "generate: this graph is not a GPT graph (model_kind '%s')", kind ? kind : "none");
    const int ctx_len = atoi(bs), V = atoi(vs), n_io = fm_graph_num_inputs(g);
    if (n_prompt < 1 || n_prompt > ctx_len) return fm_set_error(FM_ERR_INVALID, "generate: the prompt has %d tokens; the context holds 1 to %d", n_prompt, ctx_len);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V) return fm_set_error(FM_ERR_INVALID, "generate: unknown token id %d at prompt position %d (vocab size %d)", prompt[i], i, V);
    if (n_new < 0 || n_io < 1 || n_io != fm_graph_num_outputs(g)) return fm_set_error(FM_ERR_INVALID, "generate: bad token count or graph inputs");
    fm_tensor **in = calloc((size_t)n_io, sizeof *in), **res = calloc((size_t)n_io, sizeof *res);
    float *lg = malloc(sizeof(float) * (size_t)V);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)n_prompt);
    fm_status st = in && res && lg && ids ? FM_OK : fm_set_error(FM_ERR_OOM, "out of host memory");
    for (int i = 1; st == FM_OK && i < n_io; i++) { /* empty caches [1, KV, 0, D] */
        fm_graph_io io;
        fm_graph_input_info(g, i, &io);
        in[i] = fm_tensor_zeros(4, (int64_t[]){1, io.shape[1], 0, io.shape[3]}, io.dtype, fm_graph_device(g));
        if (!in[i]) st = fm_last_status();
    }
    for (int i = 0; st == FM_OK && i < n_prompt; i++) ids[i] = prompt[i];
    if (st == FM_OK && !(in[0] = fm_tensor_from_data(ids, 2, (int64_t[]){1, n_prompt}, FM_I64))) st = fm_last_status();
    int len = n_prompt, made = 0;
    /* each step appends to the caches in place (they get room for the whole run) */
    const fm_graph_run_options ro = {.kv_append = true, .kv_capacity = n_prompt + n_new < ctx_len ? n_prompt + n_new : ctx_len, .kv_dtype = kv_dtype};
    while (st == FM_OK && made < n_new) {
        if (len >= ctx_len) { if (hit_limit) *hit_limit = true; break; }
        if ((st = fm_graph_run_ex(g, in, res, &ro)) != FM_OK) break;
        fm_tensor *h = fm_tensor_to(res[0], FM_CPU);
        st = h ? last_row(h, lg) : fm_last_status();
        fm_tensor_release(h);
        for (int i = 0; i < n_io; i++) { /* the presents are the next step's pasts */
            fm_tensor_release(in[i]);
            in[i] = i ? res[i] : NULL;
            if (!i) fm_tensor_release(res[0]);
            res[i] = NULL;
        }
        if (st != FM_OK) break;
        int tok = fm_gpt_sample(lg, V, p, (uint64_t)made);
        if (tok < 0) { st = fm_set_error(FM_ERR_OOM, "generate: out of memory while sampling"); break; }
        if (out) out[made] = tok;
        made++;
        len++;
        int64_t t64 = tok;
        if (!(in[0] = fm_tensor_from_data(&t64, 2, (int64_t[]){1, 1}, FM_I64))) { st = fm_last_status(); break; }
        if (cb && cb(tok, ctx)) break;
    }
    if (out_n) *out_n = made;
    for (int i = 0; in && i < n_io; i++) fm_tensor_release(in[i]);
    free(in);
    free(res);
    free(lg);
    free(ids);
    return st;
}
