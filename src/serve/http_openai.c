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

/* A request's choices: prompts x n generation requests, whole or streamed. */
typedef struct stream_ctx {
    fm_serve_version *v;
    int n;              /* choices */
    fm_tg_req **req;    /* [n] */
    char **echo;        /* [n]: the prompt's text to send before choice i's (NULL: none, or sent) */
    bool *first_prompt; /* [n]: choice i is the first of its prompt (its prompt tokens count once) */
    bool *done, *sent_role;
    bool logprobs;      /* asked for, with top_k of the top ids per token */
    int top_k;
    int *lp_sent;       /* [n]: choice i's tokens whose logprobs went out */
    long *lp_offset;    /* [n]: completions' text_offset of choice i's next token */
    int next;           /* a stream's round robin: the choice whose text goes next */
    char id[48];
    bool sent_done, finished, background;
    fm_openai_reply reply; /* id, model, chat, include_usage (stream_options: usage in a chunk of its own) */
    int64_t t0_ns;
} stream_ctx;

/* The reply's fields as of now: the token counts so far over the choices (a prompt's once). */
static fm_openai_reply *reply_now(stream_ctx *sc) {
    sc->reply.prompt_tokens = sc->reply.completion_tokens = 0;
    for (int i = 0; i < sc->n; i++) {
        int p = 0, g = 0;
        fm_tg_req_counts(sc->req[i], &p, &g);
        sc->reply.prompt_tokens += sc->first_prompt[i] ? p : 0;
        sc->reply.completion_tokens += g;
    }
    sc->reply.created = (long long)time(NULL);
    return &sc->reply;
}

static void finish_stats(stream_ctx *sc) {
    if (sc->finished) return;
    sc->finished = true;
    bool ok = true;
    for (int i = 0; i < sc->n; i++) {
        const char *f = fm_tg_req_finish_reason(sc->req[i]);
        ok &= strcmp(f, "error") && strcmp(f, "cancelled");
    }
    fm_serve_stats_request(&sc->v->stats, ok, (uint64_t)(fm_now_ns() - sc->t0_ns) / 1000, 0);
}

static void ctx_free(stream_ctx *sc) {
    for (int i = 0; i < sc->n; i++) {
        if (sc->req[i]) {
            fm_tg_req_cancel(sc->req[i]); /* a no-op when it finished; stops generation when the client left */
            fm_tg_req_release(sc->req[i]);
        }
        free(sc->echo[i]);
    }
    free(sc->req);
    free(sc->echo);
    free(sc->first_prompt);
    free(sc->done);
    free(sc->sent_role);
    free(sc->lp_sent);
    free(sc->lp_offset);
    fm_repo_release(sc->v);
    free(sc);
}

/* Text of choice i to send now: its echo first, then what it generated. */
static char *take_choice(stream_ctx *sc, int i, bool *done) {
    char *text = NULL;
    fm_tg_req_take(sc->req[i], &text, done, -1);
    if (text && sc->echo[i]) {
        size_t a = strlen(sc->echo[i]), b = strlen(text);
        char *both = realloc(sc->echo[i], a + b + 1);
        if (!both) { free(text); return NULL; }
        memcpy(both + a, text, b + 1);
        free(text);
        text = both;
        sc->echo[i] = NULL;
    }
    return text;
}

static char *token_bytes(void *req, int32_t id, size_t *n) { return fm_tg_req_token_bytes(req, id, n); }

/* The "logprobs" of choice i's tokens taken since the last call (*failed: out of memory). */
static json_t *choice_logprobs(stream_ctx *sc, int i, bool *failed) {
    if (!sc->logprobs) return NULL;
    fm_openai_lp l = {.k = sc->top_k};
    int n = fm_tg_req_logprobs(sc->req[i], &l.ids, &l.lp, &l.top_id, &l.top_lp);
    json_t *j = fm_openai_logprobs_json(sc->reply.chat, &l, sc->lp_sent[i], n, &sc->lp_offset[i], token_bytes, sc->req[i]);
    sc->lp_sent[i] = n;
    *failed |= !j;
    return j;
}

