/* POST /v1/completions and /v1/chat/completions: OpenAI-style text and chat
 * completion on a text-generation model (textgen.c), whole or streamed as
 * server-sent events. Chat messages become one prompt through the model's chat
 * template (chat_template.h: the configured one or the documented default). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/http.h"
#include "serve/openai_codec.h"

typedef struct stream_ctx {
    fm_serve_version *v;
    fm_tg_req *req;
    char id[48];
    bool sent_done, finished, background;
    fm_openai_reply reply; /* id, model, chat, include_usage (stream_options: usage in a chunk of its own) */
    int64_t t0_ns;
} stream_ctx;

/* The reply's fields as of now: the token counts so far. */
static fm_openai_reply *reply_now(stream_ctx *sc) {
    fm_tg_req_counts(sc->req, &sc->reply.prompt_tokens, &sc->reply.completion_tokens);
    sc->reply.created = (long long)time(NULL);
    return &sc->reply;
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
    /* while it streams, this connection's thread waits for tokens and writes them:
     * it should not preempt the decode step when woken (fm_tg_thread_background) */
    if (!sc->background) fm_tg_thread_background(sc->background = true);
    char *text = NULL;
    bool done = false;
    fm_tg_req_take(sc->req, &text, &done, -1);
    if (!text) { fm_tg_thread_background(sc->background = false); return MHD_CONTENT_READER_END_WITH_ERROR; }
    /* max is 64 KiB; a chunk is one step's text */
    long n = fm_openai_sse_event(reply_now(sc), text, done ? fm_tg_req_finish_reason(sc->req) : NULL, done, buf, max);
    free(text);
    if (n < 0) { fm_tg_thread_background(sc->background = false); return MHD_CONTENT_READER_END_WITH_ERROR; }
    if (done) { sc->sent_done = true; finish_stats(sc); fm_tg_thread_background(sc->background = false); }
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
    json_t *j = fm_openai_reply_json(reply_now(sc), all ? all : "", fm_tg_req_finish_reason(sc->req), false);
    free(all);
    char *js = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return js ? fm_http_send(c, 200, js, strlen(js), "application/json") : MHD_NO;
}

static enum MHD_Result completions(fm_server *s, struct MHD_Connection *c, fm_http_req *r, bool chat) {
    char err[512];
    fm_openai_req q;
    int st = fm_openai_parse(r->body, r->len, chat, &q, err, sizeof err);
    fm_serve_version *v = NULL;
    if (!st) {
        v = fm_repo_acquire(s->repo, q.model, 0, &st, err, sizeof err);
        if (v && !v->textgen) st = 400, snprintf(err, sizeof err, "model '%s' is not a text-generation model", q.model);
        else if (v) st = 0;
    }
    fm_tg_req *req = NULL;
    if (!st) {
        size_t n = 0;
        char *prompt = fm_openai_prompt(&q, &v->cfg.chat, &n, err, sizeof err);
        /* a whole reply's reader wakes once, at the end; a stream's at every token or
         * every stream_interval_tokens */
        q.p.wake_every = !q.stream ? 0 : v->cfg.stream_interval_tokens > 0 ? v->cfg.stream_interval_tokens : 1;
        if (prompt) req = fm_textgen_submit(v->textgen, prompt, n, &q.p, &st, err, sizeof err);
        else st = 400;
        free(prompt);
        if (!req) fm_serve_stats_request(&v->stats, 0, 0, 0);
        st = req ? 0 : st;
    }
    bool streaming = q.stream, include_usage = q.include_usage;
    fm_openai_req_free(&q);
    if (st) { fm_repo_release(v); return fm_http_error(c, st, err); }
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) { fm_tg_req_cancel(req); fm_tg_req_release(req); fm_repo_release(v); return fm_http_error(c, 500, "out of memory"); }
    static atomic_ullong next_id;
    snprintf(sc->id, sizeof sc->id, "%s-%llu", chat ? "chatcmpl" : "cmpl", (unsigned long long)atomic_fetch_add(&next_id, 1));
    sc->v = v;
    sc->req = req;
    sc->reply = (fm_openai_reply){.id = sc->id, .model = v->model, .chat = chat, .include_usage = include_usage};
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

