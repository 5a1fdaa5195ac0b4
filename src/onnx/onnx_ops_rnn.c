/* ONNX's recurrent layers LSTM, GRU and RNN (opset 1 on; layout from opset 14) as
 * fathom ops, so they run on the input's device: X W^T of every step and direction
 * is one matmul up front, then each step is the recurrent matmul and the gates.
 *
 * sequence_lens: a step past a sequence's end leaves its state as it was (a mask
 * chooses the old state), so a reverse direction starts at each sequence's own last
 * step and Y_h/Y_c end on each sequence's last valid step; Y is zero past the end,
 * and an empty sequence gives zero Y_h and Y_c (ONNX Runtime's result; the spec says
 * nothing of it). */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Releases every non-NULL tensor in the list. */
#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

enum { IN_X, IN_W, IN_R, IN_B, IN_LENS, IN_H0, IN_C0, IN_P };
static const char *const in_names[] = {"X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"};

typedef enum { CELL_RNN, CELL_GRU, CELL_LSTM } rnn_cell;

typedef enum {
    ACT_RELU, ACT_TANH, ACT_SIGMOID, ACT_AFFINE, ACT_LEAKY_RELU, ACT_THRESHOLDED_RELU, ACT_SCALED_TANH,
    ACT_HARD_SIGMOID, ACT_ELU, ACT_SOFTSIGN, ACT_SOFTPLUS
} rnn_act_kind;

enum { TAKES_ALPHA = 1, TAKES_BETA = 2 };

/* The spec's activations, which of activation_alpha/activation_beta each takes, and
 * their defaults: those of the ONNX op of the same name, as the spec says (Affine's
 * and ScaledTanh's from the experimental ops, ScaledTanh's 1, 1 making it Tanh).
 * ONNX Runtime reads a missing alpha/beta of Affine, ScaledTanh and ThresholdedRelu
 * as 0 instead. */
static const struct act_def {
    const char *name;
    rnn_act_kind kind;
    int takes;
    float alpha, beta;
} act_defs[] = {
    {"Relu", ACT_RELU, 0, 0, 0},
    {"Tanh", ACT_TANH, 0, 0, 0},
    {"Sigmoid", ACT_SIGMOID, 0, 0, 0},
    {"Affine", ACT_AFFINE, TAKES_ALPHA | TAKES_BETA, 1.0f, 0.0f},
    {"LeakyRelu", ACT_LEAKY_RELU, TAKES_ALPHA, 0.01f, 0},
    {"ThresholdedRelu", ACT_THRESHOLDED_RELU, TAKES_ALPHA, 1.0f, 0},
    {"ScaledTanh", ACT_SCALED_TANH, TAKES_ALPHA | TAKES_BETA, 1.0f, 1.0f},
    {"HardSigmoid", ACT_HARD_SIGMOID, TAKES_ALPHA | TAKES_BETA, 0.2f, 0.5f},
    {"Elu", ACT_ELU, TAKES_ALPHA, 1.0f, 0},
    {"Softsign", ACT_SOFTSIGN, 0, 0, 0},
    {"Softplus", ACT_SOFTPLUS, 0, 0, 0},
};
#define N_ACT_DEFS ((int)(sizeof act_defs / sizeof *act_defs))

typedef struct rnn_act {
    rnn_act_kind kind;
    double alpha, beta;
} rnn_act;

typedef struct rnn {
    onnx_op_ctx *c;
    rnn_cell cell;
    int gates, n_act, dirs, layout; /* gates 1, 3, 4 (W's blocks); n_act: activations per direction */
    bool reverse, has_clip, input_forget, lbr;
    double clip;
    int64_t seq, batch, in, hid, steps; /* steps: the longest sequence (later steps change nothing) */
    fm_dtype dt;
    fm_device dev;
    rnn_act act[6];
    fm_tensor *mask;  /* bool [seq, batch, 1]: step t lies within sequence b; NULL: all do */
    fm_tensor *alive; /* bool [batch, 1]: sequence b is not empty; NULL: none is */
} rnn;

static fm_tensor *in_at(const onnx_op_ctx *c, int i) { return i < c->n_in ? c->in[i] : NULL; }
static bool out_wanted(const onnx_op_ctx *c, int i) { return i < c->n_out && c->node->output[i][0]; }

/* A 0-d tensor of value v in the layer's dtype, on its device. */
static fm_tensor *scalar(const rnn *s, double v) { return fm_tensor_full(0, NULL, v, s->dt, s->dev); }

static const char *dir_name(const rnn *s) { return s->dirs == 2 ? "bidirectional" : s->reverse ? "reverse" : "forward"; }

