/* Chat templates (jinja.h): rendering the parsed tree. Values are jansson values
 * (the request's messages already are); NULL is Jinja's undefined. Every value made
 * while rendering goes into one pool array that owns it until the end, so the
 * evaluator hands out borrowed references and never counts them itself. Python's
 * semantics where templates rely on them: truthiness, str() of None/True/numbers,
 * negative indices and slices, `in` on strings, lists and dicts. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/jinja_internal.h"

#define MAX_OUT (4u << 20)
#define MAX_ITER 1000000
#define MAX_FRAMES 256

typedef struct ev {
    json_t *pool;         /* owns every value made here */
    json_t *frames[MAX_FRAMES];
    int nframes;
    char *out;
    size_t len, cap;
    long iters;
    int brk;              /* 1: break, 2: continue pending */
    bool failed;
    char *err;
    size_t errn;
} ev;

static void efail(ev *e, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void efail(ev *e, int line, const char *fmt, ...) {
    if (e->failed) return;
    e->failed = true;
    va_list ap;
    va_start(ap, fmt);
    fm_jinja_verror(e->err, e->errn, line, fmt, ap);
    va_end(ap);
}

/* x into the pool (taken), returned borrowed; NULL (out of memory) fails. */
static json_t *own(ev *e, json_t *x, int line) {
    if (!x || json_array_append_new(e->pool, x)) { efail(e, line, "out of memory"); return NULL; }
    return x;
}

static bool truthy(const json_t *v) {
    if (!v || json_is_null(v) || json_is_false(v)) return false;
    if (json_is_string(v)) return json_string_length(v) > 0;
    if (json_is_integer(v)) return json_integer_value(v) != 0;
    if (json_is_real(v)) return json_real_value(v) != 0;
    if (json_is_array(v)) return json_array_size(v) > 0;
    if (json_is_object(v)) return json_object_size(v) > 0;
    return true;
}

/* ---- output and str() ---- */

static bool emit(ev *e, const char *s, size_t n, int line) {
    if (e->len + n > MAX_OUT) return efail(e, line, "the output is over %u bytes", MAX_OUT), false;
    if (e->len + n + 1 > e->cap) {
        size_t cap = (e->len + n + 1) * 2;
        char *o = realloc(e->out, cap);
        if (!o) return efail(e, line, "out of memory"), false;
        e->out = o;
        e->cap = cap;
    }
    memcpy(e->out + e->len, s, n);
    e->len += n;
    e->out[e->len] = 0;
    return true;
}

/* Python's repr of a float: the fewest significant digits that read back, in fixed
 * notation for exponents -4 to 15 (with ".0" when whole), else as 1.5e-07. */
static void real_repr(double d, char *buf, size_t n) {
    if (isnan(d)) { snprintf(buf, n, "nan"); return; }
    if (isinf(d)) { snprintf(buf, n, d > 0 ? "inf" : "-inf"); return; }
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(buf, n, "%.*e", prec - 1, d);
        if (strtod(buf, NULL) == d) break;
    }
    snprintf(buf, n, "%.*e", prec - 1, d);
    int exp10 = atoi(strchr(buf, 'e') + 1);
    if (exp10 < -4 || exp10 >= 16) return;
    snprintf(buf, n, "%.*f", prec - 1 - exp10 > 0 ? prec - 1 - exp10 : 0, d);
    if (!strchr(buf, '.')) strncat(buf, ".0", n - strlen(buf) - 1);
}

static bool put_str(ev *e, json_t *buf, const char *s, size_t n);
static bool repr(ev *e, json_t *buf, const json_t *v, bool quote);

/* Appends to the string held in buf (a one-element array: jansson strings are immutable). */
static bool put_str(ev *e, json_t *buf, const char *s, size_t n) {
    json_t *cur = json_array_get(buf, 0);
    size_t a = json_string_length(cur);
    char *t = malloc(a + n + 1);
    if (!t) return efail(e, 0, "out of memory"), false;
    memcpy(t, json_string_value(cur), a);
    memcpy(t + a, s, n);
    json_t *nv = json_stringn_nocheck(t, a + n);
    free(t);
    return nv && !json_array_set_new(buf, 0, nv) ? true : (efail(e, 0, "out of memory"), false);
}

/* str(v) (quote false) or repr(v) (quote true), Python's forms, appended to buf. */
static bool repr(ev *e, json_t *buf, const json_t *v, bool quote) {
    char num[40];
    if (!v) return true; /* undefined prints as nothing */
    if (json_is_string(v)) {
        if (!quote) return put_str(e, buf, json_string_value(v), json_string_length(v));
        const char *s = json_string_value(v);
        char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
        bool ok = put_str(e, buf, &q, 1);
        for (size_t i = 0; ok && i < json_string_length(v); i++) {
            char c = s[i], esc[8];
            if (c == q || c == '\\') { esc[0] = '\\'; esc[1] = c; ok = put_str(e, buf, esc, 2); }
            else if (c == '\n') ok = put_str(e, buf, "\\n", 2);
            else if (c == '\t') ok = put_str(e, buf, "\\t", 2);
            else if (c == '\r') ok = put_str(e, buf, "\\r", 2);
            else if ((unsigned char)c < 0x20) ok = put_str(e, buf, esc, (size_t)snprintf(esc, sizeof esc, "\\x%02x", (unsigned char)c));
            else ok = put_str(e, buf, &c, 1);
        }
        return ok && put_str(e, buf, &q, 1);
    }
    if (json_is_null(v)) return put_str(e, buf, "None", 4);
    if (json_is_true(v)) return put_str(e, buf, "True", 4);
    if (json_is_false(v)) return put_str(e, buf, "False", 5);
    if (json_is_integer(v)) return put_str(e, buf, num, (size_t)snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v)));
    if (json_is_real(v)) { real_repr(json_real_value(v), num, sizeof num); return put_str(e, buf, num, strlen(num)); }
    bool list = json_is_array(v), ok = put_str(e, buf, list ? "[" : "{", 1);
    size_t i = 0;
    const char *key;
    const json_t *x;
    if (list) {
        json_array_foreach(v, i, x) ok = ok && (!i || put_str(e, buf, ", ", 2)) && repr(e, buf, x, true);
    } else {
        json_object_foreach((json_t *)v, key, x) {
            json_t *k = json_string(key);
            ok = ok && k && (!i++ || put_str(e, buf, ", ", 2)) && repr(e, buf, k, true) && put_str(e, buf, ": ", 2) &&
                 repr(e, buf, x, true);
            json_decref(k);
        }
    }
    return ok && put_str(e, buf, list ? "]" : "}", 1);
}

