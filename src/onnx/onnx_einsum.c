/* ONNX Einsum as fathom ops: each operand's repeated labels become a diagonal (an
 * index_select of the flattened pair), labels no later operand or the output needs are summed
 * out, and each pair of operands becomes one batched matmul between permutes and reshapes.
 * The plan is made here once; the steps go through onnx_einsum_exec, which the interpreter
 * runs on tensors (below) and the graph form emits as nodes (onnx_graph_ops.c). */
#include "onnx/onnx_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Labels: 'a'..'z' and 'A'..'Z' as their characters; the ellipsis' dims as 128 + i. */
#define ES_ELL 128

static bool is_label(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }

/* One term ("ij", "...k", "") into labels, with e ellipsis dims right-aligned to E. */
static fm_status parse_term(const char *s, size_t n, int rank, int E, int *lab, int *nd, int *ell) {
    int named = 0, dots = -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '.') {
            if (i + 3 > n || strncmp(s + i, "...", 3) || dots >= 0) return fm_set_error(FM_ERR_INVALID, "a '.' outside one '...' per term");
            dots = named, i += 2;
        } else if (is_label(s[i])) named++;
        else if (s[i] != ' ') return fm_set_error(FM_ERR_INVALID, "'%c' is not a label (a-z, A-Z) or '...'", s[i]);
    }
    const int e = dots >= 0 ? rank - named : 0;
    if (rank >= 0 && (e < 0 || (dots < 0 && named != rank)))
        return fm_set_error(FM_ERR_INVALID, "term '%.*s' names %d dims but its operand has %d", (int)n, s, named, rank);
    if (named + e > FM_MAX_DIMS) return fm_set_error(FM_ERR_INVALID, "term '%.*s' has too many dims", (int)n, s);
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '.') {
            for (int j = 0; j < (rank >= 0 ? e : E); j++) lab[k++] = ES_ELL + j; /* inputs' shifted to E by the caller */
            i += 2;
        } else if (is_label(s[i])) lab[k++] = (unsigned char)s[i];
    }
    *nd = k;
    if (ell) *ell = e;
    return FM_OK;
}

