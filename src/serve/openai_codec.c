/* OpenAI-style completion requests and replies: see openai_codec.h. */
#include "serve/openai_codec.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/repository.h"

/* "stream_options" (OpenAI): only with "stream": true; {"include_usage": bool}. 0 or a 400 with the message. */
static int parse_stream_options(const json_t *j, bool streaming, bool *include_usage, char *err, size_t errn) {
    const json_t *o = json_object_get(j, "stream_options");
    *include_usage = false;
    if (!o || json_is_null(o)) return 0;
    if (!streaming) return snprintf(err, errn, "\"stream_options\" is only allowed when \"stream\" is true"), 400;
    if (!json_is_object(o)) return snprintf(err, errn, "\"stream_options\" must be an object"), 400;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        if (strcmp(key, "include_usage"))
            return snprintf(err, errn, "stream_options: unknown field '%.64s' (fathom knows include_usage)", key), 400;
        if (!json_is_boolean(v)) return snprintf(err, errn, "stream_options.include_usage must be true or false"), 400;
        *include_usage = json_is_true(v);
    }
    return 0;
}

static int parse_stop(const json_t *x, fm_tg_params *p, char *err, size_t errn) {
    if (!x || json_is_null(x)) return 0;
    bool one = json_is_string(x);
    size_t cnt = one ? 1 : json_is_array(x) ? json_array_size(x) : 0;
    if ((!one && !json_is_array(x)) || cnt > FM_TG_MAX_STOP)
        return snprintf(err, errn, "\"stop\" must be a string or an array of at most %d strings", FM_TG_MAX_STOP), 400;
    for (size_t i = 0; i < cnt; i++) {
        const char *s = json_string_value(one ? x : json_array_get(x, i));
        if (!s || !*s || strlen(s) >= sizeof p->stop[0])
            return snprintf(err, errn, "each stop sequence must be a string of 1-%zu bytes", sizeof p->stop[0] - 1), 400;
        strcpy(p->stop[p->n_stop++], s);
    }
    return 0;
}

static int parse_params(const json_t *j, fm_tg_params *p, char *err, size_t errn) {
    const json_t *x;
    memset(p, 0, sizeof *p);
    p->max_tokens = 16;
    p->sample.temperature = 1.0;
    p->sample.top_p = 1.0;
    p->sample.seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)p;
    for (int k = 0; k < 2; k++) { /* chat's newer name wins when both are given */
        const char *key = k ? "max_completion_tokens" : "max_tokens";
        if ((x = json_object_get(j, key)) && (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 100000))
            return snprintf(err, errn, "\"%s\" must be a whole number in [1, 100000]", key), 400;
        if (x) p->max_tokens = (int)json_integer_value(x);
    }
    if ((x = json_object_get(j, "temperature")) && (!json_is_number(x) || json_number_value(x) < 0 || json_number_value(x) > 100))
        return snprintf(err, errn, "\"temperature\" must be a number in [0, 100] (0: greedy)"), 400;
    if (x) p->sample.temperature = json_number_value(x);
    if ((x = json_object_get(j, "top_p")) && (!json_is_number(x) || json_number_value(x) <= 0 || json_number_value(x) > 1))
        return snprintf(err, errn, "\"top_p\" must be a number in (0, 1]"), 400;
    if (x) p->sample.top_p = json_number_value(x);
    if ((x = json_object_get(j, "top_k")) && (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1000000))
        return snprintf(err, errn, "\"top_k\" must be a whole number >= 0 (0: off)"), 400;
    if (x) p->sample.top_k = (int)json_integer_value(x);
    if ((x = json_object_get(j, "seed")) && (!json_is_integer(x) || json_integer_value(x) < 0))
        return snprintf(err, errn, "\"seed\" must be a whole number >= 0"), 400;
    if (x) p->sample.seed = (uint64_t)json_integer_value(x);
    if ((x = json_object_get(j, "n")) && (!json_is_integer(x) || json_integer_value(x) != 1))
        return snprintf(err, errn, "\"n\" other than 1 is not supported"), 400;
    return parse_stop(json_object_get(j, "stop"), p, err, errn);
}

