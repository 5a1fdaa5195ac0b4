/* OpenAI-style completion requests and replies: see openai_codec.h. */
#include "serve/openai_codec.h"

#include <limits.h>
#include <stdatomic.h>
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

/* A seed for a request that names none: distinct for every request of the process
 * (requests in the same second got the same samples when it was time(NULL)-based). */
static uint64_t fresh_seed(void) {
    static atomic_ullong counter;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t z = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
                 (atomic_fetch_add(&counter, 1) + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull; /* splitmix64's finalizer */
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Optional number j[key] in [lo, hi] into *out. 0, or a 400 with the message. */
static int number_in(const json_t *j, const char *key, double lo, double hi, bool lo_open, double *out, char *err, size_t errn) {
    const json_t *x = json_object_get(j, key);
    if (!x || json_is_null(x)) return 0;
    double v = json_is_number(x) ? json_number_value(x) : lo - 1;
    if (!(lo_open ? v > lo : v >= lo) || v > hi)
        return snprintf(err, errn, "\"%s\" must be a number in %c%g, %g]", key, lo_open ? '(' : '[', lo, hi), 400;
    *out = v;
    return 0;
}

/* "logit_bias": {"token id": bias in [-100, 100]}. */
static int parse_logit_bias(const json_t *x, fm_tg_params *p, char *err, size_t errn) {
    if (!x || json_is_null(x)) return 0;
    if (!json_is_object(x) || json_object_size(x) > FM_TG_MAX_BIAS)
        return snprintf(err, errn, "\"logit_bias\" must be an object of at most %d {\"token id\": bias}", FM_TG_MAX_BIAS), 400;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)x, key, v) {
        char *end = NULL;
        long id = strtol(key, &end, 10);
        if (!*key || *end || id < 0 || id > INT32_MAX || key[0] == '+' || key[0] == '-' || key[0] == ' ')
            return snprintf(err, errn, "logit_bias: key '%.40s' is not a token id (a whole number >= 0)", key), 400;
        if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
            return snprintf(err, errn, "logit_bias: the bias of token %ld must be a number in [-100, 100]", id), 400;
        p->bias_id[p->n_bias] = (int32_t)id;
        p->bias[p->n_bias++] = (float)json_number_value(v);
    }
    return 0;
}

/* The fields a request may hold: OpenAI's (completions or chat) and the vLLM
 * extensions fathom does. Any other is refused by name, as OpenAI's own API refuses
 * an unrecognized argument, so that a parameter fathom lacks (vLLM's min_tokens, a
 * misspelt temperture) never passes silently. The ones only named here are accepted
 * and have no effect on the text (user, store, metadata, service_tier, ...). */
static int refuse_unknown(const json_t *j, bool chat, char *err, size_t errn) {
    static const char *const both[] = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
                                       "logprobs", "stop", "presence_penalty", "frequency_penalty", "logit_bias", "user", "seed",
                                       "top_k", "repetition_penalty", "min_p", "ignore_eos", "stop_token_ids", NULL};
    static const char *const comp[] = {"prompt", "echo", "best_of", "suffix", NULL};
    static const char *const chat_only[] = {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
                                            "tool_choice", "parallel_tool_calls", "functions", "function_call", "store",
                                            "metadata", "service_tier", "modalities", "prompt_cache_key", "safety_identifier",
                                            "prediction", "reasoning_effort", "verbosity", "echo", "best_of", NULL};
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)j, key, v) {
        bool known = false;
        for (const char *const *k = both; *k && !known; k++) known = !strcmp(key, *k);
        for (const char *const *k = chat ? chat_only : comp; *k && !known; k++) known = !strcmp(key, *k);
        if (!known)
            return snprintf(err, errn, "unknown or unsupported field '%.64s' for /v1/%scompletions (docs/SERVING.md lists "
                            "the fields fathom serve takes)", key, chat ? "chat/" : ""), 400;
    }
    const json_t *m = json_object_get(j, "modalities");
    for (size_t i = 0; chat && i < json_array_size(m); i++)
        if (!json_is_string(json_array_get(m, i)) || strcmp(json_string_value(json_array_get(m, i)), "text"))
            return snprintf(err, errn, "\"modalities\": only \"text\" is supported"), 400;
    return 0;
}

