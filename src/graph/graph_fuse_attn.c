/* fuse-attention: the attention block of a KV-cache graph (graph_gpt.c writes it)
 *   qkv_split_heads(qkv) -> q, k, v;  cat(past_k, k) -> present_k;  cat(past_v, v) -> present_v;
 *   causal_attention(q, present_k, present_v) -> y;  transpose(y, 1, 2);  reshape to [B, T, H D]
 * becomes one attention_kv node (graph_ops_attn.c), which on a prompt runs sdpa_qkv
 * straight on the projection and copies neither the heads nor the cache, and in a
 * decode step saves the separate split, merge and their intermediates. q, k, v, y and
 * the transpose must have no other reader; the present caches may (they are outputs).
 * A pattern with anything between the split and the cat (Llama's RoPE) is left alone. */
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

/* The reader of the split's output `which` is cat(past, that, axis 2); its index or -1. */
static int cat_of(const fm_graph *g, const int *uses, const gnode *s, int which) {
    int c = only_reader(g, uses, s->out[which]);
    if (!is(g, c, "cat") || g->nodes[c].n_in != 2 || g->nodes[c].in[1] != s->out[which] || g_node_int(&g->nodes[c], "axis", 0) != 2) return -1;
    return c;
}

/* Matches the block at split node i: node indices in m[0..5] = split, cat k, cat v, attention, transpose, reshape. */
static bool match(const fm_graph *g, const int *uses, int i, int *m) {
    const gnode *s = &g->nodes[i];
    if (strcmp(s->op, "qkv_split_heads") || s->n_out != 3) return false;
    m[0] = i, m[1] = cat_of(g, uses, s, 1), m[2] = cat_of(g, uses, s, 2), m[3] = only_reader(g, uses, s->out[0]);
    if (m[1] < 0 || m[2] < 0 || !is(g, m[3], "causal_attention")) return false;
    const gnode *a = &g->nodes[m[3]];
    if (a->in[0] != s->out[0] || a->in[1] != g->nodes[m[1]].out[0] || a->in[2] != g->nodes[m[2]].out[0]) return false;
    m[4] = only_reader(g, uses, a->out[0]);
    if (!is(g, m[4], "transpose")) return false;
    int64_t d0 = g_node_int(&g->nodes[m[4]], "dim0", 0), d1 = g_node_int(&g->nodes[m[4]], "dim1", 1);
    if (!((d0 == 1 && d1 == 2) || (d0 == 2 && d1 == 1))) return false;
    m[5] = only_reader(g, uses, g->nodes[m[4]].out[0]);
    if (!is(g, m[5], "reshape")) return false;
    const gvalue *q = &g->values[s->out[0]], *y = &g->values[g->nodes[m[5]].out[0]];
    if (y->t.ndim != 3 || q->t.ndim != 4) return false;
    for (int p = 0; p < 2; p++) { /* [B, T, H D] at both probe sizes */
        const int64_t *qd = p ? q->probe2 : q->t.d, *yd = p ? y->probe2 : y->t.d;
        if (yd[0] != qd[0] || yd[1] != qd[2] || yd[2] != qd[1] * qd[3]) return false;
    }
    return true;
}

static int attention_node(rw_fuse *f, int i) {
    const fm_graph *g = f->g;
    int m[6];
    if (!match(g, f->uses, i, m)) return -1;
    const gnode *s = &g->nodes[i], *a = &g->nodes[m[3]];
    const gattr *sc = g_node_attr(a, "scale");
    const char *ins[3] = {rw_name(&f->r, s->in[0]), rw_name(&f->r, g->nodes[m[1]].in[0]), rw_name(&f->r, g->nodes[m[2]].in[0])};
    const char *outs[3] = {g->values[g->nodes[m[5]].out[0]].name, g->values[g->nodes[m[1]].out[0]].name, g->values[g->nodes[m[2]].out[0]].name};
    fm_graph_attr scale = fm_graph_attr_float("scale", sc && sc->type == FM_ATTR_FLOAT ? sc->f : sc && sc->type == FM_ATTR_INT ? (double)sc->i : 0.0);
    for (int k = 1; k < 6; k++) f->skip[m[k]] = true;
    f->tally[0]++;
    return rw_node_with(&f->r, s, "attention_kv", 3, ins, 3, outs, 1, &scale);
}

fm_graph *g_pass_fuse_attention(const fm_graph *g, char *note, size_t nn) {
    int n[3];
    fm_graph *out = rw_fuse_pass(g, attention_node, n);
    if (out) snprintf(note, nn, "%d attention blocks (head split, cache append, attention, head merge) fused", n[0]);
    return out;
}