int fm_openai_parse(const char *body, size_t len, bool chat, fm_openai_req *r, char *err, size_t errn) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    json_error_t je;
    json_t *j = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(j)) {
        snprintf(err, errn, "the body must be a JSON object (%s)", j ? "got another JSON value" : je.text);
        json_decref(j);
        return 400;
    }
    r->body = j;
    r->model = json_string_value(json_object_get(j, "model"));
    const json_t *stream = json_object_get(j, "stream");
    if (!r->model || !fm_serve_valid_name(r->model))
        return snprintf(err, errn, "\"model\" must name a loaded model"), 400;
    if (stream && !json_is_boolean(stream)) return snprintf(err, errn, "\"stream\" must be true or false"), 400;
    r->stream = json_is_true(stream);
    int st = parse_params(j, &r->p, err, errn);
    return st ? st : parse_stream_options(j, r->stream, &r->include_usage, err, errn);
}

void fm_openai_req_free(fm_openai_req *r) {
    json_decref(r->body);
    r->body = NULL;
    r->model = NULL;
}

char *fm_openai_prompt(fm_openai_req *r, const fm_chat_template *t, size_t *n, char *err, size_t errn) {
    fm_tg_params *p = &r->p;
    if (!r->chat) {
        const json_t *prompt = json_object_get(r->body, "prompt");
        if (!json_is_string(prompt)) return snprintf(err, errn, "\"prompt\" must be one string"), NULL;
        *n = json_string_length(prompt);
        char *s = malloc(*n + 1);
        if (s) memcpy(s, json_string_value(prompt), *n + 1);
        else snprintf(err, errn, "out of memory");
        return s;
    }
    char *s = fm_chat_render(t, json_object_get(r->body, "messages"), n, err, errn);
    bool have = !*t->stop;
    for (int i = 0; i < p->n_stop; i++) have |= !strcmp(p->stop[i], t->stop);
    if (s && !have && p->n_stop < FM_TG_MAX_STOP) strcpy(p->stop[p->n_stop++], t->stop);
    return s;
}

/* A chat choice: "message" (whole) or "delta" (a stream chunk; the first names the role). */
static json_t *chat_choice(fm_openai_reply *o, const char *text, const char *finish, bool chunk) {
    json_t *msg = json_object();
    if (!chunk || !o->sent_role) json_object_set_new(msg, "role", json_string("assistant"));
    if (!chunk || *text) json_object_set_new(msg, "content", json_string(text));
    o->sent_role = true;
    return json_pack("{s:i,s:o,s:o}", "index", 0, chunk ? "delta" : "message", msg, "finish_reason",
                     finish ? json_string(finish) : json_null());
}

static json_t *usage_json(const fm_openai_reply *o) {
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", o->prompt_tokens, "completion_tokens", o->completion_tokens,
                     "total_tokens", o->prompt_tokens + o->completion_tokens);
}

json_t *fm_openai_reply_json(fm_openai_reply *o, const char *text, const char *finish, bool chunk) {
    json_t *choice = o->chat ? chat_choice(o, text, finish, chunk)
                             : json_pack("{s:s,s:i,s:o}", "text", text, "index", 0, "finish_reason",
                                         finish ? json_string(finish) : json_null());
    const char *object = !o->chat ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion";
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", o->id, "object", object, "created", (json_int_t)o->created,
                          "model", o->model, "choices", choice);
    if (!j) return NULL;
    if (chunk && o->include_usage) json_object_set_new(j, "usage", json_null());
    else if (!chunk || finish) json_object_set_new(j, "usage", usage_json(o));
    return j;
}

json_t *fm_openai_usage_chunk(const fm_openai_reply *o) {
    return json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", o->id, "object",
                     o->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)o->created, "model",
                     o->model, "choices", "usage", usage_json(o));
}

long fm_openai_sse_event(fm_openai_reply *o, const char *text, const char *finish, bool done, char *buf, size_t max) {
    json_t *j = fm_openai_reply_json(o, text, finish, true);
    json_t *u = done && o->include_usage ? fm_openai_usage_chunk(o) : NULL;
    char *js = j ? json_dumps(j, JSON_COMPACT) : NULL, *us = u ? json_dumps(u, JSON_COMPACT) : NULL;
    json_decref(j);
    json_decref(u);
    long n = -1;
    if (js && (!done || !o->include_usage || us)) {
        size_t need = strlen(js) + 8 + (us ? strlen(us) + 8 : 0) + (done ? 14 : 0);
        if (need < max)
            n = snprintf(buf, max, "data: %s\n\n%s%s%s%s", js, us ? "data: " : "", us ? us : "", us ? "\n\n" : "",
                         done ? "data: [DONE]\n\n" : "");
    }
    free(js);
    free(us);
    return n;
}