/* POST /v1/embeddings: the texts through the model's encoder, whole (no stream). */
static enum MHD_Result embeddings(fm_server *s, struct MHD_Connection *c, fm_http_req *r) {
    char err[512];
    fm_openai_embed_req q;
    int st = fm_openai_embed_parse(r->body, r->len, &q, err, sizeof err);
    if (st) return fm_http_error(c, st, err);
    fm_serve_version *v = fm_repo_acquire(s->repo, q.model, 0, &st, err, sizeof err);
    if (v) st = 0; /* acquire's status is for a miss */
    if (v && !v->embedder) {
        st = 400;
        snprintf(err, sizeof err, "model '%s' is not an embedding model (%s)", q.model,
                 v->textgen ? "a text-generation model: POST /v1/completions" : "a KServe model: POST /v2/models/NAME/infer");
    } else if (v && q.dimensions && q.dimensions != fm_embedder_dim(v->embedder)) {
        st = 400;
        snprintf(err, sizeof err, "'dimensions' is %lld, but model '%s' gives %d (it cannot shorten its embeddings)",
                 (long long)q.dimensions, q.model, fm_embedder_dim(v->embedder));
    }
    json_t *reply = NULL;
    if (v && !st) {
        int dim = fm_embedder_dim(v->embedder);
        float *out = malloc(sizeof(float) * (size_t)q.n * (size_t)dim);
        int64_t tokens = 0;
        st = out ? fm_embedder_run(v->embedder, q.texts, q.n, out, &tokens, err, sizeof err) : 500;
        if (!out) snprintf(err, sizeof err, "out of memory for %d embeddings of %d", q.n, dim);
        if (!st && !(reply = fm_openai_embed_reply(v->model, out, q.n, dim, q.base64, tokens)))
            st = 500, snprintf(err, sizeof err, "out of memory for the reply");
        free(out);
    }
    if (v) fm_serve_stats_request(&v->stats, st == 0, (uint64_t)(fm_now_ns() - r->t0_ns) / 1000, 0);
    fm_openai_embed_req_free(&q);
    fm_repo_release(v);
    if (st) return fm_http_error(c, st, err);
    char *js = json_dumps(reply, JSON_COMPACT);
    json_decref(reply);
    return js ? fm_http_send(c, 200, js, strlen(js), "application/json") : MHD_NO;
}

enum MHD_Result fm_http_openai(fm_server *s, struct MHD_Connection *c, char **seg, int n, const char *method, fm_http_req *r) {
    if ((n == 2 || n == 3) && !strcmp(seg[1], "models")) { /* what OpenAI clients list first */
        if (strcmp(method, "GET")) return fm_http_error(c, 405, "use GET for /v1/models");
        json_t *j = fm_repo_text_models_json(s->repo, n == 3 ? seg[2] : NULL);
        if (!j) return fm_http_errorf(c, 404, "no text-generation model '%.80s' is loaded (GET /v1/models lists them)", seg[2]);
        char *js = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        return js ? fm_http_send(c, 200, js, strlen(js), "application/json") : MHD_NO;
    }
    if (n == 2 && !strcmp(seg[1], "embeddings")) {
        if (strcmp(method, "POST")) return fm_http_error(c, 405, "use POST for /v1/embeddings");
        return embeddings(s, c, r);
    }
    bool chat = n == 3 && !strcmp(seg[1], "chat") && !strcmp(seg[2], "completions");
    if (!(n == 2 && !strcmp(seg[1], "completions")) && !chat)
        return fm_http_error(c, 404, "unknown endpoint (POST /v1/completions, /v1/chat/completions or /v1/embeddings, "
                                     "GET /v1/models)");
    if (strcmp(method, "POST")) return fm_http_errorf(c, 405, "use POST for /v1/%scompletions", chat ? "chat/" : "");
    return completions(s, c, r, chat);
}
