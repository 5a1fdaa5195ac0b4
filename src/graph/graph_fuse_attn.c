/* fuse-attention: the attention block of a KV-cache graph (graph_gpt.c writes it)
 *   qkv_split_heads(qkv) -> q, k, v;  cat(past_k, k) -> present_k;  cat(past_v, v) -> present_v;
 *   causal_attention(q, present_k, present_v) -> y;  transpose(y, 1, 2);  reshape to [B, T, H D]
 * becomes one attention_kv node (graph_ops_attn.c), which on a prompt runs sdpa_qkv
 * straight on the projection and copies neither the heads nor the cache, and in a
 * decode step saves the separate split, merge and their intermediates. q, k, v, y and
 * the transpose must have no other reader; the present caches may (they are outputs).
 * Llama's ropes (fuse-rope) between the split and the attention and cache may be taken in
 * too: attention_kv then rotates q and k itself. Anything else there leaves the block alone. */
#include <stdlib.h>
#include <string.h>

#include "graph/graph_rewrite.h"

/* The one node reading v (and v no graph output), or -1. */
static int only_reader(const fm_graph *g, const int *uses, int v) {
    if (v < 0 || uses[v] != 1 || g->values[v].is_output) return -1;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] == v) return i;
    return -1;
}

static bool is(const fm_graph *g, int i, const char *op) { return i >= 0 && !strcmp(g->nodes[i].op, op); }

/* The reader of value v is cat(past, v, axis 2); its index or -1. */
static int cat_of(const fm_graph *g, const int *uses, int v) {
    int c = only_reader(g, uses, v);
    if (!is(g, c, "cat") || g->nodes[c].n_in != 2 || g->nodes[c].in[1] != v || g_node_int(&g->nodes[c], "axis", 0) != 2) return -1;
    return c;
}

/* The value after the rope that is v's only reader (its node in *r), or v itself (*r = -1). */
static int past_rope(const fm_graph *g, const int *uses, int v, int *r) {
    *r = only_reader(g, uses, v);
    if (!is(g, *r, "rope") || g->nodes[*r].in[0] != v) { *r = -1; return v; }
    return g->nodes[*r].out[0];
}

/* Matches the block at split node i: node indices in m[0..7] = split, cat k, cat v, attention,
 * transpose, reshape, and the ropes of q and k (Llama's; both or neither, -1 when absent, one
 * pair of tables). */
static bool match(const fm_graph *g, const int *uses, int i, int *m) {
    const gnode *s = &g->nodes[i];
    if (strcmp(s->op, "qkv_split_heads") || s->n_out != 3) return false;
    const int q = past_rope(g, uses, s->out[0], &m[6]), k = past_rope(g, uses, s->out[1], &m[7]);
    if ((m[6] < 0) != (m[7] < 0)) return false;
    if (m[6] >= 0 && (g->nodes[m[6]].in[1] != g->nodes[m[7]].in[1] || g->nodes[m[6]].in[2] != g->nodes[m[7]].in[2])) return false;
    m[0] = i, m[1] = cat_of(g, uses, k), m[2] = cat_of(g, uses, s->out[2]), m[3] = only_reader(g, uses, q);
    if (m[1] < 0 || m[2] < 0 || !is(g, m[3], "causal_attention")) return false;
    const gnode *a = &g->nodes[m[3]];
    if (a->in[0] != q || a->in[1] != g->nodes[m[1]].out[0] || a->in[2] != g->nodes[m[2]].out[0]) return false;
    m[4] = only_reader(g, uses, a->out[0]);
    if (!is(g, m[4], "transpose")) return false;
    int64_t d0 = g_node_int(&g->nodes[m[4]], "dim0", 0), d1 = g_node_int(&g->nodes[m[4]], "dim1", 1);
    if (!((d0 == 1 && d1 == 2) || (d0 == 2 && d1 == 1))) return false;
    m[5] = only_reader(g, uses, g->nodes[m[4]].out[0]);
    if (!is(g, m[5], "reshape")) return false;
    const gvalue *qv = &g->values[s->out[0]], *y = &g->values[g->nodes[m[5]].out[0]];
    if (y->t.ndim != 3 || qv->t.ndim != 4) return false;
    for (int p = 0; p < 2; p++) { /* [B, T, H D] at both probe sizes */
        const int64_t *qd = p ? qv->probe2 : qv->t.d, *yd = p ? y->probe2 : y->t.d;
        if (yd[0] != qd[0] || yd[1] != qd[2] || yd[2] != qd[1] * qd[3]) return false;
    }
    return true;
}