/* str(v) as a pooled string. */
static json_t *to_str(ev *e, const json_t *v, int line) {
    if (v && json_is_string(v)) return (json_t *)v;
    json_t *buf = own(e, json_pack("[s]", ""), line);
    if (!buf || !repr(e, buf, v, false)) return NULL;
    return json_array_get(buf, 0);
}

/* ---- variables ---- */

static json_t *lookup(ev *e, const char *name) {
    for (int i = e->nframes - 1; i >= 0; i--) {
        json_t *v = json_object_get(e->frames[i], name);
        if (v) return v;
    }
    return NULL;
}

static bool push_frame(ev *e, int line) {
    if (e->nframes == MAX_FRAMES) return efail(e, line, "loops nested more than %d deep", MAX_FRAMES), false;
    json_t *f = own(e, json_object(), line);
    if (!f) return false;
    e->frames[e->nframes++] = f;
    return true;
}

/* ---- expressions ---- */

static json_t *eval(ev *e, const jexpr *x);

static bool is_num(const json_t *v) { return v && (json_is_integer(v) || json_is_real(v)); }
static double num(const json_t *v) { return json_is_integer(v) ? (double)json_integer_value(v) : json_number_value(v); }

static bool equal(const json_t *a, const json_t *b) {
    if (!a || !b) return a == b;
    if (is_num(a) && is_num(b)) return num(a) == num(b);
    if ((json_is_boolean(a) && is_num(b)) || (is_num(a) && json_is_boolean(b)))
        return (json_is_boolean(a) ? json_is_true(a) : num(a)) == (json_is_boolean(b) ? json_is_true(b) : num(b));
    return json_equal((json_t *)a, (json_t *)b);
}

/* A Python index into n items (negative from the end); -1 if outside. */
static long index_of(long long i, size_t n) {
    if (i < 0) i += (long long)n;
    return i < 0 || (size_t)i >= n ? -1 : (long)i;
}

/* A string's characters (UTF-8 sequences) as a list of one-character strings: what
 * Python indexes, slices and iterates. */
static json_t *chars_of(ev *e, const json_t *str, int line) {
    json_t *r = own(e, json_array(), line);
    const unsigned char *s = (const unsigned char *)json_string_value(str);
    size_t n = json_string_length(str);
    for (size_t i = 0; r && i < n;) {
        size_t k = s[i] >= 0xF0 ? 4 : s[i] >= 0xE0 ? 3 : s[i] >= 0xC0 ? 2 : 1;
        if (k > n - i) k = n - i;
        if (json_array_append_new(r, json_stringn_nocheck((const char *)s + i, k))) return efail(e, line, "out of memory"), NULL;
        i += k;
    }
    return r;
}

static json_t *getitem(ev *e, json_t *obj, const json_t *key, int line) {
    if (!obj) return efail(e, line, "an undefined value has no items"), NULL;
    if (json_is_object(obj)) return json_is_string(key) ? json_object_get(obj, json_string_value(key)) : NULL;
    if ((json_is_array(obj) || json_is_string(obj)) && key && json_is_integer(key)) {
        json_t *list = json_is_array(obj) ? obj : chars_of(e, obj, line);
        long i = list ? index_of(json_integer_value(key), json_array_size(list)) : -1;
        return i < 0 ? NULL : json_array_get(list, (size_t)i);
    }
    return NULL;
}

/* a[b:c:d] on a list or a string (by characters). */
static json_t *slice(ev *e, json_t *obj, const json_t *b, const json_t *c, const json_t *d, int line) {
    bool str = obj && json_is_string(obj);
    if (!obj || (!str && !json_is_array(obj))) return efail(e, line, "only lists and strings can be sliced"), NULL;
    json_t *whole = obj;
    if (str && !(obj = chars_of(e, whole, line))) return NULL;
    long long n = (long long)json_array_size(obj);
    long long step = d && json_is_integer(d) ? json_integer_value(d) : 1;
    if (step == 0) return efail(e, line, "a slice step of 0"), NULL;
    long long lo = step > 0 ? 0 : n - 1, hi = step > 0 ? n : -1;
    if (b && json_is_integer(b)) { lo = json_integer_value(b); if (lo < 0) lo += n; lo = lo < 0 ? (step > 0 ? 0 : -1) : lo > n ? n : lo; if (step < 0 && lo >= n) lo = n - 1; }
    if (c && json_is_integer(c)) { hi = json_integer_value(c); if (hi < 0) hi += n; hi = hi < 0 ? -1 : hi > n ? n : hi; if (step > 0 && hi < 0) hi = 0; }
    json_t *r = own(e, json_array(), line);
    for (long long i = lo; r && (step > 0 ? i < hi : i > hi);) {
        if (json_array_append(r, json_array_get(obj, (size_t)i))) return efail(e, line, "out of memory"), NULL;
        if (__builtin_add_overflow(i, step, &i)) break; /* past long long: past the end too */
    }
    if (!r || !str) return r;
    char *s = malloc(json_string_length(whole) + 1); /* the characters back into a string */
    size_t k = 0, i;
    json_t *ch;
    if (!s) return efail(e, line, "out of memory"), NULL;
    json_array_foreach(r, i, ch) {
        memcpy(s + k, json_string_value(ch), json_string_length(ch));
        k += json_string_length(ch);
    }
    r = own(e, json_stringn_nocheck(s, k), line);
    free(s);
    return r;
}

