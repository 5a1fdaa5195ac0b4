/* GPT recipes ([model] type = gpt): the peak of `fathom train <recipe>`
 * (src/gpt/gpt_train.c) replayed at the level of fathom's autograd graph.
 *
 * A sequential recipe is a chain, so plan_fathom.c walks it layer by layer. A
 * transformer is not: every residual add hands one gradient to two consumers,
 * which the engine then sums into a new buffer; block checkpointing re-runs a
 * block and walks an inner graph in the middle of the outer walk; selective
 * recomputation re-runs a norm or GELU inside a linear's backward; autocast
 * inserts casts whose backward converts the gradient back. So this file keeps a
 * small model of the tape: nodes with their inputs, saved buffers and pending
 * gradients, and a backward walk with the engine's rules (decreasing creation
 * order, gradients summed per output and per leaf, saved buffers freed once a
 * node has run, a parameter's gradient handed over at the end of its walk).
 * Each op below allocates what its front end and CPU kernel in src/ops and
 * src/backend/cpu allocate, in the same order. GPT-2 style models only; the
 * Llama variant (rotary embeddings, SwiGLU) is refused. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "efficiency/efficiency_internal.h" /* fm_cross_entropy_lowp_rows */
#include "fathom/gpt.h"
#include "plan/plan_fathom.h"

/* Distinct UTF-8 code points of a file (a char tokenizer's vocabulary is
 * those plus 256 byte fallbacks); -1 if it cannot be read. */
static int count_chars(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    unsigned char *seen = calloc(0x110000 / 8, 1);
    if (!seen) { fclose(f); return -1; }
    int count = 0, c;
    while ((c = fgetc(f)) != EOF) {
        uint32_t cp = (uint32_t)c;
        int more = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
        if (more < 0) continue; /* invalid lead byte: the byte fallback */
        cp = more == 0 ? (uint32_t)c : more == 1 ? (uint32_t)(c & 0x1f) : more == 2 ? (uint32_t)(c & 0x0f) : (uint32_t)(c & 0x07);
        int ok = 1;
        for (int k = 0; k < more; k++) {
            int n = fgetc(f);
            if (n == EOF || (n & 0xc0) != 0x80) { ok = 0; if (n != EOF) ungetc(n, f); break; }
            cp = cp << 6 | (uint32_t)(n & 0x3f);
        }
        if (!ok || cp >= 0x110000) continue;
        if (!(seen[cp >> 3] & (1u << (cp & 7)))) { seen[cp >> 3] |= (unsigned char)(1u << (cp & 7)); count++; }
    }
    fclose(f);
    free(seen);
    return count;
}

/* ---------------- the tape model ---------------- */

typedef struct gt {
    int buf;    /* pf_sim buffer, -1: none */
    double n;   /* elements */
    int es;     /* bytes per element */
    int node;   /* producer node, -1: none */
    int out;    /* which output of the producer */
    int leaf;   /* leaf index (parameters, checkpoint inputs), -1: not a leaf */
    int rg;     /* requires grad */
    int contig;
} gt;

static const gt GT_NONE = {-1, 0, 0, -1, 0, -1, 0, 1};

enum nk { N_EMB, N_SLICE, N_ADD, N_COPY, N_VIEW, N_PERMUTE, N_LN, N_LINEAR, N_MATMUL, N_SPLIT, N_SDPA, N_UNARY,
          N_DROPOUT, N_CE, N_CKPT, N_RC, N_MULS, N_BGELU, N_ADDLN, N_LINLP, N_CELP, N_SDPAQKV, N_LINMIX };
#define N_KINDS (N_LINMIX + 1)

/* the backward phase names of the replay's report, one per kind */
static const char *const node_kind_name[] = {
    "embedding", "slice", "add", "cast/copy", "view", "transpose", "layernorm", "linear", "matmul", "qkv split",
    "attention", "gelu", "dropout", "cross-entropy", "checkpointed block", "selective linear", "scale", "bias+gelu",
    "add+layernorm", "linear (low precision)", "cross-entropy (low precision)", "attention on qkv",
    "linear (bf16 GEMMs)"};
_Static_assert(sizeof node_kind_name / sizeof node_kind_name[0] == N_KINDS, "a name for every node kind");

#define G_MAX_IN 4
typedef struct gnode {
    enum nk kind;
    int n_in;
    gt in[G_MAX_IN];   /* what the node's inputs were (producer, leaf, size) */
    int saved[6];
    int n_out;
    gt outs[3];        /* shape/dtype of each output */
    gt acc[3];         /* pending gradient per output */
    double a[4];       /* op attributes */
    gt fw, fb;         /* selective: the norm's parameters */
    int ac;            /* the forward's autocast (4: off) */
    int released;
} gnode;

typedef struct gleaf {
    gt grad;  /* .grad (after a walk) */
    double n;
    int es;
} gleaf;

typedef struct gsim {
    pf_sim *s;
    gnode *nodes;
    int nn, cap;
    gleaf *leaves;
    int nl, capl;
    int grad_on;
    int ac;        /* autocast element size: 4 off, 2 bf16/fp16 */
    int mixed;     /* bf16 on the CPU without selective checkpointing: the fused f32 path with
                    * fm_linear_mixed (bf16 GEMM operands, f32 outputs); ac is then 4 */
    /* model */
    int64_t B, T, C, H, F, V, L, block;
    int bias;
    double dropout;
    int ckpt;      /* 0 none, 1 blocks, 2 selective */
    int training;
    /* parameters (leaves) */
    gt wte, wpe, lnf_w, lnf_b;
    gt *lw;        /* per layer: ln1_w ln1_b qkv_w qkv_b proj_w proj_b ln2_w ln2_b fc_w fc_b fc2_w fc2_b */
} gsim;

#define LW(g, i, k) ((g)->lw[(i) * 12 + (k)])
enum { P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_PROJW, P_PROJB, P_LN2W, P_LN2B, P_FCW, P_FCB, P_FC2W, P_FC2B };

static gt t_new(gsim *g, double n, int es, pf_cat cat, const char *what) {
    gt t = GT_NONE;
    t.buf = pf_alloc(g->s, cat, n, es, what);
    t.n = n;
    t.es = es;
    return t;
}
static gt t_ref(gsim *g, gt t) { pf_ref(g->s, t.buf); return t; }
static void t_rel(gsim *g, gt *t) { if (t->buf >= 0) pf_unref(g->s, t->buf); *t = GT_NONE; }

static int leaf_new(gsim *g, double n, int es) {
    if (g->nl == g->capl) {
        int cap = g->capl ? 2 * g->capl : 64;
        gleaf *nl = realloc(g->leaves, (size_t)cap * sizeof *nl);
        if (!nl) { g->s->failed = 1; return -1; }
        g->leaves = nl;
        g->capl = cap;
    }
    gleaf *l = &g->leaves[g->nl];
    l->grad = GT_NONE;
    l->n = n;
    l->es = es;
    return g->nl++;
}

static gt param(gsim *g, double n, const char *what) {
    gt t = t_new(g, n, 4, PF_WEIGHTS, what);
    t.leaf = leaf_new(g, n, 4);
    t.rg = 1;
    return t;
}

/* fm_node_begin: a node only with grad mode on and an input that requires grad */
static int node_begin(gsim *g, enum nk kind, int n_in, const gt *ins) {
    if (!g->grad_on) return -1;
    int any = 0;
    for (int i = 0; i < n_in; i++) any |= ins[i].rg;
    if (!any) return -1;
    if (g->nn == g->cap) {
        int cap = g->cap ? 2 * g->cap : 256;
        gnode *nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
        if (!nn) { g->s->failed = 1; return -1; }
        g->nodes = nn;
        g->cap = cap;
    }
    gnode *n = &g->nodes[g->nn];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->n_in = n_in;
    for (int i = 0; i < n_in; i++) n->in[i] = ins[i];
    for (int i = 0; i < 6; i++) n->saved[i] = -1;
    for (int i = 0; i < 3; i++) n->acc[i] = GT_NONE;
    n->fw = n->fb = GT_NONE;
    n->ac = g->ac;
    return g->nn++;
}

