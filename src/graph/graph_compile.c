/* `fathom compile`'s library side: the passes in order, each one's effect, the
 * memory plan, and a final check that the compiled graph computes what the
 * input graph computes.
 *
 * Memory planning. At the planning sizes (the dim hints, or the batch asked
 * for) every intermediate value gets its byte size and lifetime (from the node
 * that makes it to its last reader; graph outputs live to the end). Offsets in
 * one arena are assigned greedily, largest first, each at the lowest offset
 * that overlaps no placed value alive at the same time. Reported: the sum of
 * all intermediates (no reuse: a graph that keeps everything), the peak of
 * live bytes (what freeing after the last reader reaches, as fm_graph_run
 * does, before allocator rounding), and the planned arena (>= the live peak;
 * the gap is fragmentation). The runner places its intermediates in such an
 * arena, planned at the run's sizes (graph_arena.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph/graph_rewrite.h"

typedef fm_graph *(*pass_fn)(const fm_graph *g, char *note, size_t n);
static const struct { const char *name; pass_fn fn; } k_passes[] = {
    {"dce", g_pass_dce},
    {"fold", g_pass_fold},
    {"cse", g_pass_cse},
    {"fold-reshape", g_pass_fold_reshape},
    {"matmul-to-linear", g_pass_matmul_to_linear},
    {"fold-pad-conv", g_pass_fold_pad_conv},
    {"fuse-conv-bn", g_pass_fuse_conv_bn},
    {"fuse-add-layer-norm", g_pass_fuse_add_layer_norm},
    {"fuse-bias-gelu", g_pass_fuse_bias_gelu},
    {"fuse-silu", g_pass_fuse_silu},
    {"fuse-conv-act", g_pass_fuse_conv_act},
    {"fuse-linear-act", g_pass_fuse_linear_act},
    {"fuse-elementwise", g_pass_fuse_elementwise},
    {"fuse-rope", g_pass_fuse_rope},
    {"fuse-attention", g_pass_fuse_attention},
    {"fuse-masked-attention", g_pass_fuse_masked_attention},
    {"dce", g_pass_dce},
};
#define N_PASSES ((int)(sizeof k_passes / sizeof k_passes[0]))
_Static_assert(N_PASSES <= (int)(sizeof ((fm_compile_report *)0)->passes / sizeof ((fm_compile_report *)0)->passes[0]),
               "the report has a row per pass");

/* The names of the first n passes, joined by sep, into buf. */
static const char *pass_names(char *buf, size_t len, int n, const char *sep) {
    buf[0] = 0;
    for (int i = 0; i < n; i++) snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", i ? sep : "", k_passes[i].name);
    return buf;
}

fm_graph *fm_graph_pass(const fm_graph *g, const char *name, char *note, size_t n) {
    if (!g || !name) { fm_set_error(FM_ERR_INVALID, "graph pass: NULL graph or name"); return NULL; }
    if (!g->validated) { fm_set_error(FM_ERR_STATE, "graph pass: the graph is not validated"); return NULL; }
    char dummy[8];
    if (!note) { note = dummy; n = sizeof dummy; }
    for (int i = 0; i < N_PASSES; i++)
        if (!strcmp(k_passes[i].name, name)) return k_passes[i].fn(g, note, n);
    char known[512];
    /* the last is a second dce */
    fm_set_error(FM_ERR_INVALID, "graph pass: unknown pass '%s' (%s)", name, pass_names(known, sizeof known, N_PASSES - 1, ", "));
    return NULL;
}

static int by_size(const void *a, const void *b) {
    const g_span *x = a, *y = b;
    return x->size < y->size ? 1 : x->size > y->size ? -1 : x->first - y->first;
}

int g_plan_spans(const fm_graph *g, const int64_t *vals, bool with_outputs, g_span *sp, int64_t *all_bytes) {
    const size_t nv = (size_t)g->n_values + 1;
    gtype *t = calloc(nv, sizeof *t);
    int *root = malloc(nv * sizeof *root), *last = malloc(nv * sizeof *last);
    bool *held = calloc(nv, sizeof *held);
    fm_status st = t && root && last && held ? g_infer_types(g, vals, t) : fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    int n = 0;
    for (int v = 0; st == FM_OK && v < g->n_values; v++) {
        const gvalue *val = &g->values[v];
        root[v] = v;
        last[v] = val->is_output ? g->n_nodes : val->last_use < 0 ? val->producer : val->last_use;
        held[v] = val->is_output;
    }
    for (int i = 0; st == FM_OK && i < g->n_nodes; i++) { /* a view's memory is its input's (values in node order) */
        const gnode *nd = &g->nodes[i];
        if (!g_op_is_view(nd->op) || nd->n_in < 1 || nd->in[0] < 0) continue;
        const int x = nd->in[0], v = nd->out[0];
        root[v] = g->values[x].kind == GV_NODE ? root[x] : -1; /* -1: a view of an input or a constant */
        if (root[v] < 0) continue;
        if (last[v] > last[root[v]]) last[root[v]] = last[v];
        held[root[v]] |= held[v];
    }
    for (int v = 0; st == FM_OK && v < g->n_values; v++) {
        const gvalue *val = &g->values[v];
        int64_t bytes = (int64_t)fm_dtype_size(t[v].dt);
        for (int d = 0; d < t[v].ndim; d++) bytes *= t[v].d[d];
        if (all_bytes) all_bytes[v] = bytes;
        if (val->kind != GV_NODE || root[v] != v || (held[v] && !with_outputs)) continue;
        sp[n++] = (g_span){(bytes + 63) / 64 * 64, 0, bytes, val->producer, last[v], v, held[v]};
    }
    free(t);
    free(root);
    free(last);
    free(held);
    return st == FM_OK ? n : -1;
}