/* Input i: dtype X's and shape want (n dims), which `form` spells out. */
static fm_status check_input(const rnn *s, int i, int n, const int64_t *want, const char *form) {
    const fm_tensor *t = s->c->in[i];
    char got[96], want_s[96];
    if (t->dtype != s->dt)
        return onnx_node_error(s->c, FM_ERR_INVALID, "input %s is %s; it must have X's dtype %s", in_names[i],
                               fm_dtype_name(t->dtype), fm_dtype_name(s->dt));
    if (t->ndim == n && !memcmp(t->shape, want, (size_t)n * sizeof *want)) return FM_OK;
    return onnx_node_error(s->c, FM_ERR_INVALID, "input %s must be %s (%s; direction %s, hidden_size %" PRId64 ", layout %d); got %s",
                           in_names[i], fm_shape_str(n, want, want_s, sizeof want_s), form, dir_name(s), s->hid, s->layout,
                           fm_shape_str(t->ndim, t->shape, got, sizeof got));
}

static fm_status read_attrs(onnx_op_ctx *c, rnn *s) {
    char buf[32];
    const char *dir = onnx_attr_string(c, "direction", "forward", buf, sizeof buf);
    if (!strcmp(dir, "bidirectional")) s->dirs = 2;
    else if (strcmp(dir, "forward") && strcmp(dir, "reverse"))
        return onnx_node_error(c, FM_ERR_INVALID, "direction '%s' is not forward, reverse or bidirectional", dir);
    s->reverse = !strcmp(dir, "reverse");
    s->layout = (int)onnx_attr_int(c, "layout", 0);
    if (s->layout != 0 && s->layout != 1) return onnx_node_error(c, FM_ERR_INVALID, "layout %d is not 0 or 1", s->layout);
    const Onnx__AttributeProto *clip = onnx_attr(c, "clip");
    s->has_clip = clip && clip->has_f;
    s->clip = s->has_clip ? clip->f : 0;
    if (s->has_clip && !(s->clip > 0)) return onnx_node_error(c, FM_ERR_INVALID, "clip %g must be positive", s->clip);
    s->input_forget = onnx_attr_int(c, "input_forget", 0) != 0;
    s->lbr = onnx_attr_int(c, "linear_before_reset", 0) != 0;
    /* hidden_size has no default: a node without it takes R's width, as ONNX's reference does */
    const fm_tensor *r = c->in[IN_R];
    s->hid = onnx_attr_int(c, "hidden_size", r->ndim == 3 ? r->shape[2] : -1);
    if (s->hid <= 0 || s->hid > INT32_MAX)
        return onnx_node_error(c, FM_ERR_INVALID, "hidden_size %" PRId64 " must lie in [1, 2^31)", s->hid);
    return FM_OK;
}

/* activations (f, g, h per direction); alpha and beta are taken in order by the
 * functions that have one, as ONNX Runtime reads the spec's "consumed in the order of
 * activation functions". */
static fm_status read_activations(onnx_op_ctx *c, rnn *s) {
    static const rnn_act_kind dflt[3][3] = {{ACT_TANH}, {ACT_SIGMOID, ACT_TANH}, {ACT_SIGMOID, ACT_TANH, ACT_TANH}};
    int n_all = s->n_act * s->dirs;
    const Onnx__AttributeProto *a = onnx_attr(c, "activations");
    if (!a || !a->n_strings) {
        for (int k = 0; k < n_all; k++) s->act[k] = (rnn_act){dflt[s->cell][k % s->n_act], 0, 0};
        return FM_OK;
    }
    if ((int)a->n_strings != n_all)
        return onnx_node_error(c, FM_ERR_INVALID, "activations lists %zu functions; %s with direction %s takes %d", a->n_strings,
                               c->node->op_type, dir_name(s), n_all);
    const Onnx__AttributeProto *al = onnx_attr(c, "activation_alpha"), *be = onnx_attr(c, "activation_beta");
    size_t ia = 0, ib = 0;
    for (int k = 0; k < n_all; k++) {
        const ProtobufCBinaryData *nm = &a->strings[k];
        int d = 0;
        while (d < N_ACT_DEFS && (strlen(act_defs[d].name) != nm->len || strncasecmp(act_defs[d].name, (const char *)nm->data, nm->len)))
            d++;
        if (d == N_ACT_DEFS)
            return onnx_node_error(c, FM_ERR_INVALID, "activations[%d] '%.*s' is not one of Relu, Tanh, Sigmoid, Affine, LeakyRelu, "
                                   "ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus", k, (int)(nm->len > 64 ? 64 : nm->len),
                                   (const char *)nm->data);
        rnn_act *x = &s->act[k];
        *x = (rnn_act){act_defs[d].kind, act_defs[d].alpha, act_defs[d].beta};
        if ((act_defs[d].takes & TAKES_ALPHA) && al && ia < al->n_floats) x->alpha = al->floats[ia++];
        if ((act_defs[d].takes & TAKES_BETA) && be && ib < be->n_floats) x->beta = be->floats[ib++];
    }
    return FM_OK;
}

