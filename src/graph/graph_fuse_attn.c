/* fuse-attention: the attention block of a KV-cache graph (graph_gpt.c writes it)
 *   qkv_split_heads(qkv) -> q, k, v;  cat(past_k, k) -> present_k;  cat(past_v, v) -> present_v;
 *   causal_attention(q, present_k, present_v) -> y;  transpose(y, 1, 2);  reshape to [B, T, H D]
 * becomes one attention_kv node (graph_ops_attn.c), which on a prompt runs sdpa_qkv
 * straight on the projection and copies neither the heads nor the cache, and in a
 * decode step saves the separate split, merge and their intermediates. q, k, v, y and
 * the transpose must have no other reader; the present caches may (they are outputs).
 * Llama's ropes (fuse-rope) between the split and the attention and cache may be taken in
 * too: attention_kv then rotates q and k itself. Anything else there leaves the block alone. */
#include <math.h>
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

/* the node making v when it is op, whatever else reads v (-1: none) */
static int made_by(const fm_graph *g, int v, const char *op) {
    const int p = v >= 0 && g->values[v].kind == GV_NODE ? g->values[v].producer : -1;
    return p >= 0 && !strcmp(g->nodes[p].op, op) ? p : -1;
}

/* made_by, when v has no other reader and is no graph output */
static int producer(const fm_graph *g, const int *uses, int v, const char *op) {
    return v < 0 || uses[v] != 1 || g->values[v].is_output ? -1 : made_by(g, v, op);
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

/* ---- fuse-masked-attention: attention as exporters write it out op by op (BERT's
 * and other imported encoders' padding masks; decoders' causal masks built at run time),
 *   matmul(softmax(matmul(a, bt) [* or / c] [+ mask], last axis) [NaNs to 0], v)
 * where a is q or q * c, bt is k transposed (a permute swapping the last two dims of
 * what it makes, or transpose(2, 3)) or that times c, each c a scalar constant, and
 * the NaN guard where(ne(p, p), 0, p) of transformers' exports; it becomes
 * sdpa_mask(q, k, v, mask, scale) (a zero mask when there is none), k a permute of
 * bt's source (or that source, under PyTorch dynamo's 3-D reshape-permute-reshape). The
 * mask must be where(cond, a, b) of constants 0, -inf or below -1e30 (mask_values_safe).
 * The scores, masked scores and probabilities must have no other reader. Matched at the
 * last matmul: the nodes before it were copied already, and a dce drops them. ---- */

typedef struct mattn {
    int q, k_src, v, mask, perm_node; /* values; perm_node: the permute making bt, or -1 (a transpose) */
    double scale;
} mattn;

/* v is a one-element constant: its value in *x */
static bool one_const(const fm_graph *g, int v, double *x) {
    if (v < 0 || g->values[v].kind != GV_CONST || !g->values[v].tensor || fm_tensor_numel(g->values[v].tensor) != 1) return false;
    *x = fm_tensor_item(g->values[v].tensor);
    return true;
}

/* a scale factor: a one-element constant, finite and not 0 */
static bool scalar_const(const fm_graph *g, int v, double *x) { return one_const(g, v, x) && isfinite(*x) && *x != 0; }

/* v, or the other operand of mul(v, c) / mul(c, v) (then *scale times c) when v is that
 * product with no other reader */
static int unscaled(const fm_graph *g, const int *uses, int v, double *scale, bool div_ok) {
    int p = producer(g, uses, v, "mul");
    if (p < 0 && div_ok) p = producer(g, uses, v, "div");
    if (p < 0) return v;
    const gnode *n = &g->nodes[p];
    double c;
    const bool div = !strcmp(n->op, "div");
    if (scalar_const(g, n->in[1], &c)) { *scale *= div ? 1.0 / c : c; return n->in[0]; }
    if (!div && scalar_const(g, n->in[0], &c)) { *scale *= c; return n->in[1]; }
    return v;
}

/* x when v is x's kv heads repeated for grouped-query attention, as exporters write
 * Llama's repeat_kv: reshape(expand(unsqueeze(x, 2), [B, KV, G, L, D]), [B, KV G, L, D]);
 * from5: v is the expand itself (the 5-D value); else v. sdpa_mask takes the KV heads. */
static int unrepeated(const fm_graph *g, int v, bool from5) {
    const int r = from5 ? -1 : made_by(g, v, "reshape"), e = made_by(g, from5 ? v : r >= 0 ? g->nodes[r].in[0] : -1, "expand");
    const int u = e >= 0 ? made_by(g, g->nodes[e].in[0], "unsqueeze") : -1;
    if (u < 0 || g_node_int(&g->nodes[u], "axis", -1) != 2) return v;
    const int x = g->nodes[u].in[0];
    const gvalue *xv = &g->values[x], *ev = &g->values[g->nodes[e].out[0]];
    if (xv->t.ndim != 4 || ev->t.ndim != 5) return v;
    for (int q = 0; q < 2; q++) { /* [B, KV, L, D] -> [B, KV, G, L, D] (-> [B, KV G, L, D]) */
        const int64_t *xd = q ? xv->probe2 : xv->t.d, *ed = q ? ev->probe2 : ev->t.d;
        if (ed[0] != xd[0] || ed[1] != xd[1] || ed[3] != xd[2] || ed[4] != xd[3]) return v;
        if (!from5) {
            const int64_t *vd = q ? g->values[v].probe2 : g->values[v].t.d;
            if (g->values[v].t.ndim != 4 || vd[0] != xd[0] || vd[1] != ed[1] * ed[2] || vd[2] != xd[2] || vd[3] != xd[3]) return v;
        }
    }
    return x;
}

/* bt = k transposed over its last two dims: k's source value and the permute node (-1: a
 * transpose, then the source is k itself). bt may have other readers (another block's
 * scores): its node stays for them, and k is a permute of its own. */
static bool transposed_k(const fm_graph *g, int bt, int *src, int *perm_node) {
    int p = made_by(g, bt, "permute");
    if (p >= 0) {
        const gattr *a = g_node_attr(&g->nodes[p], "perm");
        if (!a || a->type != FM_ATTR_INTS || a->n != 4) return false;
        for (int d = 0; d < 4; d++)
            if (a->ints[d].expr || a->ints[d].v < 0 || a->ints[d].v > 3) return false;
        *src = g->nodes[p].in[0], *perm_node = p;
        return true;
    }
    p = made_by(g, bt, "reshape"); /* PyTorch's dynamo export: reshape(permute(reshape(k, [B H, L, D]), [0, 2, 1]), [B, H, D, L]) */
    const int t3 = p >= 0 ? made_by(g, g->nodes[p].in[0], "permute") : -1, r0 = t3 >= 0 ? made_by(g, g->nodes[t3].in[0], "reshape") : -1;
    if (r0 >= 0) {
        const gattr *a = g_node_attr(&g->nodes[t3], "perm");
        const int k5 = g->nodes[r0].in[0], k = g->values[k5].t.ndim == 5 ? unrepeated(g, k5, true) : k5; /* Llama's repeated kv heads */
        const gvalue *kv = &g->values[k], *bv = &g->values[bt];
        if (!a || a->type != FM_ATTR_INTS || a->n != 3 || a->ints[0].v != 0 || a->ints[1].v != 2 || a->ints[2].v != 1 || kv->t.ndim != 4 ||
            bv->t.ndim != 4)
            return false;
        for (int q = 0; q < 2; q++) { /* [B, KV, L, D] to [B, H, D, L] (KV = H, or dividing it) at both probe sizes */
            const int64_t *kd = q ? kv->probe2 : kv->t.d, *bd = q ? bv->probe2 : bv->t.d;
            if (kd[0] != bd[0] || kd[1] <= 0 || bd[1] % kd[1] || (k == k5 && kd[1] != bd[1]) || kd[2] != bd[3] || kd[3] != bd[2]) return false;
        }
        *src = k, *perm_node = -1;
        return true;
    }
    p = made_by(g, bt, "transpose");
    if (p < 0) return false;
    int64_t d0 = g_node_int(&g->nodes[p], "dim0", 0), d1 = g_node_int(&g->nodes[p], "dim1", 1);
    d0 = d0 < 0 ? d0 + 4 : d0, d1 = d1 < 0 ? d1 + 4 : d1;
    if (!((d0 == 2 && d1 == 3) || (d0 == 3 && d1 == 2)) || g->values[bt].t.ndim != 4) return false;
    *src = g->nodes[p].in[0], *perm_node = -1;
    return true;
}

/* softmax's input p_in, past the optional NaN guard: where(ne(p, p), 0, p) -> p */
static int guarded_softmax(const fm_graph *g, const int *uses, int x) {
    int w = producer(g, uses, x, "where");
    if (w >= 0) {
        const gnode *wn = &g->nodes[w];
        double z = 1;
        const int ne = producer(g, uses, wn->in[0], "ne"), p = wn->in[2];
        const bool zero = one_const(g, wn->in[1], &z) && z == 0;
        /* p is read by ne (twice) and by the where, by nothing else */
        if (ne < 0 || !zero || g->nodes[ne].in[0] != p || g->nodes[ne].in[1] != p || uses[p] != 3 || g->values[p].is_output) return -1;
        x = p;
        const int s = g->values[x].kind == GV_NODE ? g->values[x].producer : -1;
        return s >= 0 && !strcmp(g->nodes[s].op, "softmax") ? s : -1;
    }
    return producer(g, uses, x, "softmax");
}

/* A mask the kernel adds as the graph does: where(cond, a, b) of two constants, each 0, -inf
 * or at most -1e30 (transformers' masks: float's lowest, or -inf). Its keys are then kept or
 * dropped outright. A mask of moderate values (-1e4) leaves a row whose every key it
 * covers to rounding (the scores' few bits above -1e4), which the fused sums would
 * round differently: such masks stay unfused. */
static bool mask_values_safe(const fm_graph *g, int mask) {
    const int w = made_by(g, mask, "where");
    for (int k = 1; w >= 0 && k < 3; k++) {
        double x;
        if (!one_const(g, g->nodes[w].in[k], &x) || !(x == 0 || x <= -1e30)) return false;
    }
    return w >= 0;
}

static bool mattn_match(const fm_graph *g, const int *uses, int i, mattn *m) {
    const gnode *y = &g->nodes[i];
    if (strcmp(y->op, "matmul") || y->n_in != 2 || g->values[y->out[0]].t.ndim != 4) return false;
    const int sm = guarded_softmax(g, uses, y->in[0]);
    if (sm < 0) return false;
    const gnode *s = &g->nodes[sm];
    const int64_t ax = g_node_int(s, "axis", -1);
    if (ax != -1 && ax != 3) return false;
    int x = s->in[0], add = producer(g, uses, x, "add");
    m->mask = -1, m->scale = 1;
    if (add >= 0) { /* the scores plus the mask, either order */
        const gnode *a = &g->nodes[add];
        const int s0 = producer(g, uses, a->in[0], "matmul") >= 0 || producer(g, uses, a->in[0], "mul") >= 0 ||
                       producer(g, uses, a->in[0], "div") >= 0 ? 0 : 1;
        x = a->in[s0], m->mask = a->in[1 - s0];
        if (!mask_values_safe(g, m->mask)) return false;
    }
    x = unscaled(g, uses, x, &m->scale, true);
    const int mm = producer(g, uses, x, "matmul");
    if (mm < 0) return false;
    const int qa = unscaled(g, uses, g->nodes[mm].in[0], &m->scale, false), bt = unscaled(g, uses, g->nodes[mm].in[1], &m->scale, false);
    if (!transposed_k(g, bt, &m->k_src, &m->perm_node)) return false;
    m->q = qa, m->v = unrepeated(g, y->in[1], false);
    /* k's heads (the permute's dim 1 when k is one) as v's: both grouped alike */
    const gattr *pa = m->perm_node >= 0 ? g_node_attr(&g->nodes[m->perm_node], "perm") : NULL;
    if (g->values[m->k_src].t.ndim != 4 || g->values[m->k_src].t.d[pa ? pa->ints[1].v : 1] != g->values[m->v].t.d[1]) return false;
    const gtype *q = &g->values[m->q].t, *v = &g->values[m->v].t;
    return q->ndim == 4 && v->ndim == 4 && (q->dt == FM_F32 || q->dt == FM_F64) && v->dt == q->dt &&
           (m->mask < 0 || g->values[m->mask].t.dt == q->dt);
}

static int masked_attention_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    mattn m;
    if (!mattn_match(g, f->uses, i, &m)) return -1;
    const gnode *y = &g->nodes[i];
    const char *out = g->values[y->out[0]].name, *k = rw_name(&f->r, m.k_src), *mask = m.mask >= 0 ? rw_name(&f->r, m.mask) : NULL;
    char kn[300], mn[300];
    fm_status st = FM_OK;
    if (m.perm_node >= 0) { /* k itself: bt's permute with its last two dims swapped back */
        const gattr *p = g_node_attr(&g->nodes[m.perm_node], "perm");
        const int64_t perm[4] = {p->ints[0].v, p->ints[1].v, p->ints[3].v, p->ints[2].v};
        fm_graph_attr a = fm_graph_attr_ints("perm", 4, perm);
        snprintf(kn, sizeof kn, "%s.k", out);
        st = fm_graph_add_node(f->r.dst, "permute", NULL, 1, &k, 1, (const char *[]){kn}, 1, &a);
        k = kn;
    }
    const int w = mask ? made_by(g, m.mask, "where") : -1, e = w >= 0 ? made_by(g, g->nodes[w].in[0], "expand") : -1;
    if (e >= 0 && !st) { /* the mask before its condition was expanded (BERT's [B, 1, T, L] from [B, 1, 1, L]): the kernel
                          * broadcasts it, one value per key instead of a value per query and key */
        const gnode *wn = &g->nodes[w];
        const char *wi[3] = {rw_name(&f->r, g->nodes[e].in[0]), rw_name(&f->r, wn->in[1]), rw_name(&f->r, wn->in[2])};
        snprintf(mn, sizeof mn, "%s.mask", out);
        st = fm_graph_add_node(f->r.dst, "where", NULL, 3, wi, 1, (const char *[]){mn}, 0, NULL);
        mask = mn;
    }
    if (!mask && !st) { /* no mask: a zero scalar */
        fm_tensor *z = fm_tensor_zeros(0, NULL, g->values[m.q].t.dt, FM_CPU); /* as the other passes' new constants */
        snprintf(mn, sizeof mn, "%s.mask", out);
        st = z ? rw_const(&f->r, mn, z) : fm_last_status();
        fm_tensor_release(z);
        mask = mn;
    }
    if (st) return st;
    f->tally[0]++;
    f->tally[1] += m.mask >= 0;
    fm_graph_attr sc = fm_graph_attr_float("scale", m.scale);
    const char *ins[4] = {rw_name(&f->r, m.q), k, rw_name(&f->r, m.v), mask};
    return rw_node_with(&f->r, y, "sdpa_mask", 4, ins, 1, &out, 1, &sc);
}

fm_graph *g_pass_fuse_masked_attention(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    char dn[256];
    fm_graph *out = rw_fuse_pass(g, masked_attention_node, n), *clean = out && n[0] ? g_pass_dce(out, dn, sizeof dn) : out;
    if (clean != out) fm_graph_free(out); /* the matched nodes, written before the last matmul, now unread */
    if (clean) snprintf(note, nn, "%d attentions written op by op (matmul, scale, mask add, softmax, matmul) fused into sdpa_mask, %d with a mask", n[0], n[1]);
    return clean;
}
