/* POST /v1/completions and /v1/chat/completions: OpenAI-style text and chat
 * completion on a text-generation model (textgen.c), whole or streamed as
 * server-sent events. Chat messages become one prompt through the model's chat
 * template (chat_template.h: the configured one or the documented default). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/http.h"

typedef struct stream_ctx {
    fm_serve_version *v;
    fm_tg_req *req;
    char id[48];
    bool sent_done, finished, chat, sent_role;
    bool include_usage; /* stream_options.include_usage: usage in a chunk of its own, "usage": null before it */
    int64_t t0_ns;
} stream_ctx;

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
    x = json_object_get(j, "stop");
    if (x && !json_is_null(x)) {
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
    }
    return 0;
}

/* A chat choice: "message" (whole) or "delta" (a stream chunk; the first names the role). */
static json_t *chat_choice(stream_ctx *sc, const char *text, const char *finish, bool chunk) {
    json_t *msg = json_object();
    if (!chunk || !sc->sent_role) json_object_set_new(msg, "role", json_string("assistant"));
    if (!chunk || *text) json_object_set_new(msg, "content", json_string(text));
    sc->sent_role = true;
    return json_pack("{s:i,s:o,s:o}", "index", 0, chunk ? "delta" : "message", msg, "finish_reason",
                     finish ? json_string(finish) : json_null());
}

static json_t *usage_json(stream_ctx *sc) {
    int pt, ct;
    fm_tg_req_counts(sc->req, &pt, &ct);
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", pt, "completion_tokens", ct, "total_tokens", pt + ct);
}

static json_t *completion_json(stream_ctx *sc, const char *text, const char *finish, bool chunk) {
    json_t *choice = sc->chat ? chat_choice(sc, text, finish, chunk)
                              : json_pack("{s:s,s:i,s:o}", "text", text, "index", 0, "finish_reason",
                                          finish ? json_string(finish) : json_null());
    const char *object = !sc->chat ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion";
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", sc->id, "object", object, "created", (json_int_t)time(NULL),
                          "model", sc->v->model, "choices", choice);
    if (chunk && sc->include_usage) json_object_set_new(j, "usage", json_null());
    else if (!chunk || finish) json_object_set_new(j, "usage", usage_json(sc));
    return j;
}

/* stream_options.include_usage's last chunk: no choices, the usage */
static json_t *usage_chunk(stream_ctx *sc) {
    return json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", sc->id, "object",
                     sc->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)time(NULL), "model",
                     sc->v->model, "choices", "usage", usage_json(sc));
}

static void finish_stats(stream_ctx *sc) {
    if (sc->finished) return;
    sc->finished = true;
    const char *f = fm_tg_req_finish_reason(sc->req);
    bool ok = strcmp(f, "error") && strcmp(f, "cancelled");
    fm_serve_stats_request(&sc->v->stats, ok, (uint64_t)(fm_now_ns() - sc->t0_ns) / 1000, 0);
}

/* libmicrohttpd pulls the event stream through this (thread per connection, so it may block). */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *sc = cls;
    if (sc->sent_done) return MHD_CONTENT_READER_END_OF_STREAM;
    char *text = NULL;
    bool done = false;
    fm_tg_req_take(sc->req, &text, &done, -1);
    if (!text) return MHD_CONTENT_READER_END_WITH_ERROR;
    json_t *j = completion_json(sc, text, done ? fm_tg_req_finish_reason(sc->req) : NULL, true);
    json_t *u = done && sc->include_usage ? usage_chunk(sc) : NULL;
    free(text);
    char *js = json_dumps(j, JSON_COMPACT), *us = u ? json_dumps(u, JSON_COMPACT) : NULL;
    json_decref(j);
    json_decref(u);
    if (!js || (u && !us)) { free(js); free(us); return MHD_CONTENT_READER_END_WITH_ERROR; }
    size_t need = strlen(js) + 8 + (us ? strlen(us) + 8 : 0) + (done ? 14 : 0);
    /* max is 64 KiB; a chunk is one step's text */
    if (need > max) { free(js); free(us); return MHD_CONTENT_READER_END_WITH_ERROR; }
    int n = snprintf(buf, max, "data: %s\n\n%s%s%s%s", js, us ? "data: " : "", us ? us : "", us ? "\n\n" : "",
                     done ? "data: [DONE]\n\n" : "");
    free(js);
    free(us);
    if (done) { sc->sent_done = true; finish_stats(sc); }
    return n;
}

static void sse_free(void *cls) {
    stream_ctx *sc = cls;
    fm_tg_req_cancel(sc->req); /* a no-op when it finished; stops generation when the client left */
    finish_stats(sc);
    fm_tg_req_release(sc->req);
    fm_repo_release(sc->v);
    free(sc);
}