/* W, R, B, P, initial_h, initial_c against X and hidden_size. */
static fm_status check_inputs(const rnn *s) {
    int64_t gh = s->gates * s->hid, d = s->dirs;
    const int64_t *hs = s->layout ? (int64_t[]){s->batch, d, s->hid} : (int64_t[]){d, s->batch, s->hid};
    const char *hform = s->layout ? "[batch_size, num_directions, hidden_size]" : "[num_directions, batch_size, hidden_size]";
    const char *g = s->cell == CELL_LSTM ? "4*" : s->cell == CELL_GRU ? "3*" : "";
    char wf[64], rf[64], bf[64];
    snprintf(wf, sizeof wf, "[num_directions, %shidden_size, input_size]", g);
    snprintf(rf, sizeof rf, "[num_directions, %shidden_size, hidden_size]", g);
    snprintf(bf, sizeof bf, "[num_directions, %shidden_size]", s->cell == CELL_LSTM ? "8*" : s->cell == CELL_GRU ? "6*" : "2*");
    if (check_input(s, IN_W, 3, (int64_t[]){d, gh, s->in}, wf) || check_input(s, IN_R, 3, (int64_t[]){d, gh, s->hid}, rf))
        return fm_last_status();
    if (in_at(s->c, IN_B) && check_input(s, IN_B, 2, (int64_t[]){d, 2 * gh}, bf)) return fm_last_status();
    if (in_at(s->c, IN_H0) && check_input(s, IN_H0, 3, hs, hform)) return fm_last_status();
    if (in_at(s->c, IN_C0) && check_input(s, IN_C0, 3, hs, hform)) return fm_last_status();
    if (in_at(s->c, IN_P) && check_input(s, IN_P, 2, (int64_t[]){d, 3 * s->hid}, "[num_directions, 3*hidden_size]"))
        return fm_last_status();
    return FM_OK;
}

/* A bool tensor of the host values v on the layer's device. */
static fm_tensor *bool_on_dev(const rnn *s, const bool *v, int n, const int64_t *shape) {
    fm_tensor *h = fm_tensor_from_data(v, n, shape, FM_BOOL), *t = h ? fm_tensor_to(h, s->dev) : NULL;
    fm_tensor_release(h);
    return t;
}

/* sequence_lens: int32 [batch], each in [0, seq]; the masks where one is shorter. */
static fm_status read_lens(rnn *s) {
    onnx_op_ctx *c = s->c;
    s->steps = s->seq;
    fm_tensor *t = in_at(c, IN_LENS);
    if (!t) return FM_OK;
    char got[96];
    if (t->dtype != FM_I32)
        return onnx_node_error(c, FM_ERR_INVALID, "input sequence_lens must be int32; got %s", fm_dtype_name(t->dtype));
    if (t->ndim != 1 || t->shape[0] != s->batch)
        return onnx_node_error(c, FM_ERR_INVALID, "input sequence_lens must be [%" PRId64 "] ([batch_size]); got %s", s->batch,
                               fm_shape_str(t->ndim, t->shape, got, sizeof got));
    size_t nb = (size_t)s->batch, nm = (size_t)(s->seq * s->batch);
    int32_t *len = malloc(nb * sizeof *len + 1);
    bool *m = malloc((nm + nb + 1) * sizeof *m);
    fm_status st = len && m ? (nb ? fm_tensor_copy_to_host(t, len, FM_I32) : FM_OK) : fm_set_error(FM_ERR_OOM, "out of memory");
    bool shorter = false, empty = false;
    s->steps = 0;
    for (size_t b = 0; !st && b < nb; b++) {
        if (len[b] < 0 || len[b] > s->seq)
            st = onnx_node_error(c, FM_ERR_INVALID, "input sequence_lens[%zu] is %" PRId32 "; it must lie in [0, %" PRId64 "] (X's seq_length)",
                                 b, len[b], s->seq);
        else {
            shorter |= len[b] < s->seq;
            empty |= len[b] == 0;
            s->steps = len[b] > s->steps ? len[b] : s->steps;
        }
    }
    if (nb == 0) s->steps = s->seq;
    for (size_t i = 0; !st && shorter && i < nm; i++) m[i] = (int64_t)(i / nb) < len[i % nb];
    for (size_t b = 0; !st && empty && b < nb; b++) m[nm + b] = len[b] > 0;
    if (!st && shorter && !(s->mask = bool_on_dev(s, m, 3, (int64_t[]){s->seq, s->batch, 1}))) st = fm_last_status();
    if (!st && empty && !(s->alive = bool_on_dev(s, m + nm, 2, (int64_t[]){s->batch, 1}))) st = fm_last_status();
    free(len);
    free(m);
    return st;
}

