/* The `fathom summary` table of a GPT model (fathom/gpt.h): embeddings, each
 * block's norms, attention (QKV projection, rotary embedding, scaled dot-product
 * attention, output projection) and MLP, the final norm and the LM head, for an
 * input of [batch, seq] token ids.
 *
 * Shapes and FLOPs follow from the configuration; parameters come from the
 * model's own tensors, placed in a row by name ("h.0.attn.qkv.weight" belongs to
 * row "h.0.attn.qkv"), and every tensor must land in exactly one row, so a new
 * parameter the table does not know about is an error rather than a wrong total.
 * The LM head reuses the token embedding (weight tying): its row names the
 * shared tensor and the totals count it once.
 *
 * FLOP conventions are those of the module summary (a multiply-add is 2,
 * elementwise 1 per element, norms 5 per element) plus: the residual add is
 * counted in the projection that feeds it; rotary embedding 4 per element of q
 * and k (two products, a negation, a sum); attention 4*B*H*T*T*D (QK^T and PV),
 * halved because the causal kernels skip the masked half, as the profiler counts
 * it; softmax is not counted (as in PyTorch's FLOP counter); dropout, when the
 * model has it, 1 per element where it is applied. */
#include <stdlib.h>
#include <string.h>

#include "fathom/gpt.h"
#include "fathom/observe.h"

typedef struct gwalk {
    fm_model_summary *s;
    int cap;
    size_t elt;
} gwalk;

static fm_layer_summary *row(gwalk *w, int depth, const char *name, const char *desc, int nd, const int64_t *shape,
                             double flops) {
    if (w->s->n == w->cap) {
        int nc = w->cap ? w->cap * 2 : 64;
        fm_layer_summary *nl = realloc(w->s->layers, (size_t)nc * sizeof *nl);
        if (!nl) return NULL;
        w->s->layers = nl;
        w->cap = nc;
    }
    fm_layer_summary *r = &w->s->layers[w->s->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->desc, sizeof r->desc, "%s", desc);
    r->depth = depth;
    r->out_ndim = nd;
    int64_t n = 1;
    for (int i = 0; i < nd; i++) {
        r->out_shape[i] = shape[i];
        n *= shape[i];
    }
    r->flops = flops;
    r->act_bytes = (double)n * (double)w->elt;
    return r;
}

/* A container row whose numbers are the sums of the rows after it at depth + 1. */
static void close_container(fm_model_summary *s, int idx) {
    fm_layer_summary *c = &s->layers[idx];
    c->container = true;
    c->flops = c->act_bytes = 0;
    for (int j = idx + 1; j < s->n && s->layers[j].depth > c->depth; j++) {
        const fm_layer_summary *k = &s->layers[j];
        if (k->depth != c->depth + 1) continue;
        c->flops += k->flops;
        c->act_bytes += k->act_bytes;
    }
}

/* Parameters of each leaf row, by name prefix; the containers then add up their
 * children. */
static fm_status place_params(fm_model_summary *s, const fm_named_list *ps) {
    for (int i = 0; i < ps->n; i++) {
        const char *name = ps->items[i].name;
        const fm_tensor *t = ps->items[i].tensor;
        int64_t n = fm_tensor_numel(t);
        int hit = -1;
        for (int j = 0; j < s->n && hit < 0; j++) {
            const fm_layer_summary *r = &s->layers[j];
            size_t ln = strlen(r->name);
            if (!r->container && !strncmp(name, r->name, ln) && name[ln] == '.' && !strchr(name + ln + 1, '.')) hit = j;
        }
        if (hit < 0)
            return fm_set_error(FM_ERR_INTERNAL, "summary: parameter %s of the GPT model has no row in the table", name);
        fm_layer_summary *r = &s->layers[hit];
        r->params += n;
        if (t->requires_grad) r->trainable += n;
        else r->frozen += n;
    }
    /* containers, deepest first so nested sums are complete when used */
    for (int depth = 2; depth >= 0; depth--)
        for (int j = 0; j < s->n; j++) {
            fm_layer_summary *c = &s->layers[j];
            if (!c->container || c->depth != depth) continue;
            c->params = c->trainable = c->frozen = 0;
            for (int k = j + 1; k < s->n && s->layers[k].depth > depth; k++) {
                const fm_layer_summary *d = &s->layers[k];
                if (d->depth != depth + 1) continue;
                c->params += d->params;
                c->trainable += d->trainable;
                c->frozen += d->frozen;
            }
        }
    return FM_OK;
}

/* The configuration's sizes for an input of [B, T] token ids. */
typedef struct gdims {
    const fm_gpt_config *c;
    bool llama, bias;
    int64_t B, T, C, H, D, V, F, KV, NQKV, NFC;
    double BT, BTC, dflops; /* dflops: dropout's 1 per element where the model has dropout */
    const char *norm;
} gdims;