static json_t *call_fn(ev *e, const jexpr *x);
static json_t *call_method(ev *e, const jexpr *x, json_t *self, const char *name);
static json_t *apply_filter(ev *e, const jexpr *x);
static bool apply_test(ev *e, const jexpr *x);
static json_t *select_items(ev *e, const jexpr *x, json_t *list, bool attr, bool keep);
static json_t *map_items(ev *e, const jexpr *x, json_t *list);

/* String + string, list + list, number op number. */
static json_t *arith(ev *e, int op, json_t *a, json_t *b, int line) {
    if (op == JOP_ADD && a && b && json_is_string(a) && json_is_string(b)) {
        json_t *buf = own(e, json_pack("[O]", a), line);
        return buf && put_str(e, buf, json_string_value(b), json_string_length(b)) ? json_array_get(buf, 0) : NULL;
    }
    if (op == JOP_ADD && a && b && json_is_array(a) && json_is_array(b)) {
        json_t *r = own(e, json_deep_copy(a), line);
        if (r && json_array_extend(r, b)) return efail(e, line, "out of memory"), NULL;
        return r;
    }
    if (!is_num(a) || !is_num(b))
        return efail(e, line, "arithmetic on %s and %s", !a ? "an undefined value" : json_is_string(a) ? "a string" : "a non-number",
                     !b ? "an undefined value" : json_is_string(b) ? "a string" : "a non-number"), NULL;
    bool ints = json_is_integer(a) && json_is_integer(b);
    long long ia = ints ? json_integer_value(a) : 0, ib = ints ? json_integer_value(b) : 0;
    double da = num(a), db = num(b);
    if ((op == JOP_DIV || op == JOP_FLOORDIV || op == JOP_MOD) && db == 0) return efail(e, line, "division by zero"), NULL;
    if (ints && op != JOP_DIV) { /* Python's integers have no bound; past 64 bits is refused, never wrapped */
        long long r = 0;
        bool over = op == JOP_ADD ? __builtin_add_overflow(ia, ib, &r) : op == JOP_SUB ? __builtin_sub_overflow(ia, ib, &r)
                  : op == JOP_MUL ? __builtin_mul_overflow(ia, ib, &r) : ia == LLONG_MIN && ib == -1;
        if (over) return efail(e, line, "integer arithmetic past 64 bits"), NULL;
        if (op == JOP_FLOORDIV || op == JOP_MOD) {
            long long q = ia / ib, m = ia % ib;
            if (m != 0 && ((m < 0) != (ib < 0))) { q--; m += ib; } /* Python floors */
            r = op == JOP_FLOORDIV ? q : m;
        }
        return own(e, json_integer(r), line);
    }
    double r = op == JOP_ADD ? da + db : op == JOP_SUB ? da - db : op == JOP_MUL ? da * db : op == JOP_DIV ? da / db
             : op == JOP_FLOORDIV ? floor(da / db) : da - db * floor(da / db);
    return own(e, json_real(r), line);
}

static bool contains(const json_t *hay, const json_t *needle) {
    if (!hay) return false;
    if (json_is_string(hay))
        return needle && json_is_string(needle) &&
               (json_string_length(needle) == 0 || strstr(json_string_value(hay), json_string_value(needle)));
    if (json_is_object(hay)) return needle && json_is_string(needle) && json_object_get(hay, json_string_value(needle));
    size_t i;
    const json_t *x;
    json_array_foreach(hay, i, x) if (equal(x, needle)) return true;
    return false;
}

static json_t *binary(ev *e, const jexpr *x) {
    json_t *a = eval(e, x->a);
    if (e->failed) return NULL;
    if (x->op == JOP_OR) return truthy(a) ? a : eval(e, x->b);
    if (x->op == JOP_AND) return !truthy(a) ? a : eval(e, x->b);
    json_t *b = eval(e, x->b);
    if (e->failed) return NULL;
    switch (x->op) {
    case JOP_EQ: return own(e, json_boolean(equal(a, b)), x->line);
    case JOP_NE: return own(e, json_boolean(!equal(a, b)), x->line);
    case JOP_IN: return own(e, json_boolean(contains(b, a)), x->line);
    case JOP_NOTIN: return own(e, json_boolean(!contains(b, a)), x->line);
    case JOP_CONCAT: {
        json_t *sa = to_str(e, a, x->line), *sb = sa ? to_str(e, b, x->line) : NULL;
        return sb ? arith(e, JOP_ADD, sa, sb, x->line) : NULL;
    }
    case JOP_LT: case JOP_GT: case JOP_LE: case JOP_GE: {
        int c;
        if (is_num(a) && is_num(b)) c = num(a) < num(b) ? -1 : num(a) > num(b);
        else if (a && b && json_is_string(a) && json_is_string(b)) c = strcmp(json_string_value(a), json_string_value(b));
        else return efail(e, x->line, "only numbers or strings can be ordered"), NULL;
        bool r = x->op == JOP_LT ? c < 0 : x->op == JOP_GT ? c > 0 : x->op == JOP_LE ? c <= 0 : c >= 0;
        return own(e, json_boolean(r), x->line);
    }
    default: return arith(e, x->op, a, b, x->line);
    }
}