static fm_status setup(onnx_op_ctx *c, rnn_cell cell, rnn *s) {
    static const int gates[] = {1, 3, 4}, n_act[] = {1, 2, 3};
    *s = (rnn){.c = c, .cell = cell, .gates = gates[cell], .n_act = n_act[cell], .dirs = 1};
    const fm_tensor *x = c->in[IN_X];
    s->dt = x->dtype;
    s->dev = x->storage->device;
    if (s->dt != FM_F32 && s->dt != FM_F64)
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "input X is %s; fathom's %s runs float32 and float64 only", fm_dtype_name(s->dt),
                               c->node->op_type);
    char got[96];
    if (x->ndim != 3)
        return onnx_node_error(c, FM_ERR_INVALID, "input X must have 3 dimensions; got %s", fm_shape_str(x->ndim, x->shape, got, sizeof got));
    if (read_attrs(c, s) || read_activations(c, s)) return fm_last_status();
    s->seq = x->shape[s->layout ? 1 : 0];
    s->batch = x->shape[s->layout ? 0 : 1];
    s->in = x->shape[2];
    return check_inputs(s) ? fm_last_status() : read_lens(s);
}

static fm_tensor *activate(const rnn *s, const rnn_act *a, fm_tensor *x) {
    fm_tensor *t = NULL, *u = NULL, *v = NULL, *y = NULL;
    switch (a->kind) {
    case ACT_RELU: return fm_relu(x);
    case ACT_TANH: return fm_tanh(x);
    case ACT_SIGMOID: return fm_sigmoid(x);
    case ACT_LEAKY_RELU: return fm_leaky_relu(x, a->alpha);
    case ACT_SOFTPLUS: return fm_softplus(x);
    case ACT_AFFINE:
        t = fm_mul_scalar(x, a->alpha);
        y = t ? fm_add_scalar(t, a->beta) : NULL;
        break;
    case ACT_SCALED_TANH:
        t = fm_mul_scalar(x, a->beta);
        u = t ? fm_tanh(t) : NULL;
        y = u ? fm_mul_scalar(u, a->alpha) : NULL;
        break;
    case ACT_HARD_SIGMOID:
        t = fm_mul_scalar(x, a->alpha);
        u = t ? fm_add_scalar(t, a->beta) : NULL;
        y = u ? fm_clamp(u, 0, 1) : NULL;
        break;
    case ACT_THRESHOLDED_RELU: /* x >= alpha, as the recurrent ops' spec writes it */
        t = scalar(s, a->alpha);
        u = t ? fm_ge(x, t) : NULL;
        v = u ? scalar(s, 0) : NULL;
        y = v ? fm_where(u, x, v) : NULL;
        break;
    case ACT_ELU: /* the exp of a large x is unused (where picks x) */
        t = scalar(s, 0);
        u = t ? fm_ge(x, t) : NULL;
        fm_tensor_release(t);
        t = u ? fm_exp(x) : NULL;
        v = t ? fm_add_scalar(t, -1.0) : NULL;
        fm_tensor_release(t);
        t = v ? fm_mul_scalar(v, a->alpha) : NULL;
        y = t ? fm_where(u, x, t) : NULL;
        break;
    case ACT_SOFTSIGN:
        t = fm_abs(x);
        u = t ? fm_add_scalar(t, 1.0) : NULL;
        y = u ? fm_div(x, u) : NULL;
        break;
    }
    REL(t, u, v);
    return y;
}

/* clip (on the input of every gate's activation, not of LSTM's h(C): ONNX Runtime's
 * reading), then the activation. */
static fm_tensor *gate_act(const rnn *s, const rnn_act *a, fm_tensor *x) {
    if (!s->has_clip) return activate(s, a, x);
    fm_tensor *cl = fm_clamp(x, -s->clip, s->clip), *y = cl ? activate(s, a, cl) : NULL;
    fm_tensor_release(cl);
    return y;
}

