/* OpenAI's POST /v1/embeddings bodies (docs/SERVING.md): the request's fields, and
 * the reply with the vectors as JSON numbers or base64 (encoding_format). Apart
 * from the HTTP daemon so that tests/fuzz/fuzz_embed_request.c drives them. */
#include "serve/openai_codec.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fm_openai_embed_req_free(fm_openai_embed_req *r) {
    json_decref(r->body);
    free(r->texts);
    memset(r, 0, sizeof *r);
}

static int fail(fm_openai_embed_req *r, char *err, size_t errn, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(fm_openai_embed_req *r, char *err, size_t errn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errn, fmt, ap);
    va_end(ap);
    fm_openai_embed_req_free(r);
    return 400;
}

/* input: a string or an array of 1..FM_OPENAI_EMBED_MAX_INPUTS non-empty strings */
static int parse_input(fm_openai_embed_req *r, const json_t *in, char *err, size_t errn) {
    size_t n = json_is_array(in) ? json_array_size(in) : 1;
    if (!in) return fail(r, err, errn, "'input' is missing: a string or an array of strings to embed");
    if (!json_is_string(in) && !json_is_array(in))
        return fail(r, err, errn, "'input' must be a string or an array of strings");
    if (n == 0 || n > FM_OPENAI_EMBED_MAX_INPUTS)
        return fail(r, err, errn, "'input' holds %zu texts; give 1 to %d", n, FM_OPENAI_EMBED_MAX_INPUTS);
    if (!(r->texts = calloc(n, sizeof *r->texts))) return fail(r, err, errn, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_is_array(in) ? json_array_get(in, i) : in;
        if (json_is_integer(t) || json_is_array(t))
            return fail(r, err, errn, "input %lld: token ids are not taken here; send the text (the model's own "
                        "tokenizer runs on the server)", (long long)i);
        if (!json_is_string(t)) return fail(r, err, errn, "input %lld must be a string", (long long)i);
        if (json_string_length(t) == 0 || strlen(json_string_value(t)) != json_string_length(t))
            return fail(r, err, errn, "input %lld is empty (or holds a NUL byte): give text to embed", (long long)i);
        r->texts[i] = json_string_value(t);
    }
    r->n = (int)n;
    return 0;
}

int fm_openai_embed_parse(const char *body, size_t len, fm_openai_embed_req *r, char *err, size_t errn) {
    memset(r, 0, sizeof *r);
    json_error_t je;
    r->body = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(r->body)) {
        if (!r->body) snprintf(err, errn, "the body is not JSON: %s", je.text);
        else snprintf(err, errn, "the body must be a JSON object");
        fm_openai_embed_req_free(r);
        return 400;
    }
    r->model = json_string_value(json_object_get(r->body, "model"));
    if (!r->model || !*r->model) return fail(r, err, errn, "'model' must name a loaded embedding model");
    const json_t *fmt = json_object_get(r->body, "encoding_format"), *dims = json_object_get(r->body, "dimensions");
    const char *f = json_string_value(fmt);
    if (fmt && (!f || (strcmp(f, "float") && strcmp(f, "base64"))))
        return fail(r, err, errn, "'encoding_format' must be \"float\" or \"base64\"");
    r->base64 = f && !strcmp(f, "base64");
    if (dims && (!json_is_integer(dims) || json_integer_value(dims) < 1))
        return fail(r, err, errn, "'dimensions' must be a whole number >= 1");
    r->dimensions = dims ? (int64_t)json_integer_value(dims) : 0;
    return parse_input(r, json_object_get(r->body, "input"), err, errn);
}

/* Standard base64 with padding. Written here: neither jansson nor libmicrohttpd
 * exports an encoder, and these few lines are not worth another dependency. */
static char *base64(const unsigned char *p, size_t n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc((n + 2) / 3 * 4 + 1), *q = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *q++ = tab[v >> 18 & 63];
        *q++ = tab[v >> 12 & 63];
        *q++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
        *q++ = i + 2 < n ? tab[v & 63] : '=';
    }
    *q = 0;
    return o;
}

json_t *fm_openai_embed_reply(const char *model, const float *emb, int n, int dim, bool b64, int64_t tokens) {
    json_t *data = json_array();
    for (int i = 0; data && i < n; i++) {
        const float *row = emb + (size_t)i * (size_t)dim;
        json_t *vec;
        if (b64) { /* the float32 values' little-endian bytes, as OpenAI's clients decode them */
            char *s = base64((const unsigned char *)row, sizeof(float) * (size_t)dim);
            vec = s ? json_string(s) : NULL;
            free(s);
        } else {
            vec = json_array();
            for (int d = 0; vec && d < dim; d++) json_array_append_new(vec, json_real(row[d]));
        }
        if (!vec) { json_decref(data); return NULL; }
        json_array_append_new(data, json_pack("{s:s,s:i,s:o}", "object", "embedding", "index", i, "embedding", vec));
    }
    if (!data) return NULL;
    return json_pack("{s:s,s:o,s:s,s:{s:I,s:I}}", "object", "list", "data", data, "model", model, "usage", "prompt_tokens",
                     (json_int_t)tokens, "total_tokens", (json_int_t)tokens);
}
