/* Chat templates (jinja.h): the template into text, output and statement segments
 * (whitespace control as jinja2 with trim_blocks and lstrip_blocks), each tag's
 * expression into tokens, and both into the tree of jinja_internal.h. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/jinja_internal.h"

#define MAX_DEPTH 100 /* nested expressions and blocks: deeper is refused, never a stack overflow */

typedef enum { SEG_TEXT, SEG_OUT, SEG_STMT } seg_kind;
typedef struct seg {
    seg_kind k;
    size_t at, len; /* in the source */
    int line;
} seg;

typedef enum { T_END, T_NAME, T_INT, T_FLOAT, T_STR, T_OP } tok_kind;
typedef struct tok {
    tok_kind k;
    const char *s; /* in the source (T_STR: its decoded text, owned by the parser's list) */
    size_t len;
    int line;
} tok;

typedef struct parser {
    const char *src;
    size_t n;
    seg *segs;
    int nseg, cap, at; /* segments; the next one to read */
    tok *toks;         /* the current tag's tokens */
    int ntok, tcap, ti;
    char **strs;       /* decoded string literals (freed with the parser) */
    int nstr, scap;
    int depth;
    char *err;
    size_t errn;
    bool failed;
} parser;

static void fail(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void fm_jinja_verror(char *err, size_t errn, int line, const char *fmt, va_list ap) {
    int k = snprintf(err, errn, "line %d: ", line);
    if (k >= 0 && (size_t)k < errn) vsnprintf(err + k, errn - (size_t)k, fmt, ap);
}

static void fail(parser *p, int line, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = true;
    va_list ap;
    va_start(ap, fmt);
    fm_jinja_verror(p->err, p->errn, line, fmt, ap);
    va_end(ap);
}

static int line_at(const parser *p, size_t at) {
    int line = 1;
    for (size_t i = 0; i < at && i < p->n; i++) line += p->src[i] == '\n';
    return line;
}

static bool add_seg(parser *p, seg_kind k, size_t at, size_t len) {
    if (p->nseg == p->cap) {
        int cap = p->cap ? p->cap * 2 : 64;
        seg *v = realloc(p->segs, sizeof *v * (size_t)cap);
        if (!v) return fail(p, 0, "out of memory"), false;
        p->segs = v;
        p->cap = cap;
    }
    p->segs[p->nseg++] = (seg){k, at, len, line_at(p, at)};
    return true;
}

/* The end of a tag's inside from `at` (past its opening): the offset of `close`
 * outside string literals, or n when there is none. */
static size_t tag_end(const parser *p, size_t at, const char *close) {
    char q = 0;
    for (size_t i = at; i + 1 < p->n; i++) {
        char c = p->src[i];
        if (q) {
            if (c == '\\') i++;
            else if (c == q) q = 0;
        } else if (c == '\'' || c == '"') {
            q = c;
        } else if (c == close[0] && p->src[i + 1] == close[1]) {
            return i;
        }
    }
    return p->n;
}

/* The text src[a, b) as a segment, trimmed as the tags around it say: rstrip (the next
 * tag opens with '-'), lstrip_line (the next tag is a block or comment: spaces and tabs
 * from the start of its line), lstrip (the previous tag closed with '-'). */
static bool text_seg(parser *p, size_t a, size_t b, bool lstrip, bool rstrip, bool lstrip_line) {
    if (lstrip)
        while (a < b && isspace((unsigned char)p->src[a])) a++;
    if (rstrip) {
        while (b > a && isspace((unsigned char)p->src[b - 1])) b--;
    } else if (lstrip_line) {
        size_t k = b;
        while (k > a && (p->src[k - 1] == ' ' || p->src[k - 1] == '\t')) k--;
        if (k == a ? a == 0 || p->src[a - 1] == '\n' : p->src[k - 1] == '\n') b = k; /* at a line's start */
    }
    return b > a ? add_seg(p, SEG_TEXT, a, b - a) : true;
}

/* The template into segments. */
static bool segment(parser *p) {
    size_t pos = 0;
    bool lstrip = false;
    while (pos < p->n) {
        const char *o = NULL;
        for (size_t i = pos; i + 1 < p->n && !o; i++)
            if (p->src[i] == '{' && (p->src[i + 1] == '{' || p->src[i + 1] == '%' || p->src[i + 1] == '#')) o = p->src + i;
        if (!o) return text_seg(p, pos, p->n, lstrip, false, false);
        size_t open = (size_t)(o - p->src), in = open + 2;
        char kind = o[1];
        bool minus = in < p->n && p->src[in] == '-', plus = in < p->n && p->src[in] == '+';
        bool block = kind != '{';
        if (!text_seg(p, pos, open, lstrip, minus, block && !plus)) return false;
        if (minus || plus) in++;
        const char *close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
        size_t end = kind == '#' ? in : tag_end(p, in, close);
        if (kind == '#') {
            const char *c = NULL;
            for (size_t i = in; i + 1 < p->n && !c; i++)
                if (p->src[i] == '#' && p->src[i + 1] == '}') c = p->src + i;
            end = c ? (size_t)(c - p->src) : p->n;
        }
        if (end >= p->n) return fail(p, line_at(p, open), "'%c%c' is never closed with '%s'", o[0], o[1], close), false;
        bool close_minus = end > in && p->src[end - 1] == '-';
        size_t inner_end = close_minus ? end - 1 : end;
        if (kind != '#' && !add_seg(p, kind == '{' ? SEG_OUT : SEG_STMT, in, inner_end > in ? inner_end - in : 0)) return false;
        pos = end + 2;
        lstrip = close_minus;
        if (!close_minus && block && pos < p->n && p->src[pos] == '\n') pos++; /* trim_blocks */
        else if (!close_minus && block && pos + 1 < p->n && p->src[pos] == '\r' && p->src[pos + 1] == '\n') pos += 2;
    }
    return true;
}

/* ---- a tag's tokens ---- */

static bool push_tok(parser *p, tok t) {
    if (p->ntok == p->tcap) {
        int cap = p->tcap ? p->tcap * 2 : 32;
        tok *v = realloc(p->toks, sizeof *v * (size_t)cap);
        if (!v) return fail(p, t.line, "out of memory"), false;
        p->toks = v;
        p->tcap = cap;
    }
    p->toks[p->ntok++] = t;
    return true;
}

/* A string literal from s (at its quote): the decoded text into a new token. */
static size_t lex_string(parser *p, const char *s, size_t n, int line) {
    char q = s[0], *out = malloc(n + 1);
    size_t i = 1, k = 0;
    if (!out) return fail(p, line, "out of memory"), 0;
    for (; i < n && s[i] != q; i++) {
        char c = s[i];
        if (c == '\\' && i + 1 < n) {
            char e = s[++i];
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == '0' ? '\0' : e;
        }
        out[k++] = c;
    }
    out[k] = 0;
    if (i >= n) { free(out); return fail(p, line, "a string is never closed"), 0; }
    if (p->nstr == p->scap) {
        int cap = p->scap ? p->scap * 2 : 16;
        char **v = realloc(p->strs, sizeof *v * (size_t)cap);
        if (!v) { free(out); return fail(p, line, "out of memory"), 0; }
        p->strs = v;
        p->scap = cap;
    }
    p->strs[p->nstr++] = out;
    return push_tok(p, (tok){T_STR, out, k, line}) ? i + 1 : 0;
}

static bool lex(parser *p, const seg *g) {
    static const char *const ops[] = {"//", "==", "!=", "<=", ">=", "**", "+", "-", "*", "/", "%", "~", "<", ">", "(", ")",
                                      "[", "]", "{", "}", ",", ".", ":", "|", "=", NULL};
    const char *s = p->src + g->at;
    size_t n = g->len, i = 0;
    int line = g->line;
    p->ntok = p->ti = 0;
    while (i < n && !p->failed) {
        char c = s[i];
        if (c == '\n') line++;
        if (isspace((unsigned char)c)) { i++; continue; }
        size_t j = i;
        if (isalpha((unsigned char)c) || c == '_') {
            while (j < n && (isalnum((unsigned char)s[j]) || s[j] == '_')) j++;
            push_tok(p, (tok){T_NAME, s + i, j - i, line});
        } else if (isdigit((unsigned char)c)) {
            bool real = false;
            while (j < n && (isdigit((unsigned char)s[j]) || s[j] == '_' ||
                             (s[j] == '.' && !real && j + 1 < n && isdigit((unsigned char)s[j + 1]) && (real = true))))
                j++;
            size_t k = j + 1 < n && (s[j + 1] == '+' || s[j + 1] == '-') ? j + 2 : j + 1; /* an exponent: 1e300, 2.5E-3 */
            if (j < n && (s[j] == 'e' || s[j] == 'E') && k < n && isdigit((unsigned char)s[k])) {
                real = true;
                for (j = k; j < n && isdigit((unsigned char)s[j]); j++) {}
            }
            push_tok(p, (tok){real ? T_FLOAT : T_INT, s + i, j - i, line});
        } else if (c == '\'' || c == '"') {
            size_t used = lex_string(p, s + i, n - i, line);
            if (!used) return false;
            j = i + used;
        } else {
            const char *const *o = ops;
            while (*o && strncmp(s + i, *o, strlen(*o))) o++;
            if (!*o) return fail(p, line, "unexpected character '%c'", c), false;
            j = i + strlen(*o);
            push_tok(p, (tok){T_OP, s + i, j - i, line});
        }
        i = j;
    }
    return !p->failed && push_tok(p, (tok){T_END, s + n, 0, line});
}

static const tok *peek(const parser *p) { return &p->toks[p->ti]; }
static bool is_op(const tok *t, const char *op) { return t->k == T_OP && t->len == strlen(op) && !memcmp(t->s, op, t->len); }
static bool is_name(const tok *t, const char *w) { return t->k == T_NAME && t->len == strlen(w) && !memcmp(t->s, w, t->len); }
static bool accept_op(parser *p, const char *op) { return is_op(peek(p), op) ? (p->ti++, true) : false; }
static bool accept_name(parser *p, const char *w) { return is_name(peek(p), w) ? (p->ti++, true) : false; }

static bool expect_op(parser *p, const char *op) {
    if (accept_op(p, op)) return true;
    const tok *t = peek(p);
    fail(p, t->line, "expected '%s', got '%.*s'", op, t->k == T_END ? 5 : (int)t->len, t->k == T_END ? "(end)" : t->s);
    return false;
}

static char *tok_name(parser *p) {
    const tok *t = peek(p);
    if (t->k != T_NAME) {
        fail(p, t->line, "expected a name, got '%.*s'", t->k == T_END ? 5 : (int)t->len, t->k == T_END ? "(end)" : t->s);
        return NULL;
    }
    p->ti++;
    char *s = strndup(t->s, t->len);
    if (!s) fail(p, t->line, "out of memory");
    return s;
}

/* ---- expressions ---- */

void fm_jinja_free_expr(jexpr *e);
void fm_jinja_free_expr(jexpr *e) {
    if (!e) return;
    free(e->name);
    json_decref(e->lit);
    fm_jinja_free_expr(e->a);
    fm_jinja_free_expr(e->b);
    fm_jinja_free_expr(e->c);
    fm_jinja_free_expr(e->d);
    for (int i = 0; i < e->n; i++) {
        fm_jinja_free_expr(e->args[i]);
        if (e->kw) free(e->kw[i]);
        if (e->vals) fm_jinja_free_expr(e->vals[i]);
    }
    free(e->args);
    free(e->kw);
    free(e->vals);
    free(e);
}

static jexpr *mk(parser *p, jexpr_kind k, int line) {
    jexpr *e = calloc(1, sizeof *e);
    if (!e) fail(p, line, "out of memory");
    else e->k = k, e->line = line;
    return e;
}

static jexpr *parse_expr(parser *p);

/* Appends (kw, value) to e's arguments. */
static bool add_arg(parser *p, jexpr *e, char *kw, jexpr *v, jexpr *val2) {
    jexpr **a = realloc(e->args, sizeof *a * (size_t)(e->n + 1));
    if (a) e->args = a;
    char **k = a ? realloc(e->kw, sizeof *k * (size_t)(e->n + 1)) : NULL;
    if (k) e->kw = k;
    jexpr **vv = k && e->k == JE_DICT ? realloc(e->vals, sizeof *vv * (size_t)(e->n + 1)) : NULL;
    if (vv) e->vals = vv;
    if (!a || !k || (e->k == JE_DICT && !vv)) {
        free(kw);
        fm_jinja_free_expr(v);
        fm_jinja_free_expr(val2);
        return fail(p, e->line, "out of memory"), false;
    }
    e->args[e->n] = v;
    e->kw[e->n] = kw;
    if (e->k == JE_DICT) e->vals[e->n] = val2;
    e->n++;
    return true;
}

/* "(" args ")" after the opening parenthesis: positional, then name=value. */
static bool parse_args(parser *p, jexpr *e) {
    while (!p->failed && !accept_op(p, ")")) {
        if (e->n && !expect_op(p, ",")) return false;
        if (accept_op(p, ")")) break; /* a trailing comma */
        char *kw = NULL;
        if (peek(p)->k == T_NAME && is_op(&p->toks[p->ti + 1], "=")) {
            kw = tok_name(p);
            p->ti++;
        }
        jexpr *v = parse_expr(p);
        if (!v || !add_arg(p, e, kw, v, NULL)) { if (!v) free(kw); return false; }
    }
    return !p->failed;
}

static jexpr *literal(parser *p, const tok *t) {
    jexpr *e = mk(p, JE_LIT, t->line);
    if (!e) return NULL;
    char buf[64];
    size_t k = 0;
    for (size_t i = 0; i < t->len && k + 1 < sizeof buf; i++)
        if (t->s[i] != '_') buf[k++] = t->s[i];
    buf[k] = 0;
    errno = 0;
    if (t->k == T_STR) e->lit = json_stringn(t->s, t->len);
    else if (t->k == T_INT) e->lit = json_integer(strtoll(buf, NULL, 10));
    else e->lit = json_real(strtod(buf, NULL));
    if (t->k == T_INT && errno) { fm_jinja_free_expr(e); return fail(p, t->line, "number %s is out of range", buf), NULL; }
    if (!e->lit) { fm_jinja_free_expr(e); return fail(p, t->line, "a string literal is not valid UTF-8"), NULL; }
    return e;
}

static jexpr *parse_primary(parser *p) {
    const tok *t = peek(p);
    int line = t->line;
    if (t->k == T_STR || t->k == T_INT || t->k == T_FLOAT) {
        p->ti++;
        jexpr *e = literal(p, t);
        while (e && e->lit && json_is_string(e->lit) && peek(p)->k == T_STR) { /* 'a' 'b': one string */
            const tok *u = &p->toks[p->ti++];
            size_t a = json_string_length(e->lit);
            char *s = malloc(a + u->len + 1);
            if (!s) { fm_jinja_free_expr(e); return fail(p, line, "out of memory"), NULL; }
            memcpy(s, json_string_value(e->lit), a);
            memcpy(s + a, u->s, u->len);
            json_decref(e->lit);
            e->lit = json_stringn(s, a + u->len);
            free(s);
        }
        return e;
    }
    if (t->k == T_NAME) {
        static const char *const consts[] = {"true", "True", "false", "False", "none", "None"};
        for (int i = 0; i < 6; i++)
            if (is_name(t, consts[i])) {
                p->ti++;
                jexpr *e = mk(p, JE_LIT, line);
                if (e) e->lit = i < 2 ? json_true() : i < 4 ? json_false() : json_null();
                return e;
            }
        jexpr *e = mk(p, JE_VAR, line);
        if (e && !(e->name = tok_name(p))) { fm_jinja_free_expr(e); return NULL; }
        return e;
    }
    if (accept_op(p, "(")) {
        jexpr *e = parse_expr(p);
        if (e && !expect_op(p, ")")) { fm_jinja_free_expr(e); return NULL; }
        return e;
    }
    bool list = accept_op(p, "[");
    if (list || accept_op(p, "{")) {
        jexpr *e = mk(p, list ? JE_LIST : JE_DICT, line);
        while (e && !p->failed && !accept_op(p, list ? "]" : "}")) {
            if (e->n && !expect_op(p, ",")) break;
            if (accept_op(p, list ? "]" : "}")) break;
            jexpr *k = parse_expr(p), *v = NULL;
            if (k && !list && (!expect_op(p, ":") || !(v = parse_expr(p)))) { fm_jinja_free_expr(k); break; }
            if (!k || !add_arg(p, e, NULL, k, v)) break;
        }
        if (p->failed) { fm_jinja_free_expr(e); return NULL; }
        return e;
    }
    fail(p, line, "expected a value, got '%.*s'", t->k == T_END ? 5 : (int)t->len, t->k == T_END ? "(end)" : t->s);
    return NULL;
}

/* Subscript after "[": an index or a slice. */
static jexpr *parse_subscript(parser *p, jexpr *obj) {
    int line = obj->line;
    jexpr *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    while (!p->failed) {
        if (!is_op(peek(p), ":") && !is_op(peek(p), "]")) parts[k] = parse_expr(p);
        if (accept_op(p, ":") && k < 2) { slice = true; k++; continue; }
        break;
    }
    jexpr *e = !p->failed && expect_op(p, "]") ? mk(p, slice ? JE_SLICE : JE_ITEM, line) : NULL;
    if (!e || (!slice && !parts[0])) {
        if (e && !parts[0]) fail(p, line, "an empty subscript");
        fm_jinja_free_expr(e);
        fm_jinja_free_expr(obj);
        for (int i = 0; i < 3; i++) fm_jinja_free_expr(parts[i]);
        return NULL;
    }
    e->a = obj;
    e->b = parts[0];
    e->c = parts[1];
    e->d = parts[2];
    return e;
}

/* Postfix (. [] ()) on e, then (with_filters) filters (|) and tests (is), as jinja2's parse_unary. */
static jexpr *parse_postfix(parser *p, jexpr *e, bool with_filters) {
    while (e && !p->failed) {
        int line = peek(p)->line;
        if (accept_op(p, ".")) {
            jexpr *a = mk(p, JE_ATTR, line);
            if (a && !(a->name = tok_name(p))) { fm_jinja_free_expr(a); a = NULL; }
            if (!a) break;
            a->a = e;
            e = a;
        } else if (accept_op(p, "[")) {
            e = parse_subscript(p, e);
        } else if (accept_op(p, "(")) {
            jexpr *c = mk(p, JE_CALL, line);
            if (!c) break;
            c->a = e;
            e = c;
            if (!parse_args(p, c)) break;
        } else if (with_filters && (accept_op(p, "|") || is_name(peek(p), "is"))) {
            bool test = is_name(peek(p), "is");
            if (test) p->ti++;
            jexpr *f = mk(p, test ? JE_TEST : JE_FILTER, line);
            if (!f) break;
            f->a = e;
            e = f;
            f->neg = test && accept_name(p, "not");
            if (!(f->name = tok_name(p))) break;
            if (accept_op(p, "(") && !parse_args(p, f)) break;
        } else {
            return e;
        }
    }
    fm_jinja_free_expr(e);
    return NULL;
}

static jexpr *bin(parser *p, int op, jexpr *a, jexpr *b, int line) {
    if (!a || !b) { fm_jinja_free_expr(a); fm_jinja_free_expr(b); return NULL; }
    jexpr *e = mk(p, JE_BIN, line);
    if (!e) { fm_jinja_free_expr(a); fm_jinja_free_expr(b); return NULL; }
    e->op = op;
    e->a = a;
    e->b = b;
    return e;
}

/* jinja2's: -x|f is (-x)|f, the sign's operand parsed without filters. */
static jexpr *parse_unary(parser *p, bool with_filters) {
    int line = peek(p)->line;
    jexpr *e;
    if (accept_op(p, "-") || accept_op(p, "+")) {
        bool minus = is_op(&p->toks[p->ti - 1], "-");
        if (++p->depth > MAX_DEPTH) return fail(p, line, "expressions nested more than %d deep", MAX_DEPTH), NULL;
        jexpr *a = parse_unary(p, false);
        p->depth--;
        e = a;
        if (a && minus) {
            if (!(e = mk(p, JE_NEG, line))) { fm_jinja_free_expr(a); return NULL; }
            e->a = a;
        }
    } else {
        e = parse_primary(p);
    }
    return parse_postfix(p, e, with_filters);
}

static jexpr *parse_math2(parser *p) {
    jexpr *e = parse_unary(p, true);
    for (;;) {
        int line = peek(p)->line, op = accept_op(p, "*") ? JOP_MUL : accept_op(p, "//") ? JOP_FLOORDIV
                                     : accept_op(p, "/") ? JOP_DIV : accept_op(p, "%") ? JOP_MOD : 0;
        if (!op || !e) return e;
        e = bin(p, op, e, parse_unary(p, true), line);
    }
}

static jexpr *parse_math1(parser *p) {
    jexpr *e = parse_math2(p);
    for (;;) {
        int line = peek(p)->line, op = accept_op(p, "+") ? JOP_ADD : accept_op(p, "-") ? JOP_SUB : 0;
        if (!op || !e) return e;
        e = bin(p, op, e, parse_math2(p), line);
    }
}

static jexpr *parse_concat(parser *p) {
    jexpr *e = parse_math1(p);
    while (e && is_op(peek(p), "~")) {
        int line = peek(p)->line;
        p->ti++;
        e = bin(p, JOP_CONCAT, e, parse_math1(p), line);
    }
    return e;
}

static jexpr *parse_compare(parser *p) {
    jexpr *e = parse_concat(p);
    for (;;) {
        int line = peek(p)->line, op = 0;
        static const char *const cmp[] = {"==", "!=", "<=", ">=", "<", ">"};
        static const int code[] = {JOP_EQ, JOP_NE, JOP_LE, JOP_GE, JOP_LT, JOP_GT};
        for (int i = 0; i < 6 && !op; i++)
            if (accept_op(p, cmp[i])) op = code[i];
        if (!op && accept_name(p, "in")) op = JOP_IN;
        if (!op && is_name(peek(p), "not") && is_name(&p->toks[p->ti + 1], "in")) { p->ti += 2; op = JOP_NOTIN; }
        if (!op || !e) return e;
        e = bin(p, op, e, parse_concat(p), line);
    }
}

static jexpr *parse_not(parser *p) {
    int line = peek(p)->line;
    if (!accept_name(p, "not")) return parse_compare(p);
    if (++p->depth > MAX_DEPTH) return fail(p, line, "expressions nested more than %d deep", MAX_DEPTH), NULL;
    jexpr *a = parse_not(p), *e = a ? mk(p, JE_NOT, line) : NULL;
    p->depth--;
    if (!e) { fm_jinja_free_expr(a); return NULL; }
    e->a = a;
    return e;
}

static jexpr *parse_and(parser *p) {
    jexpr *e = parse_not(p);
    while (e && is_name(peek(p), "and")) {
        int line = peek(p)->line;
        p->ti++;
        e = bin(p, JOP_AND, e, parse_not(p), line);
    }
    return e;
}

static jexpr *parse_or(parser *p) {
    jexpr *e = parse_and(p);
    while (e && is_name(peek(p), "or")) {
        int line = peek(p)->line;
        p->ti++;
        e = bin(p, JOP_OR, e, parse_and(p), line);
    }
    return e;
}

/* a [if cond [else b]] */
static jexpr *parse_expr(parser *p) {
    int line = peek(p)->line;
    if (++p->depth > MAX_DEPTH) return fail(p, line, "expressions nested more than %d deep", MAX_DEPTH), NULL;
    jexpr *e = parse_or(p);
    if (e && accept_name(p, "if")) {
        jexpr *c = mk(p, JE_COND, line);
        if (c) {
            c->a = e;
            e = c;
            if (!(c->b = parse_or(p)) || (accept_name(p, "else") && !(c->c = parse_expr(p)))) {
                fm_jinja_free_expr(e);
                e = NULL;
            }
        } else {
            fm_jinja_free_expr(e);
            e = NULL;
        }
    }
    p->depth--;
    return e;
}

/* ---- statements ---- */

static void free_node(jnode *nd) {
    if (!nd) return;
    free(nd->text);
    fm_jinja_free_expr(nd->e);
    fm_jinja_free_expr(nd->filter);
    for (int i = 0; i < nd->n; i++) {
        fm_jinja_free_expr(nd->conds[i]);
        fm_jinja_free_body(&nd->bodies[i]);
    }
    free(nd->conds);
    free(nd->bodies);
    fm_jinja_free_body(&nd->body);
    fm_jinja_free_body(&nd->els);
    free(nd->vars[0]);
    free(nd->vars[1]);
    free(nd);
}

void fm_jinja_free_body(jbody *b) {
    for (int i = 0; i < b->n; i++) free_node(b->v[i]);
    free(b->v);
    b->v = NULL;
    b->n = b->cap = 0;
}

static bool body_add(parser *p, jbody *b, jnode *nd) {
    if (!nd) return false;
    if (b->n == b->cap) {
        int cap = b->cap ? b->cap * 2 : 8;
        jnode **v = realloc(b->v, sizeof *v * (size_t)cap);
        if (!v) { free_node(nd); return fail(p, nd->line, "out of memory"), false; }
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = nd;
    return true;
}

static jnode *mknode(parser *p, jnode_kind k, int line) {
    jnode *nd = calloc(1, sizeof *nd);
    if (!nd) fail(p, line, "out of memory");
    else nd->k = k, nd->line = line;
    return nd;
}

/* The tag's words were all used: anything left is an error. */
static bool tag_done(parser *p) {
    const tok *t = peek(p);
    if (t->k == T_END) return true;
    fail(p, t->line, "unexpected '%.*s' in this tag", (int)t->len, t->s);
    return false;
}

static bool parse_body(parser *p, jbody *b, const char *const *ends, int *which);

static jnode *parse_if(parser *p, int line) {
    jnode *nd = mknode(p, JN_IF, line);
    const char *const ends[] = {"elif", "else", "endif", NULL};
    for (int which = 0; nd && !p->failed;) {
        jexpr **c = realloc(nd->conds, sizeof *c * (size_t)(nd->n + 1));
        jbody *b = c ? realloc(nd->bodies, sizeof *b * (size_t)(nd->n + 1)) : NULL;
        if (c) nd->conds = c;
        if (b) nd->bodies = b;
        if (!c || !b) { fail(p, line, "out of memory"); break; }
        nd->bodies[nd->n] = (jbody){0};
        nd->conds[nd->n++] = parse_expr(p);
        if (p->failed || !tag_done(p) || !parse_body(p, &nd->bodies[nd->n - 1], ends, &which)) break;
        if (which == 1) { /* else: its body to endif */
            const char *const end2[] = {"endif", NULL};
            if (!tag_done(p) || !parse_body(p, &nd->els, end2, &which)) break;
            which = 2;
        }
        if (which == 2) return tag_done(p) ? nd : (free_node(nd), NULL); /* endif */
    }
    free_node(nd);
    return NULL;
}

static jnode *parse_for(parser *p, int line) {
    jnode *nd = mknode(p, JN_FOR, line);
    if (!nd || !(nd->vars[0] = tok_name(p))) { free_node(nd); return NULL; }
    if (accept_op(p, ",") && !(nd->vars[1] = tok_name(p))) { free_node(nd); return NULL; }
    if (!accept_name(p, "in")) { fail(p, line, "expected 'in' in the for loop"); free_node(nd); return NULL; }
    nd->e = parse_or(p); /* not parse_expr: a trailing `if` filters the loop */
    if (nd->e && accept_name(p, "if")) nd->filter = parse_or(p);
    if (accept_name(p, "recursive")) fail(p, line, "recursive loops are not supported");
    const char *const ends[] = {"else", "endfor", NULL}, *const end2[] = {"endfor", NULL};
    int which = 0;
    if (p->failed || !tag_done(p) || !parse_body(p, &nd->body, ends, &which) ||
        (which == 0 && (!tag_done(p) || !parse_body(p, &nd->els, end2, &which))) || !tag_done(p)) {
        free_node(nd);
        return NULL;
    }
    return nd;
}

static jnode *parse_set(parser *p, int line) {
    jnode *nd = mknode(p, JN_SET, line);
    if (!nd || !(nd->vars[0] = tok_name(p))) { free_node(nd); return NULL; }
    if (accept_op(p, ".") && !(nd->vars[1] = tok_name(p))) { free_node(nd); return NULL; }
    if (!accept_op(p, "=")) {
        fail(p, line, "'set' needs 'name = value' (block assignments are not supported)");
        free_node(nd);
        return NULL;
    }
    if (!(nd->e = parse_expr(p)) || !tag_done(p)) { free_node(nd); return NULL; }
    return nd;
}

/* One statement tag (its tokens lexed, its keyword next). */
static jnode *parse_stmt(parser *p, const tok *kw) {
    int line = kw->line;
    if (is_name(kw, "if")) return parse_if(p, line);
    if (is_name(kw, "for")) return parse_for(p, line);
    if (is_name(kw, "set")) return parse_set(p, line);
    if (is_name(kw, "break") || is_name(kw, "continue")) {
        jnode *nd = mknode(p, is_name(kw, "break") ? JN_BREAK : JN_CONTINUE, line);
        if (nd && !tag_done(p)) { free_node(nd); return NULL; }
        return nd;
    }
    if (is_name(kw, "generation")) { /* transformers' marker of the assistant's text: rendered as is */
        jnode *nd = mknode(p, JN_BLOCK, line);
        const char *const ends[] = {"endgeneration", NULL};
        int which = 0;
        if (nd && (!tag_done(p) || !parse_body(p, &nd->body, ends, &which) || !tag_done(p))) { free_node(nd); return NULL; }
        return nd;
    }
    fail(p, line, "'%.*s' statements are not supported in chat templates here (fathom knows if, for, set, break, "
                  "continue, generation)", kw->k == T_END ? 0 : (int)kw->len, kw->s);
    return NULL;
}

/* Segments into b until a statement whose keyword is in ends (its index into *which,
 * its remaining tokens left to read); ends NULL: to the end of the template. */
static bool parse_body(parser *p, jbody *b, const char *const *ends, int *which) {
    if (++p->depth > MAX_DEPTH) return fail(p, p->at < p->nseg ? p->segs[p->at].line : 0, "blocks nested too deep"), false;
    bool ok = false;
    while (!p->failed) {
        if (p->at == p->nseg) {
            int last = 0;
            while (ends && ends[last + 1]) last++;
            if (ends) fail(p, p->nseg ? p->segs[p->nseg - 1].line : 1, "the template ends before '{%% %s %%}'", ends[last]);
            else ok = true;
            break;
        }
        const seg *g = &p->segs[p->at++];
        if (g->k == SEG_TEXT) {
            jnode *nd = mknode(p, JN_TEXT, g->line);
            if (nd && !(nd->text = malloc(g->len + 1))) { free_node(nd); fail(p, g->line, "out of memory"); break; }
            if (nd) { memcpy(nd->text, p->src + g->at, g->len); nd->len = g->len; }
            if (!body_add(p, b, nd)) break;
            continue;
        }
        if (!lex(p, g)) break;
        if (g->k == SEG_OUT) {
            jnode *nd = mknode(p, JN_OUT, g->line);
            if (nd && (!(nd->e = parse_expr(p)) || !tag_done(p))) { free_node(nd); nd = NULL; }
            if (!body_add(p, b, nd)) break;
            continue;
        }
        const tok *kw = &p->toks[p->ti++];
        int k = -1;
        for (int i = 0; ends && ends[i] && k < 0; i++)
            if (is_name(kw, ends[i])) k = i;
        if (k >= 0) { *which = k; ok = true; break; }
        if (kw->k == T_NAME && kw->len > 3 && (!strncmp(kw->s, "end", 3) || is_name(kw, "elif") || is_name(kw, "else"))) {
            fail(p, g->line, "'%.*s' without its opening statement", (int)kw->len, kw->s);
            break;
        }
        if (!body_add(p, b, parse_stmt(p, kw))) break;
    }
    p->depth--;
    return ok && !p->failed;
}

fm_jinja *fm_jinja_parse(const char *src, size_t n, char *err, size_t errn) {
    /* jinja2 (keep_trailing_newline off, as transformers leaves it) drops one newline at the end */
    if (n && src[n - 1] == '\n') n -= n > 1 && src[n - 2] == '\r' ? 2 : 1;
    parser p = {.src = src, .n = n, .err = err, .errn = errn};
    fm_jinja *t = calloc(1, sizeof *t);
    if (!t) { snprintf(err, errn, "out of memory"); return NULL; }
    if (n > (1u << 20)) fail(&p, 1, "the template is %zu bytes (at most 1 MiB)", n);
    int which = 0;
    bool ok = !p.failed && segment(&p) && parse_body(&p, &t->root, NULL, &which);
    free(p.segs);
    free(p.toks);
    for (int i = 0; i < p.nstr; i++) free(p.strs[i]);
    free(p.strs);
    if (!ok) { fm_jinja_free(t); return NULL; }
    return t;
}

void fm_jinja_free(fm_jinja *t) {
    if (!t) return;
    fm_jinja_free_body(&t->root);
    free(t);
}