/* One direction's weights and running state. */
typedef struct rnn_dir {
    fm_tensor *xw;     /* [seq, batch, gates*hid]: X W^T + the biases folded into it */
    fm_tensor *r;      /* [gates*hid, hid] */
    fm_tensor *r_zr, *r_h; /* GRU: R's update/reset rows and its hidden rows */
    fm_tensor *rb;     /* GRU with linear_before_reset: Rb [3*hid], added to H R^T; else NULL */
    fm_tensor *p;      /* LSTM: P [3*hid] or NULL */
    fm_tensor *rpack;  /* LSTM, GRU with linear_before_reset: R in fm_linear_fused's panel form (f32 on the CPU,
                        * batch >= 8), made once per run; else NULL */
    const rnn_act *act;
    fm_tensor *h, *cs; /* the state [batch, hid] */
} rnn_dir;

/* g (the gates' pre-activations)'s block k, plus the peephole block pk of P times cs
 * where P is given, through activation a. */
static fm_tensor *lstm_gate(const rnn *s, const rnn_dir *d, const rnn_act *a, fm_tensor *g, int k, int pk, fm_tensor *cs) {
    fm_tensor *pre = fm_narrow(g, 1, k * s->hid, s->hid), *pp = NULL, *m = NULL, *sum = NULL;
    if (pre && d->p && pk >= 0) {
        pp = fm_narrow(d->p, 0, pk * s->hid, s->hid);
        m = pp ? fm_mul(pp, cs) : NULL;
        sum = m ? fm_add(pre, m) : NULL;
    }
    fm_tensor *y = pre && (sum || !d->p || pk < 0) ? gate_act(s, a, sum ? sum : pre) : NULL;
    REL(pre, pp, m, sum);
    return y;
}

/* The default activations (sigmoid, tanh, tanh), no clip, peepholes or input_forget: the step
 * after its matmul is fm_lstm_cell, one pass (what exported nn.LSTMs are). */
static bool lstm_plain(const rnn *s, const rnn_dir *d) {
    return !s->has_clip && !s->input_forget && !d->p && (s->dt == FM_F32 || s->dt == FM_F64) && d->act[0].kind == ACT_SIGMOID &&
           d->act[1].kind == ACT_TANH && d->act[2].kind == ACT_TANH;
}

/* W's gate order is i, o, f, c; P's i, o, f. input_forget couples f = 1 - i. */
static fm_status lstm_step(const rnn *s, rnn_dir *d, fm_tensor *xt, fm_tensor **hn, fm_tensor **cn) {
    fm_tensor *hr = d->rpack ? fm_linear_fused(d->h, d->r, NULL, d->rpack, false) : fm_linear(d->h, d->r, NULL), *g = NULL;
    if (hr && lstm_plain(s, d)) {
        *hn = fm_lstm_cell(xt, hr, d->cs, cn);
        fm_tensor_release(hr);
        return *hn ? FM_OK : fm_last_status();
    }
    g = hr ? fm_add(xt, hr) : NULL;
    fm_tensor_release(hr);
    fm_tensor *i = g ? lstm_gate(s, d, &d->act[0], g, 0, 0, d->cs) : NULL, *f = NULL, *ni = NULL;
    if (i && s->input_forget) {
        ni = fm_neg(i);
        f = ni ? fm_add_scalar(ni, 1.0) : NULL;
    } else if (i) f = lstm_gate(s, d, &d->act[0], g, 2, 2, d->cs);
    fm_tensor *cc = f ? lstm_gate(s, d, &d->act[1], g, 3, -1, NULL) : NULL;
    fm_tensor *fc = cc ? fm_mul(f, d->cs) : NULL, *ic = fc ? fm_mul(i, cc) : NULL;
    fm_tensor *c = ic ? fm_add(fc, ic) : NULL;
    fm_tensor *o = c ? lstm_gate(s, d, &d->act[0], g, 1, 1, c) : NULL;
    fm_tensor *hc = o ? activate(s, &d->act[2], c) : NULL, *h = hc ? fm_mul(o, hc) : NULL;
    REL(g, i, f, ni, cc, fc, ic, o, hc);
    if (!h) {
        fm_tensor_release(c);
        return fm_last_status();
    }
    *hn = h;
    *cn = c;
    return FM_OK;
}

/* W's gate order is z, r, h. linear_before_reset applies r after H Rh^T + Rbh. With it (what
 * nn.GRU exports), the default activations and no clip, the step after its matmul is fm_gru_cell. */
