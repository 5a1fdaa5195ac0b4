/* Protobuf text format -> JSON (pbtxt.h says what and why). A recursive descent
 * over the bytes; the nesting depth is bounded so that no input runs the stack out. */
#include "serve/pbtxt.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/error.h"

#define MAX_DEPTH 64
#define MAX_NAME 128

typedef struct {
    const char *s;
    size_t n, i;
    const char *where;
    int depth;
    bool failed;
} reader;

/* ModelConfig's repeated fields (Triton's model_config.proto): arrays even when given once */
static const char *const repeated_fields[] = {
    "input", "output", "batch_input", "batch_output", "instance_group", "model_warmup", "dims", "shape", "gpus",
    "secondary_devices", "profile", "preferred_batch_size", "versions", "target_name", "source_input", "resources",
    "control_input", "control", "state", "initial_state", "step", "gpu_execution_accelerator",
    "cpu_execution_accelerator", "int32_false_true", "fp32_false_true", "bool_false_true", "graph_spec"};
/* its map fields: objects keyed by the entries' keys */
static const char *const map_fields[] = {"parameters", "input_map",   "output_map", "cc_model_filenames",
                                         "metric_tags", "priority_queue_policy", "inputs"};
/* the singular fields model_config.c reads: given twice is an error, as protobuf's parser says */
static const char *const read_fields[] = {
    "name", "platform", "backend", "default_model_filename", "max_batch_size", "data_type", "dynamic_batching",
    "max_queue_delay_microseconds", "default_queue_policy", "max_queue_size", "default_timeout_microseconds", "count",
    "kind", "version_policy", "latest", "all", "specific", "num_versions", "text_generation", "kv_cache_blocks",
    "kv_block_tokens", "prefill_chunk_tokens", "stream_interval_tokens", "kv_cache_dtype", "chat_template"};

static bool in_list(const char *name, const char *const *list, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (!strcmp(name, list[k])) return true;
    return false;
}
#define IN(name, list) in_list(name, list, sizeof list / sizeof *list)

/* Sets the error once, at byte `at`, as WHERE:LINE:COLUMN. */
static void fail_at(reader *r, size_t at, const char *fmt, const char *arg) {
    if (r->failed) return;
    r->failed = true;
    int line = 1, col = 1;
    for (size_t k = 0; k < at && k < r->n; k++) {
        if (r->s[k] == '\n') line++, col = 1;
        else col++;
    }
    char what[256];
    snprintf(what, sizeof what, fmt, arg ? arg : "");
    fm_set_error(FM_ERR_FORMAT, "%s:%d:%d: %s", r->where, line, col, what);
}

static void skip_space(reader *r) {
    while (r->i < r->n) {
        char c = r->s[r->i];
        if (c == '#') {
            while (r->i < r->n && r->s[r->i] != '\n') r->i++;
        } else if (isspace((unsigned char)c)) {
            r->i++;
        } else {
            return;
        }
    }
}

static int peek(reader *r) {
    skip_space(r);
    return r->i < r->n ? (unsigned char)r->s[r->i] : 0;
}

static bool is_ident_start(int c) { return isalpha(c) || c == '_'; }

/* An identifier into buf; false (error set) when there is none or it is too long. */
static bool read_ident(reader *r, char *buf, const char *what) {
    size_t start = r->i, k = 0;
    if (r->i >= r->n || !is_ident_start((unsigned char)r->s[r->i])) {
        fail_at(r, start, "expected %s", what);
        return false;
    }
    while (r->i < r->n && (isalnum((unsigned char)r->s[r->i]) || r->s[r->i] == '_')) {
        if (k + 1 >= MAX_NAME) { fail_at(r, start, "a name longer than 127 characters%s", NULL); return false; }
        buf[k++] = r->s[r->i++];
    }
    buf[k] = 0;
    return true;
}

static int hex_value(int c) { return isdigit(c) ? c - '0' : isxdigit(c) ? (tolower(c) - 'a' + 10) : -1; }