/* vLLM's min_p, ignore_eos and stop_token_ids. */
static int parse_vllm(const json_t *j, fm_tg_params *p, char *err, size_t errn) {
    double min_p = 0;
    int st = number_in(j, "min_p", 0, 1, false, &min_p, err, errn);
    if (st) return st;
    p->min_p = (float)min_p;
    const json_t *x = json_object_get(j, "ignore_eos");
    if (x && !json_is_null(x) && !json_is_boolean(x)) return snprintf(err, errn, "\"ignore_eos\" must be true or false"), 400;
    p->ignore_eos = json_is_true(x);
    x = json_object_get(j, "stop_token_ids");
    if (!x || json_is_null(x)) return 0;
    if (!json_is_array(x) || json_array_size(x) > FM_TG_MAX_STOP_IDS)
        return snprintf(err, errn, "\"stop_token_ids\" must be an array of at most %d token ids", FM_TG_MAX_STOP_IDS), 400;
    for (size_t i = 0; i < json_array_size(x); i++) {
        const json_t *v = json_array_get(x, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return snprintf(err, errn, "stop_token_ids[%zu] is not a token id (a whole number >= 0)", i), 400;
        p->stop_ids[p->n_stop_ids++] = (int32_t)json_integer_value(v);
    }
    return 0;
}

/* OpenAI fields fathom serve does not do: refused by name, not silently ignored. */
static int refuse_unsupported(const json_t *j, bool chat, char *err, size_t errn) {
    const json_t *x;
    int st = refuse_unknown(j, chat, err, errn);
    if (st) return st;
    if ((x = json_object_get(j, "suffix")) && !json_is_null(x) && !(json_is_string(x) && !json_string_length(x)))
        return snprintf(err, errn, "\"suffix\" (insertion) is not supported"), 400;
    if (chat && (x = json_object_get(j, "echo")) && !json_is_null(x) && !json_is_false(x))
        return snprintf(err, errn, "\"echo\" is for /v1/completions; a chat reply never repeats the messages"), 400;
    const char *tool_keys[2][2] = {{"tools", "tool_choice"}, {"functions", "function_call"}};
    for (int k = 0; k < 2; k++) {
        const json_t *tools = json_object_get(j, tool_keys[k][0]), *choice = json_object_get(j, tool_keys[k][1]);
        bool none = json_is_string(choice) && !strcmp(json_string_value(choice), "none");
        bool auto_ = !choice || json_is_null(choice) || (json_is_string(choice) && !strcmp(json_string_value(choice), "auto"));
        bool any = tools && !json_is_null(tools) && !(json_is_array(tools) && json_array_size(tools) == 0);
        if ((any && !none) || (!any && !none && !auto_))
            return snprintf(err, errn, "\"%s\" / \"%s\": tool (function) calling is not supported by fathom serve; send "
                            "no tools, or \"%s\": \"none\"", tool_keys[k][0], tool_keys[k][1], tool_keys[k][1]), 400;
    }
    if ((x = json_object_get(j, "response_format")) && !json_is_null(x)) {
        const char *type = json_string_value(json_object_get(x, "type"));
        if (!type || strcmp(type, "text"))
            return snprintf(err, errn, "\"response_format\" %.40s is not supported: fathom serve has no constrained "
                            "(JSON) decoding; only {\"type\": \"text\"}", type ? type : "without a type"), 400;
    }
    return 0;
}

/* Completions' "logprobs": k, the top ids to list per token (0-20); chat's "logprobs":
 * true with "top_logprobs": k. Not with echo: the prompt's own log-probabilities
 * would need the prefill's logits at every position, which the decoder does not keep. */
static int parse_logprobs(const json_t *j, bool chat, bool echo, fm_tg_params *p, char *err, size_t errn) {
    const json_t *x = json_object_get(j, "logprobs"), *top = json_object_get(j, "top_logprobs");
    bool on = false;
    if (chat) {
        if (x && !json_is_null(x) && !json_is_boolean(x)) return snprintf(err, errn, "\"logprobs\" must be true or false"), 400;
        on = json_is_true(x);
        if (top && !json_is_null(top) && (!json_is_integer(top) || json_integer_value(top) < 0 ||
                                          json_integer_value(top) > FM_TG_MAX_TOP))
            return snprintf(err, errn, "\"top_logprobs\" must be a whole number in [0, %d]", FM_TG_MAX_TOP), 400;
        if (top && !json_is_null(top) && !on) return snprintf(err, errn, "\"top_logprobs\" needs \"logprobs\": true"), 400;
        p->top_logprobs = json_is_integer(top) ? (int)json_integer_value(top) : 0;
    } else if (x && !json_is_null(x) && !json_is_false(x)) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > FM_TG_MAX_TOP)
            return snprintf(err, errn, "\"logprobs\" must be a whole number in [0, %d] (the top ids to list per token)",
                            FM_TG_MAX_TOP), 400;
        on = true;
        p->top_logprobs = (int)json_integer_value(x);
    }
    if (on && echo)
        return snprintf(err, errn, "\"echo\" with \"logprobs\" (the prompt's log-probabilities) is not supported; "
                        "ask for one of them"), 400;
    p->logprobs = on;
    return 0;
}