static fm_status gru_step(const rnn *s, rnn_dir *d, fm_tensor *xt, fm_tensor **hn) {
    int64_t hid = s->hid;
    fm_tensor *hr = NULL, *hr_zr = NULL, *rh = NULL, *q = NULL;
    if (s->lbr) {
        hr = d->rpack ? fm_linear_fused(d->h, d->r, d->rb, d->rpack, false) : fm_linear(d->h, d->r, d->rb);
        if (hr && !s->has_clip && (s->dt == FM_F32 || s->dt == FM_F64) && d->act[0].kind == ACT_SIGMOID && d->act[1].kind == ACT_TANH) {
            *hn = fm_gru_cell(xt, hr, d->h);
            fm_tensor_release(hr);
            return *hn ? FM_OK : fm_last_status();
        }
        hr_zr = hr ? fm_narrow(hr, 1, 0, 2 * hid) : NULL;
    } else hr_zr = fm_linear(d->h, d->r_zr, NULL);
    fm_tensor *x_zr = hr_zr ? fm_narrow(xt, 1, 0, 2 * hid) : NULL, *g = x_zr ? fm_add(x_zr, hr_zr) : NULL;
    fm_tensor *zr = g ? gate_act(s, &d->act[0], g) : NULL;
    fm_tensor *z = zr ? fm_narrow(zr, 1, 0, hid) : NULL, *r = z ? fm_narrow(zr, 1, hid, hid) : NULL;
    if (r && s->lbr) {
        rh = fm_narrow(hr, 1, 2 * hid, hid);
        q = rh ? fm_mul(r, rh) : NULL;
    } else if (r) {
        rh = fm_mul(r, d->h);
        q = rh ? fm_linear(rh, d->r_h, NULL) : NULL;
    }
    fm_tensor *x_h = q ? fm_narrow(xt, 1, 2 * hid, hid) : NULL, *pre = x_h ? fm_add(x_h, q) : NULL;
    fm_tensor *ht = pre ? gate_act(s, &d->act[1], pre) : NULL;
    /* (1 - z) ht + z H = ht + z (H - ht) */
    fm_tensor *df = ht ? fm_sub(d->h, ht) : NULL, *zd = df ? fm_mul(z, df) : NULL;
    *hn = zd ? fm_add(ht, zd) : NULL;
    REL(hr, hr_zr, rh, q, x_zr, g, zr, z, r, x_h, pre, ht, df, zd);
    return *hn ? FM_OK : fm_last_status();
}

static fm_status rnn_step(const rnn *s, rnn_dir *d, fm_tensor *xt, fm_tensor **hn) {
    fm_tensor *hr = fm_linear(d->h, d->r, NULL), *g = hr ? fm_add(xt, hr) : NULL;
    *hn = g ? gate_act(s, &d->act[0], g) : NULL;
    REL(hr, g);
    return *hn ? FM_OK : fm_last_status();
}

/* m ? a : b, replacing *b; a is released. */
static fm_status keep_where(fm_tensor *m, fm_tensor *a, fm_tensor **b) {
    fm_tensor *y = m ? fm_where(m, a, *b) : fm_tensor_retain(a);
    REL(a, *b);
    *b = y;
    return y ? FM_OK : fm_last_status();
}

/* Step t of direction d: the state moves on where t lies within the sequence. */
static fm_status step(const rnn *s, rnn_dir *d, int64_t t) {
    fm_tensor *xt = fm_select(d->xw, 0, t), *hn = NULL, *cn = NULL;
    if (!xt) return fm_last_status();
    fm_status st = s->cell == CELL_LSTM ? lstm_step(s, d, xt, &hn, &cn) : s->cell == CELL_GRU ? gru_step(s, d, xt, &hn) : rnn_step(s, d, xt, &hn);
    fm_tensor_release(xt);
    if (st) return st;
    fm_tensor *m = s->mask ? fm_select(s->mask, 0, t) : NULL;
    if (s->mask && !m) {
        REL(hn, cn);
        return fm_last_status();
    }
    st = keep_where(m, hn, &d->h);
    if (cn && st) fm_tensor_release(cn);
    else if (cn) st = keep_where(m, cn, &d->cs);
    fm_tensor_release(m);
    return st;
}

/* initial_h/initial_c's direction d, or zeros. */
static fm_tensor *initial(const rnn *s, int i, int d) {
    fm_tensor *t = in_at(s->c, i);
    return t ? fm_select(t, s->layout ? 1 : 0, d) : fm_tensor_zeros(2, (int64_t[]){s->batch, s->hid}, s->dt, s->dev);
}