/* libmicrohttpd pulls the event stream through this (thread per connection, so it may block).
 * Each event carries one choice's new text; the choices take turns (they advance
 * together, in the same decode steps), and the last one's end closes the stream. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *sc = cls;
    if (sc->sent_done) return MHD_CONTENT_READER_END_OF_STREAM;
    /* while it streams, this connection's thread waits for tokens and writes them:
     * it should not preempt the decode step when woken (fm_tg_thread_background) */
    if (!sc->background) fm_tg_thread_background(sc->background = true);
    int i = sc->next;
    while (sc->done[i]) i = (i + 1) % sc->n;
    bool done = false;
    char *text = take_choice(sc, i, &done);
    if (!text) { fm_tg_thread_background(sc->background = false); return MHD_CONTENT_READER_END_WITH_ERROR; }
    sc->done[i] = done;
    bool all = true;
    for (int k = 0; k < sc->n; k++) all &= sc->done[k];
    sc->next = (i + 1) % sc->n;
    fm_openai_reply *o = reply_now(sc);
    o->index = i;
    o->sent_role = sc->sent_role[i];
    sc->sent_role[i] = true;
    bool failed = false;
    o->logprobs = choice_logprobs(sc, i, &failed);
    /* max is 64 KiB; a chunk is one step's text */
    long n = failed ? -1 : fm_openai_sse_event(o, text, done ? fm_tg_req_finish_reason(sc->req[i]) : NULL, all, buf, max);
    json_decref(o->logprobs);
    o->logprobs = NULL;
    free(text);
    if (n < 0) { fm_tg_thread_background(sc->background = false); return MHD_CONTENT_READER_END_WITH_ERROR; }
    if (all) { sc->sent_done = true; finish_stats(sc); fm_tg_thread_background(sc->background = false); }
    return n;
}

static void sse_free(void *cls) {
    stream_ctx *sc = cls;
    finish_stats(sc);
    ctx_free(sc);
}

/* Every choice's whole text, in one reply. */
static enum MHD_Result respond_whole(struct MHD_Connection *c, stream_ctx *sc) {
    char **texts = calloc((size_t)sc->n, sizeof *texts);
    const char **finishes = calloc((size_t)sc->n, sizeof *finishes);
    json_t **lps = calloc((size_t)sc->n, sizeof *lps);
    bool oom = !texts || !finishes || !lps;
    for (int i = 0; i < sc->n && !oom; i++) {
        size_t len = 0;
        for (bool done = false; !done && !oom;) {
            char *part = take_choice(sc, i, &done);
            size_t n = part ? strlen(part) : 0;
            char *na = part ? realloc(texts[i], len + n + 1) : NULL;
            if (!na) { free(part); oom = true; break; }
            texts[i] = na;
            memcpy(texts[i] + len, part, n + 1);
            len += n;
            free(part);
        }
        finishes[i] = fm_tg_req_finish_reason(sc->req[i]);
        if (!oom) lps[i] = choice_logprobs(sc, i, &oom);
    }
    finish_stats(sc);
    json_t *j = oom ? NULL : fm_openai_reply_choices(reply_now(sc), sc->n, texts, finishes, lps);
    for (int i = 0; i < sc->n; i++) {
        if (texts) free(texts[i]);
        if (lps) json_decref(lps[i]);
    }
    free(texts);
    free(finishes);
    free(lps);
    char *js = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!js) return fm_http_error(c, 500, "out of memory");
    return fm_http_send(c, 200, js, strlen(js), "application/json");
}

static stream_ctx *ctx_new(fm_serve_version *v, int n) {
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) return NULL;
    sc->v = v;
    sc->n = n;
    sc->req = calloc((size_t)n, sizeof *sc->req);
    sc->echo = calloc((size_t)n, sizeof *sc->echo);
    sc->first_prompt = calloc((size_t)n, sizeof *sc->first_prompt);
    sc->done = calloc((size_t)n, sizeof *sc->done);
    sc->sent_role = calloc((size_t)n, sizeof *sc->sent_role);
    sc->lp_sent = calloc((size_t)n, sizeof *sc->lp_sent);
    sc->lp_offset = calloc((size_t)n, sizeof *sc->lp_offset);
    if (!sc->req || !sc->echo || !sc->first_prompt || !sc->done || !sc->sent_role || !sc->lp_sent || !sc->lp_offset) { sc->v = NULL; ctx_free(sc); return NULL; }
    return sc;
}

/* Submits prompts x n choices into sc (choice k of prompt i is i * n + k; with a seed,
 * choice k samples from seed + k, so that the n differ). 0, or an HTTP status with err. */