static json_t *eval(ev *e, const jexpr *x) {
    if (e->failed || !x) return NULL;
    switch (x->k) {
    case JE_LIT: return x->lit;
    case JE_VAR: return lookup(e, x->name);
    case JE_ATTR: {
        json_t *o = eval(e, x->a);
        if (!o && !e->failed) return efail(e, x->line, "'%s' of an undefined value", x->name), NULL;
        return o && json_is_object(o) ? json_object_get(o, x->name) : NULL;
    }
    case JE_ITEM: {
        json_t *o = eval(e, x->a), *k = eval(e, x->b);
        return e->failed ? NULL : getitem(e, o, k, x->line);
    }
    case JE_SLICE: {
        json_t *o = eval(e, x->a), *b = eval(e, x->b), *c = eval(e, x->c), *d = eval(e, x->d);
        return e->failed ? NULL : slice(e, o, b, c, d, x->line);
    }
    case JE_CALL:
        if (x->a->k == JE_ATTR) { /* a method: s.strip(), d.items(), ... */
            json_t *self = eval(e, x->a->a);
            if (e->failed) return NULL;
            if (!self) return efail(e, x->line, "'%s' of an undefined value", x->a->name), NULL;
            if (!json_is_object(self) || !json_object_get(self, x->a->name)) return call_method(e, x, self, x->a->name);
        }
        return call_fn(e, x);
    case JE_FILTER: return apply_filter(e, x);
    case JE_TEST: {
        bool r = apply_test(e, x);
        return e->failed ? NULL : own(e, json_boolean(r != x->neg), x->line);
    }
    case JE_BIN: return binary(e, x);
    case JE_NOT: {
        json_t *a = eval(e, x->a);
        return e->failed ? NULL : own(e, json_boolean(!truthy(a)), x->line);
    }
    case JE_NEG: {
        json_t *a = eval(e, x->a);
        if (e->failed) return NULL;
        if (!is_num(a)) return efail(e, x->line, "unary minus of a non-number"), NULL;
        if (json_is_integer(a) && json_integer_value(a) == LLONG_MIN) return efail(e, x->line, "integer arithmetic past 64 bits"), NULL;
        return own(e, json_is_integer(a) ? json_integer(-json_integer_value(a)) : json_real(-json_real_value(a)), x->line);
    }
    case JE_COND: {
        json_t *c = eval(e, x->b);
        return e->failed ? NULL : truthy(c) ? eval(e, x->a) : eval(e, x->c);
    }
    case JE_LIST: case JE_DICT: {
        json_t *r = own(e, x->k == JE_LIST ? json_array() : json_object(), x->line);
        for (int i = 0; r && i < x->n && !e->failed; i++) {
            json_t *v = eval(e, x->k == JE_LIST ? x->args[i] : x->vals[i]);
            json_t *k = x->k == JE_DICT ? eval(e, x->args[i]) : NULL;
            if (e->failed) break;
            if (x->k == JE_DICT && (!k || !json_is_string(k))) return efail(e, x->line, "a dict key must be a string"), NULL;
            if (!v) v = own(e, json_null(), x->line); /* jansson holds no undefined */
            if (x->k == JE_LIST ? json_array_append(r, v) : json_object_set(r, json_string_value(k), v)) efail(e, x->line, "out of memory");
        }
        return e->failed ? NULL : r;
    }
    }
    return NULL;
}

/* Positional argument i of a call, filter or test (0 for filters: the value filtered comes first). */
static json_t *arg(ev *e, const jexpr *x, int i, const char *kw) {
    int pos = 0;
    for (int k = 0; k < x->n; k++) {
        if (x->kw[k] ? kw && !strcmp(x->kw[k], kw) : pos++ == i) return eval(e, x->args[k]);
    }
    return NULL;
}

/* ---- functions, methods, filters, tests ---- */

static json_t *call_fn(ev *e, const jexpr *x) {
    const char *name = x->a->k == JE_VAR ? x->a->name : NULL;
    if (!name || lookup(e, name)) {
        if (!e->failed) efail(e, x->line, "only raise_exception, namespace, range, dict and strftime_now can be called here");
        return NULL;
    }
    if (!strcmp(name, "raise_exception")) {
        json_t *m = arg(e, x, 0, NULL), *s = e->failed ? NULL : to_str(e, m, x->line);
        if (s) efail(e, x->line, "the template refused the messages: %s", json_string_value(s));
        return NULL;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        json_t *r = own(e, json_object(), x->line);
        for (int i = 0; r && i < x->n && !e->failed; i++) {
            if (!x->kw[i]) return efail(e, x->line, "%s() takes name=value arguments", name), NULL;
            json_t *v = eval(e, x->args[i]);
            if (!v) v = own(e, json_null(), x->line);
            if (v && json_object_set(r, x->kw[i], v)) efail(e, x->line, "out of memory");
        }
        return e->failed ? NULL : r;
    }
    if (!strcmp(name, "range")) {
        json_t *a = arg(e, x, 0, NULL), *b = arg(e, x, 1, NULL), *c = arg(e, x, 2, NULL);
        if (e->failed || !a || !json_is_integer(a) || (b && !json_is_integer(b)) || (c && !json_is_integer(c)))
            return efail(e, x->line, "range() takes whole numbers"), NULL;
        long long lo = b ? json_integer_value(a) : 0, hi = b ? json_integer_value(b) : json_integer_value(a);
        long long st = c ? json_integer_value(c) : 1;
        if (st == 0) return efail(e, x->line, "range() with a step of 0"), NULL;
        json_t *r = own(e, json_array(), x->line);
        for (long long i = lo; r && (st > 0 ? i < hi : i > hi);) {
            if (json_array_size(r) >= 100000) return efail(e, x->line, "range() of over 100000 numbers"), NULL;
            if (json_array_append_new(r, json_integer(i))) return efail(e, x->line, "out of memory"), NULL;
            if (__builtin_add_overflow(i, st, &i)) break; /* past the end of long long: past hi too */
        }
        return r;
    }
    if (!strcmp(name, "strftime_now")) {
        json_t *f = arg(e, x, 0, NULL);
        if (!f || !json_is_string(f)) return efail(e, x->line, "strftime_now() takes a format string"), NULL;
        char buf[256];
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t k = strftime(buf, sizeof buf, json_string_value(f), &tm);
        return own(e, json_stringn(buf, k), x->line);
    }
    return efail(e, x->line, "'%s' is not a function fathom's templates have", name), NULL;
}