/* Direction d's views of W R^T, R, B, P and its initial state. */
static fm_status dir_init(const rnn *s, fm_tensor *xw, int d, rnn_dir *r) {
    onnx_op_ctx *c = s->c;
    int64_t gh = s->gates * s->hid;
    *r = (rnn_dir){.act = &s->act[d * s->n_act]};
    r->xw = fm_narrow(xw, 2, d * gh, gh);
    r->r = r->xw ? fm_select(c->in[IN_R], 0, d) : NULL;
    /* the packed product: 1.70 -> 1.45 ms for a 2-layer nn.LSTM at batch 32 (Zen 5); at batch 1
     * the GEMV of fm_linear is faster (0.20 against 0.23 ms) */
    const bool packs = s->cell == CELL_LSTM || (s->cell == CELL_GRU && s->lbr);
    if (r->r && s->dt == FM_F32 && s->dev.type == FM_DEV_CPU && packs && s->batch >= 8 && !(r->rpack = fm_linear_fused_pack(r->r)))
        return fm_last_status();
    if (!r->r) return fm_last_status();
    if (s->cell == CELL_GRU && (!(r->r_zr = fm_narrow(r->r, 0, 0, 2 * s->hid)) || !(r->r_h = fm_narrow(r->r, 0, 2 * s->hid, s->hid))))
        return fm_last_status();
    if (s->cell == CELL_GRU && s->lbr && in_at(c, IN_B)) {
        fm_tensor *rb = fm_narrow(c->in[IN_B], 1, gh, gh), *rbd = rb ? fm_select(rb, 0, d) : NULL;
        r->rb = rbd ? fm_contiguous(rbd) : NULL;
        REL(rb, rbd);
        if (!r->rb) return fm_last_status();
    }
    if (s->cell == CELL_LSTM && in_at(c, IN_P) && !(r->p = fm_select(c->in[IN_P], 0, d))) return fm_last_status();
    if (!(r->h = initial(s, IN_H0, d))) return fm_last_status();
    if (s->cell == CELL_LSTM && !(r->cs = initial(s, IN_C0, d))) return fm_last_status();
    return FM_OK;
}

/* Runs direction d over the steps; ys[t dirs + d] receives each step's H when ys is
 * given; *h and *cs the final state. */
static fm_status run_dir(const rnn *s, fm_tensor *xw, int d, fm_tensor **ys, fm_tensor **h, fm_tensor **cs) {
    rnn_dir r;
    fm_status st = dir_init(s, xw, d, &r);
    bool back = s->reverse || d == 1;
    for (int64_t k = 0; !st && k < s->steps; k++) {
        int64_t t = back ? s->steps - 1 - k : k;
        st = step(s, &r, t);
        if (!st && ys) ys[t * s->dirs + d] = fm_tensor_retain(r.h);
    }
    REL(r.xw, r.r, r.r_zr, r.r_h, r.rb, r.p, r.rpack);
    if (st) {
        REL(r.h, r.cs);
        return st;
    }
    *h = r.h;
    *cs = r.cs;
    return FM_OK;
}

/* X W^T + the biases that do not wait for the reset gate, for every step and
 * direction in one matmul: [seq, batch, dirs * gates * hid]. */
static fm_tensor *input_proj(const rnn *s) {
    onnx_op_ctx *c = s->c;
    int64_t gh = s->gates * s->hid, n = s->dirs * gh;
    fm_tensor *x = s->layout ? fm_transpose(c->in[IN_X], 0, 1) : fm_tensor_retain(c->in[IN_X]);
    fm_tensor *w = x ? fm_reshape(c->in[IN_W], 2, (int64_t[]){n, s->in}) : NULL, *wb = NULL, *rb = NULL, *sum = NULL, *bias = NULL;
    fm_tensor *b = in_at(c, IN_B);
    if (w && b) {
        wb = fm_narrow(b, 1, 0, gh);
        rb = wb && !(s->cell == CELL_GRU && s->lbr) ? fm_narrow(b, 1, gh, gh) : NULL;
        sum = rb ? fm_add(wb, rb) : wb ? fm_contiguous(wb) : NULL;
        bias = sum ? fm_reshape(sum, 1, &n) : NULL;
    }
    fm_tensor *y = w && (bias || !b) ? fm_linear(x, w, bias) : NULL;
    REL(x, w, wb, rb, sum, bias);
    return y;
}

/* A direction's state [batch, hid] where its sequence is not empty, else 0 (replacing *t). */
static fm_status zero_empty(const rnn *s, fm_tensor **t) {
    if (!s->alive) return FM_OK;
    fm_tensor *z = scalar(s, 0), *y = z ? fm_where(s->alive, *t, z) : NULL;
    REL(z, *t);
    *t = y;
    return y ? FM_OK : fm_last_status();
}