/* Appends code point cp (from \u or \U) as UTF-8; the JSON string checks the rest. */
static size_t put_utf8(char *o, unsigned long cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* One escape after the backslash at r->i - 1, written to o; its length, or 0 on error. */
static size_t read_escape(reader *r, char *o) {
    size_t at = r->i - 1;
    if (r->i >= r->n) { fail_at(r, at, "a string ends inside an escape%s", NULL); return 0; }
    char c = r->s[r->i++];
    const char *plain = "abfnrtv\\'\"?", *means = "\a\b\f\n\r\t\v\\'\"?";
    const char *p = c ? strchr(plain, c) : NULL;
    if (p) { *o = means[p - plain]; return 1; }
    if (c >= '0' && c <= '7') { /* up to three octal digits */
        unsigned v = (unsigned)(c - '0');
        for (int k = 0; k < 2 && r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '7'; k++) v = v * 8 + (unsigned)(r->s[r->i++] - '0');
        if (v > 255) { fail_at(r, at, "an octal escape above \\377%s", NULL); return 0; }
        *o = (char)v;
        return 1;
    }
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (!digits) { fail_at(r, at, "unknown escape in a string%s", NULL); return 0; }
    unsigned long v = 0;
    int got = 0;
    while (got < digits && r->i < r->n && hex_value((unsigned char)r->s[r->i]) >= 0) v = v * 16 + (unsigned long)hex_value((unsigned char)r->s[r->i++]), got++;
    if (!got || (c != 'x' && got != digits) || (c != 'x' && (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)))) {
        fail_at(r, at, "a malformed \\x, \\u or \\U escape%s", NULL);
        return 0;
    }
    if (c == 'x') { *o = (char)v; return 1; }
    return put_utf8(o, v);
}

/* One or more adjacent quoted strings, joined. */
static json_t *read_string(reader *r) {
    size_t start = r->i, cap = 64, len = 0;
    char *buf = malloc(cap);
    if (!buf) { fail_at(r, start, "out of memory%s", NULL); return NULL; }
    while (!r->failed && r->i < r->n && (r->s[r->i] == '"' || r->s[r->i] == '\'')) {
        char q = r->s[r->i++];
        for (;;) {
            if (r->i >= r->n || r->s[r->i] == '\n') { fail_at(r, start, "a string with no closing quote%s", NULL); break; }
            if (len + 8 > cap) {
                char *nb = realloc(buf, cap *= 2);
                if (!nb) { fail_at(r, start, "out of memory%s", NULL); break; }
                buf = nb;
            }
            char c = r->s[r->i++];
            if (c == q) break;
            if (c != '\\') { buf[len++] = c; continue; }
            size_t k = read_escape(r, buf + len);
            if (!k) break;
            len += k;
        }
        skip_space(r);
    }
    json_t *j = r->failed ? NULL : json_stringn(buf, len);
    if (!j) fail_at(r, start, "a string that is not UTF-8 text%s", NULL);
    free(buf);
    return j;
}

/* A number: an integer when it is one (decimal, 0x hex, 0 octal), else a double
 * (an 'f' suffix allowed). -inf and -nan have no JSON form: they stay text. */
static json_t *read_number(reader *r) {
    size_t start = r->i;
    char tok[80];
    size_t k = 0;
    if (r->s[r->i] == '-') tok[k++] = r->s[r->i++];
    while (r->i < r->n && k + 1 < sizeof tok) {
        char c = r->s[r->i], prev = k ? tok[k - 1] : 0;
        bool sign = (c == '+' || c == '-') && (prev == 'e' || prev == 'E') && !(k > 1 && (tok[1] == 'x' || tok[1] == 'X'));
        if (!isalnum((unsigned char)c) && c != '.' && c != '_' && !sign) break;
        tok[k++] = c;
        r->i++;
    }
    tok[k] = 0;
    const char *body = tok[0] == '-' ? tok + 1 : tok;
    if (is_ident_start((unsigned char)*body)) return json_string(tok); /* -inf, -nan */
    char *end;
    errno = 0;
    long long v = strtoll(tok, &end, 0);
    if (end != tok && !*end && !errno) return json_integer(v);
    if (end != tok && !*end) { fail_at(r, start, "the integer %s does not fit in 64 bits", tok); return NULL; }
    errno = 0;
    double d = strtod(tok, &end);
    if (end != tok && (*end == 'f' || *end == 'F') && !end[1]) end++;
    if (end == tok || *end || errno) { fail_at(r, start, "'%s' is not a number", tok); return NULL; }
    return json_real(d);
}

static json_t *read_message(reader *r, int close);

/* A value after `name:` or in a list: a message, a string, a number or an enum name. */
static json_t *read_value(reader *r) {
    int c = peek(r);
    if (c == '{' || c == '<') { r->i++; return read_message(r, c == '{' ? '}' : '>'); }
    if (c == '"' || c == '\'') return read_string(r);
    if (c == '-' || c == '.' || isdigit(c)) return read_number(r);
    if (is_ident_start(c)) {
        char id[MAX_NAME];
        if (!read_ident(r, id, "a value")) return NULL;
        if (!strcmp(id, "true") || !strcmp(id, "True")) return json_true();
        if (!strcmp(id, "false") || !strcmp(id, "False")) return json_false();
        return json_string(id);
    }
    fail_at(r, r->i, c ? "expected a value (a number, a string, a name or { ... })%s" : "the file ends where a value "
                     "was expected%s", NULL);
    return NULL;
}