static int count_of(const onnx_einsum *p, int l) {
    int c = 0;
    for (int i = 0; i < p->n_in; i++)
        for (int d = 0; d < p->nd[i]; d++) c += p->lab[i][d] == l;
    return c;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* The implicit output: the ellipsis' dims, then the labels used once, in character order. */
static void implicit_output(onnx_einsum *p, int E) {
    p->nout = 0;
    for (int j = 0; j < E; j++) p->out[p->nout++] = ES_ELL + j;
    int once[64], n = 0;
    for (int l = 'A'; l <= 'z'; l++)
        if (is_label((char)l) && count_of(p, l) == 1) once[n++] = l;
    qsort(once, (size_t)n, sizeof *once, cmp_int);
    for (int i = 0; i < n && p->nout < FM_MAX_DIMS; i++) p->out[p->nout++] = once[i];
}

fm_status onnx_einsum_parse(const char *eq, int n_in, const int *ranks, onnx_einsum *p) {
    memset(p, 0, sizeof *p);
    if (n_in < 1 || n_in > ONNX_EINSUM_MAX_IN) return fm_set_error(FM_ERR_INVALID, "takes 1 to %d operands", ONNX_EINSUM_MAX_IN);
    const char *arrow = strstr(eq, "->"), *end = arrow ? arrow : eq + strlen(eq), *s = eq;
    int E = 0, ell[ONNX_EINSUM_MAX_IN];
    p->n_in = n_in;
    for (int i = 0; i < n_in; i++) {
        const char *c = memchr(s, ',', (size_t)(end - s));
        if ((i < n_in - 1) != (c != NULL)) return fm_set_error(FM_ERR_INVALID, "'%s' has not %d terms for %d operands", eq, n_in, n_in);
        const char *te = c ? c : end;
        if (parse_term(s, (size_t)(te - s), ranks[i], 0, p->lab[i], &p->nd[i], &ell[i])) return fm_last_status();
        if (ell[i] > E) E = ell[i];
        s = te + 1;
    }
    for (int i = 0; i < n_in; i++) /* right-align every operand's ellipsis to the widest */
        for (int d = 0; d < p->nd[i]; d++)
            if (p->lab[i][d] >= ES_ELL) p->lab[i][d] += E - ell[i];
    if (!arrow) {
        implicit_output(p, E);
        return FM_OK;
    }
    if (parse_term(arrow + 2, strlen(arrow + 2), -1, E, p->out, &p->nout, NULL)) return fm_last_status();
    for (int k = 0; k < p->nout; k++) {
        for (int j = 0; j < k; j++)
            if (p->out[j] == p->out[k]) return fm_set_error(FM_ERR_INVALID, "output label '%c' appears twice", p->out[k]);
        if (p->out[k] < ES_ELL && !count_of(p, p->out[k]))
            return fm_set_error(FM_ERR_INVALID, "output label '%c' is in no operand", p->out[k]);
    }
    return FM_OK;
}

/* ---- running the plan ---- */

typedef struct es_val {
    int nd;
    int lab[FM_MAX_DIMS];
    int64_t sz[FM_MAX_DIMS];
    void *h;
} es_val;

static bool has(const int *l, int n, int x) {
    for (int i = 0; i < n; i++)
        if (l[i] == x) return true;
    return false;
}

static fm_status step(const onnx_einsum_exec *x, es_val *v, void *nh) {
    if (!nh) return fm_last_status() ? fm_last_status() : fm_set_error(FM_ERR_INTERNAL, "a step failed");
    x->release(x->ctx, v->h);
    v->h = nh;
    return FM_OK;
}

static fm_status permute_to(const onnx_einsum_exec *x, es_val *v, const int *order) {
    bool id = true;
    for (int d = 0; d < v->nd; d++) id &= order[d] == d;
    if (id) return FM_OK;
    es_val w = *v;
    for (int d = 0; d < v->nd; d++) w.lab[d] = v->lab[order[d]], w.sz[d] = v->sz[order[d]];
    if (step(x, v, x->permute(x->ctx, v->h, v->nd, order))) return fm_last_status();
    memcpy(v->lab, w.lab, sizeof w.lab), memcpy(v->sz, w.sz, sizeof w.sz);
    return FM_OK;
}

/* The first label that appears twice in v becomes one dim (the diagonal), moved last. */
static fm_status take_diagonal(const onnx_einsum_exec *x, es_val *v, int d1, int d2) {
    if (v->sz[d1] != v->sz[d2])
        return fm_set_error(FM_ERR_INVALID, "label '%c' has sizes %lld and %lld in one operand", v->lab[d1], (long long)v->sz[d1], (long long)v->sz[d2]);
    int order[FM_MAX_DIMS], k = 0;
    for (int d = 0; d < v->nd; d++)
        if (d != d1 && d != d2) order[k++] = d;
    order[k++] = d1, order[k++] = d2;
    if (permute_to(x, v, order)) return fm_last_status();
    const int64_t n = v->sz[v->nd - 1];
    if (step(x, v, x->diag(x->ctx, v->h, v->nd, v->sz, n))) return fm_last_status();
    v->nd--;
    return FM_OK;
}

/* Diagonals of repeated labels, then sums over labels not in keep. */
static fm_status reduce_single(const onnx_einsum_exec *x, es_val *v, const int *keep, int nkeep) {
    for (bool again = true; again;) {
        again = false;
        for (int a = 0; a < v->nd && !again; a++)
            for (int b = a + 1; b < v->nd && !again; b++)
                if (v->lab[a] == v->lab[b]) {
                    if (take_diagonal(x, v, a, b)) return fm_last_status();
                    again = true;
                }
    }
    int axes[FM_MAX_DIMS], n = 0, k = 0;
    for (int d = 0; d < v->nd; d++)
        if (!has(keep, nkeep, v->lab[d])) axes[n++] = d;
    if (!n) return FM_OK;
    if (step(x, v, x->sum(x->ctx, v->h, v->nd, v->sz, n, axes))) return fm_last_status();
    for (int d = 0; d < v->nd; d++)
        if (!has(axes, n, d)) v->lab[k] = v->lab[d], v->sz[k++] = v->sz[d];
    v->nd = k;
    return FM_OK;
}

/* v's dims ordered batch, free, contracted (B: batch, contracted, free), expanded where the
 * other operand's label is larger (a size-1 broadcast), reshaped to [batch, M, K] (B: [batch,
 * K, N]); v's labels and sizes stay those of the ordered dims, *rows gets M (B: N). */
static fm_status to_matrix(const onnx_einsum_exec *x, es_val *v, const es_val *o, const int *bt, int nb, const int *ct, int nc, bool is_a,
                           int64_t *rows) {
    int order[FM_MAX_DIMS], k = 0;
    for (int i = 0; i < nb; i++)
        for (int d = 0; d < v->nd; d++)
            if (v->lab[d] == bt[i]) order[k++] = d;
    for (int pass = 0; pass < 2; pass++) /* A: free then contracted; B: contracted then free */
        for (int d = 0; d < v->nd; d++)
            if (!has(bt, nb, v->lab[d]) && has(ct, nc, v->lab[d]) == (pass == (is_a ? 1 : 0))) order[k++] = d;
    if (permute_to(x, v, order)) return fm_last_status();
    int64_t want[FM_MAX_DIMS];
    bool grow = false;
    for (int d = 0; d < v->nd; d++) {
        want[d] = v->sz[d];
        for (int e = 0; e < o->nd; e++)
            if (o->lab[e] == v->lab[d] && o->sz[e] != v->sz[d]) {
                if (v->sz[d] != 1 && o->sz[e] != 1)
                    return fm_set_error(FM_ERR_INVALID, "label '%c' has sizes %lld and %lld", v->lab[d] < ES_ELL ? v->lab[d] : '.',
                                        (long long)v->sz[d], (long long)o->sz[e]);
                if (v->sz[d] == 1) want[d] = o->sz[e], grow = true;
            }
    }
    if (grow) {
        if (step(x, v, x->expand(x->ctx, v->h, v->nd, v->sz, want))) return fm_last_status();
        memcpy(v->sz, want, sizeof want);
    }
    int64_t m = 1, kk = 1, sh[FM_MAX_DIMS];
    for (int d = nb; d < v->nd; d++) *(has(ct, nc, v->lab[d]) ? &kk : &m) *= v->sz[d];
    for (int d = 0; d < nb; d++) sh[d] = v->sz[d];
    sh[nb] = is_a ? m : kk, sh[nb + 1] = is_a ? kk : m;
    *rows = m;
    return step(x, v, x->reshape(x->ctx, v->h, v->nd, v->sz, nb + 2, sh, nb));
}

/* a and b into one value (in a) with the batch, a's free and b's free labels. */
static fm_status contract(const onnx_einsum_exec *x, es_val *a, es_val *b, const int *need, int nneed) {
    int bt[FM_MAX_DIMS], ct[FM_MAX_DIMS], nb = 0, nc = 0;
    for (int d = 0; d < a->nd; d++)
        if (has(b->lab, b->nd, a->lab[d])) {
            if (has(need, nneed, a->lab[d])) bt[nb++] = a->lab[d];
            else ct[nc++] = a->lab[d];
        }
    int64_t M, N;
    if (to_matrix(x, a, b, bt, nb, ct, nc, true, &M) || to_matrix(x, b, a, bt, nb, ct, nc, false, &N)) return fm_last_status();
    es_val r = {.nd = 0};
    int64_t cur[FM_MAX_DIMS];
    for (int i = 0; i < nb; i++) r.lab[r.nd] = bt[i], cur[i] = r.sz[r.nd++] = a->sz[i];
    cur[nb] = M, cur[nb + 1] = N;
    for (int pass = 0; pass < 2; pass++) {
        const es_val *f = pass ? b : a;
        for (int d = nb; d < f->nd; d++)
            if (!has(ct, nc, f->lab[d])) r.lab[r.nd] = f->lab[d], r.sz[r.nd++] = f->sz[d];
    }
    void *y = x->matmul(x->ctx, a->h, b->h), *z = y ? x->reshape(x->ctx, y, nb + 2, cur, r.nd, r.sz, nb) : NULL;
    if (y) x->release(x->ctx, y);
    if (!z) return fm_last_status();
    x->release(x->ctx, a->h);
    x->release(x->ctx, b->h);
    b->h = NULL;
    r.h = z;
    *a = r;
    return FM_OK;
}

/* Labels the output or the operands j > after other than skip use. */
static int needed(const onnx_einsum *p, const es_val *v, int after, int skip, int *need) {
    int n = 0;
    for (int k = 0; k < p->nout; k++) need[n++] = p->out[k];
    for (int j = after + 1; j < p->n_in; j++)
        for (int d = 0; j != skip && d < v[j].nd; d++)
            if (!has(need, n, v[j].lab[d])) need[n++] = v[j].lab[d];
    return n;
}

void *onnx_einsum_run(const onnx_einsum *p, const onnx_einsum_exec *x, void *const *in, const int64_t *const *shapes) {
    es_val v[ONNX_EINSUM_MAX_IN];
    int need[FM_MAX_DIMS * (ONNX_EINSUM_MAX_IN + 1)], order[FM_MAX_DIMS];
    for (int i = 0; i < p->n_in; i++) {
        v[i].nd = p->nd[i], v[i].h = x->retain(x->ctx, in[i]);
        memcpy(v[i].lab, p->lab[i], sizeof v[i].lab);
        memcpy(v[i].sz, shapes[i], sizeof(int64_t) * (size_t)p->nd[i]);
    }
    fm_status st = FM_OK;
    for (int i = 0; i < p->n_in && !st; i++) st = reduce_single(x, &v[i], need, needed(p, v, -1, i, need)); /* what no one else needs */
    for (int i = 1; i < p->n_in && !st; i++) st = contract(x, &v[0], &v[i], need, needed(p, v, i, -1, need));
    if (!st) st = reduce_single(x, &v[0], p->out, p->nout);
    for (int k = 0; k < p->nout && !st; k++) {
        order[k] = -1;
        for (int d = 0; d < v[0].nd; d++)
            if (v[0].lab[d] == p->out[k]) order[k] = d;
        if (order[k] < 0) st = fm_set_error(FM_ERR_INVALID, "output label '%c' is in no operand", p->out[k] < ES_ELL ? p->out[k] : '.');
    }
    if (!st) st = permute_to(x, &v[0], order);
    for (int i = st ? 0 : 1; i < p->n_in; i++)
        if (v[i].h) x->release(x->ctx, v[i].h);
    return st ? NULL : v[0].h;
}

/* ---- the interpreter's executor: fathom ops on tensors ---- */

static void *t_retain(void *c, void *h) { (void)c; return fm_tensor_retain(h); }
static void t_release(void *c, void *h) { (void)c; fm_tensor_release(h); }
static void *t_permute(void *c, void *h, int nd, const int *perm) { (void)c, (void)nd; return fm_permute(h, perm); }
static void *t_reshape(void *c, void *h, int nd, const int64_t *sz, int n, const int64_t *sh, int nkeep) {
    (void)c, (void)nd, (void)sz, (void)nkeep;
    return fm_reshape(h, n, sh);
}
static void *t_sum(void *c, void *h, int nd, const int64_t *sz, int n, const int *axes) {
    (void)c, (void)nd, (void)sz;
    return fm_sum(h, n, axes, false);
}
static void *t_matmul(void *c, void *a, void *b) { (void)c; return fm_matmul(a, b); }
static void *t_expand(void *c, void *h, int nd, const int64_t *sz, const int64_t *want) { (void)c, (void)sz; return fm_expand(h, nd, want); }

/* The last two dims (n, n) to their diagonal (n): flattened, every (n + 1)-th element. */
static void *t_diag(void *c, void *h, int nd, const int64_t *sz, int64_t n) {
    (void)c;
    int64_t sh[FM_MAX_DIMS];
    memcpy(sh, sz, sizeof(int64_t) * (size_t)nd);
    sh[nd - 2] = n * n;
    fm_tensor *f = fm_reshape(h, nd - 1, sh), *ar = fm_tensor_arange(0, (double)(n * n), (double)(n + 1), FM_I64);
    fm_tensor *ad = ar ? fm_tensor_to(ar, ((fm_tensor *)h)->storage->device) : NULL, *y = f && ad ? fm_index_select(f, nd - 2, ad) : NULL;
    fm_tensor_release_n(3, f, ar, ad);
    return y;
}

static const onnx_einsum_exec tensor_exec = {NULL, t_retain, t_release, t_permute, t_reshape, t_sum, t_matmul, t_expand, t_diag};

fm_status onnx_op_einsum(onnx_op_ctx *c) {
    char eq[256];
    if (!onnx_attr_string(c, "equation", NULL, eq, sizeof eq)) return onnx_node_error(c, FM_ERR_INVALID, "needs the equation attribute");
    int ranks[ONNX_EINSUM_MAX_IN];
    const int64_t *shapes[ONNX_EINSUM_MAX_IN];
    if (c->n_in > ONNX_EINSUM_MAX_IN) return onnx_node_error(c, FM_ERR_UNSUPPORTED, "more than %d operands", ONNX_EINSUM_MAX_IN);
    for (int i = 0; i < c->n_in; i++) {
        ranks[i] = c->in[i]->ndim, shapes[i] = c->in[i]->shape;
        if (c->in[i]->dtype != c->in[0]->dtype) return onnx_node_error(c, FM_ERR_INVALID, "operands have different dtypes");
    }
    onnx_einsum p;
    if (onnx_einsum_parse(eq, c->n_in, ranks, &p)) return fm_last_status();
    return onnx_set_out(c, 0, onnx_einsum_run(&p, &tensor_exec, (void *const *)c->in, shapes));
}