/* Placed values that share a node's run with the one being placed, by offset:
 * the lowest offset clear of them all is found in one sweep. */
static int by_off(const void *a, const void *b) {
    const g_span *x = *(const g_span *const *)a, *y = *(const g_span *const *)b;
    return x->off < y->off ? -1 : x->off > y->off;
}

int64_t g_plan_place(g_span *sp, int n) {
    qsort(sp, (size_t)n, sizeof *sp, by_size);
    const g_span **near = malloc(((size_t)n + 1) * sizeof *near);
    if (!near) { fm_set_error(FM_ERR_OOM, "graph: out of host memory"); return -1; }
    int64_t arena = 0;
    for (int k = 0; k < n; k++) {
        int m = 0;
        for (int j = 0; j < k; j++)
            if (sp[j].first <= sp[k].last && sp[k].first <= sp[j].last) near[m++] = &sp[j];
        qsort(near, (size_t)m, sizeof *near, by_off);
        int64_t off = 0;
        for (int j = 0; j < m && near[j]->off < off + sp[k].size; j++)
            if (near[j]->off + near[j]->size > off) off = near[j]->off + near[j]->size;
        sp[k].off = off;
        if (off + sp[k].size > arena) arena = off + sp[k].size;
    }
    free(near);
    return arena;
}

fm_status g_plan_memory_at(const fm_graph *g, const int64_t *vals, fm_memory_plan *out) {
    memset(out, 0, sizeof *out);
    g_span *sp = calloc((size_t)g->n_values + 1, sizeof *sp);
    if (!sp) return fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    int n = g_plan_spans(g, vals, true, sp, NULL);
    for (int k = 0; k < n; k++) out->naive_bytes += (size_t)sp[k].size;
    for (int i = 0; i < g->n_nodes; i++) { /* live bytes while node i runs */
        size_t live = 0;
        for (int k = 0; k < n; k++) live += sp[k].first <= i && i <= sp[k].last ? (size_t)sp[k].size : 0;
        if (live > out->live_peak_bytes) out->live_peak_bytes = live;
    }
    for (int k = 0; k < n; k++) out->output_bytes += sp[k].out ? (size_t)sp[k].bytes : 0;
    int64_t arena = n >= 0 ? g_plan_place(sp, n) : -1;
    int m = arena >= 0 ? g_plan_spans(g, vals, false, sp, NULL) : -1; /* the runner's block: intermediates only */
    int64_t block = m >= 0 ? g_plan_place(sp, m) : -1;
    free(sp);
    if (arena < 0 || block < 0) return fm_last_status();
    out->planned_bytes = (size_t)arena;
    out->run_arena_bytes = (size_t)block;
    out->n_values = n;
    /* The block is held for the whole run, so outputs made along the way add to all of it:
     * a graph whose outputs pile up (a GPT's present caches) would peak higher with it.
     * The runner takes it when that costs at most 1/8 of the live peak, or 1 MiB. */
    const size_t slack = out->live_peak_bytes / 8 > ((size_t)1 << 20) ? out->live_peak_bytes / 8 : (size_t)1 << 20;
    out->run_uses_arena = block > 0 && out->run_arena_bytes + out->output_bytes <= out->live_peak_bytes + slack;
    int sb = g_find_sym(g, "batch");
    out->batch = sb >= 0 ? vals[sb] : 0;
    return FM_OK;
}

fm_status fm_graph_plan_memory(const fm_graph *g, int64_t batch, fm_memory_plan *out) {
    if (!g || !out || !g->validated) return fm_set_error(FM_ERR_INVALID, "memory plan: needs a validated graph");
    int64_t vals[G_MAX_SYMS];
    for (int s = 0; s < g->n_syms; s++) vals[s] = batch > 0 && !strcmp(g->syms[s].name, "batch") ? batch : g->syms[s].hint;
    return g_plan_memory_at(g, vals, out);
}

