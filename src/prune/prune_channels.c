/* Structured pruning: whole conv2d output channels and linear output neurons
 * (fathom/prune.h). A group is a producer layer, the batch norm that may follow
 * it, and the one consumer layer that reads its channels through channel-wise
 * layers. Removing channel c drops the producer's row c (weight and bias), the
 * batch norm's entry c, and the consumer's input columns of c (after flatten,
 * the block c*H*W .. (c+1)*H*W - 1). The consumer then never sees the channel,
 * so the result equals the original with those columns zeroed (keep_shape). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prune/prune_internal.h"

typedef struct group {
    int prod, bn, cons; /* layer indices; bn -1 when none */
    int64_t hw;         /* consumer features per channel (H*W after flatten, else 1) */
    int64_t c;          /* producer's output channels */
    double *score;
    bool *drop;
} group;

static bool channelwise(fm_module_kind k) {
    return k == FM_MOD_RELU || k == FM_MOD_GELU || k == FM_MOD_SILU || k == FM_MOD_TANH || k == FM_MOD_SIGMOID ||
           k == FM_MOD_MAXPOOL2D || k == FM_MOD_AVGPOOL2D || k == FM_MOD_DROPOUT;
}

/* The group starting at producer i, or false when its channels cannot be removed. */
static bool find_group(const prune_layer *L, int n, int i, group *g) {
    memset(g, 0, sizeof *g);
    g->prod = i;
    g->bn = -1;
    g->hw = 1;
    for (int j = i + 1; j < n; j++) {
        fm_module_kind k = L[j].kind;
        if (k == FM_MOD_BATCHNORM2D && g->bn < 0) g->bn = j;
        else if (k == FM_MOD_FLATTEN) g->hw = L[j].in_ndim == 4 ? L[j].in[2] * L[j].in[3] : 1;
        else if (k == FM_MOD_LINEAR || k == FM_MOD_CONV2D) { g->cons = j; return true; }
        else if (!channelwise(k)) return false;
    }
    return false; /* the classifier's last layer: its outputs are the classes */
}

static fm_tensor *param_of(fm_module *m, const char *name) {
    fm_named_list ps = {0};
    fm_tensor *t = NULL;
    if (fm_module_state(m, &ps) == FM_OK) {
        int k = fm_named_list_find(&ps, name);
        if (k >= 0) t = ps.items[k].tensor;
    }
    fm_named_list_free(&ps);
    return t; /* borrowed */
}