/* s.strip(chars) / lstrip / rstrip */
static json_t *strip(ev *e, const json_t *s, const json_t *chars, bool left, bool right, int line) {
    const char *p = json_string_value(s), *set = chars && json_is_string(chars) ? json_string_value(chars) : " \t\n\r\v\f";
    size_t a = 0, b = json_string_length(s);
    while (left && a < b && strchr(set, p[a]) && p[a]) a++;
    while (right && b > a && strchr(set, p[b - 1]) && p[b - 1]) b--;
    return own(e, json_stringn_nocheck(p + a, b - a), line);
}

static json_t *case_map(ev *e, const json_t *s, int mode, int line) { /* 0 lower, 1 upper, 2 capitalize, 3 title */
    size_t n = json_string_length(s);
    char *t = malloc(n + 1);
    if (!t) return efail(e, line, "out of memory"), NULL;
    const char *p = json_string_value(s);
    bool start = true;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        bool up = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && start);
        t[i] = up && c >= 'a' && c <= 'z' ? (char)(c - 32) : !up && mode != 1 && c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
        start = !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'));
    }
    json_t *r = own(e, json_stringn_nocheck(t, n), line);
    free(t);
    return r;
}

static json_t *replace(ev *e, const json_t *s, const json_t *from, const json_t *to, int line) {
    if (!from || !to || !json_is_string(from) || !json_is_string(to)) return efail(e, line, "replace() takes two strings"), NULL;
    const char *p = json_string_value(s), *f = json_string_value(from);
    size_t fl = json_string_length(from);
    json_t *buf = own(e, json_pack("[s]", ""), line);
    size_t i = 0, n = json_string_length(s);
    while (buf && i < n) {
        const char *hit = fl ? strstr(p + i, f) : NULL;
        size_t upto = hit ? (size_t)(hit - p) : n;
        if (!put_str(e, buf, p + i, upto - i) || (hit && !put_str(e, buf, json_string_value(to), json_string_length(to)))) return NULL;
        i = hit ? upto + fl : n;
    }
    return buf ? json_array_get(buf, 0) : NULL;
}

static json_t *split(ev *e, const json_t *s, const json_t *sep, int line) {
    json_t *r = own(e, json_array(), line);
    const char *p = json_string_value(s), *d = sep && json_is_string(sep) ? json_string_value(sep) : NULL;
    size_t n = json_string_length(s), i = 0;
    if (d && !*d) return efail(e, line, "split() with an empty separator"), NULL;
    while (r && i <= n) {
        if (!d) { /* on runs of whitespace, none empty */
            while (i < n && strchr(" \t\n\r\v\f", p[i])) i++;
            if (i >= n) break;
        }
        size_t j = i;
        const char *hit = d ? strstr(p + i, d) : NULL;
        if (d) j = hit ? (size_t)(hit - p) : n;
        else while (j < n && !strchr(" \t\n\r\v\f", p[j])) j++;
        if (json_array_append_new(r, json_stringn_nocheck(p + i, j - i))) return efail(e, line, "out of memory"), NULL;
        i = d ? (hit ? j + strlen(d) : n + 1) : j;
    }
    return r;
}

static json_t *items_of(ev *e, json_t *d, int which, int line) { /* 0 items, 1 keys, 2 values */
    if (!json_is_object(d)) return efail(e, line, "items(), keys() and values() are for dicts"), NULL;
    json_t *r = own(e, json_array(), line);
    const char *key;
    json_t *v;
    json_object_foreach(d, key, v) {
        json_t *k = json_string(key);
        json_t *x = which == 0 ? json_pack("[oO]", k, v) : which == 1 ? k : json_incref(v);
        if (which == 2) json_decref(k);
        if (!r || json_array_append_new(r, x)) return efail(e, line, "out of memory"), NULL;
    }
    return r;
}

static json_t *call_method(ev *e, const jexpr *x, json_t *self, const char *m) {
    int line = x->line;
    json_t *a0 = arg(e, x, 0, NULL), *a1 = arg(e, x, 1, NULL);
    if (e->failed) return NULL;
    if (json_is_string(self)) {
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
            return strip(e, self, a0, m[0] != 'r', m[0] != 'l', line);
        if (!strcmp(m, "lower") || !strcmp(m, "upper") || !strcmp(m, "capitalize") || !strcmp(m, "title"))
            return case_map(e, self, m[0] == 'l' ? 0 : m[0] == 'u' ? 1 : m[0] == 'c' ? 2 : 3, line);
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            if (!a0 || !json_is_string(a0)) return efail(e, line, "%s() takes a string", m), NULL;
            size_t n = json_string_length(self), k = json_string_length(a0);
            bool r = k <= n && !memcmp(json_string_value(self) + (m[0] == 's' ? 0 : n - k), json_string_value(a0), k);
            return own(e, json_boolean(r), line);
        }
        if (!strcmp(m, "replace")) return replace(e, self, a0, a1, line);
        if (!strcmp(m, "split")) return split(e, self, a0, line);
        if (!strcmp(m, "join")) {
            if (!a0 || !json_is_array(a0)) return efail(e, line, "join() takes a list"), NULL;
            json_t *buf = own(e, json_pack("[s]", ""), line);
            size_t i;
            json_t *v;
            json_array_foreach(a0, i, v) {
                json_t *s = to_str(e, v, line);
                if (!buf || !s || (i && !put_str(e, buf, json_string_value(self), json_string_length(self))) ||
                    !put_str(e, buf, json_string_value(s), json_string_length(s)))
                    return NULL;
            }
            return buf ? json_array_get(buf, 0) : NULL;
        }
    }
    if (json_is_object(self)) {
        if (!strcmp(m, "items")) return items_of(e, self, 0, line);
        if (!strcmp(m, "keys")) return items_of(e, self, 1, line);
        if (!strcmp(m, "values")) return items_of(e, self, 2, line);
        if (!strcmp(m, "get")) {
            json_t *v = a0 && json_is_string(a0) ? json_object_get(self, json_string_value(a0)) : NULL;
            return v ? v : a1 ? a1 : own(e, json_null(), line);
        }
    }
    return efail(e, line, "'%s()' is not a method fathom's templates have for this value", m), NULL;
}

