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

#include "serve/chat_template.h"
#include "serve/textgen.h"

typedef struct fm_openai_req {
    json_t *body;      /* the parsed object (owned) */
    const char *model; /* in body */
    bool chat, stream, include_usage;
    fm_tg_params p;
} fm_openai_req;

/* The body of a completions (chat: chat completions) request: model, stream,
 * max_tokens / max_completion_tokens, temperature, top_p, top_k, seed, n, stop and
 * stream_options. 0, or 400 with the message in err. fm_openai_req_free either way. */
int fm_openai_parse(const char *body, size_t len, bool chat, fm_openai_req *r, char *err, size_t errn);
void fm_openai_req_free(fm_openai_req *r);
/* The prompt (malloc'd, its length in *n): "prompt", or for chat "messages"
 * through template t, whose stop string joins the request's when there is room.
 * NULL with a 400 message. */
char *fm_openai_prompt(fm_openai_req *r, const fm_chat_template *t, size_t *n, char *err, size_t errn);

/* What a reply says besides the text. */
typedef struct fm_openai_reply {
    const char *id, *model;
    bool chat, include_usage;
    bool sent_role; /* chat streams: the first chunk's delta names the role */
    int prompt_tokens, completion_tokens;
    long long created;
} fm_openai_reply;

/* The whole reply (chunk false) or one stream chunk with the new text (finish:
 * NULL until the last). text must be valid UTF-8. NULL if out of memory. */
json_t *fm_openai_reply_json(fm_openai_reply *o, const char *text, const char *finish, bool chunk);
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
