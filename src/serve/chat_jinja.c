/* A model's own chat template (jinja.h): found, parsed once at load, rendered per request. */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "serve/jinja.h"

static bool is_file(const char *dir, const char *name, char *path, size_t n) {
    struct stat st;
    snprintf(path, n, "%s/%s", dir, name);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A special token's text: a string, or an AddedToken object's "content". */
static const char *token_text(const json_t *v) {
    return json_is_string(v) ? json_string_value(v) : json_string_value(json_object_get(v, "content"));
}

/* The template's source out of tokenizer_config.json's or chat_template.json's "chat_template". */
static const json_t *template_of(const json_t *t) {
    if (json_is_string(t)) return t;
    size_t i;
    const json_t *x;
    json_array_foreach(t, i, x) {
        const char *name = json_string_value(json_object_get(x, "name"));
        if (name && !strcmp(name, "default")) return json_object_get(x, "template");
    }
    return NULL;
}

fm_chat_jinja *fm_chat_jinja_load(const char *dir, char *err, size_t errn) {
    char path[PATH_MAX + 64];
    err[0] = 0;
    json_error_t je;
    json_t *tc = is_file(dir, "tokenizer_config.json", path, sizeof path) ? json_load_file(path, 0, &je) : NULL;
    json_t *src = NULL;
    const char *file = NULL;
    if (is_file(dir, "chat_template.jinja", path, sizeof path)) {
        FILE *f = fopen(path, "rb");
        char *buf = f ? malloc((1u << 20) + 1) : NULL;
        size_t n = buf ? fread(buf, 1, (1u << 20) + 1, f) : 0;
        if (f) fclose(f);
        if (buf && n <= (1u << 20)) src = json_stringn(buf, n);
        free(buf);
        file = "chat_template.jinja";
        if (!src) snprintf(err, errn, "%s/chat_template.jinja: cannot be read, is over 1 MiB or is not UTF-8", dir);
    } else if (is_file(dir, "chat_template.json", path, sizeof path)) {
        json_t *j = json_load_file(path, 0, &je);
        const json_t *t = template_of(json_object_get(j, "chat_template"));
        src = t ? json_incref((json_t *)t) : NULL;
        json_decref(j);
        file = "chat_template.json";
        if (!src) snprintf(err, errn, "%s/chat_template.json: no \"chat_template\" string (or \"default\" entry) in it", dir);
    } else {
        const json_t *t = json_object_get(tc, "chat_template");
        if (!t || json_is_null(t) || (json_is_string(t) && !json_string_length(t))) { json_decref(tc); return NULL; }
        src = template_of(t) ? json_incref((json_t *)template_of(t)) : NULL;
        file = "tokenizer_config.json";
        if (!src) snprintf(err, errn, "%s/tokenizer_config.json: \"chat_template\" is neither a string nor a list with a \"default\"", dir);
    }
    fm_chat_jinja *c = src ? calloc(1, sizeof *c) : NULL;
    char perr[400] = "";
    if (c) {
        snprintf(c->file, sizeof c->file, "%s", file);
        c->t = fm_jinja_parse(json_string_value(src), json_string_length(src), perr, sizeof perr);
        c->vars = json_object();
        if (!c->t) snprintf(err, errn, "%s/%s: the chat template: %s", dir, file, perr);
    } else if (src) {
        snprintf(err, errn, "out of memory");
    }
    static const char *const specials[] = {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"};
    for (size_t i = 0; c && c->vars && i < sizeof specials / sizeof *specials; i++) {
        const char *v = token_text(json_object_get(tc, specials[i]));
        if (v) json_object_set_new(c->vars, specials[i], json_string(v));
    }
    const char *eos = c ? token_text(json_object_get(tc, "eos_token")) : NULL;
    if (eos && strlen(eos) < sizeof c->stop) snprintf(c->stop, sizeof c->stop, "%s", eos);
    json_decref(src);
    json_decref(tc);
    if (c && (!c->t || !c->vars)) {
        if (!err[0]) snprintf(err, errn, "out of memory");
        fm_chat_jinja_free(c);
        return NULL;
    }
    return c;
}

void fm_chat_jinja_free(fm_chat_jinja *c) {
    if (!c) return;
    fm_jinja_free(c->t);
    json_decref(c->vars);
    free(c);
}

/* The messages as the template reads them: text-part arrays joined into strings. */
static json_t *flatten(const json_t *messages, char *err, size_t errn) {
    if (!json_is_array(messages) || !json_array_size(messages))
        return snprintf(err, errn, "\"messages\" must be a non-empty array"), NULL;
    json_t *out = json_array();
    size_t i;
    const json_t *m;
    json_array_foreach(messages, i, m) {
        const json_t *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            json_decref(out);
            return snprintf(err, errn, "messages[%zu] must be an object with a \"role\" string", i), NULL;
        }
        json_t *c = json_deep_copy(m);
        if (json_is_array(content)) {
            char *text = NULL;
            size_t len = 0, k;
            const json_t *part;
            json_array_foreach(content, k, part) {
                const char *type = json_string_value(json_object_get(part, "type"));
                const json_t *t = json_object_get(part, "text");
                if (!type || strcmp(type, "text") || !json_is_string(t)) {
                    free(text);
                    json_decref(c);
                    json_decref(out);
                    return snprintf(err, errn, "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": ...} parts are "
                                    "supported (this model reads text)", i, k), NULL;
                }
                size_t add = json_string_length(t);
                char *nt = realloc(text, len + add + 2);
                if (!nt) { free(text); json_decref(c); json_decref(out); return snprintf(err, errn, "out of memory"), NULL; }
                text = nt;
                if (k) text[len++] = '\n';
                memcpy(text + len, json_string_value(t), add);
                len += add;
            }
            json_object_set_new(c, "content", json_stringn(text ? text : "", len));
            free(text);
        } else if (content && !json_is_string(content) && !json_is_null(content)) {
            json_decref(c);
            json_decref(out);
            return snprintf(err, errn, "messages[%zu].content must be a string or an array of text parts", i), NULL;
        }
        if (!c || json_array_append_new(out, c)) { json_decref(out); return snprintf(err, errn, "out of memory"), NULL; }
    }
    return out;
}

char *fm_chat_jinja_render(const fm_chat_jinja *c, const json_t *messages, size_t *n, char *err, size_t errn) {
    json_t *msgs = flatten(messages, err, errn);
    if (!msgs) return NULL;
    json_t *vars = json_deep_copy(c->vars);
    if (!vars || json_object_set_new(vars, "messages", msgs) || json_object_set_new(vars, "add_generation_prompt", json_true())) {
        json_decref(vars);
        return snprintf(err, errn, "out of memory"), NULL;
    }
    char rerr[400] = "";
    char *s = fm_jinja_render(c->t, vars, n, rerr, sizeof rerr);
    json_decref(vars);
    if (!s) return snprintf(err, errn, "the model's chat template (%s): %s", c->file, rerr), NULL;
    size_t k = strlen(c->strip);
    if (k && *n >= k && !memcmp(s, c->strip, k)) {
        memmove(s, s + k, *n - k + 1);
        *n -= k;
    }
    return s;
}