static gdims gpt_dims(const fm_gpt_config *c, int64_t batch, int64_t seq) {
    gdims g = {.c = c, .llama = c->arch == FM_GPT_LLAMA, .B = batch, .T = seq, .C = c->n_embd, .H = c->n_head,
               .V = c->vocab_size, .F = c->ffn_hidden};
    g.bias = c->bias && !g.llama;
    g.D = g.C / g.H;
    g.KV = g.llama ? c->n_kv_head : g.H;
    g.NQKV = (g.H + 2 * g.KV) * g.D;
    g.NFC = (g.llama ? 2 : 1) * g.F;
    g.BT = (double)(g.B * g.T);
    g.BTC = g.BT * (double)g.C;
    g.dflops = c->dropout > 0 ? g.BTC : 0;
    g.norm = g.llama ? "rmsnorm" : "layernorm";
    return g;
}

/* Row helpers for the functions below, which hold `w`, `nm` and `d` and return
 * false when out of memory. */
#define ROW(depth, flops, nd, ...)                                            \
    do {                                                                       \
        if (!row(w, depth, nm, d, nd, (const int64_t[]){__VA_ARGS__}, flops)) \
            return false;                                                      \
    } while (0)
#define NAME(...) snprintf(nm, sizeof nm, __VA_ARGS__)
#define DESC(...) snprintf(d, sizeof d, __VA_ARGS__)

/* wte (and GPT-2's learned positions wpe); *wte_row gets the token embedding's row. */
static bool embedding_rows(gwalk *w, const gdims *g, int *wte_row) {
    char nm[64], d[96];
    const int64_t B = g->B, T = g->T, C = g->C;
    NAME("wte");
    DESC("token embedding %lld x %lld", (long long)g->V, (long long)C);
    /* a gather: no arithmetic; Llama's embedding dropout lands here */
    ROW(0, g->llama ? g->dflops : 0, 3, B, T, C);
    *wte_row = w->s->n - 1;
    if (!g->llama) {
        NAME("wpe");
        DESC("position embedding %d x %lld (+ add)", g->c->block_size, (long long)C);
        ROW(0, g->BTC + g->dflops, 3, B, T, C);
    }
    return true;
}

/* Block i: its norms, attention (qkv, rope, sdpa, proj) and MLP (fc, act, proj). */
static bool block_rows(gwalk *w, const gdims *g, int i) {
    char nm[64], d[96];
    const int64_t B = g->B, T = g->T, C = g->C, H = g->H, D = g->D, F = g->F, KV = g->KV, NQKV = g->NQKV;
    const double BT = g->BT, BTC = g->BTC, dflops = g->dflops;
    const bool llama = g->llama, bias = g->bias;
    fm_model_summary *out = w->s;
    NAME("h.%d", i);
    DESC("block %d", i);
    ROW(0, 0, 3, B, T, C);
    int blk = out->n - 1;
    NAME("h.%d.ln_1", i);
    DESC("%s %lld", g->norm, (long long)C);
    ROW(1, 5 * BTC, 3, B, T, C);
    NAME("h.%d.attn", i);
    if (KV != H) DESC("causal self-attention %lldx%lld, %lld kv heads", (long long)H, (long long)D, (long long)KV);
    else DESC("causal self-attention %lldx%lld", (long long)H, (long long)D);
    ROW(1, 0, 3, B, T, C);
    int att = out->n - 1;
    NAME("h.%d.attn.qkv", i);
    DESC("linear %lld->%lld (q, k, v)", (long long)C, (long long)NQKV);
    ROW(2, 2 * BT * (double)C * (double)NQKV + (bias || (llama && g->c->qkv_bias) ? BT * (double)NQKV : 0), 3, B, T,
        NQKV);
    if (llama) {
        NAME("h.%d.attn.rope", i);
        DESC("rotary embedding (q, k)");
        /* q [B, H, T, D] and k [B, KV, T, D]; the shape shown is q's */
        if (!row(w, 2, nm, d, 4, (const int64_t[]){B, H, T, D}, 4 * BT * (double)((H + KV) * D))) return false;
        out->layers[out->n - 1].act_bytes = BT * (double)((H + KV) * D) * (double)w->elt;
    }
    NAME("h.%d.attn.sdpa", i);
    DESC("scaled dot-product attention");
    ROW(2, 4.0 * (double)B * (double)H * (double)T * (double)T * (double)D / 2, 3, B, T, H * D);
    NAME("h.%d.attn.proj", i);
    DESC("linear %lld->%lld (+ residual)", (long long)(H * D), (long long)C);
    ROW(2, 2 * BT * (double)(H * D) * (double)C + (bias ? BTC : 0) + BTC + dflops, 3, B, T, C);
    close_container(out, att);
    NAME("h.%d.ln_2", i);
    DESC("%s %lld", g->norm, (long long)C);
    ROW(1, 5 * BTC, 3, B, T, C);
    NAME("h.%d.mlp", i);
    DESC(llama ? "mlp %lld->%lld->%lld (swiglu)" : "mlp %lld->%lld->%lld (gelu)", (long long)C, (long long)F, (long long)C);
    ROW(1, 0, 3, B, T, C);
    int mlp = out->n - 1;
    NAME("h.%d.mlp.fc", i);
    if (llama) DESC("linear %lld->2x%lld (gate, up)", (long long)C, (long long)F);
    else DESC("linear %lld->%lld", (long long)C, (long long)F);
    ROW(2, 2 * BT * (double)C * (double)g->NFC + (bias ? BT * (double)g->NFC : 0), 3, B, T, g->NFC);
    NAME("h.%d.mlp.act", i);
    DESC(llama ? "silu(gate) * up" : "gelu (tanh)");
    ROW(2, (llama ? 2 : 1) * BT * (double)F, 3, B, T, F);
    NAME("h.%d.mlp.proj", i);
    DESC("linear %lld->%lld (+ residual)", (long long)F, (long long)C);
    ROW(2, 2 * BT * (double)F * (double)C + (bias ? BTC : 0) + BTC + dflops, 3, B, T, C);
    close_container(out, mlp);
    close_container(out, blk);
    return true;
}