/* L1 norm of each filter, times the following batch norm's gain |gamma| / sqrt(var + eps). */
static fm_status score_group(const prune_layer *L, group *g) {
    fm_tensor *w = param_of(L[g->prod].mod, "weight");
    if (!w) return fm_set_error(FM_ERR_INVALID, "prune: layer %d has no weight", g->prod);
    g->c = w->shape[0];
    int64_t row = fm_tensor_numel(w) / g->c;
    float *v = malloc((size_t)fm_tensor_numel(w) * sizeof *v);
    g->score = calloc((size_t)g->c, sizeof *g->score);
    g->drop = calloc((size_t)g->c, sizeof *g->drop);
    if (!v || !g->score || !g->drop) { free(v); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
    fm_status st = fm_tensor_copy_to_host(w, v, FM_F32);
    for (int64_t c = 0; st == FM_OK && c < g->c; c++)
        for (int64_t k = 0; k < row; k++) g->score[c] += fabs((double)v[c * row + k]);
    free(v);
    if (st || g->bn < 0) return st;
    fm_tensor *gamma = param_of(L[g->bn].mod, "weight"), *var = param_of(L[g->bn].mod, "running_var");
    double eps = fm_module_get_hparams(L[g->bn].mod).eps;
    for (int64_t c = 0; gamma && var && c < g->c; c++)
        g->score[c] *= fabs(fm_tensor_get(gamma, c)) / sqrt(fm_tensor_get(var, c) + eps);
    return FM_OK;
}

typedef struct ranked { double s; int g; int64_t c; } ranked;
static int cmp_ranked(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    if (x->g != y->g) return x->g - y->g;
    return (x->c > y->c) - (x->c < y->c);
}

/* Marks the channels to drop: the lowest scores, `sparsity` of each group or of all of them
 * (scores over their group's mean), never a group's last channel. */
static fm_status choose(group *gs, int ng, const fm_prune_options *o) {
    int64_t total = 0;
    for (int i = 0; i < ng; i++) total += gs[i].c;
    ranked *r = malloc((size_t)total * sizeof *r);
    int64_t *left = calloc((size_t)ng, sizeof *left);
    if (!r || !left) { free(r); free(left); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
    for (int pass = 0; pass < (o->global ? 1 : ng); pass++) {
        int64_t n = 0;
        for (int i = 0; i < ng; i++) {
            if (!o->global && i != pass) continue;
            double mean = 0;
            for (int64_t c = 0; c < gs[i].c; c++) mean += gs[i].score[c] / (double)gs[i].c;
            for (int64_t c = 0; c < gs[i].c; c++) r[n++] = (ranked){mean > 0 ? gs[i].score[c] / mean : 0, i, c};
            left[i] = gs[i].c;
        }
        qsort(r, (size_t)n, sizeof *r, cmp_ranked);
        int64_t k = (int64_t)llround(o->sparsity * (double)n);
        for (int64_t j = 0; j < n && k > 0; j++) {
            if (left[r[j].g] <= 1) continue;
            gs[r[j].g].drop[r[j].c] = true;
            left[r[j].g]--;
            k--;
        }
    }
    free(r);
    free(left);
    return FM_OK;
}

/* ---------------- the masked original (keep_shape) ---------------- */

/* Zeroes index `c` along dim `dim` of the contiguous f32 tensor t, in blocks of `hw` along that dim. */
static fm_status zero_slice(fm_tensor *t, int dim, int64_t c, int64_t hw) {
    if (!t) return FM_OK;
    if (t->dtype != FM_F32 || !fm_tensor_is_contiguous(t) || !fm_device_eq(t->storage->device, FM_CPU))
        return fm_set_error(FM_ERR_UNSUPPORTED, "prune: the model's weights must be contiguous f32 on the CPU");
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; d++) outer *= t->shape[d];
    for (int d = dim + 1; d < t->ndim; d++) inner *= t->shape[d];
    float *p = fm_tensor_data(t);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t h = 0; h < hw; h++) memset(p + (o * t->shape[dim] + c * hw + h) * inner, 0, (size_t)inner * sizeof *p);
    return FM_OK;
}

static fm_status mask_groups(const prune_layer *L, fm_module *clone, const group *gs, int ng) {
    fm_status st = FM_OK;
    for (int i = 0; st == FM_OK && i < ng; i++) {
        fm_module *p = fm_module_child(clone, gs[i].prod), *q = fm_module_child(clone, gs[i].cons);
        (void)L;
        for (int64_t c = 0; st == FM_OK && c < gs[i].c; c++) {
            if (!gs[i].drop[c]) continue;
            if ((st = zero_slice(param_of(p, "weight"), 0, c, 1)) || (st = zero_slice(param_of(p, "bias"), 0, c, 1))) break;
            st = zero_slice(param_of(q, "weight"), 1, c, gs[i].hw);
        }
    }
    return st;
}

/* ---------------- the shrunk model ---------------- */

/* The positional (non key=value) arguments of a layer spec, the kind excluded. */
static int n_positional(const char *spec) {
    char buf[192];
    int n = 0, i = 0;
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *t = strtok(buf, " \t"); t; t = strtok(NULL, " \t"), i++) n += i > 0 && !strchr(t, '=');
    return n;
}

/* spec with positional argument `which` (0 the first, -1 the last) set to v, or, with key,
 * its key=value option set to v when present. */