static void node_save(gsim *g, int id, int slot, gt t) {
    if (id < 0 || t.buf < 0) return;
    pf_ref(g->s, t.buf);
    g->nodes[id].saved[slot] = t.buf;
}

static void node_finish(gsim *g, int id, int n_out, gt *outs) {
    if (id < 0) return;
    gnode *n = &g->nodes[id];
    n->n_out = n_out;
    for (int i = 0; i < n_out; i++) {
        outs[i].node = id;
        outs[i].out = i;
        outs[i].rg = 1;
        outs[i].leaf = -1;
        n->outs[i] = outs[i];
    }
}

static int needs(const gnode *n, int i) { return i < n->n_in && n->in[i].rg; }

/* ---------------- ops ---------------- */

static gt op_copy(gsim *g, gt x, int es, pf_cat cat, const char *what);

/* a view of x's storage, recorded as a view node when x requires grad */
static gt op_view(gsim *g, gt x, enum nk kind, double n, int contig) {
    gt y = t_ref(g, x);
    y.n = n;
    y.contig = contig;
    y.node = -1;
    y.leaf = -1;
    y.rg = 0;
    int id = node_begin(g, kind, 1, &x);
    node_finish(g, id, 1, &y);
    return y;
}

static gt op_reshape(gsim *g, gt x) {
    if (x.contig) return op_view(g, x, N_VIEW, x.n, 1);
    gt c = op_copy(g, x, x.es, PF_ACT, "contiguous");
    gt y = op_view(g, c, N_VIEW, c.n, 1);
    t_rel(g, &c);
    return y;
}

/* copy_as: a new buffer in dtype es; the node keeps a one-element stand-in */
static gt op_copy(gsim *g, gt x, int es, pf_cat cat, const char *what) {
    gt y = t_new(g, x.n, es, cat, what);
    int id = node_begin(g, N_COPY, 1, &x);
    if (id >= 0) {
        gt z = t_new(g, 1, x.es, PF_ACT, "stand-in");
        node_save(g, id, 0, z);
        t_rel(g, &z);
    }
    node_finish(g, id, 1, &y);
    return y;
}

static gt op_to(gsim *g, gt x, int es, pf_cat cat, const char *what) {
    if (x.es == es) return t_ref(g, x);
    return op_copy(g, x, es, cat, what);
}

/* binary add with autocast promotion and the stand-ins add saves */
static gt op_add(gsim *g, gt a, gt b) {
    if (a.es != b.es && g->ac != 4) {
        gt pa = op_to(g, a, 4, PF_ACT, "to f32"), pb = op_to(g, b, 4, PF_ACT, "to f32");
        gt y = op_add(g, pa, pb);
        t_rel(g, &pa);
        t_rel(g, &pb);
        return y;
    }
    double n = a.n > b.n ? a.n : b.n;
    gt y = t_new(g, n, a.es, PF_ACT, "add");
    gt ins[2] = {a, b};
    int id = node_begin(g, N_ADD, 2, ins);
    if (id >= 0) {
        gt za = t_new(g, 1, a.es, PF_ACT, "stand-in"), zb = t_new(g, 1, b.es, PF_ACT, "stand-in");
        node_save(g, id, 0, za);
        node_save(g, id, 1, zb);
        t_rel(g, &za);
        t_rel(g, &zb);
    }
    node_finish(g, id, 1, &y);
    return y;
}

static gt op_layer_norm(gsim *g, gt x, gt w, gt b) {
    double rows = x.n / (double)g->C;
    gt y = t_new(g, x.n, x.es, PF_ACT, "layernorm");
    gt mean = t_new(g, rows, 4, PF_ACT, "ln mean"), rstd = t_new(g, rows, 4, PF_ACT, "ln rstd");
    gt ins[3] = {x, w, b};
    int id = node_begin(g, N_LN, b.buf >= 0 ? 3 : 2, ins);
    node_save(g, id, 0, x);
    node_save(g, id, 1, mean);
    node_save(g, id, 2, rstd);
    node_finish(g, id, 1, &y);
    t_rel(g, &mean);
    t_rel(g, &rstd);
    return y;
}

/* fm_linear: one node in fp32 (linear_node); under autocast the weight and an
 * f32 input are cast, a matmul node keeps the low-precision copies, and the
 * bias joins through an add */
static gt op_linear(gsim *g, gt x, gt w, gt b, double out) {
    double inf = w.n / out, rows = x.n / inf;
    if (g->mixed) { /* fm_linear_mixed: bf16 copies of x and w (kept by the node), an f32 output */
        gt x2 = op_view(g, x, N_VIEW, x.n, 1);
        gt xl = t_new(g, x.n, 2, PF_ACT, "input cast");
        gt wl = t_new(g, w.n, 2, PF_WEIGHTS, "weight cast");
        gt y = t_new(g, rows * out, 4, PF_ACT, "matmul");
        gt ins[3] = {x, w, b};
        int id = node_begin(g, N_LINMIX, b.buf >= 0 ? 3 : 2, ins);
        if (id >= 0) {
            node_save(g, id, 0, xl);
            node_save(g, id, 1, wl);
            g->nodes[id].a[0] = rows; g->nodes[id].a[1] = inf; g->nodes[id].a[2] = out;
        }
        node_finish(g, id, 1, &y);
        t_rel(g, &x2); t_rel(g, &xl); t_rel(g, &wl);
        gt r = op_view(g, y, N_VIEW, y.n, 1);
        t_rel(g, &y);
        return r;
    }
    if (g->ac == 4) {
        gt t = t_new(g, rows * out, 4, PF_ACT, "matmul");
        gt y = t;
        if (b.buf >= 0) { y = t_new(g, rows * out, 4, PF_ACT, "linear"); t_rel(g, &t); }
        gt ins[3] = {x, w, b};
        int id = node_begin(g, N_LINEAR, b.buf >= 0 ? 3 : 2, ins);
        if (id >= 0) { node_save(g, id, 0, x); g->nodes[id].a[0] = rows; g->nodes[id].a[1] = inf; g->nodes[id].a[2] = out; }
        node_finish(g, id, 1, &y);
        return y;
    }
    gt x2 = op_view(g, x, N_VIEW, x.n, 1);
    gt wc = op_copy(g, w, g->ac, PF_WEIGHTS, "weight cast");
    gt wt = op_view(g, wc, N_PERMUTE, wc.n, 0);
    gt ca = op_to(g, x2, g->ac, PF_ACT, "input cast");
    gt ae = op_view(g, ca, N_VIEW, ca.n, 1), be = op_view(g, wt, N_VIEW, wt.n, 0);
    gt y = t_new(g, rows * out, g->ac, PF_ACT, "matmul");
    gt ins[2] = {ae, be};
    int id = node_begin(g, N_MATMUL, 2, ins);
    if (id >= 0) {
        node_save(g, id, 0, ae);
        node_save(g, id, 1, be);
        g->nodes[id].a[0] = rows; g->nodes[id].a[1] = inf; g->nodes[id].a[2] = out;
    }
    node_finish(g, id, 1, &y);
    t_rel(g, &ae); t_rel(g, &be); t_rel(g, &ca); t_rel(g, &x2); t_rel(g, &wc); t_rel(g, &wt);
    if (b.buf >= 0) {
        gt bc = op_to(g, b, g->ac, PF_ACT, "bias cast");
        gt yb = op_add(g, y, bc);
        t_rel(g, &y);
        t_rel(g, &bc);
        y = yb;
    }
    gt r = op_view(g, y, N_VIEW, y.n, 1);
    t_rel(g, &y);
    return r;
}

/* fm_efficiency_linear under autocast with grad (src/efficiency/recompute.c's
 * linear_lowp): the input cast first, then fm_linear without a tape, whose weight
 * copy is freed at once; the node keeps the cast input (the weight is the master) */
static gt op_linear_lowp(gsim *g, gt x, gt w, gt b, double out) {
    double inf = w.n / out, rows = x.n / inf;
    int on = g->grad_on;
    g->grad_on = 0;
    gt xc = op_to(g, x, g->ac, PF_ACT, "input cast");
    gt y = op_linear(g, xc, w, b, out);
    g->grad_on = on;
    gt ins[3] = {x, w, b};
    int id = node_begin(g, N_LINLP, b.buf >= 0 ? 3 : 2, ins);
    if (id >= 0) { node_save(g, id, 0, xc); g->nodes[id].a[0] = rows; g->nodes[id].a[1] = inf; g->nodes[id].a[2] = out; }
    node_finish(g, id, 1, &y);
    t_rel(g, &xc);
    return y;
}