/* The directions' final states [batch, hid] as Y_h/Y_c (output i). */
static fm_status state_out(const rnn *s, int i, fm_tensor **st) {
    for (int d = 0; d < s->dirs; d++)
        if (zero_empty(s, &st[d])) return fm_last_status();
    fm_tensor *y = fm_stack(s->dirs, st, s->layout ? 1 : 0);
    if (!y) return fm_last_status();
    fm_tensor *yc = fm_contiguous(y);
    fm_tensor_release(y);
    return onnx_set_out(s->c, i, yc);
}

/* ys [seq dirs] (steps past the longest sequence left NULL) as Y. */
static fm_status y_out(const rnn *s, fm_tensor **ys) {
    int64_t n = s->seq * s->dirs;
    if (n == 0)
        return onnx_set_out(s->c, 0, fm_tensor_zeros(4, s->layout ? (int64_t[]){s->batch, 0, s->dirs, s->hid} : (int64_t[]){0, s->dirs, s->batch, s->hid},
                                                    s->dt, s->dev));
    fm_tensor *zero = s->steps < s->seq ? fm_tensor_zeros(2, (int64_t[]){s->batch, s->hid}, s->dt, s->dev) : NULL;
    if (s->steps < s->seq && !zero) return fm_last_status();
    for (int64_t k = 0; k < n; k++)
        if (!ys[k]) ys[k] = fm_tensor_retain(zero);
    fm_tensor_release(zero);
    fm_tensor *st = n <= INT32_MAX ? fm_stack((int)n, ys, 0) : NULL;
    if (!st) return n <= INT32_MAX ? fm_last_status() : onnx_node_error(s->c, FM_ERR_UNSUPPORTED, "seq_length too large");
    fm_tensor *y = fm_view(st, 4, (int64_t[]){s->seq, s->dirs, s->batch, s->hid}), *m = NULL, *z = NULL, *ym = NULL;
    fm_tensor_release(st);
    if (y && s->mask) {
        m = fm_unsqueeze(s->mask, 1);
        z = m ? scalar(s, 0) : NULL;
        ym = z ? fm_where(m, y, z) : NULL;
        REL(y, m, z);
        y = ym;
    }
    if (y && s->layout) {
        fm_tensor *p = fm_permute(y, (int[]){2, 0, 1, 3}), *pc = p ? fm_contiguous(p) : NULL;
        REL(y, p);
        y = pc;
    }
    return onnx_set_out(s->c, 0, y);
}

static fm_status run_layer(rnn *s) {
    onnx_op_ctx *c = s->c;
    int64_t n = s->seq * s->dirs;
    fm_tensor **ys = out_wanted(c, 0) ? calloc((size_t)n + 1, sizeof *ys) : NULL;
    if (out_wanted(c, 0) && !ys) return fm_set_error(FM_ERR_OOM, "out of memory");
    fm_tensor *xw = input_proj(s), *h[2] = {0}, *cs[2] = {0};
    fm_status st = xw ? FM_OK : fm_last_status();
    for (int d = 0; !st && d < s->dirs; d++) st = run_dir(s, xw, d, ys, &h[d], &cs[d]);
    fm_tensor_release(xw);
    if (!st && ys) st = y_out(s, ys);
    if (!st && out_wanted(c, 1)) st = state_out(s, 1, h);
    if (!st && out_wanted(c, 2)) st = state_out(s, 2, cs);
    for (int64_t k = 0; ys && k < n; k++) fm_tensor_release(ys[k]);
    free(ys);
    REL(h[0], h[1], cs[0], cs[1]);
    return st;
}

static fm_status run(onnx_op_ctx *c, rnn_cell cell) {
    rnn s;
    fm_status st = setup(c, cell, &s);
    if (!st) st = run_layer(&s);
    REL(s.mask, s.alive);
    return st;
}

static fm_status op_lstm(onnx_op_ctx *c) { return run(c, CELL_LSTM); }
static fm_status op_gru(onnx_op_ctx *c) { return run(c, CELL_GRU); }
static fm_status op_rnn(onnx_op_ctx *c) { return run(c, CELL_RNN); }

/* output_sequence (opsets 1-6) only said whether Y is given, which the outputs say. */
#define RNN_ATTRS "activation_alpha,activation_beta,activations,clip,direction,hidden_size,layout,output_sequence"
const onnx_op onnx_ops_rnn[] = {
    {"LSTM", 1, 3, 8, 3, RNN_ATTRS ",input_forget", op_lstm},
    {"GRU", 1, 3, 6, 2, RNN_ATTRS ",linear_before_reset", op_gru},
    {"RNN", 1, 3, 6, 2, RNN_ATTRS, op_rnn},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