static void respec(const char *spec, int which, const char *key, int64_t v, char *out, size_t n) {
    char buf[192];
    snprintf(buf, sizeof buf, "%s", spec);
    int npos = n_positional(spec), ipos = 0, i = 0;
    int target = key ? -2 : which < 0 ? npos - 1 : which;
    size_t len = 0, kl = key ? strlen(key) : 0;
    out[0] = 0;
    for (char *t = strtok(buf, " \t"); t && len < n; t = strtok(NULL, " \t"), i++) {
        char num[64];
        bool pos = i > 0 && !strchr(t, '=');
        if (pos && ipos++ == target) { snprintf(num, sizeof num, "%lld", (long long)v); t = num; }
        else if (key && !strncmp(t, key, kl) && t[kl] == '=') { snprintf(num, sizeof num, "%s=%lld", key, (long long)v); t = num; }
        len += (size_t)snprintf(out + len, n - len, "%s%s", i ? " " : "", t);
    }
}

static int64_t kept(const group *g) {
    int64_t k = 0;
    for (int64_t c = 0; c < g->c; c++) k += !g->drop[c];
    return k;
}

/* The recipe text with the producers' and consumers' layer lines rewritten. */
static char *shrunk_text(const fm_recipe *r, const group *gs, int ng) {
    char spec[FM_RECIPE_MAX_LAYERS][192];
    bool changed[FM_RECIPE_MAX_LAYERS] = {0};
    for (int i = 0; i < r->n_layers; i++) snprintf(spec[i], sizeof spec[i], "%s", r->layers[i].spec);
    for (int i = 0; i < ng; i++) {
        int p = gs[i].prod, q = gs[i].cons;
        char tmp[192];
        int64_t k = kept(&gs[i]);
        respec(spec[p], strncmp(spec[p], "conv2d", 6) ? -1 : 0, NULL, k, tmp, sizeof tmp);
        memcpy(spec[p], tmp, sizeof tmp);
        /* an explicit input size on the consumer ("linear IN OUT", "conv2d ... in=C") follows */
        if (!strncmp(spec[q], "linear", 6) && n_positional(spec[q]) == 2) respec(spec[q], 0, NULL, k * gs[i].hw, tmp, sizeof tmp);
        else respec(spec[q], 0, "in", k, tmp, sizeof tmp);
        memcpy(spec[q], tmp, sizeof tmp);
        changed[p] = changed[q] = true;
    }
    size_t cap = strlen(r->text) + (size_t)r->n_layers * 420 + 64, len = 0;
    char *out = malloc(cap);
    if (!out) { fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    int line = 0;
    for (const char *s = r->text; *s;) {
        const char *e = strchr(s, '\n');
        size_t ll = e ? (size_t)(e - s) : strlen(s);
        line++;
        int li = -1;
        for (int i = 0; i < r->n_layers; i++)
            if (changed[i] && r->layers[i].line == line) li = i;
        if (li >= 0) len += (size_t)snprintf(out + len, cap - len, "layer = %-28s ; pruned: was %s\n", spec[li], r->layers[li].spec);
        else len += (size_t)snprintf(out + len, cap - len, "%.*s\n", (int)ll, s);
        s += ll + (e != NULL);
    }
    return out;
}

/* index_select along dim 0 (and dim 1, for the consumer) by the kept channels */
static fm_tensor *take(fm_tensor *t, int dim, const group *g, int64_t hw) {
    int64_t n = kept(g) * hw, *idx = malloc((size_t)(n ? n : 1) * sizeof *idx), j = 0;
    if (!idx) { fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    for (int64_t c = 0; c < g->c; c++)
        for (int64_t h = 0; !g->drop[c] && h < hw; h++) idx[j++] = c * hw + h;
    fm_tensor *it = fm_tensor_from_data(idx, 1, &n, FM_I64);
    free(idx);
    fm_tensor *o = it ? fm_index_select(t, dim, it) : NULL;
    fm_tensor_release(it);
    return o;
}

/* Fills the shrunk model's state from the original's, entry by entry. */
static fm_status fill_shrunk(fm_module *m, fm_module *out, const group *gs, int ng) {
    fm_named_list a = {0}, b = {0};
    fm_status st = fm_module_state(m, &a);
    if (st == FM_OK) st = fm_module_state(out, &b);
    for (int i = 0; st == FM_OK && i < b.n; i++) {
        const char *name = b.items[i].name, *dot = strchr(name, '.');
        int li = atoi(name), k = fm_named_list_find(&a, name);
        if (k < 0 || !dot) { st = fm_set_error(FM_ERR_INVALID, "prune: '%s' is missing", name); break; }
        fm_tensor *t = fm_tensor_retain(a.items[k].tensor);
        bool counter = !strcmp(dot + 1, "num_batches_tracked");
        for (int g = 0; t && g < ng; g++) {
            fm_tensor *u = NULL;
            if ((gs[g].prod == li || gs[g].bn == li) && !counter) u = take(t, 0, &gs[g], 1);
            else if (gs[g].cons == li && !strcmp(dot + 1, "weight")) u = take(t, 1, &gs[g], gs[g].hw);
            else continue;
            fm_tensor_release(t);
            t = u;
        }
        st = t ? fm_copy_(b.items[i].tensor, t) : fm_last_status();
        fm_tensor_release(t);
    }
    fm_named_list_free(&a);
    fm_named_list_free(&b);
    return st;
}

fm_status prune_channels(const fm_recipe *r, fm_module *m, const prune_layer *L, int n, const fm_prune_options *o,
                         fm_recipe *out_recipe, fm_module **out_model, fm_prune_report *rep) {
    group gs[FM_PRUNE_MAX_LAYERS];
    int ng = 0;
    fm_status st = FM_OK;
    for (int i = 0; i < n && ng < FM_PRUNE_MAX_LAYERS; i++)
        if ((L[i].kind == FM_MOD_LINEAR || L[i].kind == FM_MOD_CONV2D) && find_group(L, n, i, &gs[ng])) ng++;
    if (ng == 0) st = fm_set_error(FM_ERR_INVALID, "prune: no layer's channels can be removed (a layer needs a next "
                                   "linear or conv2d layer reached through batchnorm2d, activations, pooling, dropout or flatten)");
    for (int i = 0; st == FM_OK && i < ng; i++) st = score_group(L, &gs[i]);
    if (st == FM_OK) st = choose(gs, ng, o);
    char *text = NULL;
    if (st == FM_OK && o->keep_shape) {
        st = fm_recipe_parse(r->text, r->path, out_recipe);
        if (st == FM_OK) st = (*out_model = prune_clone(out_recipe, m)) ? mask_groups(L, *out_model, gs, ng) : fm_last_status();
    } else if (st == FM_OK) {
        text = shrunk_text(r, gs, ng);
        st = text ? fm_recipe_parse(text, r->path, out_recipe) : fm_last_status();
        fm_rng rng;
        fm_rng_init(&rng, 0);
        if (st == FM_OK && !(*out_model = fm_recipe_build_model(out_recipe, &rng))) st = fm_last_status();
        if (st == FM_OK) st = fill_shrunk(m, *out_model, gs, ng);
        if (st == FM_OK) fm_module_train(*out_model, false);
    }
    for (int i = 0; st == FM_OK && i < ng; i++) {
        fm_prune_layer_report *lr = &rep->layers[rep->n_layers++];
        prune_layer_name(L, gs[i].prod, lr->name, sizeof lr->name);
        lr->before = gs[i].c;
        lr->after = kept(&gs[i]);
    }
    free(text);
    for (int i = 0; i < ng; i++) { free(gs[i].score); free(gs[i].drop); }
    return st;
}
