/* Dim expressions: sizes written over the graph's dynamic dim names, as a
 * reshape's target needs when the batch or the sequence length varies
 * ("batch*seq", "past+seq", "2*seq", "seq-1"). Grammar: terms joined by + or -,
 * each a product (*) of integers and names; whitespace is ignored. */
#include <ctype.h>
#include <string.h>

#include "graph/graph_internal.h"

typedef struct ep { const fm_graph *g; const char *s, *p; const int64_t *vals; } ep;

static void skip_ws(ep *e) { while (*e->p == ' ') e->p++; }

static fm_status bad(const ep *e, const char *why) {
    return fm_set_error(FM_ERR_INVALID, "dim expression '%s': %s at offset %d", e->s, why, (int)(e->p - e->s));
}

static fm_status factor(ep *e, int64_t *out) {
    skip_ws(e);
    if (isdigit((unsigned char)*e->p)) {
        int64_t v = 0;
        while (isdigit((unsigned char)*e->p)) {
            if (v > (INT64_C(1) << 40)) return bad(e, "number too large");
            v = v * 10 + (*e->p++ - '0');
        }
        *out = v;
        return FM_OK;
    }
    if (isalpha((unsigned char)*e->p) || *e->p == '_') {
        char name[65];
        int n = 0;
        while (isalnum((unsigned char)*e->p) || *e->p == '_') {
            if (n == 64) return bad(e, "name longer than 64 characters");
            name[n++] = *e->p++;
        }
        name[n] = 0;
        int s = g_find_sym(e->g, name);
        if (s < 0) return fm_set_error(FM_ERR_INVALID, "dim expression '%s': '%s' is not a dynamic dim of any graph input", e->s, name);
        *out = e->vals ? e->vals[s] : 1;
        return FM_OK;
    }
    return bad(e, *e->p ? "expected a number or a name" : "unexpected end");
}

static fm_status term(ep *e, int64_t *out) {
    fm_status st = factor(e, out);
    if (st != FM_OK) return st;
    for (;;) {
        skip_ws(e);
        if (*e->p != '*') return FM_OK;
        e->p++;
        int64_t f;
        if ((st = factor(e, &f)) != FM_OK) return st;
        if (__builtin_mul_overflow(*out, f, out) || *out > (INT64_C(1) << 50)) return bad(e, "size overflows");
    }
}

static fm_status parse(ep *e, int64_t *out) {
    if (!e->s || strlen(e->s) > 256) return fm_set_error(FM_ERR_INVALID, "dim expression missing or longer than 256 characters");
    e->p = e->s;
    fm_status st = term(e, out);
    if (st != FM_OK) return st;
    for (;;) {
        skip_ws(e);
        if (!*e->p) return FM_OK;
        char op = *e->p;
        if (op != '+' && op != '-') return bad(e, "expected + - or *");
        e->p++;
        int64_t t;
        if ((st = term(e, &t)) != FM_OK) return st;
        *out = op == '+' ? *out + t : *out - t;
        if (*out > (INT64_C(1) << 50) || *out < -(INT64_C(1) << 50)) return bad(e, "size overflows");
    }
}

fm_status g_expr_check(const fm_graph *g, const char *expr) {
    ep e = {g, expr, expr, NULL};
    int64_t v;
    return parse(&e, &v);
}

fm_status g_expr_eval(const fm_graph *g, const char *expr, const int64_t *vals, int64_t *out) {
    ep e = {g, expr, expr, vals};
    return parse(&e, out);
}