static gt op_gelu(gsim *g, gt x) {
    gt y = t_new(g, x.n, x.es, PF_ACT, "gelu");
    int id = node_begin(g, N_UNARY, 1, &x);
    node_save(g, id, 0, x);
    node_finish(g, id, 1, &y);
    return y;
}

/* the lowp wrapper (src/backend/cpu/lowp_cpu.c) widens bf16/fp16 inputs and
 * outputs of the f32-only kernels to f32 scratch around the call */
static void lowp_scratch(gsim *g, const double *ins, int nin, const double *outs, int nout) {
    int ids[12], k = 0;
    for (int i = 0; i < nin; i++) ids[k++] = pf_alloc(g->s, PF_WORK, ins[i], 4, "f32 scratch");
    for (int i = 0; i < nout; i++) ids[k++] = pf_alloc(g->s, PF_WORK, outs[i], 4, "f32 scratch");
    for (int i = 0; i < k; i++) pf_unref(g->s, ids[i]);
}

/* for SDPA and its backward the wrapper widens an eighth of the batch at a time */
static void lowp_scratch_batched(gsim *g, const double *ins, int nin, const double *outs, int nout) {
    const int64_t B = g->B, step = (B + 7) / 8;
    if (B <= 1) { lowp_scratch(g, ins, nin, outs, nout); return; }
    for (int64_t b0 = 0; b0 < B; b0 += step) {
        double f = (double)(B - b0 < step ? B - b0 : step) / (double)B, a[6], o[6];
        for (int i = 0; i < nin; i++) a[i] = ins[i] * f;
        for (int i = 0; i < nout; i++) o[i] = outs[i] * f;
        lowp_scratch(g, a, nin, o, nout);
    }
}

static gt op_dropout(gsim *g, gt x) {
    if (!(g->training && g->dropout > 0)) return t_ref(g, x);
    gt y = t_new(g, x.n, x.es, PF_ACT, "dropout");
    gt mask = t_new(g, x.n, 1, PF_ACT, "dropout mask");
    if (x.es != 4) lowp_scratch(g, &x.n, 1, &x.n, 1);
    int id = node_begin(g, N_DROPOUT, 1, &x);
    node_save(g, id, 0, mask);
    node_finish(g, id, 1, &y);
    t_rel(g, &mask);
    return y;
}

static void op_split(gsim *g, gt qkv, gt *q, gt *k, gt *v) {
    double n = qkv.n / 3;
    *q = t_new(g, n, qkv.es, PF_ACT, "q");
    *k = t_new(g, n, qkv.es, PF_ACT, "k");
    *v = t_new(g, n, qkv.es, PF_ACT, "v");
    int id = node_begin(g, N_SPLIT, 1, &qkv);
    gt o[3] = {*q, *k, *v};
    node_finish(g, id, 3, o);
    *q = o[0]; *k = o[1]; *v = o[2];
}

static gt op_sdpa(gsim *g, gt q, gt k, gt v) {
    gt out = t_new(g, q.n, q.es, PF_ACT, "attention");
    gt lse = t_new(g, (double)(q.n / (double)(g->C / g->H)), 4, PF_ACT, "logsumexp");
    if (q.es != 4) { double in[3] = {q.n, k.n, v.n}; lowp_scratch_batched(g, in, 3, &q.n, 1); }
    gt ins[3] = {q, k, v};
    int id = node_begin(g, N_SDPA, 3, ins);
    node_save(g, id, 0, q);
    node_save(g, id, 1, k);
    node_save(g, id, 2, v);
    node_save(g, id, 3, out);
    node_save(g, id, 4, lse);
    node_finish(g, id, 1, &out);
    t_rel(g, &lse);
    return out;
}

/* fm_sdpa_qkv (src/ops/fused.c): attention straight on qkv into merged heads;
 * the node keeps qkv, the output and the logsumexp */
static gt op_sdpa_qkv(gsim *g, gt qkv) {
    gt out = t_new(g, qkv.n / 3, qkv.es, PF_ACT, "attention");
    gt lse = t_new(g, (double)(qkv.n / 3 / (double)(g->C / g->H)), 4, PF_ACT, "logsumexp");
    int id = node_begin(g, N_SDPAQKV, 1, &qkv);
    node_save(g, id, 0, qkv);
    node_save(g, id, 1, out);
    node_save(g, id, 2, lse);
    node_finish(g, id, 1, &out);
    t_rel(g, &lse);
    return out;
}

/* fm_mul_scalar on the loss (1/grad_accum, the fp16 loss scale): a scalar
 * operand, and a mul node that keeps both operands */
static gt op_mul_scalar(gsim *g, gt x) {
    gt t = t_new(g, 1, x.es, PF_ACT, "scalar");
    gt y = t_new(g, x.n, x.es, PF_ACT, "scaled loss");
    int id = node_begin(g, N_MULS, 1, &x);
    node_save(g, id, 0, x);
    node_save(g, id, 1, t);
    node_finish(g, id, 1, &y);
    t_rel(g, &t);
    return y;
}

/* fm_bias_gelu_tanh (src/ops/fused.c): y = GELU(x + b); the node keeps x and b */
static gt op_bias_gelu(gsim *g, gt x, gt b) {
    gt y = t_new(g, x.n, x.es, PF_ACT, "bias+gelu");
    gt ins[2] = {x, b};
    int id = node_begin(g, N_BGELU, 2, ins);
    node_save(g, id, 0, x);
    node_save(g, id, 1, b);
    node_finish(g, id, 1, &y);
    return y;
}

/* fm_add_layer_norm (src/ops/fused.c): sum = x + h (x itself without h), y = its
 * norm; the node keeps the sum, mean and rstd */
static void op_add_ln(gsim *g, gt x, gt h, gt w, gt b, gt *sum, gt *y) {
    double rows = x.n / (double)g->C;
    gt s = h.buf >= 0 ? t_new(g, x.n, x.es, PF_ACT, "residual sum") : t_ref(g, x);
    gt yy = t_new(g, x.n, x.es, PF_ACT, "layernorm");
    gt mean = t_new(g, rows, 4, PF_ACT, "ln mean"), rstd = t_new(g, rows, 4, PF_ACT, "ln rstd");
    gt ins[4] = {x, h, w, b};
    if (h.buf < 0) ins[1].rg = 0;
    int id = node_begin(g, N_ADDLN, 4, ins);
    node_save(g, id, 0, s);
    node_save(g, id, 1, mean);
    node_save(g, id, 2, rstd);
    if (id >= 0) g->nodes[id].a[0] = h.buf >= 0;
    if (h.buf >= 0) {
        gt o[2] = {s, yy};
        node_finish(g, id, 2, o);
        s = o[0];
        yy = o[1];
    } else {
        node_finish(g, id, 1, &yy);
    }
    t_rel(g, &mean);
    t_rel(g, &rstd);
    *sum = s;
    *y = yy;
}

/* ---------------- the model's forward (src/gpt/gpt_model.c) ---------------- */

static int fused(const gsim *g);

static gt merge_f(gsim *g, gt h) {
    gt y = op_view(g, h, N_PERMUTE, h.n, 0);
    gt r = op_reshape(g, y);
    t_rel(g, &y);
    return r;
}

/* The cheap functions in front of a linear (gpt_model.c's norm_fn/fnorm_fn,
 * merge_fn, attn_fn, act_fn, bias_gelu_fn). fnorm (fm_add_layer_norm without the
 * add) allocates and saves what layer_norm does. */
enum fkind { F_NORM, F_MERGE, F_GELU, F_BIAS_GELU, F_ATTN };