static json_t *length_of(ev *e, const json_t *v, int line) {
    if (!v) return own(e, json_integer(0), line);
    size_t n = json_is_string(v) ? json_string_length(v) : json_is_array(v) ? json_array_size(v) : json_is_object(v) ? json_object_size(v) : (size_t)-1;
    if (n == (size_t)-1) return efail(e, line, "length of a value that has none"), NULL;
    if (json_is_string(v)) { /* characters, not bytes */
        n = 0;
        for (const unsigned char *p = (const unsigned char *)json_string_value(v); *p; p++) n += (*p & 0xC0) != 0x80;
    }
    return own(e, json_integer((json_int_t)n), line);
}

/* tojson as transformers defines it: json.dumps(x, ensure_ascii=False, indent=indent). */
static json_t *to_json(ev *e, const jexpr *x, json_t *v) {
    json_t *ind = arg(e, x, 0, "indent");
    size_t flags = JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17);
    if (ind && json_is_integer(ind) && json_integer_value(ind) > 0 && json_integer_value(ind) <= 31)
        flags |= JSON_INDENT((size_t)json_integer_value(ind));
    char *s = json_dumps(v ? v : json_null(), flags);
    json_t *r = s ? own(e, json_string(s), x->line) : NULL;
    free(s);
    if (!s) efail(e, x->line, "tojson of a value that has no JSON form");
    return r;
}

static json_t *apply_filter(ev *e, const jexpr *x) {
    json_t *v = eval(e, x->a);
    if (e->failed) return NULL;
    const char *f = x->name;
    int line = x->line;
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        json_t *dflt = arg(e, x, 0, "default_value"), *b = arg(e, x, 1, "boolean");
        return (!v || (truthy(b) && !truthy(v))) ? (dflt ? dflt : own(e, json_string(""), line)) : v;
    }
    if (!strcmp(f, "safe") || !strcmp(f, "e") || !strcmp(f, "escape")) return strcmp(f, "safe") ? (efail(e, line, "the escape filter is not supported"), NULL) : v;
    if (!strcmp(f, "tojson")) return to_json(e, x, v);
    if (!strcmp(f, "length") || !strcmp(f, "count")) return length_of(e, v, line);
    if (!strcmp(f, "string")) return to_str(e, v, line);
    if (!v) return efail(e, line, "the '%s' filter on an undefined value", f), NULL;
    if (!strcmp(f, "trim")) return json_is_string(v) ? strip(e, v, arg(e, x, 0, "chars"), true, true, line) : (efail(e, line, "trim of a non-string"), NULL);
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize") || !strcmp(f, "title")) {
        json_t *s = to_str(e, v, line);
        return s ? case_map(e, s, f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 'c' ? 2 : 3, line) : NULL;
    }
    if (!strcmp(f, "replace")) return json_is_string(v) ? replace(e, v, arg(e, x, 0, NULL), arg(e, x, 1, NULL), line) : (efail(e, line, "replace of a non-string"), NULL);
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        if (!json_is_array(v)) return efail(e, line, "%s of a non-list", f), NULL;
        size_t n = json_array_size(v);
        return n ? json_array_get(v, f[0] == 'f' ? 0 : n - 1) : NULL;
    }
    if (!strcmp(f, "join")) {
        json_t *sep = arg(e, x, 0, "d");
        if (!json_is_array(v)) return efail(e, line, "join of a non-list"), NULL;
        json_t *buf = own(e, json_pack("[s]", ""), line);
        size_t i;
        json_t *it;
        json_array_foreach(v, i, it) {
            json_t *s = to_str(e, it, line);
            if (!buf || !s || (i && sep && json_is_string(sep) && !put_str(e, buf, json_string_value(sep), json_string_length(sep))) ||
                !put_str(e, buf, json_string_value(s), json_string_length(s)))
                return NULL;
        }
        return buf ? json_array_get(buf, 0) : NULL;
    }
    if (!strcmp(f, "list")) return json_is_array(v) ? v : json_is_object(v) ? items_of(e, v, 1, line) : (efail(e, line, "list of this value"), NULL);
    if (!strcmp(f, "items")) return items_of(e, v, 0, line);
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) return select_items(e, x, v, true, f[0] == 's');
    if (!strcmp(f, "select") || !strcmp(f, "reject")) return select_items(e, x, v, false, f[0] == 's');
    if (!strcmp(f, "map")) return map_items(e, x, v);
    if (!strcmp(f, "reverse")) {
        if (!json_is_array(v)) return efail(e, line, "reverse of a non-list"), NULL;
        json_t *r = own(e, json_array(), line);
        for (size_t i = json_array_size(v); r && i > 0; i--)
            if (json_array_append(r, json_array_get(v, i - 1))) return efail(e, line, "out of memory"), NULL;
        return r;
    }
    if (!strcmp(f, "int")) {
        if (json_is_real(v) && !(fabs(json_real_value(v)) < 9.2e18)) return efail(e, line, "int of %g: past 64 bits", json_real_value(v)), NULL;
        return own(e, json_integer(is_num(v) ? (json_int_t)num(v) : json_is_string(v) ? strtoll(json_string_value(v), NULL, 10) : 0), line);
    }
    if (!strcmp(f, "abs") && is_num(v) && !(json_is_integer(v) && json_integer_value(v) == LLONG_MIN))
        return own(e, json_is_integer(v) ? json_integer(llabs(json_integer_value(v))) : json_real(fabs(num(v))), line);
    return efail(e, line, "the '%s' filter is not supported in chat templates here", f), NULL;
}