/* n and best_of (best_of > n would rank choices by log-probability, which fathom does not compute). */
static int parse_n(const json_t *j, int *n, char *err, size_t errn) {
    const json_t *x = json_object_get(j, "n"), *b = json_object_get(j, "best_of");
    *n = 1;
    if (x && !json_is_null(x) && (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > FM_OPENAI_MAX_CHOICES))
        return snprintf(err, errn, "\"n\" must be a whole number in [1, %d]", FM_OPENAI_MAX_CHOICES), 400;
    if (x && !json_is_null(x)) *n = (int)json_integer_value(x);
    if (b && !json_is_null(b) && !(json_is_integer(b) && json_integer_value(b) == *n))
        return snprintf(err, errn, "\"best_of\" other than n (%d) is not supported (fathom serve returns every choice it "
                        "samples)", *n), 400;
    return 0;
}

static int parse_params(const json_t *j, bool chat, fm_tg_params *p, char *err, size_t errn) {
    const json_t *x;
    memset(p, 0, sizeof *p);
    /* completions stop at 16 tokens unless told (OpenAI's default); a chat reply runs to
     * its stop or the end of the context, as OpenAI's and vLLM's do */
    p->max_tokens = chat ? 100000 : 16;
    p->sample.temperature = 1.0;
    p->sample.top_p = 1.0;
    p->repetition_penalty = 1;
    p->sample.seed = fresh_seed();
    for (int k = 0; k < 2; k++) { /* chat's newer name wins when both are given */
        const char *key = k ? "max_completion_tokens" : "max_tokens";
        if ((x = json_object_get(j, key)) && json_is_null(x)) continue;
        if (x && (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 100000))
            return snprintf(err, errn, "\"%s\" must be a whole number in [1, 100000]", key), 400;
        if (x) p->max_tokens = (int)json_integer_value(x);
    }
    double temperature = p->sample.temperature, top_p = p->sample.top_p, pp = 0, fp = 0, rp = 1;
    int st = number_in(j, "temperature", 0, 100, false, &temperature, err, errn);
    if (!st) st = number_in(j, "top_p", 0, 1, true, &top_p, err, errn);
    if (!st) st = number_in(j, "presence_penalty", -2, 2, false, &pp, err, errn);
    if (!st) st = number_in(j, "frequency_penalty", -2, 2, false, &fp, err, errn);
    if (!st) st = number_in(j, "repetition_penalty", 0, 10, true, &rp, err, errn);
    if (st) return st;
    p->sample.temperature = temperature;
    p->sample.top_p = top_p;
    p->presence_penalty = (float)pp;
    p->frequency_penalty = (float)fp;
    p->repetition_penalty = (float)rp;
    if ((x = json_object_get(j, "top_k")) && !json_is_null(x) &&
        (!json_is_integer(x) || json_integer_value(x) < -1 || json_integer_value(x) > 1000000))
        return snprintf(err, errn, "\"top_k\" must be a whole number >= 0 (0 or -1: off)"), 400;
    if (x && json_is_integer(x) && json_integer_value(x) > 0) p->sample.top_k = (int)json_integer_value(x);
    if ((x = json_object_get(j, "seed")) && !json_is_null(x) && (!json_is_integer(x) || json_integer_value(x) < 0))
        return snprintf(err, errn, "\"seed\" must be a whole number >= 0"), 400;
    if (x && !json_is_null(x)) p->sample.seed = (uint64_t)json_integer_value(x);
    if ((st = parse_logit_bias(json_object_get(j, "logit_bias"), p, err, errn))) return st;
    if ((st = parse_vllm(j, p, err, errn))) return st;
    if ((st = refuse_unsupported(j, chat, err, errn))) return st;
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
    if (stream && !json_is_null(stream) && !json_is_boolean(stream)) return snprintf(err, errn, "\"stream\" must be true or false"), 400;
    r->stream = json_is_true(stream);
    const json_t *echo = json_object_get(j, "echo");
    if (echo && !json_is_null(echo) && !json_is_boolean(echo)) return snprintf(err, errn, "\"echo\" must be true or false"), 400;
    r->echo = json_is_true(echo);
    int st = parse_params(j, chat, &r->p, err, errn);
    if (!st) st = parse_n(j, &r->n, err, errn);
    if (!st) st = parse_logprobs(j, chat, r->echo, &r->p, err, errn);
    return st ? st : parse_stream_options(j, r->stream, &r->include_usage, err, errn);
}

