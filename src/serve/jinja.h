/* Hugging Face chat templates: the subset of Jinja they are written in, parsed and
 * rendered as transformers' apply_chat_template does (jinja2 with trim_blocks,
 * lstrip_blocks and loop controls), so that /v1/chat/completions prompts a model
 * the way it was trained.
 *
 * Written here rather than taken from a library: the C and C++ Jinja engines
 * (llama.cpp's minja, jinja2cpp, inja) are C++ with a runtime of their own, and
 * fathom's serving layer is C; what chat templates use is small and fixed.
 *
 * Statements: if / elif / else, for (one or two names, an `if` filter, else,
 * loop.index / index0 / revindex / revindex0 / first / last / length, break,
 * continue), set (a name or namespace.attribute), generation (rendered as its
 * body), and comments, with `-` and `+` whitespace control. Expressions: literals
 * (strings, numbers, true/false/none, lists, dicts), names, `.attr`, `[i]`, slices,
 * calls, `x if c else y`, or / and / not, comparisons, in / not in, is / is not
 * tests, + - * / // % ~, filters. Names given: raise_exception, namespace, range,
 * strftime_now, dict. Anything else (macros, includes, raw blocks, an unknown filter
 * or test) is an error that names it and its line: the caller refuses the request
 * rather than render a prompt another way. */
#ifndef FATHOM_SERVE_JINJA_H
#define FATHOM_SERVE_JINJA_H
#include <jansson.h>
#include <stddef.h>

typedef struct fm_jinja fm_jinja;

/* A template of n bytes; NULL with "line L: ..." in err. */
fm_jinja *fm_jinja_parse(const char *src, size_t n, char *err, size_t errn);
void fm_jinja_free(fm_jinja *t);
/* The template with the variables of `vars` (a JSON object: messages,
 * add_generation_prompt, bos_token, ...): malloc'd text, its length in *n; NULL with
 * the reason in err (raise_exception's message, an undefined value used, a limit:
 * 4 MiB of output, 1,000,000 loop iterations). */
char *fm_jinja_render(const fm_jinja *t, const json_t *vars, size_t *n, char *err, size_t errn);

/* A Hugging Face model's chat template with what it renders with: the special
 * tokens of tokenizer_config.json (bos_token, eos_token, ...), the prefix its
 * tokenizer adds by itself (set by the caller: a rendered prompt that starts with it
 * drops it, so BOS is not there twice), and eos_token's text as a stop string. */
typedef struct fm_chat_jinja {
    fm_jinja *t;
    json_t *vars;
    char strip[64];
    char stop[64];
    char file[32]; /* where the template was: tokenizer_config.json, chat_template.jinja or .json */
} fm_chat_jinja;
/* The template of a model directory: "chat_template.jinja", "chat_template.json"
 * ({"chat_template": ...}) or tokenizer_config.json's "chat_template" (a string, or
 * a list of {"name", "template"} of which "default" is taken). NULL with err ""
 * when there is none; NULL with the file and the reason in err when there is one
 * that cannot be read or parsed. */
fm_chat_jinja *fm_chat_jinja_load(const char *dir, char *err, size_t errn);
void fm_chat_jinja_free(fm_chat_jinja *c);
/* The request's messages through it, with add_generation_prompt: the prompt
 * (malloc'd, its length in *n), or NULL with a 400 message (content that is not
 * text, or the template's refusal). Array contents of {"type": "text"} parts are
 * joined with newlines, as vLLM does for text-only models. */
char *fm_chat_jinja_render(const fm_chat_jinja *c, const json_t *messages, size_t *n, char *err, size_t errn);
#endif