/* Whether value v is in the output graph when node i is written: made before i, or by a node
 * after i that reads only values made before i (graph_gpt.c slices the rope tables after the
 * split), which is then written first. */
static bool ready_at(rw_fuse *f, int v, int i, fm_status *st) {
    const fm_graph *g = f->g;
    const int p = g->values[v].kind == GV_NODE ? g->values[v].producer : -1;
    if (p < i) return true;
    if (f->skip[p]) return false;
    for (int k = 0; k < g->nodes[p].n_in; k++) {
        const int u = g->nodes[p].in[k];
        if (u >= 0 && g->values[u].kind == GV_NODE && g->values[u].producer >= i) return false;
    }
    f->skip[p] = true;
    *st = rw_copy_node(&f->r, &g->nodes[p]);
    return true;
}

static int attention_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    int m[8];
    if (!match(g, f->uses, i, m)) return -1;
    fm_status st = FM_OK;
    for (int k = 1; m[6] >= 0 && k < 3; k++) /* the tables, written first when made after the split */
        if (!ready_at(f, g->nodes[m[6]].in[k], i, &st) || st) return st ? (int)st : -1;
    const gnode *s = &g->nodes[i], *a = &g->nodes[m[3]];
    const gattr *sc = g_node_attr(a, "scale");
    const bool rope = m[6] >= 0;
    const char *ins[5] = {rw_name(&f->r, s->in[0]), rw_name(&f->r, g->nodes[m[1]].in[0]), rw_name(&f->r, g->nodes[m[2]].in[0]),
                          rope ? rw_name(&f->r, g->nodes[m[6]].in[1]) : NULL, rope ? rw_name(&f->r, g->nodes[m[6]].in[2]) : NULL};
    const char *outs[3] = {g->values[g->nodes[m[5]].out[0]].name, g->values[g->nodes[m[1]].out[0]].name, g->values[g->nodes[m[2]].out[0]].name};
    fm_graph_attr scale = fm_graph_attr_float("scale", sc && sc->type == FM_ATTR_FLOAT ? sc->f : sc && sc->type == FM_ATTR_INT ? (double)sc->i : 0.0);
    for (int k = 1; k < 8; k++)
        if (m[k] >= 0) f->skip[m[k]] = true;
    f->tally[0]++;
    f->tally[1] += rope;
    return rw_node_with(&f->r, s, "attention_kv", rope ? 5 : 3, ins, 3, outs, 1, &scale);
}

fm_graph *g_pass_fuse_attention(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    fm_graph *out = rw_fuse_pass(g, attention_node, n);
    if (out) snprintf(note, nn, "%d attention blocks (head split, cache append, attention, head merge) fused, %d with their ropes", n[0], n[1]);
    return out;
}

/* ---- fuse-rope: the rotate-half RoPE as graph_gpt.c and torch.onnx.export (Hugging Face's
 * rotate_half) write it,
 *   add(mul(x, cos), mul(cat(neg(slice(x, D/2, D)), slice(x, 0, D/2), last axis), sin))
 * (either order of each mul's and the add's operands), becomes rope(x, cos, sin); cos and
 * sin [T, D], or with leading dims of 1 (then reshaped to [T, D]). The slices, the neg, the
 * cat and the products must have no other reader. The pattern is matched at its add, after
 * its first nodes were copied: they are left without readers, and a dce drops them. ---- */

static int producer(const fm_graph *g, const int *uses, int v, const char *op) {
    if (v < 0 || uses[v] != 1 || g->values[v].is_output || g->values[v].kind != GV_NODE) return -1;
    const int p = g->values[v].producer;
    return p >= 0 && !strcmp(g->nodes[p].op, op) ? p : -1;
}

/* Node j slices x's last axis (of size D) at [0, D/2) (upper false) or [D/2, D) (upper true). */
static bool half_of(const fm_graph *g, int j, int x, bool upper) {
    const gnode *n = &g->nodes[j];
    const gtype *t = &g->values[x].t;
    if (n->in[0] != x || g_node_int(n, "step", 1) != 1 || t->ndim < 2) return false;
    const int64_t axis = g_node_int(n, "axis", 0), D = t->d[t->ndim - 1];
    if ((axis != t->ndim - 1 && axis != -1) || D % 2) return false;
    int64_t v[2] = {0, INT64_MAX};
    for (int k = 0; k < 2; k++) {
        const gattr *a = g_node_attr(n, k ? "end" : "start");
        if (!a) continue;
        if (a->type == FM_ATTR_INT) v[k] = a->i;
        else if (a->type == FM_ATTR_INTS && a->n == 1 && !a->ints[0].expr) v[k] = a->ints[0].v;
        else return false;
    }
    return upper ? v[0] == D / 2 && v[1] >= D : v[0] == 0 && v[1] == D / 2;
}