void fm_openai_req_free(fm_openai_req *r) {
    json_decref(r->body);
    r->body = NULL;
    r->model = NULL;
}

/* An array of token ids into it->ids. 0, or a 400 with the message. */
static int token_prompt(const json_t *a, int which, fm_openai_prompt_item *it, char *err, size_t errn) {
    size_t n = json_array_size(a);
    if (n == 0) return snprintf(err, errn, "prompt %d is empty", which), 400;
    if (n > 1000000) return snprintf(err, errn, "prompt %d has %zu token ids (at most 1000000)", which, n), 400;
    if (!(it->ids = malloc(sizeof(int32_t) * n))) return snprintf(err, errn, "out of memory"), 500;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return snprintf(err, errn, "prompt %d: element %zu is not a token id (a whole number >= 0)", which, i), 400;
        it->ids[i] = (int32_t)json_integer_value(v);
    }
    it->n_ids = (int64_t)n;
    return 0;
}

static int copy_text(const json_t *s, fm_openai_prompt_item *it, char *err, size_t errn) {
    it->len = json_string_length(s);
    if (!(it->text = malloc(it->len + 1))) return snprintf(err, errn, "out of memory"), 500;
    memcpy(it->text, json_string_value(s), it->len + 1);
    return 0;
}

/* "prompt": a string, an array of strings, an array of token ids, or an array of arrays of ids. */
static int completion_prompts(const json_t *prompt, int n_per, fm_openai_prompt_item **out, int *n, char *err, size_t errn) {
    const char *what = "\"prompt\" must be a string, an array of strings, an array of token ids or an array of such arrays";
    bool one = json_is_string(prompt) || (json_is_array(prompt) && json_is_integer(json_array_get(prompt, 0)));
    if (!json_is_string(prompt) && !json_is_array(prompt)) return snprintf(err, errn, "%s", what), 400;
    size_t cnt = one ? 1 : json_array_size(prompt);
    if (cnt == 0) return snprintf(err, errn, "\"prompt\" is an empty array"), 400;
    if (cnt * (size_t)n_per > FM_OPENAI_MAX_CHOICES)
        return snprintf(err, errn, "%zu prompts x n %d is over the limit of %d choices in one request", cnt, n_per,
                        FM_OPENAI_MAX_CHOICES), 400;
    if (!(*out = calloc(cnt, sizeof **out))) return snprintf(err, errn, "out of memory"), 500;
    *n = (int)cnt;
    for (size_t i = 0; i < cnt; i++) {
        const json_t *p = one ? prompt : json_array_get(prompt, i);
        int st = json_is_string(p) ? copy_text(p, &(*out)[i], err, errn)
               : json_is_array(p) ? token_prompt(p, (int)i, &(*out)[i], err, errn)
               : (snprintf(err, errn, "%s (element %zu is neither)", what, i), 400);
        if (st) return st;
    }
    return 0;
}