/* Random inputs at the dim hints: floats from N(0, 1), integers 0. */
static fm_status sample_inputs(const fm_graph *g, fm_tensor **in) {
    fm_rng r;
    fm_rng_init(&r, 12345);
    for (int i = 0; i < g->n_inputs; i++) {
        const gvalue *v = &g->values[g->inputs[i]];
        int64_t sh[FM_MAX_DIMS];
        for (int d = 0; d < v->t.ndim; d++) sh[d] = v->sym[d] >= 0 ? g->syms[v->sym[d]].hint : v->t.d[d];
        fm_tensor *x = fm_tensor_randn(v->t.ndim, sh, FM_F32, &r);
        in[i] = !x ? NULL : fm_dtype_is_float(v->t.dt) ? fm_to_dtype(x, v->t.dt) : fm_tensor_zeros(v->t.ndim, sh, v->t.dt, FM_CPU);
        fm_tensor_release(x);
        if (!in[i]) return fm_last_status();
    }
    return FM_OK;
}

fm_status fm_graph_compare(const fm_graph *a, const fm_graph *b, double *max_rel) {
    int n_in = a->n_inputs, n_out = a->n_outputs;
    if (n_in != b->n_inputs || n_out != b->n_outputs) return fm_set_error(FM_ERR_INVALID, "compare: the graphs' inputs or outputs differ");
    fm_tensor **in = calloc((size_t)n_in + 1, sizeof *in), **oa = calloc((size_t)n_out, sizeof *oa), **ob = calloc((size_t)n_out, sizeof *ob);
    fm_status st = in && oa && ob ? sample_inputs(a, in) : fm_set_error(FM_ERR_OOM, "graph: out of host memory");
    if (st == FM_OK) st = fm_graph_run(a, in, oa);
    if (st == FM_OK) st = fm_graph_run(b, in, ob);
    double worst = 0;
    for (int j = 0; st == FM_OK && j < n_out; j++) {
        fm_tensor *x = oa[j], *y = ob[j];
        if (x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim)) { worst = 1e300; break; }
        double scale = 1e-30, diff = 0;
        for (int64_t i = 0; i < fm_tensor_numel(x); i++) {
            double p = fm_tensor_get(x, i), q = fm_tensor_get(y, i), d = p - q;
            scale = fmax(scale, fabs(p));
            if (d < 0) d = -d;
            if (!(d <= diff)) diff = d; /* NaN counts as the worst */
        }
        worst = fmax(worst, diff / scale);
    }
    for (int i = 0; in && i < n_in; i++) fm_tensor_release(in[i]);
    for (int j = 0; oa && ob && j < n_out; j++) fm_tensor_release_n(2, oa[j], ob[j]);
    free(in);
    free(oa);
    free(ob);
    if (max_rel) *max_rel = worst;
    return st;
}

fm_graph *fm_graph_compile(const fm_graph *g, fm_compile_report *rep) {
    if (!g || !rep || !g->validated) { fm_set_error(FM_ERR_INVALID, "compile: needs a validated graph and a report"); return NULL; }
    memset(rep, 0, sizeof *rep);
    fm_graph *cur = NULL;
    for (int i = 0; i < N_PASSES; i++) {
        const fm_graph *in = cur ? cur : g;
        fm_compile_pass_report *p = &rep->passes[rep->n_passes++];
        snprintf(p->name, sizeof p->name, "%s", k_passes[i].name);
        p->nodes_before = fm_graph_num_nodes(in);
        p->consts_before = fm_graph_num_consts(in);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fm_graph *next = k_passes[i].fn(in, p->note, sizeof p->note);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (!next) { fm_error_prefix("compile pass %s", k_passes[i].name); fm_graph_free(cur); return NULL; }
        p->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        p->nodes_after = fm_graph_num_nodes(next);
        p->consts_after = fm_graph_num_consts(next);
        fm_graph_free(cur);
        cur = next;
    }
    if (fm_graph_compare(g, cur, &rep->max_rel_diff) != FM_OK) { fm_graph_free(cur); return NULL; }
    if (!(rep->max_rel_diff <= 1e-4)) {
        fm_set_error(FM_ERR_INTERNAL, "compile: the compiled graph's outputs differ from the input graph's by %.3g (relative); not writing it",
                     rep->max_rel_diff);
        fm_graph_free(cur);
        return NULL;
    }
    if (fm_graph_plan_memory(g, 0, &rep->plan_before) || fm_graph_plan_memory(cur, 0, &rep->plan_after)) { fm_graph_free(cur); return NULL; }
    char passes[512]; /* the passes in the order they ran */
    fm_graph_set_meta(cur, "compiled", pass_names(passes, sizeof passes, N_PASSES, ","));
    return cur;
}