static bool run_test(ev *e, const char *t, json_t *v, json_t *a0, int line);

static bool apply_test(ev *e, const jexpr *x) {
    json_t *v = eval(e, x->a), *a0 = e->failed ? NULL : arg(e, x, 0, NULL);
    return e->failed ? false : run_test(e, x->name, v, a0, x->line);
}

/* Test t (by name) of v, with argument a0 where it takes one. */
static bool run_test(ev *e, const char *t, json_t *v, json_t *a0, int line) {
    if (!strcmp(t, "defined")) return v != NULL;
    if (!strcmp(t, "undefined")) return v == NULL;
    if (!strcmp(t, "none")) return v && json_is_null(v);
    if (!strcmp(t, "string")) return v && json_is_string(v);
    if (!strcmp(t, "number")) return is_num(v);
    if (!strcmp(t, "integer")) return v && json_is_integer(v);
    if (!strcmp(t, "float")) return v && json_is_real(v);
    if (!strcmp(t, "boolean")) return v && json_is_boolean(v);
    if (!strcmp(t, "true")) return v && json_is_true(v);
    if (!strcmp(t, "false")) return v && json_is_false(v);
    if (!strcmp(t, "mapping")) return v && json_is_object(v);
    if (!strcmp(t, "sequence") || !strcmp(t, "iterable")) return v && (json_is_array(v) || json_is_string(v) || json_is_object(v));
    if (!strcmp(t, "odd") || !strcmp(t, "even")) {
        if (!v || !json_is_integer(v)) return efail(e, line, "'%s' of a non-integer", t), false;
        return (json_integer_value(v) % 2 != 0) == (t[0] == 'o');
    }
    if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "sameas") || !strcmp(t, "==")) return equal(v, a0);
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) return !equal(v, a0);
    if (!strcmp(t, "in")) return contains(a0, v);
    efail(e, line, "the '%s' test is not supported in chat templates here", t);
    return false;
}

/* selectattr / rejectattr (attribute, [test, [argument]]; no test: truthiness) and
 * select / reject (test, [argument]) over a list. */
static json_t *select_items(ev *e, const jexpr *x, json_t *list, bool attr, bool keep) {
    if (!json_is_array(list)) return efail(e, x->line, "%s of a non-list", x->name), NULL;
    json_t *name = attr ? arg(e, x, 0, NULL) : NULL, *test = arg(e, x, attr ? 1 : 0, NULL), *a0 = arg(e, x, attr ? 2 : 1, NULL);
    if (e->failed) return NULL;
    if ((attr && (!name || !json_is_string(name))) || (test && !json_is_string(test)))
        return efail(e, x->line, "%s takes %sa test name", x->name, attr ? "an attribute name and " : ""), NULL;
    json_t *r = own(e, json_array(), x->line);
    size_t i;
    json_t *it;
    json_array_foreach(list, i, it) {
        json_t *v = !attr ? it : json_is_object(it) ? json_object_get(it, json_string_value(name)) : NULL;
        bool ok = test ? run_test(e, json_string_value(test), v, a0, x->line) : truthy(v);
        if (e->failed) return NULL;
        if (ok == keep && (!r || json_array_append(r, it))) return efail(e, x->line, "out of memory"), NULL;
    }
    return r;
}

/* map(attribute="name") or map("filter") of a list (trim, upper, lower, string, length, tojson). */
static json_t *map_items(ev *e, const jexpr *x, json_t *list) {
    if (!json_is_array(list)) return efail(e, x->line, "map of a non-list"), NULL;
    json_t *attr = arg(e, x, -1, "attribute"), *f = attr ? NULL : arg(e, x, 0, NULL);
    if (e->failed) return NULL;
    if ((!attr || !json_is_string(attr)) && (!f || !json_is_string(f)))
        return efail(e, x->line, "map takes attribute=\"name\" or a filter name"), NULL;
    json_t *r = own(e, json_array(), x->line);
    size_t i;
    json_t *it;
    json_array_foreach(list, i, it) {
        json_t *v = NULL;
        if (attr) {
            v = json_is_object(it) ? json_object_get(it, json_string_value(attr)) : NULL;
        } else {
            jexpr lit = {.k = JE_LIT, .line = x->line, .lit = it}, call = {.k = JE_FILTER, .line = x->line, .a = &lit};
            call.name = (char *)json_string_value(f);
            v = apply_filter(e, &call);
        }
        if (e->failed) return NULL;
        if (!v) v = own(e, json_null(), x->line);
        if (!r || !v || json_array_append(r, v)) return efail(e, x->line, "out of memory"), NULL;
    }
    return r;
}

/* ---- statements ---- */

static bool render_body(ev *e, const jbody *b);