static gt apply_f(gsim *g, enum fkind f, const gt *xs, gt fw, gt fb) {
    if (f == F_NORM) return op_layer_norm(g, xs[0], fw, fb);
    if (f == F_MERGE) return merge_f(g, xs[0]);
    if (f == F_ATTN && fused(g)) return op_sdpa_qkv(g, xs[0]); /* one op on the fused path */
    if (f == F_ATTN) { /* head split, attention, head merge */
        gt q, k, v;
        op_split(g, xs[0], &q, &k, &v);
        gt a = op_sdpa(g, q, k, v);
        t_rel(g, &q); t_rel(g, &k); t_rel(g, &v);
        gt y = merge_f(g, a);
        t_rel(g, &a);
        return y;
    }
    if (f == F_BIAS_GELU) return op_bias_gelu(g, xs[0], xs[1]);
    return op_gelu(g, xs[0]);
}

/* fm_linear_recompute: f and the linear without a tape, and a node that keeps
 * only f's inputs */
static gt lin_rc(gsim *g, enum fkind f, int n_in, const gt *xs, gt fw, gt fb, gt w, gt b, double out) {
    g->grad_on = 0;
    gt h = apply_f(g, f, xs, fw, fb);
    gt y = op_linear(g, h, w, b, out);
    g->grad_on = 1;
    t_rel(g, &h);
    gt ins[G_MAX_IN];
    for (int i = 0; i < n_in; i++) ins[i] = xs[i];
    ins[n_in] = w;
    ins[n_in + 1] = b;
    int id = node_begin(g, N_RC, n_in + 2, ins);
    if (id >= 0) {
        for (int i = 0; i < n_in; i++) node_save(g, id, i, xs[i]);
        gnode *n = &g->nodes[id];
        n->a[0] = f;
        n->a[1] = out;
        n->a[2] = n_in;
        n->fw = fw;
        n->fb = fb;
    }
    node_finish(g, id, 1, &y);
    return y;
}

/* fm_efficiency_linear: a recompute node (selective), or f then the linear */
static gt lin(gsim *g, enum fkind f, int n_in, const gt *xs, gt fw, gt fb, gt w, gt b, double out) {
    if (g->ckpt == 2 && g->grad_on) return lin_rc(g, f, n_in, xs, fw, fb, w, b, out);
    gt h = apply_f(g, f, xs, fw, fb);
    gt y = g->ac != 4 && g->grad_on ? op_linear_lowp(g, h, w, b, out) : op_linear(g, h, w, b, out);
    t_rel(g, &h);
    return y;
}

static gt lin1(gsim *g, enum fkind f, gt x, gt fw, gt fb, gt w, gt b, double out) {
    return lin(g, f, 1, &x, fw, fb, w, b, out);
}

/* attention and the projection back to the residual width (gpt_model.c's
 * attn_proj): selective recomputes the whole attention core, keeping only qkv */
static gt attn(gsim *g, gt h, int i) {
    gt p;
    if (fused(g) || (g->ckpt == 2 && g->grad_on)) {
        p = lin1(g, F_ATTN, h, GT_NONE, GT_NONE, LW(g, i, P_PROJW), LW(g, i, P_PROJB), (double)g->C);
    } else {
        gt q, k, v;
        op_split(g, h, &q, &k, &v);
        gt a = op_sdpa(g, q, k, v);
        t_rel(g, &q); t_rel(g, &k); t_rel(g, &v);
        /* with a tape the head merge is recomputed in backward, not kept (gpt_model.c attn_proj) */
        p = g->grad_on ? lin_rc(g, F_MERGE, 1, &a, GT_NONE, GT_NONE, LW(g, i, P_PROJW), LW(g, i, P_PROJB), (double)g->C)
                       : lin1(g, F_MERGE, a, GT_NONE, GT_NONE, LW(g, i, P_PROJW), LW(g, i, P_PROJB), (double)g->C);
        t_rel(g, &a);
    }
    gt d = op_dropout(g, p);
    t_rel(g, &p);
    return d;
}

/* block(): the unfused block, which autocast (bf16/fp16) runs */
static gt block(gsim *g, gt x, int i) {
    gt h = lin1(g, F_NORM, x, LW(g, i, P_LN1W), LW(g, i, P_LN1B), LW(g, i, P_QKVW), LW(g, i, P_QKVB), 3.0 * (double)g->C);
    gt d = attn(g, h, i);
    t_rel(g, &h);
    gt r = op_add(g, x, d);
    t_rel(g, &d);
    h = lin1(g, F_NORM, r, LW(g, i, P_LN2W), LW(g, i, P_LN2B), LW(g, i, P_FCW), LW(g, i, P_FCB), (double)g->F);
    gt h2 = lin1(g, F_GELU, h, GT_NONE, GT_NONE, LW(g, i, P_FC2W), LW(g, i, P_FC2B), (double)g->C);
    t_rel(g, &h);
    d = op_dropout(g, h2);
    t_rel(g, &h2);
    gt o = op_add(g, r, d);
    t_rel(g, &r);
    t_rel(g, &d);
    return o;
}

/* block_fused(): fp32 GPT-2. y = ln_1(x) when the previous block made it; with
 * next (the norm after this block) and no selective recomputation, the closing
 * residual add is fused with that norm and *y_next gets its output. */
static gt block_fused(gsim *g, gt x, gt y, int i, const gt *next_w, const gt *next_b, gt *y_next) {
    const int sel = g->ckpt == 2 && g->grad_on;
    gt h = y.buf >= 0 ? op_linear(g, y, LW(g, i, P_QKVW), LW(g, i, P_QKVB), 3.0 * (double)g->C)
                      : lin1(g, F_NORM, x, LW(g, i, P_LN1W), LW(g, i, P_LN1B), LW(g, i, P_QKVW), LW(g, i, P_QKVB),
                             3.0 * (double)g->C);
    if (y_next) *y_next = GT_NONE;
    gt d = attn(g, h, i);
    t_rel(g, &h);
    gt r = GT_NONE, y2 = GT_NONE;
    if (sel) {
        r = op_add(g, x, d);
        h = lin1(g, F_NORM, r, LW(g, i, P_LN2W), LW(g, i, P_LN2B), LW(g, i, P_FCW), GT_NONE, (double)g->F);
    } else {
        op_add_ln(g, x, d, LW(g, i, P_LN2W), LW(g, i, P_LN2B), &r, &y2);
        h = op_linear(g, y2, LW(g, i, P_FCW), GT_NONE, (double)g->F);
    }
    t_rel(g, &d);
    gt h2;
    if (g->bias) {
        gt act_in[2] = {h, LW(g, i, P_FCB)};
        h2 = lin(g, F_BIAS_GELU, 2, act_in, GT_NONE, GT_NONE, LW(g, i, P_FC2W), LW(g, i, P_FC2B), (double)g->C);
    } else {
        h2 = lin1(g, F_GELU, h, GT_NONE, GT_NONE, LW(g, i, P_FC2W), GT_NONE, (double)g->C);
    }
    t_rel(g, &h);
    d = op_dropout(g, h2);
    t_rel(g, &h2);
    gt o;
    if (next_w && !sel) op_add_ln(g, r, d, *next_w, *next_b, &o, y_next);
    else o = op_add(g, r, d);
    t_rel(g, &d);
    t_rel(g, &r);
    t_rel(g, &y2);
    return o;
}

static gt embed(gsim *g, gt idx) {
    gt x = t_new(g, idx.n * (double)g->C, 4, PF_ACT, "embedding");
    gt ins[2] = {g->wte, idx};
    int id = node_begin(g, N_EMB, 1, ins);
    node_save(g, id, 0, idx);
    node_finish(g, id, 1, &x);
    gt pe = t_ref(g, g->wpe); /* fm_narrow: a view of the first T rows */
    pe.n = (double)g->T * (double)g->C;
    pe.leaf = -1; pe.rg = 0; pe.node = -1;
    int sid = node_begin(g, N_SLICE, 1, &g->wpe);
    node_finish(g, sid, 1, &pe);
    gt s = op_add(g, x, pe);
    t_rel(g, &x);
    t_rel(g, &pe);
    gt d = op_dropout(g, s);
    t_rel(g, &s);
    return d;
}

static void walk(gsim *g, int lo, int hi, int n_roots, const gt *roots, const gt *seeds);

/* gpt_model.c fused_path(): GPT-2 without autocast, or bf16's mixed path */
static int fused(const gsim *g) { return g->ac == 4; }