/* ln_f and the LM head. */
static bool head_rows(gwalk *w, const gdims *g) {
    char nm[64], d[96];
    NAME("ln_f");
    DESC("%s %lld", g->norm, (long long)g->C);
    ROW(0, 5 * g->BTC, 3, g->B, g->T, g->C);
    NAME("lm_head");
    DESC("linear %lld->%lld (tied to wte)", (long long)g->C, (long long)g->V);
    ROW(0, 2 * g->BT * (double)g->C * (double)g->V, 3, g->B, g->T, g->V);
    return true;
}
#undef ROW
#undef NAME
#undef DESC

/* Weight tying, the input, and the totals over the top-level rows. */
static void add_totals(fm_model_summary *out, const fm_named_list *ps, const gdims *g, int wte_row) {
    /* weight tying: the head's weight is the embedding's tensor, already counted there */
    fm_layer_summary *head = &out->layers[out->n - 1];
    snprintf(head->tied_to, sizeof head->tied_to, "wte.weight");
    head->tied_params = out->layers[wte_row].params;
    out->tied_params = head->tied_params;
    snprintf(out->input_desc, sizeof out->input_desc, "token ids");
    out->in_ndim = 2;
    out->in_shape[0] = g->B;
    out->in_shape[1] = g->T;
    for (int i = 0; i < out->n; i++) {
        const fm_layer_summary *r = &out->layers[i];
        if (r->depth != 0) continue;
        out->total_params += r->params;
        out->trainable += r->trainable;
        out->frozen += r->frozen;
        out->total_flops += r->flops;
        out->act_bytes += r->act_bytes;
    }
    for (int i = 0; i < ps->n; i++) out->param_bytes += (double)fm_tensor_nbytes(ps->items[i].tensor);
    out->input_bytes = g->BT * 8; /* i64 ids */
}

fm_status fm_gpt_summarize(const fm_gpt *m, int64_t batch, int64_t seq, fm_model_summary *out) {
    memset(out, 0, sizeof *out);
    if (!m) return fm_set_error(FM_ERR_INVALID, "summary: no GPT model given");
    const fm_gpt_config *c = fm_gpt_get_config(m);
    if (batch < 1 || seq < 1 || seq > c->block_size)
        return fm_set_error(FM_ERR_INVALID,
                            "summary: batch %lld and sequence length %lld must be >= 1, and the sequence at most the "
                            "model's block_size %d",
                            (long long)batch, (long long)seq, c->block_size);
    const fm_named_list *ps = fm_gpt_parameters(m);
    gwalk w = {out, 0, ps->n ? fm_dtype_size(ps->items[0].tensor->dtype) : 4};
    const gdims g = gpt_dims(c, batch, seq);
    int wte_row = -1;
    bool ok = embedding_rows(&w, &g, &wte_row);
    for (int i = 0; ok && i < c->n_layer; i++) ok = block_rows(&w, &g, i);
    if (ok) ok = head_rows(&w, &g);
    if (!ok) {
        fm_model_summary_free(out);
        return fm_set_error(FM_ERR_OOM, "summary: out of memory");
    }
    fm_status st = place_params(out, ps);
    if (st != FM_OK) { fm_model_summary_free(out); return st; }
    add_totals(out, ps, &g, wte_row);
    return FM_OK;
}
