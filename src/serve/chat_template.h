/* Chat messages -> one prompt, for /v1/chat/completions on models that carry no
 * chat template of their own (fathom's GPT recipes do not). A template is a
 * format per role with one "{content}" where the message's text goes, a
 * generation prompt appended after the last message, and a stop string that ends
 * the reply where the model starts the next turn. The default (docs/SERVING.md):
 *     system     "{content}\n\n"
 *     user       "User: {content}\n"
 *     assistant  "Assistant: {content}\n"
 *     generation "Assistant:"          stop "\nUser:"
 * config.json's text_generation.chat_template replaces any of these fields. */
#ifndef FATHOM_SERVE_CHAT_TEMPLATE_H
#define FATHOM_SERVE_CHAT_TEMPLATE_H
#include <jansson.h>
#include <stdbool.h>

#include "fathom/error.h"

#define FM_CHAT_FMT_MAX 256

typedef struct fm_chat_template {
    bool set; /* given in config.json (else the default applies) */
    char system[FM_CHAT_FMT_MAX], user[FM_CHAT_FMT_MAX], assistant[FM_CHAT_FMT_MAX];
    char generation[FM_CHAT_FMT_MAX];
    char stop[64]; /* "": none */
} fm_chat_template;

void fm_chat_template_default(fm_chat_template *t);
/* The "chat_template" object of config.json over the default; errors name `where` and the field (FM_ERR_FORMAT). */
fm_status fm_chat_template_parse(fm_chat_template *t, const json_t *j, const char *where);
json_t *fm_chat_template_json(const fm_chat_template *t);
/* OpenAI "messages" -> the prompt (malloc'd, length in *n), or NULL with a message
 * for a 400 naming the bad message (not an array, unknown role, content that is
 * not text). */
char *fm_chat_render(const fm_chat_template *t, const json_t *messages, size_t *n, char *err, size_t errn);
#endif