/* fm_checkpoint around a block: no tape inside; the node keeps the input */
static gt ckpt_block(gsim *g, gt x, int i) {
    g->grad_on = 0;
    gt y = fused(g) ? block_fused(g, x, GT_NONE, i, NULL, NULL, NULL) : block(g, x, i);
    g->grad_on = 1;
    int id = node_begin(g, N_CKPT, 1, &x);
    if (id >= 0) { node_save(g, id, 0, x); g->nodes[id].a[0] = i; }
    node_finish(g, id, 1, &y);
    return y;
}

/* logits [N, V] and the loss (trainer holds both until after backward) */
static void forward(gsim *g, gt idx, gt tgt, gt *logits, gt *loss) {
    gt x = embed(g, idx), yn = GT_NONE;
    const int fu = fused(g);
    for (int i = 0; i < g->L; i++) {
        gt y;
        if (g->ckpt == 1 && g->grad_on && i < g->L - 1) {
            y = ckpt_block(g, x, i);
        } else if (fu) {
            const gt *nw = i + 1 < g->L ? &LW(g, i + 1, P_LN1W) : &g->lnf_w;
            const gt *nb = i + 1 < g->L ? &LW(g, i + 1, P_LN1B) : &g->lnf_b;
            gt ny;
            y = block_fused(g, x, yn, i, nw, nb, &ny);
            t_rel(g, &yn);
            yn = ny;
        } else {
            y = block(g, x, i);
        }
        t_rel(g, &x);
        x = y;
    }
    gt lg = yn.buf >= 0 ? op_linear(g, yn, g->wte, GT_NONE, (double)g->V)
                        : lin1(g, F_NORM, x, g->lnf_w, g->lnf_b, g->wte, GT_NONE, (double)g->V);
    t_rel(g, &yn);
    t_rel(g, &x);
    gt l2 = op_view(g, lg, N_VIEW, lg.n, 1);
    if (g->ac != 4 && g->grad_on) { /* fm_cross_entropy_lowp: f32 only a block of rows at a time */
        double rows = l2.n / (double)g->V, step = (double)fm_cross_entropy_lowp_rows(g->V);
        for (double r0 = 0; r0 < rows; r0 += step) { /* the loss by blocks of rows */
            double k = rows - r0 < step ? rows - r0 : step;
            gt xb = t_new(g, k * (double)g->V, 4, PF_ACT, "logits block f32");
            gt lb = t_new(g, 1, 4, PF_ACT, "block loss");
            t_rel(g, &xb);
            t_rel(g, &lb);
        }
        gt lw = t_new(g, 1, 4, PF_ACT, "loss");
        int cid = node_begin(g, N_CELP, 1, &l2);
        node_save(g, cid, 0, l2);
        node_save(g, cid, 1, tgt);
        if (cid >= 0) { g->nodes[cid].a[0] = l2.n / (double)g->V; g->nodes[cid].a[1] = (double)g->V; }
        node_finish(g, cid, 1, &lw);
        t_rel(g, &l2);
        *logits = lg;
        *loss = lw;
        return;
    }
    gt l32 = op_to(g, l2, 4, PF_ACT, "logits f32"); /* autocast: the loss in f32 */
    gt ls = t_new(g, 1, 4, PF_ACT, "loss");
    int id = node_begin(g, N_CE, 1, &l32);
    node_save(g, id, 0, l32);
    node_save(g, id, 1, tgt);
    node_finish(g, id, 1, &ls);
    t_rel(g, &l32);
    t_rel(g, &l2);
    *logits = lg;
    *loss = ls;
}

/* ---------------- backward rules (what each node's backward allocates) ---------------- */

static gt g_new(gsim *g, double n, int es, const char *what) { gt t = t_new(g, n, es, PF_WORK, what); return t; }

/* fm_sum_to: a view when the shapes match, else a reduced new tensor */
static gt sum_to(gsim *g, gt gr, double n) {
    if (gr.n == n) { gt v = t_ref(g, gr); return v; }
    return g_new(g, n, gr.es, "sum");
}

static void recompute_grad(gsim *g, gnode *n, gt *gout, gt *gin);