static int submit_all(stream_ctx *sc, fm_openai_req *q, fm_openai_prompt_item *items, int n_items, char *err, size_t errn) {
    fm_textgen *tg = sc->v->textgen;
    uint64_t seed = q->p.sample.seed;
    for (int i = 0; i < n_items; i++)
        for (int k = 0; k < q->n; k++) {
            int c = i * q->n + k, st = 0;
            fm_openai_prompt_item *it = &items[i];
            q->p.sample.seed = seed + (uint64_t)c;
            sc->req[c] = fm_textgen_submit(tg, it->text, it->len, it->ids, it->n_ids, &q->p, &st, err, errn);
            if (!sc->req[c]) {
                if (n_items > 1) { /* say which prompt */
                    char pre[24];
                    size_t a = (size_t)snprintf(pre, sizeof pre, "prompt %d: ", i), b = strnlen(err, errn - 1);
                    if (a + b >= errn) b = errn - 1 - a;
                    memmove(err + a, err, b);
                    memcpy(err, pre, a);
                    err[a + b] = 0;
                }
                return st;
            }
            sc->first_prompt[c] = k == 0;
            if (q->echo) {
                size_t len = 0;
                sc->echo[c] = it->text ? strdup(it->text) : fm_tg_req_prompt_text(sc->req[c], &len);
                if (!sc->echo[c]) return snprintf(err, errn, "out of memory"), 500;
            }
        }
    return 0;
}

static enum MHD_Result completions(fm_server *s, struct MHD_Connection *c, fm_http_req *r, bool chat) {
    char err[1024];
    fm_openai_req q;
    int st = fm_openai_parse(r->body, r->len, chat, &q, err, sizeof err);
    fm_serve_version *v = NULL;
    if (!st) {
        v = fm_repo_acquire(s->repo, q.model, 0, &st, err, sizeof err);
        if (v && !v->textgen) st = 400, snprintf(err, sizeof err, "model '%s' is not a text-generation model", q.model);
        else if (v && chat && v->chat_refusal[0])
            st = 400, snprintf(err, sizeof err, "model '%s' has a chat template fathom cannot run (%.300s); rendering its "
                               "messages another way would prompt it wrongly. Give its format as "
                               "text_generation.chat_template in the model's config.json (docs/SERVING.md), or send the "
                               "formatted prompt to /v1/completions", q.model, v->chat_refusal);
        else if (v) st = 0;
    }
    fm_openai_prompt_item *items = NULL;
    int n_items = 0;
    stream_ctx *sc = NULL;
    const char *why = NULL;
    if (!st) st = fm_openai_prompts(&q, &v->cfg.chat, fm_textgen_chat_template(v->textgen, &why), &items, &n_items, err, sizeof err);
    if (!st && !(sc = ctx_new(v, n_items * q.n))) st = 500, snprintf(err, sizeof err, "out of memory");
    if (sc) {
        /* a whole reply's reader wakes once, at the end; a stream's at every token or
         * every stream_interval_tokens */
        q.p.wake_every = !q.stream ? 0 : v->cfg.stream_interval_tokens > 0 ? v->cfg.stream_interval_tokens : 1;
        st = submit_all(sc, &q, items, n_items, err, sizeof err);
    }
    fm_openai_prompts_free(items, n_items);
    bool streaming = q.stream, include_usage = q.include_usage, logprobs = q.p.logprobs;
    int top_k = q.p.top_logprobs;
    fm_openai_req_free(&q);
    if (st) {
        if (v) fm_serve_stats_request(&v->stats, 0, 0, 0);
        if (sc) ctx_free(sc);
        else fm_repo_release(v);
        return fm_http_error(c, st, err);
    }
    static atomic_ullong next_id;
    snprintf(sc->id, sizeof sc->id, "%s-%llu", chat ? "chatcmpl" : "cmpl", (unsigned long long)atomic_fetch_add(&next_id, 1));
    sc->reply = (fm_openai_reply){.id = sc->id, .model = v->model, .chat = chat, .include_usage = include_usage};
    sc->logprobs = logprobs;
    sc->top_k = top_k;
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
    /* With --api-key every /v1 endpoint needs it, as OpenAI-compatible servers (vLLM's
     * --api-key) do: its clients send it as their api_key. /v2 inference stays open, as
     * Triton's is; the key guards its repository control. */
    if (!fm_http_authorized(s, c))
        return fm_http_error(c, 401, "this server needs its API key on /v1 (header Authorization: Bearer KEY: an OpenAI "
                                     "client's api_key)");
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