int fm_openai_prompts(fm_openai_req *r, const fm_chat_template *t, const fm_chat_jinja *j, fm_openai_prompt_item **out,
                      int *n, char *err, size_t errn) {
    *out = NULL;
    *n = 0;
    if (!r->chat) return completion_prompts(json_object_get(r->body, "prompt"), r->n, out, n, err, errn);
    fm_tg_params *p = &r->p;
    fm_openai_prompt_item it = {0};
    const json_t *msgs = json_object_get(r->body, "messages");
    if (!(it.text = j ? fm_chat_jinja_render(j, msgs, &it.len, err, errn) : fm_chat_render(t, msgs, &it.len, err, errn))) return 400;
    if (!(*out = malloc(sizeof it))) { free(it.text); return snprintf(err, errn, "out of memory"), 500; }
    **out = it;
    *n = 1;
    const char *stop = j ? j->stop : t->stop;
    bool have = !*stop;
    for (int i = 0; i < p->n_stop; i++) have |= !strcmp(p->stop[i], stop);
    if (!have && p->n_stop < FM_TG_MAX_STOP && strlen(stop) < sizeof p->stop[0]) strcpy(p->stop[p->n_stop++], stop);
    return 0;
}

void fm_openai_prompts_free(fm_openai_prompt_item *items, int n) {
    for (int i = 0; items && i < n; i++) {
        free(items[i].text);
        free(items[i].ids);
    }
    free(items);
}

/* A chat choice: "message" (whole) or "delta" (a stream chunk; the first names the role). */
static json_t *chat_choice(fm_openai_reply *o, const char *text, const char *finish, bool chunk) {
    json_t *msg = json_object();
    if (!chunk || !o->sent_role) json_object_set_new(msg, "role", json_string("assistant"));
    if (!chunk || *text) json_object_set_new(msg, "content", json_string(text));
    o->sent_role = true;
    return json_pack("{s:i,s:o,s:o}", "index", o->index, chunk ? "delta" : "message", msg, "finish_reason",
                     finish ? json_string(finish) : json_null());
}

static json_t *choice_json(fm_openai_reply *o, const char *text, const char *finish, bool chunk) {
    json_t *c = o->chat ? chat_choice(o, text, finish, chunk)
                        : json_pack("{s:s,s:i,s:o}", "text", text, "index", o->index, "finish_reason",
                                    finish ? json_string(finish) : json_null());
    if (c && json_object_set(c, "logprobs", o->logprobs ? o->logprobs : json_null())) {
        json_decref(c);
        return NULL;
    }
    return c;
}

/* A token's text (its bytes with any not forming UTF-8 as U+FFFD) and, for chat, its bytes. */
static int token_entry(bool chat, fm_openai_token_fn fn, void *ctx, int32_t id, float lp, json_t **text_out, json_t **entry) {
    size_t n = 0, m = 0;
    char *raw = fn(ctx, id, &n);
    char *s = raw ? fm_tg_sanitize_utf8(raw, n, true, &m) : NULL;
    json_t *t = s ? json_stringn(s, m) : NULL, *bytes = chat && t ? json_array() : NULL;
    for (size_t i = 0; bytes && i < n; i++)
        if (json_array_append_new(bytes, json_integer((unsigned char)raw[i]))) { json_decref(bytes); bytes = NULL; }
    free(raw);
    free(s);
    if (!t || (chat && !bytes)) { json_decref(t); json_decref(bytes); return -1; }
    *text_out = t;
    *entry = chat ? json_pack("{s:O,s:f,s:o}", "token", t, "logprob", (double)lp, "bytes", bytes) : NULL;
    return chat && !*entry ? (json_decref(t), -1) : 0;
}