static void backward_node(gsim *g, int id, gt *gout, gt *gin) {
    gnode *n = &g->nodes[id];
    gt gr = gout[0];
    switch (n->kind) {
    case N_EMB: gin[0] = g_new(g, g->wte.n, 4, "d wte"); break;
    case N_SLICE: gin[0] = g_new(g, n->in[0].n, 4, "d wpe"); break;
    case N_ADD:
        if (needs(n, 0)) gin[0] = sum_to(g, gr, n->in[0].n);
        if (needs(n, 1)) gin[1] = sum_to(g, gr, n->in[1].n);
        break;
    case N_COPY:
        gin[0] = gr.es == n->in[0].es ? t_ref(g, gr) : g_new(g, gr.n, n->in[0].es, "grad cast");
        break;
    case N_VIEW: /* a reshape (or a same-shape expand) of the gradient: a view unless it cannot be one */
        if (gr.contig || !n->in[0].contig) { gin[0] = t_ref(g, gr); gin[0].contig = gr.contig; }
        else gin[0] = g_new(g, gr.n, gr.es, "contiguous");
        break;
    case N_PERMUTE: gin[0] = t_ref(g, gr); gin[0].contig = !gr.contig; break;
    case N_LN: {
        gt dx = g_new(g, n->in[0].n, n->in[0].es, "d ln");
        if (needs(n, 1)) gin[1] = g_new(g, (double)g->C, 4, "d ln w");
        if (n->n_in > 2 && needs(n, 2)) gin[2] = g_new(g, (double)g->C, 4, "d ln b");
        if (needs(n, 0)) gin[0] = dx;
        else t_rel(g, &dx);
        break;
    }
    case N_LINEAR: {
        double rows = n->a[0], in = n->a[1], out = n->a[2];
        if (needs(n, 0)) gin[0] = g_new(g, rows * in, gr.es, "d input");
        if (needs(n, 1)) gin[1] = g_new(g, out * in, 4, "d weight");
        if (n->n_in > 2 && needs(n, 2)) gin[2] = g_new(g, out, 4, "d bias");
        break;
    }
    case N_MATMUL: {
        double rows = n->a[0], in = n->a[1], out = n->a[2];
        if (needs(n, 0)) gin[0] = g_new(g, rows * in, gr.es, "d input");
        if (needs(n, 1)) { gin[1] = g_new(g, out * in, gr.es, "d weight"); gin[1].contig = 0; }
        break;
    }
    case N_SPLIT: gin[0] = g_new(g, 3 * n->outs[0].n, n->outs[0].es, "d qkv"); break;
    case N_SDPAQKV: gin[0] = g_new(g, 3 * n->outs[0].n, n->outs[0].es, "d qkv"); break;
    case N_SDPA: {
        double m = n->outs[0].n;
        int es = n->outs[0].es;
        for (int i = 0; i < 3; i++) gin[i] = g_new(g, m, es, "d qkv head");
        /* the kernel takes contiguous inputs: the head-merge's gradient arrives transposed */
        gt c = gr.contig ? GT_NONE : g_new(g, m, es, "contiguous");
        if (es != 4) { double ins[5] = {m, m, m, m, m}, outs[3] = {m, m, m}; lowp_scratch_batched(g, ins, 5, outs, 3); }
        t_rel(g, &c);
        break;
    }
    case N_UNARY: gin[0] = g_new(g, gr.n, n->outs[0].es, "d gelu"); break;
    case N_DROPOUT: {
        gt mf = g_new(g, gr.n, n->outs[0].es, "mask");
        gt sc = g_new(g, 1, n->outs[0].es, "scalar");
        gt ms = g_new(g, gr.n, n->outs[0].es, "mask scaled");
        t_rel(g, &sc);
        gin[0] = g_new(g, gr.n, n->outs[0].es, "d dropout");
        t_rel(g, &mf);
        t_rel(g, &ms);
        break;
    }
    case N_CE: gin[0] = g_new(g, n->in[0].n, 4, "d logits"); break;
    case N_CKPT: {
        /* re-run the block with the tape from an alias of the saved input, walk it */
        gt x = n->in[0];
        gt leaf = t_ref(g, x);
        leaf.node = -1;
        leaf.leaf = leaf_new(g, x.n, x.es);
        leaf.rg = 1;
        int lo = g->nn, ac = g->ac, on = g->grad_on;
        g->ac = n->ac;
        g->grad_on = 1;
        gt y = fused(g) ? block_fused(g, leaf, GT_NONE, (int)n->a[0], NULL, NULL, NULL) : block(g, leaf, (int)n->a[0]);
        g->ac = ac;
        g->grad_on = on;
        int hi = g->nn;
        walk(g, lo, hi, 1, &y, &gr);
        n = &g->nodes[id]; /* the node array may have moved */
        gleaf *lf = &g->leaves[leaf.leaf];
        gin[0] = lf->grad;
        lf->grad = GT_NONE;
        t_rel(g, &leaf);
        t_rel(g, &y);
        break;
    }
    case N_RC: recompute_grad(g, n, gout, gin); break;
    case N_CELP: { /* cel_backward: the mean's scale, the low-precision gradient, then blocks of rows in f32 */
        double rows = n->a[0], V = n->a[1], step = (double)fm_cross_entropy_lowp_rows((int64_t)V);
        gt gs = g_new(g, 1, 4, "mean scale");
        gt dx = g_new(g, rows * V, n->in[0].es, "d logits");
        for (double r0 = 0; r0 < rows; r0 += step) {
            double k = rows - r0 < step ? rows - r0 : step;
            gt xb = g_new(g, k * V, 4, "logits block f32");
            gt lb = g_new(g, 1, 4, "block loss");
            gt db = g_new(g, k * V, 4, "d logits block");
            t_rel(g, &xb);
            t_rel(g, &db);
            t_rel(g, &lb);
        }
        t_rel(g, &gs);
        gin[0] = dx;
        break;
    }
    case N_LINMIX: { /* linear_mixed_backward: one bf16 copy of the gradient for both GEMMs, the bias's sum */
        double rows = n->a[0], in = n->a[1], out = n->a[2];
        gt gl = g_new(g, rows * out, 2, "d output bf16");
        if (n->n_in > 2 && needs(n, 2)) gin[2] = g_new(g, out, 4, "d bias");
        if (needs(n, 0)) gin[0] = g_new(g, rows * in, 4, "d input");
        if (needs(n, 1)) gin[1] = g_new(g, out * in, 4, "d weight");
        t_rel(g, &gl);
        break;
    }
    case N_LINLP: { /* ll_backward: the linear's gradients under the forward's autocast */
        double rows = n->a[0], in = n->a[1], out = n->a[2];
        if (needs(n, 1)) {
            gt gw = g_new(g, out * in, n->ac, "d weight");
            gin[1] = g_new(g, out * in, 4, "d weight f32");
            t_rel(g, &gw);
        }
        if (n->n_in > 2 && needs(n, 2)) {
            gt sb = g_new(g, out, gr.es, "d bias");
            if (gr.es != 4) { gin[2] = g_new(g, out, 4, "d bias f32"); t_rel(g, &sb); }
            else gin[2] = sb;
        }
        if (needs(n, 0)) {
            gt wc = g_new(g, out * in, n->ac, "weight cast");
            gt d = g_new(g, rows * in, n->ac, "d input");
            t_rel(g, &wc);
            if (n->in[0].es != n->ac) { gin[0] = g_new(g, rows * in, n->in[0].es, "d input f32"); t_rel(g, &d); }
            else gin[0] = d;
        }
        break;
    }
    case N_MULS: gin[0] = g_new(g, gr.n, gr.es, "d loss"); break;
    case N_BGELU: {
        gt dx = g_new(g, n->in[0].n, n->in[0].es, "d bias+gelu");
        if (needs(n, 1)) gin[1] = g_new(g, n->in[1].n, 4, "d fc bias");
        if (needs(n, 0)) gin[0] = dx;
        else t_rel(g, &dx);
        break;
    }
    case N_ADDLN: { /* one gradient buffer serves both x and h */
        gt d = g_new(g, n->in[0].n, n->in[0].es, "d residual");
        if (needs(n, 2)) gin[2] = g_new(g, (double)g->C, 4, "d ln w");
        if (needs(n, 3)) gin[3] = g_new(g, (double)g->C, 4, "d ln b");
        if (n->a[0] && needs(n, 1)) gin[1] = t_ref(g, d);
        if (needs(n, 0)) gin[0] = t_ref(g, d);
        t_rel(g, &d);
        break;
    }
    }
}

/* rc_backward (src/efficiency/recompute.c): f re-run with the tape, the
 * linear's gradients computed directly (under the forward's autocast), then a
 * walk of f's small graph */
static void recompute_grad(gsim *g, gnode *n0, gt *gout, gt *gin) {
    gnode n = *n0; /* the node array may move while f's graph is built */
    enum fkind f = (enum fkind)(int)n.a[0];
    double out = n.a[1];
    int k = (int)n.a[2]; /* f's inputs; the weight and bias follow them */
    gt b = n.in[k + 1];
    gt leaf[2];
    for (int i = 0; i < k; i++) {
        leaf[i] = t_ref(g, n.in[i]);
        leaf[i].node = -1;
        leaf[i].leaf = leaf_new(g, n.in[i].n, n.in[i].es);
        leaf[i].rg = needs(&n, i);
    }
    int lo = g->nn, ac = g->ac, on = g->grad_on;
    g->ac = n.ac; /* f, and the linear's gradient matmuls, run under the forward's autocast */
    g->grad_on = 1;
    gt h = apply_f(g, f, leaf, n.fw, n.fb);
    g->grad_on = 0;
    int hi = g->nn;
    double in = f == F_GELU || f == F_BIAS_GELU ? (double)g->F : (double)g->C, rows = h.n / in;
    gt go = gout[0];
    if (needs(&n, k)) { /* gw = matmul(go^T, h), then in the weight's dtype */
        if (g->ac != 4) {
            gt hc = h.es != g->ac ? g_new(g, h.n, g->ac, "cast") : GT_NONE;
            gt gw = g_new(g, out * in, g->ac, "d weight");
            t_rel(g, &hc);
            gt g32 = g_new(g, out * in, 4, "d weight f32");
            t_rel(g, &gw);
            gin[k] = g32;
        } else {
            gin[k] = g_new(g, out * in, 4, "d weight");
        }
    }
    if (b.rg && needs(&n, k + 1)) { /* the bias's gradient: summed in go's dtype, then widened */
        gt sb = g_new(g, out, go.es, "d bias");
        if (go.es != 4) { gin[k + 1] = g_new(g, out, 4, "d bias f32"); t_rel(g, &sb); }
        else gin[k + 1] = sb;
    }
    /* f's output is released before dg: the walk below reads only its producer */
    gt root = h;
    t_rel(g, &h);
    gt dg; /* matmul(go, w), in f's output dtype */
    if (g->ac != 4) {
        gt wc = g_new(g, out * in, g->ac, "weight cast");
        dg = g_new(g, rows * in, g->ac, "d f-out");
        t_rel(g, &wc);
        if (root.es != dg.es) { gt d2 = g_new(g, rows * in, root.es, "d f-out cast"); t_rel(g, &dg); dg = d2; }
    } else {
        dg = g_new(g, rows * in, 4, "d f-out");
    }
    g->ac = ac;
    walk(g, lo, hi, 1, &root, &dg);
    g->grad_on = on;
    for (int i = 0; i < k; i++) {
        if (needs(&n, i)) {
            gleaf *lf = &g->leaves[leaf[i].leaf];
            gin[i] = lf->grad;
            lf->grad = GT_NONE;
        }
        t_rel(g, &leaf[i]);
    }
    t_rel(g, &dg);
}

/* the pending gradient of an input: summed into a new tensor when one is already there */
static void accumulate(gsim *g, gt *slot, gt add) {
    if (slot->buf < 0) { *slot = add; return; }
    gt s = g_new(g, slot->n, slot->es, "grad sum");
    t_rel(g, slot);
    t_rel(g, &add);
    *slot = s;
}

typedef struct wleaf { int leaf; gt sum; } wleaf;