/* `[v, v, ...]` after its '[' */
static json_t *read_list(reader *r) {
    json_t *a = json_array();
    if (peek(r) == ']') { r->i++; return a; }
    for (;;) {
        json_t *v = read_value(r);
        if (!v) { json_decref(a); return NULL; }
        json_array_append_new(a, v);
        int c = peek(r);
        r->i++;
        if (c == ']') return a;
        if (c != ',') {
            fail_at(r, r->i - 1, c ? "expected ',' or ']' in a list%s" : "the file ends inside a list ('[' with no ']')%s", NULL);
            json_decref(a);
            return NULL;
        }
    }
}

/* A map field's entries {key: K value: V} into the object `into`. Steals `entries`. */
static bool add_map_entries(reader *r, json_t *into, json_t *entries, const char *name, size_t at) {
    size_t k;
    json_t *e;
    bool ok = true;
    json_array_foreach(entries, k, e) {
        json_t *key = json_object_get(e, "key"), *val = json_object_get(e, "value");
        char ks[64];
        const char *kstr = json_is_string(key) ? json_string_value(key) : ks;
        if (json_is_integer(key)) snprintf(ks, sizeof ks, "%lld", (long long)json_integer_value(key));
        else if (!json_is_string(key)) { fail_at(r, at, "each entry of the map '%s' needs a key", name); ok = false; break; }
        if (json_object_get(into, kstr)) { fail_at(r, at, "a key given twice in the map '%s'", name); ok = false; break; }
        json_object_set(into, kstr, val ? val : json_null());
    }
    json_decref(entries);
    return ok;
}

/* Adds field `name` (value v, or the elements of list v) to obj. Steals v. */
static bool add_field(reader *r, json_t *obj, const char *name, json_t *v, bool is_list, size_t at) {
    json_t *have = json_object_get(obj, name);
    if (!is_list) {
        json_t *a = json_array();
        json_array_append_new(a, v);
        v = a;
    }
    if (IN(name, map_fields)) {
        if (!have) json_object_set_new(obj, name, have = json_object());
        return add_map_entries(r, have, v, name, at);
    }
    if (!have && (is_list || IN(name, repeated_fields))) return json_object_set_new(obj, name, v) == 0;
    if (!have) {
        json_object_set(obj, name, json_array_get(v, 0));
        json_decref(v);
        return true;
    }
    if (!json_is_array(have) && IN(name, read_fields)) {
        fail_at(r, at, "the field '%s' is given twice; it holds one value", name);
        json_decref(v);
        return false;
    }
    if (!json_is_array(have)) { /* a field fathom does not read, repeated: keep every value */
        json_t *a = json_array();
        json_array_append(a, have);
        json_object_set_new(obj, name, a);
        have = a;
    }
    json_array_extend(have, v);
    json_decref(v);
    return true;
}

/* Fields up to `close` ('}' or '>'; 0: the end of the text). */
static json_t *read_message(reader *r, int close) {
    if (++r->depth > MAX_DEPTH) { fail_at(r, r->i, "messages nested more than 64 deep%s", NULL); return NULL; }
    json_t *obj = json_object();
    for (;;) {
        int c = peek(r);
        size_t at = r->i;
        if (c == close) { if (c) r->i++; break; }
        if (!c) { fail_at(r, at, close == '}' ? "the file ends inside { ... } (a '}' is missing)%s" : "the file ends inside "
                                                "< ... > (a '>' is missing)%s", NULL); break; }
        if (c == '[') { fail_at(r, at, "extension and Any fields ([...]) are not read here%s", NULL); break; }
        char name[MAX_NAME];
        if (!read_ident(r, name, "a field name")) break;
        bool colon = peek(r) == ':';
        if (colon) r->i++;
        c = peek(r);
        json_t *v = NULL;
        if (c == '[') { r->i++; v = read_list(r); }
        else if (c == '{' || c == '<' || colon) v = read_value(r);
        else fail_at(r, r->i, "expected ':' or '{' after the field name '%s'", name);
        if (!v || !add_field(r, obj, name, v, c == '[', at)) break;
        if (peek(r) == ',' || peek(r) == ';') r->i++;
    }
    r->depth--;
    if (r->failed) { json_decref(obj); return NULL; }
    return obj;
}

json_t *fm_pbtxt_to_json(const char *text, size_t len, const char *where) {
    reader r = {.s = text, .n = len, .where = where ? where : "config.pbtxt"};
    if (memchr(text, 0, len)) { fail_at(&r, (size_t)((const char *)memchr(text, 0, len) - text), "a NUL byte: this is not "
                                                                                               "a text file%s", NULL); return NULL; }
    return read_message(&r, 0);
}