/* A table for x: x's dtype, its last two dims x's at both probe sizes, any before them 1. */
static bool rope_table(const fm_graph *g, int c, int x) {
    const gvalue *cv = &g->values[c], *xv = &g->values[x];
    if (cv->t.dt != xv->t.dt || cv->t.ndim < 2 || cv->t.ndim > xv->t.ndim) return false;
    for (int p = 0; p < 2; p++) {
        const int64_t *cd = p ? cv->probe2 : cv->t.d, *xd = p ? xv->probe2 : xv->t.d;
        for (int d = 0; d < cv->t.ndim - 2; d++)
            if (cd[d] != 1) return false;
        if (cd[cv->t.ndim - 1] != xd[xv->t.ndim - 1] || cd[cv->t.ndim - 2] != xd[xv->t.ndim - 2]) return false;
    }
    return true;
}

/* The add at node i as rope: x, cos and sin in r[0..2], or false. */
static bool rope_match(const fm_graph *g, const int *uses, int i, int *r) {
    const gnode *a = &g->nodes[i];
    if (strcmp(a->op, "add") || a->n_in != 2 || !fm_dtype_is_float(g->values[a->out[0]].t.dt)) return false;
    for (int o = 0; o < 2; o++) {
        const int ma = producer(g, uses, a->in[o], "mul"), mb = producer(g, uses, a->in[1 - o], "mul");
        if (ma < 0 || mb < 0) continue;
        for (int p = 0; p < 2; p++) {
            const int cat = producer(g, uses, g->nodes[mb].in[p], "cat");
            if (cat < 0 || g->nodes[cat].n_in != 2) continue;
            const int ng = producer(g, uses, g->nodes[cat].in[0], "neg"), lo = producer(g, uses, g->nodes[cat].in[1], "slice");
            const int hi = ng >= 0 ? producer(g, uses, g->nodes[ng].in[0], "slice") : -1;
            if (hi < 0 || lo < 0) continue;
            const int x = g->nodes[lo].in[0], nd = g->values[x].t.ndim, ax = (int)g_node_int(&g->nodes[cat], "axis", 0);
            if ((ax != nd - 1 && ax != -1) || !half_of(g, lo, x, false) || !half_of(g, hi, x, true)) continue;
            const gnode *m = &g->nodes[ma];
            const int cs = m->in[0] == x ? m->in[1] : m->in[1] == x ? m->in[0] : -1, sn = g->nodes[mb].in[1 - p];
            if (cs < 0 || !rope_table(g, cs, x) || !rope_table(g, sn, x)) continue;
            r[0] = x, r[1] = cs, r[2] = sn;
            return true;
        }
    }
    return false;
}

static int rope_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    int r[3];
    if (!rope_match(g, f->uses, i, r)) return -1;
    const gnode *a = &g->nodes[i];
    const char *ins[3] = {rw_name(&f->r, r[0]), NULL, NULL}, *outs[1] = {g->values[a->out[0]].name};
    char names[2][300];
    for (int k = 1; k < 3; k++) {
        ins[k] = rw_name(&f->r, r[k]);
        if (g->values[r[k]].t.ndim == 2) continue;
        snprintf(names[k - 1], sizeof names[0], "%s.%s", outs[0], k == 1 ? "cos" : "sin"); /* [1, .., T, D] -> [T, D] */
        const int64_t D = g->values[r[0]].t.d[g->values[r[0]].t.ndim - 1], sh[2] = {-1, D};
        fm_graph_attr at = fm_graph_attr_ints("shape", 2, sh);
        fm_status st = fm_graph_add_node(f->r.dst, "reshape", NULL, 1, &ins[k], 1, (const char *[]){names[k - 1]}, 1, &at);
        if (st) return st;
        ins[k] = names[k - 1];
    }
    f->tally[0]++;
    return rw_node_as(&f->r, a, "rope", 3, ins, 1, outs);
}

fm_graph *g_pass_fuse_rope(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    char dn[256];
    fm_graph *out = rw_fuse_pass(g, rope_node, n), *clean = out && n[0] ? g_pass_dce(out, dn, sizeof dn) : out;
    if (clean != out) fm_graph_free(out); /* the matched nodes written before their add, now unread */
    if (clean) snprintf(note, nn, "%d rotary embeddings (slices, neg, cat, two products, an add) fused into rope", n[0]);
    return clean;
}