static enum MHD_Result respond_whole(struct MHD_Connection *c, stream_ctx *sc) {
    char *all = NULL;
    size_t len = 0;
    bool done = false;
    while (!done) {
        char *part = NULL;
        size_t n = fm_tg_req_take(sc->req, &part, &done, -1);
        char *na = part ? realloc(all, len + n + 1) : NULL;
        if (!na) { free(part); free(all); return fm_http_error(c, 500, "out of memory"); }
        all = na;
        memcpy(all + len, part, n + 1);
        len += n;
        free(part);
    }
    finish_stats(sc);
    json_t *j = completion_json(sc, all ? all : "", fm_tg_req_finish_reason(sc->req), false);
    free(all);
    char *js = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return js ? fm_http_send(c, 200, js, strlen(js), "application/json") : MHD_NO;
}

/* The prompt: "prompt" (one string) or, for chat, "messages" through the model's
 * template, whose stop string joins the request's when there is room. malloc'd;
 * NULL with a 400 message. */
static char *request_prompt(const json_t *j, const fm_serve_version *v, bool chat, fm_tg_params *p, size_t *n, char *err,
                            size_t errn) {
    if (!chat) {
        const json_t *prompt = json_object_get(j, "prompt");
        if (!json_is_string(prompt)) return snprintf(err, errn, "\"prompt\" must be one string"), NULL;
        *n = json_string_length(prompt);
        char *s = malloc(*n + 1);
        if (s) memcpy(s, json_string_value(prompt), *n + 1);
        else snprintf(err, errn, "out of memory");
        return s;
    }
    const fm_chat_template *t = &v->cfg.chat;
    char *s = fm_chat_render(t, json_object_get(j, "messages"), n, err, errn);
    bool have = !*t->stop;
    for (int i = 0; i < p->n_stop; i++) have |= !strcmp(p->stop[i], t->stop);
    if (s && !have && p->n_stop < FM_TG_MAX_STOP) strcpy(p->stop[p->n_stop++], t->stop);
    return s;
}

static enum MHD_Result completions(fm_server *s, struct MHD_Connection *c, fm_http_req *r, bool chat) {
    char err[512];
    json_error_t je;
    json_t *j = json_loadb(r->body ? r->body : "", r->len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return fm_http_errorf(c, 400, "the body must be a JSON object (%s)", j ? "got another JSON value" : je.text);
    }
    const char *model = json_string_value(json_object_get(j, "model"));
    const json_t *stream = json_object_get(j, "stream");
    fm_tg_params p;
    int st = 0;
    if (!model || !fm_serve_valid_name(model)) st = 400, snprintf(err, sizeof err, "\"model\" must name a loaded model");
    else if (stream && !json_is_boolean(stream)) st = 400, snprintf(err, sizeof err, "\"stream\" must be true or false");
    else st = parse_params(j, &p, err, sizeof err);
    bool include_usage = false;
    if (!st) st = parse_stream_options(j, json_is_true(stream), &include_usage, err, sizeof err);
    fm_serve_version *v = NULL;
    if (!st) {
        v = fm_repo_acquire(s->repo, model, 0, &st, err, sizeof err);
        if (v && !v->textgen) st = 400, snprintf(err, sizeof err, "model '%s' is not a text-generation model", model);
        else if (v) st = 0;
    }
    fm_tg_req *req = NULL;
    if (!st) {
        size_t n = 0;
        char *prompt = request_prompt(j, v, chat, &p, &n, err, sizeof err);
        if (prompt) req = fm_textgen_submit(v->textgen, prompt, n, &p, &st, err, sizeof err);
        else st = 400;
        free(prompt);
        if (!req) fm_serve_stats_request(&v->stats, 0, 0, 0);
        st = req ? 0 : st;
    }
    bool streaming = json_is_true(stream);
    json_decref(j);
    if (st) { fm_repo_release(v); return fm_http_error(c, st, err); }
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) { fm_tg_req_cancel(req); fm_tg_req_release(req); fm_repo_release(v); return fm_http_error(c, 500, "out of memory"); }
    static atomic_ullong next_id;
    snprintf(sc->id, sizeof sc->id, "%s-%llu", chat ? "chatcmpl" : "cmpl", (unsigned long long)atomic_fetch_add(&next_id, 1));
    sc->v = v;
    sc->req = req;
    sc->chat = chat;
    sc->include_usage = include_usage;
    sc->t0_ns = r->t0_ns;
    if (!streaming) {
        enum MHD_Result ret = respond_whole(c, sc);
        sse_free(sc);
        return ret;
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, sse_read, sc, sse_free);
    if (!resp) { sse_free(sc); return MHD_NO; }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

enum MHD_Result fm_http_openai(fm_server *s, struct MHD_Connection *c, char **seg, int n, const char *method, fm_http_req *r) {
    bool chat = n == 3 && !strcmp(seg[1], "chat") && !strcmp(seg[2], "completions");
    if (!(n == 2 && !strcmp(seg[1], "completions")) && !chat)
        return fm_http_error(c, 404, "unknown endpoint (POST /v1/completions or /v1/chat/completions)");
    if (strcmp(method, "POST")) return fm_http_errorf(c, 405, "use POST for /v1/%scompletions", chat ? "chat/" : "");
    return completions(s, c, r, chat);
}
