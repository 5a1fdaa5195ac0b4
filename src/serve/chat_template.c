/* Rendering chat messages with a per-role format: see chat_template.h. */
#include "serve/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fm_chat_template_default(fm_chat_template *t) {
    memset(t, 0, sizeof *t);
    strcpy(t->system, "{content}\n\n");
    strcpy(t->user, "User: {content}\n");
    strcpy(t->assistant, "Assistant: {content}\n");
    strcpy(t->generation, "Assistant:");
    strcpy(t->stop, "\nUser:");
}

static fm_status get_fmt(const json_t *j, const char *key, char *dst, size_t cap, bool role, const char *where) {
    const json_t *v = json_object_get(j, key);
    if (!v) return FM_OK;
    const char *s = json_string_value(v);
    if (!s || strlen(s) >= cap)
        return fm_set_error(FM_ERR_FORMAT, "%s: chat_template.%s must be a string of at most %zu bytes", where, key, cap - 1);
    const char *at = strstr(s, "{content}");
    if (role && (!at || strstr(at + 9, "{content}")))
        return fm_set_error(FM_ERR_FORMAT, "%s: chat_template.%s must hold \"{content}\" exactly once (where the message goes)",
                            where, key);
    strcpy(dst, s);
    return FM_OK;
}

fm_status fm_chat_template_parse(fm_chat_template *t, const json_t *j, const char *where) {
    if (!j) return FM_OK;
    if (!json_is_object(j))
        return fm_set_error(FM_ERR_FORMAT, "%s: \"chat_template\" must be an object (system, user, assistant, generation, stop)",
                            where);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)j, key, v) {
        if (strcmp(key, "system") && strcmp(key, "user") && strcmp(key, "assistant") && strcmp(key, "generation") &&
            strcmp(key, "stop"))
            return fm_set_error(FM_ERR_FORMAT, "%s: chat_template: unknown field '%s' (system, user, assistant, generation, stop)",
                                where, key);
    }
    if (get_fmt(j, "system", t->system, sizeof t->system, true, where) ||
        get_fmt(j, "user", t->user, sizeof t->user, true, where) ||
        get_fmt(j, "assistant", t->assistant, sizeof t->assistant, true, where) ||
        get_fmt(j, "generation", t->generation, sizeof t->generation, false, where) ||
        get_fmt(j, "stop", t->stop, sizeof t->stop, false, where))
        return fm_last_status();
    t->set = true;
    return FM_OK;
}

json_t *fm_chat_template_json(const fm_chat_template *t) {
    return json_pack("{s:s,s:s,s:s,s:s,s:s}", "system", t->system, "user", t->user, "assistant", t->assistant, "generation",
                     t->generation, "stop", t->stop);
}

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static bool put(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *np = realloc(b->p, cap);
        if (!np) return false;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

/* A message's text: a string, or an array of {"type": "text", "text": ...} parts joined. */
static bool put_content(buf *b, const json_t *c) {
    if (json_is_string(c)) return put(b, json_string_value(c), json_string_length(c));
    if (!json_is_array(c)) return false;
    size_t i;
    const json_t *part;
    json_array_foreach(c, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        if (!type || strcmp(type, "text") || !json_is_string(text)) return false;
        if (!put(b, json_string_value(text), json_string_length(text))) return false;
    }
    return true;
}

char *fm_chat_render(const fm_chat_template *t, const json_t *messages, size_t *n, char *err, size_t errn) {
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        snprintf(err, errn, "\"messages\" must be a non-empty array of {\"role\", \"content\"} objects");
        return NULL;
    }
    buf b = {0};
    size_t i;
    const json_t *m;
    json_array_foreach(messages, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role) {
            snprintf(err, errn, "messages[%zu] must be an object with a \"role\" string and \"content\"", i);
            goto fail;
        }
        const char *fmt = !strcmp(role, "system") || !strcmp(role, "developer") ? t->system
                          : !strcmp(role, "user")                               ? t->user
                          : !strcmp(role, "assistant")                          ? t->assistant
                                                                                : NULL;
        if (!fmt) {
            snprintf(err, errn, "messages[%zu]: unknown role '%.40s' (use system, developer, user or assistant; tools are not supported)",
                     i, role);
            goto fail;
        }
        const char *at = strstr(fmt, "{content}");
        if (!put(&b, fmt, (size_t)(at - fmt))) goto oom;
        if (!put_content(&b, json_object_get(m, "content"))) {
            snprintf(err, errn, "messages[%zu]: \"content\" must be a string or an array of {\"type\": \"text\", \"text\"} parts",
                     i);
            goto fail;
        }
        if (!put(&b, at + 9, strlen(at + 9))) goto oom;
    }
    if (!put(&b, t->generation, strlen(t->generation))) goto oom;
    *n = b.n;
    return b.p;
oom:
    snprintf(err, errn, "out of memory");
fail:
    free(b.p);
    return NULL;
}