/* fm_backward_multi over the nodes created in [lo, hi) */
static void walk(gsim *g, int lo, int hi, int n_roots, const gt *roots, const gt *seeds) {
    wleaf *wl = NULL;
    int nwl = 0, capwl = 0, on = g->grad_on;
    gt held[8];
    g->grad_on = 0; /* backward functions run without a tape */
    for (int r = 0; r < n_roots; r++) {
        held[r] = t_ref(g, seeds[r]);
        held[r].contig = seeds[r].contig;
        if (roots[r].node >= 0) accumulate(g, &g->nodes[roots[r].node].acc[roots[r].out], t_ref(g, held[r]));
    }
    for (int k = hi - 1; k >= lo; k--) {
        gnode *n = &g->nodes[k];
        if (n->released) continue;
        gt gout[3] = {GT_NONE, GT_NONE, GT_NONE}, gin[G_MAX_IN] = {GT_NONE, GT_NONE, GT_NONE, GT_NONE};
        int any = 0;
        for (int i = 0; i < n->n_out; i++) { gout[i] = n->acc[i]; n->acc[i] = GT_NONE; any |= gout[i].buf >= 0; }
        pf_phase(g->s, "  backward %s", node_kind_name[n->kind]);
        if (any) backward_node(g, k, gout, gin);
        n = &g->nodes[k];
        for (int j = 0; j < n->n_in; j++) {
            if (gin[j].buf < 0) continue;
            if (!needs(n, j)) { t_rel(g, &gin[j]); continue; }
            gt src = n->in[j];
            gin[j].node = -1;
            if (src.node >= 0) accumulate(g, &g->nodes[src.node].acc[src.out], gin[j]);
            else if (src.leaf >= 0) {
                int q = 0;
                while (q < nwl && wl[q].leaf != src.leaf) q++;
                if (q == nwl) {
                    if (nwl == capwl) {
                        capwl = capwl ? 2 * capwl : 64;
                        wleaf *nw = realloc(wl, (size_t)capwl * sizeof *nw);
                        if (!nw) { g->s->failed = 1; t_rel(g, &gin[j]); continue; }
                        wl = nw;
                    }
                    wl[nwl].leaf = src.leaf;
                    wl[nwl].sum = GT_NONE;
                    nwl++;
                }
                pf_recat(g->s, gin[j].buf, PF_GRADS);
                accumulate(g, &wl[q].sum, gin[j]);
                pf_recat(g->s, wl[q].sum.buf, PF_GRADS);
            } else t_rel(g, &gin[j]);
        }
        for (int i = 0; i < 3; i++) t_rel(g, &gout[i]);
        for (int i = 0; i < 6; i++) { if (n->saved[i] >= 0) pf_unref(g->s, n->saved[i]); n->saved[i] = -1; }
        n->released = 1;
    }
    /* finish_leaf: a fresh, contiguous gradient is handed over as is; a shared or
     * strided one is cloned; an existing .grad is added to */
    pf_phase(g->s, "  gradients to leaves");
    for (int q = 0; q < nwl; q++) {
        gleaf *lf = &g->leaves[wl[q].leaf];
        gt s = wl[q].sum;
        if (s.buf < 0) continue;
        if (lf->grad.buf >= 0) {
            gt ng = t_new(g, lf->grad.n, lf->grad.es, PF_GRADS, "grad + grad");
            t_rel(g, &lf->grad);
            t_rel(g, &s);
            lf->grad = ng;
        } else if (!s.contig || g->s->b[s.buf].refs > 1) {
            lf->grad = t_new(g, s.n, s.es, PF_GRADS, "grad clone");
            t_rel(g, &s);
        } else {
            pf_recat(g->s, s.buf, PF_GRADS);
            lf->grad = s;
        }
        lf->grad.contig = 1;
    }
    for (int r = 0; r < n_roots; r++) t_rel(g, &held[r]);
    free(wl);
    g->grad_on = on;
}

/* ---------------- the trainer ---------------- */

static void build_params(gsim *g) {
    double C = (double)g->C, V = (double)g->V, F = (double)g->F;
    g->wte = param(g, V * C, "wte");
    g->wpe = param(g, (double)g->block * C, "wpe");
    for (int i = 0; i < g->L; i++) {
        for (int k = 0; k < 12; k++) LW(g, i, k) = GT_NONE;
        LW(g, i, P_LN1W) = param(g, C, "ln_1.weight");
        if (g->bias) LW(g, i, P_LN1B) = param(g, C, "ln_1.bias");
        LW(g, i, P_QKVW) = param(g, 3 * C * C, "attn.qkv.weight");
        if (g->bias) LW(g, i, P_QKVB) = param(g, 3 * C, "attn.qkv.bias");
        LW(g, i, P_PROJW) = param(g, C * C, "attn.proj.weight");
        if (g->bias) LW(g, i, P_PROJB) = param(g, C, "attn.proj.bias");
        LW(g, i, P_LN2W) = param(g, C, "ln_2.weight");
        if (g->bias) LW(g, i, P_LN2B) = param(g, C, "ln_2.bias");
        LW(g, i, P_FCW) = param(g, F * C, "mlp.fc.weight");
        if (g->bias) LW(g, i, P_FCB) = param(g, F, "mlp.fc.bias");
        LW(g, i, P_FC2W) = param(g, C * F, "mlp.proj.weight");
        if (g->bias) LW(g, i, P_FC2B) = param(g, C, "mlp.proj.bias");
    }
    g->lnf_w = param(g, C, "ln_f.weight");
    g->lnf_b = g->bias ? param(g, C, "ln_f.bias") : GT_NONE;
}

static void zero_grads(gsim *g) {
    for (int i = 0; i < g->nl; i++) t_rel(g, &g->leaves[i].grad);
}

