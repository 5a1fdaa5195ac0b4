/* The OpenAI-style request and reply bodies of /v1/completions and
 * /v1/chat/completions (docs/SERVING.md), apart from the HTTP daemon so that
 * tests/fuzz/fuzz_completion_request.c can drive them: the request's fields into
 * generation parameters (400 with a message for anything malformed), the prompt
 * (or chat messages through a template), and the whole reply, a stream chunk, the
 * include_usage chunk and their server-sent-event framing. */
#ifndef FATHOM_SERVE_OPENAI_CODEC_H
#define FATHOM_SERVE_OPENAI_CODEC_H
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/chat_template.h"
#include "serve/jinja.h"
#include "serve/textgen.h"

typedef struct fm_openai_req {
    json_t *body;      /* the parsed object (owned) */
    const char *model; /* in body */
    bool chat, stream, include_usage;
    bool echo; /* completions: the prompt's text comes before each choice's */
    int n;     /* choices per prompt */
    fm_tg_params p;
} fm_openai_req;

/* The most choices (prompts x n) one request may ask for. */
#define FM_OPENAI_MAX_CHOICES 128

/* The body of a completions (chat: chat completions) request: model, stream,
 * max_tokens / max_completion_tokens, temperature, top_p, top_k, seed, n, best_of (= n),
 * stop, presence_penalty, frequency_penalty, repetition_penalty, logit_bias, echo
 * and stream_options; the fields it does not do (logprobs, suffix, tools, function
 * calls, response formats other than text) are refused by name. 0, or 400 with
 * the message in err. fm_openai_req_free either way. */
int fm_openai_parse(const char *body, size_t len, bool chat, fm_openai_req *r, char *err, size_t errn);
void fm_openai_req_free(fm_openai_req *r);

/* One prompt: text (malloc'd, NUL-terminated, len bytes) or token ids (malloc'd). */
typedef struct fm_openai_prompt_item {
    char *text;
    size_t len;
    int32_t *ids;
    int64_t n_ids;
} fm_openai_prompt_item;
/* The request's prompts into *out[*n]: completions' "prompt" (a string, an array of
 * strings, an array of token ids or an array of such arrays; prompts x n at most
 * FM_OPENAI_MAX_CHOICES), or for chat the one prompt of "messages" through the
 * model's own template j (jinja.h) when given, else through t; the template's stop
 * string (j: its eos_token's text) joins the request's when there is room. 0, or 400 (500 out
 * of memory) with the message; fm_openai_prompts_free either way. */
int fm_openai_prompts(fm_openai_req *r, const fm_chat_template *t, const fm_chat_jinja *j, fm_openai_prompt_item **out,
                      int *n, char *err, size_t errn);
void fm_openai_prompts_free(fm_openai_prompt_item *items, int n);

/* What a reply says besides the text. */
typedef struct fm_openai_reply {
    const char *id, *model;
    bool chat, include_usage;
    bool sent_role; /* chat streams: the chunk's delta names the role (the choice's first) */
    int index;      /* the choice a stream chunk carries */
    json_t *logprobs; /* that choice's "logprobs" (borrowed; NULL: null) */
    int prompt_tokens, completion_tokens;
    long long created;
} fm_openai_reply;

/* The whole reply (chunk false) or one stream chunk with the new text (finish:
 * NULL until the last) of choice o->index. text must be valid UTF-8. NULL if out
 * of memory. */
json_t *fm_openai_reply_json(fm_openai_reply *o, const char *text, const char *finish, bool chunk);
/* The whole reply of n choices: texts[i], finishes[i] and logprobs[i] (logprobs NULL:
 * none) are choice i's. */
json_t *fm_openai_reply_choices(fm_openai_reply *o, int n, char *const *texts, const char *const *finishes,
                                json_t *const *logprobs);

/* A choice's generated tokens with their log-probabilities (fm_tg_req_logprobs). */
typedef struct fm_openai_lp {
    const int32_t *ids;
    const float *lp;
    const int32_t *top_id; /* [i * k + j] */
    const float *top_lp;
    int k;
} fm_openai_lp;
/* A token's decoded bytes (malloc'd, *n), or NULL. */
typedef char *(*fm_openai_token_fn)(void *ctx, int32_t id, size_t *n);
/* The "logprobs" of tokens [from, to) of a choice: for completions {"tokens",
 * "token_logprobs", "top_logprobs": [{token: logprob}] (the k top and the sampled
 * one), "text_offset"} with offsets in characters from *offset (advanced past them);
 * for chat {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
 * "logprob", "bytes"}]}], "refusal": null}. A token's text has U+FFFD for bytes that
 * do not form UTF-8 on their own (chat's "bytes" has them all). NULL if out of memory. */
json_t *fm_openai_logprobs_json(bool chat, const fm_openai_lp *l, int from, int to, long *offset, fm_openai_token_fn fn,
                                void *ctx);
/* stream_options.include_usage's last chunk: no choices, the usage. */
json_t *fm_openai_usage_chunk(const fm_openai_reply *o);
/* One server-sent event holding a chunk with `text` (and, when done, the usage
 * chunk if asked for and "data: [DONE]") into buf[max]: its length, or -1 if it
 * does not fit or memory ran out. */
long fm_openai_sse_event(fm_openai_reply *o, const char *text, const char *finish, bool done, char *buf, size_t max);

/* ---- POST /v1/embeddings (openai_embed.c) ---- */
#define FM_OPENAI_EMBED_MAX_INPUTS 2048
typedef struct fm_openai_embed_req {
    json_t *body;       /* the parsed object (owned) */
    const char *model;  /* in body */
    const char **texts; /* n texts, in body */
    int n;
    bool base64;        /* encoding_format "base64" */
    int64_t dimensions; /* asked for (0: not given); the server refuses any other than the model's */
} fm_openai_embed_req;
/* model, input (a string or 1-2048 non-empty strings; token ids are refused),
 * encoding_format, dimensions; other fields are ignored. 0, or 400 with err.
 * fm_openai_embed_req_free either way. */
int fm_openai_embed_parse(const char *body, size_t len, fm_openai_embed_req *r, char *err, size_t errn);
void fm_openai_embed_req_free(fm_openai_embed_req *r);
/* {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
 * "usage"}: n rows of dim floats, as numbers or (b64) base64 of their float32 bytes. */
json_t *fm_openai_embed_reply(const char *model, const float *emb, int n, int dim, bool b64, int64_t tokens);
#endif