static bool set_var(ev *e, const jnode *nd) {
    json_t *v = eval(e, nd->e);
    if (e->failed) return false;
    if (!v) v = own(e, json_null(), nd->line);
    if (!nd->vars[1]) return !json_object_set(e->frames[e->nframes - 1], nd->vars[0], v) || (efail(e, nd->line, "out of memory"), false);
    json_t *ns = lookup(e, nd->vars[0]);
    if (!ns || !json_is_object(ns)) return efail(e, nd->line, "'%s' is not a namespace", nd->vars[0]), false;
    return !json_object_set(ns, nd->vars[1], v) || (efail(e, nd->line, "out of memory"), false);
}

/* The items a for loop walks: a list's, a dict's keys (or [key, value] pairs with two names), a string's characters. */
static json_t *loop_items(ev *e, const jnode *nd) {
    json_t *it = eval(e, nd->e);
    if (e->failed) return NULL;
    if (!it) return own(e, json_array(), nd->line); /* an undefined iterable runs the loop zero times */
    if (json_is_array(it)) return it;
    json_t *r = own(e, json_array(), nd->line);
    const char *key;
    json_t *v;
    if (r && json_is_object(it)) {
        json_object_foreach(it, key, v) {
            json_t *k = json_string(key);
            if (json_array_append_new(r, k)) return efail(e, nd->line, "out of memory"), NULL;
        }
    } else if (r && json_is_string(it)) {
        return chars_of(e, it, nd->line);
    } else if (r) {
        return efail(e, nd->line, "a for loop over a value that is not a list, dict or string"), NULL;
    }
    return r;
}

/* Binds the loop's names to item (two names: the item's two elements). */
static bool bind(ev *e, const jnode *nd, json_t *frame, json_t *item) {
    if (!nd->vars[1]) return !json_object_set(frame, nd->vars[0], item);
    if (!json_is_array(item) || json_array_size(item) != 2)
        return efail(e, nd->line, "cannot unpack a value into '%s, %s'", nd->vars[0], nd->vars[1]), false;
    return !json_object_set(frame, nd->vars[0], json_array_get(item, 0)) && !json_object_set(frame, nd->vars[1], json_array_get(item, 1));
}

static bool render_for(ev *e, const jnode *nd) {
    json_t *items = loop_items(e, nd), *kept = items ? own(e, json_array(), nd->line) : NULL;
    if (!kept || !push_frame(e, nd->line)) return false;
    size_t i;
    json_t *item;
    json_array_foreach(items, i, item) { /* the `if` filter first: loop.length counts what is kept */
        if (nd->filter) {
            json_t *f = e->frames[e->nframes - 1];
            json_object_clear(f);
            if (!bind(e, nd, f, item)) break;
            json_t *c = eval(e, nd->filter);
            if (e->failed) break;
            if (!truthy(c)) continue;
        }
        if (json_array_append(kept, item)) { efail(e, nd->line, "out of memory"); break; }
    }
    size_t n = json_array_size(kept);
    json_array_foreach(kept, i, item) {
        if (e->failed || ++e->iters > MAX_ITER) { if (!e->failed) efail(e, nd->line, "over %d loop iterations", MAX_ITER); break; }
        json_t *f = e->frames[e->nframes - 1];
        json_object_clear(f);
        json_t *loop = json_pack("{s:I,s:I,s:I,s:I,s:b,s:b,s:I}", "index", (json_int_t)i + 1, "index0", (json_int_t)i, "revindex",
                                 (json_int_t)(n - i), "revindex0", (json_int_t)(n - i - 1), "first", i == 0, "last", i + 1 == n,
                                 "length", (json_int_t)n);
        if (!loop || json_object_set_new(f, "loop", loop) || !bind(e, nd, f, item)) { efail(e, nd->line, "out of memory"); break; }
        if (!render_body(e, &nd->body)) break;
        int b = e->brk;
        e->brk = 0;
        if (b == 1) break;
    }
    e->nframes--;
    if (!e->failed && n == 0) return render_body(e, &nd->els);
    return !e->failed;
}

static bool render_node(ev *e, const jnode *nd) {
    switch (nd->k) {
    case JN_TEXT: return emit(e, nd->text, nd->len, nd->line);
    case JN_OUT: {
        json_t *v = eval(e, nd->e), *s = e->failed ? NULL : to_str(e, v, nd->line);
        return s && emit(e, json_string_value(s), json_string_length(s), nd->line);
    }
    case JN_IF:
        for (int i = 0; i < nd->n; i++) {
            json_t *c = eval(e, nd->conds[i]);
            if (e->failed) return false;
            if (truthy(c)) return render_body(e, &nd->bodies[i]);
        }
        return render_body(e, &nd->els);
    case JN_FOR: return render_for(e, nd);
    case JN_SET: return set_var(e, nd);
    case JN_BREAK: e->brk = 1; return true;
    case JN_CONTINUE: e->brk = 2; return true;
    case JN_BLOCK: return render_body(e, &nd->body);
    }
    return false;
}

static bool render_body(ev *e, const jbody *b) {
    for (int i = 0; i < b->n && !e->failed && !e->brk; i++)
        if (!render_node(e, b->v[i])) return false;
    return !e->failed;
}

char *fm_jinja_render(const fm_jinja *t, const json_t *vars, size_t *n, char *err, size_t errn) {
    ev e = {.err = err, .errn = errn};
    e.pool = json_array();
    json_t *globals = json_is_object(vars) ? json_deep_copy(vars) : json_object();
    if (!e.pool || !globals) { json_decref(e.pool); json_decref(globals); snprintf(err, errn, "out of memory"); return NULL; }
    e.frames[e.nframes++] = globals;
    bool ok = emit(&e, "", 0, 0) && render_body(&e, &t->root);
    json_decref(globals);
    json_decref(e.pool);
    if (!ok) { free(e.out); return NULL; }
    *n = e.len;
    return e.out;
}