json_t *fm_openai_logprobs_json(bool chat, const fm_openai_lp *l, int from, int to, long *offset, fm_openai_token_fn fn,
                                void *ctx) {
    json_t *content = json_array(), *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    bool ok = content && toks && lps && tops && offs;
    for (int i = from; ok && i < to; i++) {
        json_t *t = NULL, *e = NULL, *top = chat ? json_array() : json_object();
        ok = top && !token_entry(chat, fn, ctx, l->ids[i], l->lp[i], &t, &e);
        for (int j = 0; ok && j < l->k; j++) {
            json_t *tt = NULL, *te = NULL;
            float v = l->top_lp[(size_t)i * (size_t)l->k + (size_t)j];
            ok = !token_entry(chat, fn, ctx, l->top_id[(size_t)i * (size_t)l->k + (size_t)j], v, &tt, &te);
            ok = ok && !(chat ? json_array_append_new(top, te) : json_object_set_new(top, json_string_value(tt), json_real(v)));
            json_decref(tt);
        }
        if (ok && chat) {
            if (json_object_set_new(e, "top_logprobs", top)) { json_decref(e); ok = false; }
            else ok = !json_array_append_new(content, e);
        } else if (ok) { /* completions: the sampled token is among its top ones too, as OpenAI's are */
            if (json_object_set_new(top, json_string_value(t), json_real(l->lp[i]))) { json_decref(top); ok = false; }
            else ok = !json_array_append_new(tops, top) && !json_array_append(toks, t) &&
                      !json_array_append_new(lps, json_real(l->lp[i])) && !json_array_append_new(offs, json_integer(*offset));
            const unsigned char *c = (const unsigned char *)json_string_value(t);
            for (; c && *c; c++) *offset += (*c & 0xC0) != 0x80; /* characters, as OpenAI counts its offsets */
        } else {
            json_decref(top);
            json_decref(e);
        }
        json_decref(t);
    }
    json_t *j = !ok ? NULL
              : chat ? json_pack("{s:O,s:n}", "content", content, "refusal")
                     : json_pack("{s:O,s:O,s:O,s:O}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset", offs);
    json_decref(content);
    json_decref(toks);
    json_decref(lps);
    json_decref(tops);
    json_decref(offs);
    return j;
}

static json_t *usage_json(const fm_openai_reply *o) {
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", o->prompt_tokens, "completion_tokens", o->completion_tokens,
                     "total_tokens", o->prompt_tokens + o->completion_tokens);
}

/* The reply around its choices (an array, taken). */
static json_t *reply_with(fm_openai_reply *o, json_t *choices, bool chunk) {
    const char *object = !o->chat ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion";
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", o->id, "object", object, "created", (json_int_t)o->created, "model",
                     o->model, "choices", choices);
}

json_t *fm_openai_reply_choices(fm_openai_reply *o, int n, char *const *texts, const char *const *finishes,
                                json_t *const *logprobs) {
    json_t *choices = json_array();
    for (int i = 0; choices && i < n; i++) {
        o->index = i;
        o->logprobs = logprobs ? logprobs[i] : NULL;
        if (json_array_append_new(choices, choice_json(o, texts[i], finishes[i], false))) { json_decref(choices); return NULL; }
    }
    json_t *j = choices ? reply_with(o, choices, false) : NULL;
    if (j) json_object_set_new(j, "usage", usage_json(o));
    return j;
}

json_t *fm_openai_reply_json(fm_openai_reply *o, const char *text, const char *finish, bool chunk) {
    json_t *choice = choice_json(o, text, finish, chunk);
    json_t *j = choice ? reply_with(o, json_pack("[o]", choice), chunk) : NULL;
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