fm_status plan_fathom_gpt(const char *path, const fm_plan_run_opts *o, int explain, fm_plan_run *out) {
    /* the trainer's own parser: the same keys, defaults and file:line errors */
    fm_gpt_recipe rec;
    if (fm_gpt_recipe_load(path, &rec) != FM_OK) { /* a bad recipe is a bad file here, not bad usage */
        if (fm_last_status() != FM_ERR_INVALID) return fm_last_status();
        char msg[512];
        snprintf(msg, sizeof msg, "%s", fm_last_error());
        return fm_set_error(FM_ERR_FORMAT, "%s", msg);
    }
    const fm_gpt_config *mc = &rec.opts.model;
    struct {
        int llama, n_layer, n_head, n_embd, block_size, ffn, bias;
        double dropout;
        int tok_kind; /* 0 bpe, 1 char, 2 byte */
        int vocab_req, batch;
        char corpus[1024];
    } r = {mc->arch == FM_GPT_LLAMA, mc->n_layer, mc->n_head, mc->n_embd, mc->block_size, mc->ffn_hidden, mc->bias,
           mc->dropout, rec.opts.tokenizer == FM_TOK_BPE ? 0 : rec.opts.tokenizer == FM_TOK_CHAR ? 1 : 2,
           rec.opts.tokenizer_vocab, rec.opts.batch_size, ""};
    snprintf(r.corpus, sizeof r.corpus, "%s", rec.opts.corpus ? rec.opts.corpus : "kjv");
    fm_gpt_recipe_free(&rec);
    if (r.llama)
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: the planner replays GPT-2 style recipes only (arch = llama: rotary "
                            "embeddings and SwiGLU are not modelled)", path);
    if (r.n_layer < 1 || r.n_head < 1 || r.n_embd < 1 || r.block_size < 1 || r.ffn < 1 || r.n_embd % r.n_head)
        return fm_set_error(FM_ERR_FORMAT, "%s: n_layer, n_head, n_embd, block_size and ffn_hidden must be >= 1 and n_head "
                            "must divide n_embd", path);
    int64_t B = o->batch > 0 ? o->batch : r.batch;
    int accum = o->grad_accum > 1 ? o->grad_accum : 1;
    if (B % accum)
        return fm_set_error(FM_ERR_INVALID, "--batch %lld is not divisible by --grad-accum %d (each micro-batch must have "
                            "the same size)", (long long)B, accum);
    /* the vocabulary the trainer will build */
    int V = r.vocab_req;
    const char *vnote = "";
    if (r.tok_kind == 2) V = 256;
    else if (r.tok_kind == 1) {
        int n = strcmp(r.corpus, "kjv") ? count_chars(r.corpus) : -1;
        if (n < 0) return fm_set_error(FM_ERR_IO, "%s: a char tokenizer's vocabulary is the corpus's characters, and the "
                                       "corpus '%s' cannot be read", path, r.corpus);
        V = n + 256;
    } else vnote = "BPE vocabulary taken as the recipe's vocab_size (training stops early only on a corpus too small to repeat pairs)";
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", path);
    const char *base = strrchr(path, '/');
    snprintf(out->name, sizeof out->name, "%.63s", base ? base + 1 : path);
    char *dot = strstr(out->name, ".ini");
    if (dot) *dot = 0;
    snprintf(out->trainer, sizeof out->trainer, "gpt");
    out->opts = *o;
    out->opts.grad_accum = accum;
    out->batch = B;
    snprintf(out->notes, sizeof out->notes, "%s", vnote);

    pf_sim sim;
    memset(&sim, 0, sizeof sim);
    plan_sb log = {0};
    if (explain) sim.log = &log;
    gsim g;
    memset(&g, 0, sizeof g);
    g.s = &sim;
    g.T = r.block_size; g.C = r.n_embd; g.H = r.n_head; g.F = r.ffn; g.V = V; g.L = r.n_layer; g.block = r.block_size;
    g.bias = r.bias;
    g.dropout = r.dropout;
    g.ckpt = o->checkpointing;
    g.mixed = o->precision == FM_PLAN_BF16 && o->checkpointing != 2;
    g.ac = o->precision == FM_PLAN_FP32 || g.mixed ? 4 : 2;
    g.training = 1;
    g.lw = calloc((size_t)r.n_layer * 12, sizeof *g.lw);
    fm_status st = FM_OK;
    if (!g.lw) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); goto done; }
    int ac = g.ac;

    /* before fm_memory_reset_peak: the model, then AdamW's two moments per parameter */
    pf_phase(&sim, "model");
    build_params(&g);
    int n_params = g.nl;
    double params = 0;
    for (int i = 0; i < n_params; i++) params += g.leaves[i].n;
    out->params = (int64_t)params;
    pf_phase(&sim, "optimizer state (AdamW, created up front)");
    for (int i = 0; i < n_params; i++) {
        pf_alloc(&sim, PF_OPTIM, g.leaves[i].n, 4, "exp_avg");
        pf_alloc(&sim, PF_OPTIM, g.leaves[i].n, 4, "exp_avg_sq");
    }
    out->resident = sim.cur;
    sim.peak = sim.cur;
    memcpy(sim.peak_cat, sim.cat, sizeof sim.cat);
    snprintf(sim.peak_where, sizeof sim.peak_where, "before the first step");
    snprintf(out->model, sizeof out->model, "GPT-2 style, %d layers, %d heads, width %d, MLP %d, context %d, vocab %d, "
             "AdamW", r.n_layer, r.n_head, r.n_embd, r.ffn, r.block_size, V);

    /* Two steps: the second begins with the first's gradients alive until
     * zero_grad, then runs as the first did; the last step of a run also
     * evaluates and writes a checkpoint with its gradients still alive. */
    int64_t mb = B / accum;
    for (int step = 1; step <= 2; step++) {
        pf_phase(&sim, "step %d batch", step);
        gt x = t_new(&g, (double)(B * g.T), 8, PF_DATA, "batch x"), y = t_new(&g, (double)(B * g.T), 8, PF_DATA, "batch y");
        pf_phase(&sim, "step %d zero_grad", step);
        zero_grads(&g);
        for (int k = 0; k < accum; k++) {
            g.B = mb;
            gt xs = t_ref(&g, x), ys = t_ref(&g, y);
            xs.n = ys.n = (double)(mb * g.T);
            int lo = g.nn;
            g.grad_on = 1;
            g.ac = ac;
            pf_phase(&sim, "step %d forward%s", step, accum > 1 ? " (micro-batch)" : "");
            gt lg, loss;
            forward(&g, xs, ys, &lg, &loss);
            t_rel(&g, &lg); /* gpt_train.c's gpt_loss keeps only the loss: the logits live on in the nodes that saved them */
            g.ac = 4; /* the trainer restores autocast before backward */
            pf_phase(&sim, "step %d backward", step);
            /* src/gpt/gpt_train.c: loss / grad_accum, then the fp16 scaler's scale */
            gt l = accum > 1 ? op_mul_scalar(&g, loss) : t_ref(&g, loss);
            gt sl = o->precision == FM_PLAN_FP16 ? op_mul_scalar(&g, l) : t_ref(&g, l);
            t_rel(&g, &l);
            gt seed = t_new(&g, 1, 4, PF_WORK, "seed");
            int hi = g.nn;
            walk(&g, lo, hi, 1, &sl, &seed);
            t_rel(&g, &seed);
            t_rel(&g, &sl);
            pf_phase(&sim, "step %d release logits and loss", step);
            t_rel(&g, &xs); t_rel(&g, &ys); t_rel(&g, &loss);
            g.nn = lo; /* the tape is gone */
        }
        t_rel(&g, &x);
        t_rel(&g, &y);
    }
    /* the run's last step: validation (no tape, the training precision), then the checkpoint */
    g.grad_on = 0;
    g.training = 0;
    g.ac = ac;
    g.B = B;
    pf_phase(&sim, "validation batch (after the last step, gradients alive)");
    {
        gt x = t_new(&g, (double)(B * g.T), 8, PF_DATA, "eval x"), y = t_new(&g, (double)(B * g.T), 8, PF_DATA, "eval y");
        gt lg, loss;
        forward(&g, x, y, &lg, &loss);
        t_rel(&g, &lg); t_rel(&g, &loss); t_rel(&g, &x); t_rel(&g, &y);
    }
    pf_phase(&sim, "checkpoint (Hugging Face layout: Conv1D weights transposed into copies)");
    {
        int *ids = malloc(sizeof(int) * 4 * (size_t)g.L), k = 0;
        double C = (double)g.C, F = (double)g.F;
        if (!ids) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); goto done; }
        for (int i = 0; i < g.L; i++) {
            ids[k++] = pf_alloc(&sim, PF_WORK, 3 * C * C, 4, "c_attn copy");
            ids[k++] = pf_alloc(&sim, PF_WORK, C * C, 4, "c_proj copy");
            ids[k++] = pf_alloc(&sim, PF_WORK, F * C, 4, "c_fc copy");
            ids[k++] = pf_alloc(&sim, PF_WORK, C * F, 4, "mlp c_proj copy");
        }
        for (int i = 0; i < k; i++) pf_unref(&sim, ids[i]);
        free(ids);
    }
    pf_end(&sim);
    if (sim.failed) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); goto done; }
    out->peak = sim.peak;
    out->data = sim.peak_cat[PF_DATA];
    out->weights = sim.peak_cat[PF_WEIGHTS];
    out->gradients = sim.peak_cat[PF_GRADS];
    out->optimizer = sim.peak_cat[PF_OPTIM];
    out->activations = sim.peak_cat[PF_ACT];
    out->workspace = sim.peak_cat[PF_WORK];
    snprintf(out->peak_at, sizeof out->peak_at, "%s", sim.peak_where);
    if (explain) {
        static const char *ck[] = {"none", "blocks", "selective"};
        char b1[32];
        plan_sb hdr = {0};
        plan_sb_printf(&hdr, "Replay of `fathom train %s --batch %lld --precision %s --checkpointing %s --grad-accum %d` on "
                       "the CPU allocator (sizes rounded as it rounds them: 64 B below 4 KiB, eighths of a power of two "
                       "above; + allocated, - freed):\n", path, (long long)B, fm_plan_precision_name(o->precision),
                       ck[o->checkpointing], accum);
        plan_sb_printf(&hdr, "%s", log.buf ? log.buf : "");
        plan_sb_printf(&hdr, "peak %s at %s\n", pf_mib(sim.peak, b1, sizeof b1), sim.peak_where);
        out->explain = plan_sb_take(&hdr);
    }
done:
    free(log.buf);
    free(g.nodes);
    free(g.leaves);
    free(g.lw);
    pf_free(&sim);
    return st;
}
