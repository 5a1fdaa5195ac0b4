/* The OpenAI-style completion requests and replies (src/serve/openai_codec.c),
 * with the UTF-8 clean-up of generated text (fm_tg_sanitize_utf8) and the token
 * sampler (fm_gpt_sample) under the parsed parameters.
 *
 * Input: one flag byte (bit 0: /v1/chat/completions, bit 1: a configured chat
 * template instead of the default, bit 2: the text is final), the request body up
 * to the first NUL byte, then the bytes a model "generated" (also read as float
 * logits for the sampler). Checked: a refusal is a 400 with a message; an accepted
 * request's parameters are in range (stream_options only with stream, penalties,
 * logit_bias, n); each prompt is text or token ids, the text what was sent or ending
 * with the template's generation prompt; the cleaned text
 * is valid UTF-8; the whole reply and each stream event are JSON that carries the
 * text back unchanged; a sampled id lies in the vocabulary. */
#include <jansson.h>

#include "fathom/gpt.h"
#include "fuzz_util.h"
#include "serve/openai_codec.h"

static void check_params(const fm_openai_req *q) {
    const fm_tg_params *p = &q->p;
    if (p->max_tokens < 1 || p->max_tokens > 100000) abort();
    if (!(p->sample.temperature >= 0 && p->sample.temperature <= 100)) abort();
    if (!(p->sample.top_p > 0 && p->sample.top_p <= 1)) abort();
    if (p->sample.top_k < 0 || p->sample.top_k > 1000000) abort();
    if (p->n_stop < 0 || p->n_stop > FM_TG_MAX_STOP) abort();
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i][0] || strlen(p->stop[i]) >= sizeof p->stop[i]) abort();
    if (q->include_usage && !q->stream) abort();
    if (q->n < 1 || q->n > FM_OPENAI_MAX_CHOICES) abort();
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2 && p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        abort();
    if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 10)) abort();
    if (p->n_bias < 0 || p->n_bias > FM_TG_MAX_BIAS) abort();
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_id[i] < 0 || !(p->bias[i] >= -100 && p->bias[i] <= 100)) abort();
    if (q->echo && q->chat) abort();
    if (!q->model || !*q->model) abort();
}

/* The text of a parsed reply: choices[0].text, .message.content or .delta.content ("" when absent). */
static const char *reply_text(const json_t *j, size_t *n) {
    const json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    const json_t *t = json_object_get(c, "text");
    if (!t) t = json_object_get(json_object_get(c, "message"), "content");
    if (!t) t = json_object_get(json_object_get(c, "delta"), "content");
    *n = t ? json_string_length(t) : 0;
    return t ? json_string_value(t) : "";
}

static void check_reply(fm_openai_reply *o, const char *text, size_t n) {
    json_t *j = fm_openai_reply_json(o, text, "length", false);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (!s) abort(); /* valid UTF-8 always makes a reply */
    json_error_t je;
    json_t *back = json_loads(s, 0, &je);
    size_t bn = 0;
    const char *bt = back ? reply_text(back, &bn) : NULL;
    if (!bt || bn != strlen(text) || memcmp(bt, text, bn)) abort(); /* a C string: up to a NUL the model made */
    if (!json_is_object(json_object_get(back, "usage"))) abort();
    json_decref(back);
    json_decref(j);
    free(s);
    static char buf[64 * 1024];
    for (int done = 0; done < 2; done++) {
        long len = fm_openai_sse_event(o, text, done ? "stop" : NULL, done, buf, sizeof buf);
        if (len < 0) {
            if (n < 16 * 1024) abort(); /* a short chunk always fits */
            continue;
        }
        if ((size_t)len != strlen(buf) || len < 8 || memcmp(buf, "data: ", 6) || memcmp(buf + len - 2, "\n\n", 2)) abort();
        if (done && !strstr(buf, "data: [DONE]\n\n")) abort();
        char *nl = strstr(buf, "\n\n");
        *nl = 0;
        json_t *ev = json_loads(buf + 6, 0, &je);
        if (!ev) abort();
        const char *et = reply_text(ev, &bn);
        if (bn != strlen(text) || memcmp(et, text, bn)) abort();
        json_decref(ev);
    }
}

static void check_sample(const fm_tg_params *p, const uint8_t *raw, size_t n) {
    int V = (int)(n / sizeof(float));
    if (V < 1 || V > 4096) return;
    float *lg = malloc(sizeof(float) * (size_t)V);
    if (!lg) return;
    memcpy(lg, raw, sizeof(float) * (size_t)V);
    for (uint64_t d = 0; d < 2; d++) {
        int tok = fm_gpt_sample(lg, V, &p->sample, d);
        if (tok < 0 || tok >= V) abort();
    }
    free(lg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const bool chat = data[0] & 1, custom = data[0] & 2, final = data[0] & 4;
    const char *body = (const char *)data + 1;
    size_t blen = size - 1;
    const uint8_t *nul = memchr(body, 0, blen);
    const uint8_t *raw = nul ? nul + 1 : (const uint8_t *)body + blen;
    size_t raw_n = nul ? (size_t)((const uint8_t *)body + blen - raw) : 0;
    if (nul) blen = (size_t)(nul - (const uint8_t *)body);
    char err[512] = "";
    fm_openai_req q;
    int st = fm_openai_parse(body, blen, chat, &q, err, sizeof err);
    if (st) {
        if (st != 400 || !err[0]) abort();
        fm_openai_req_free(&q);
        return 0;
    }
    check_params(&q);
    fm_chat_template t;
    fm_chat_template_default(&t);
    if (custom) {
        json_t *cfg = json_pack("{s:s,s:s,s:s,s:s}", "user", "<u>{content}</u>", "generation", "<a>", "stop", "<u>",
                                "system", "<s>{content}</s>");
        if (!cfg) abort();
        if (fm_chat_template_parse(&t, cfg, "fuzz") != FM_OK) abort();
        json_decref(cfg);
    }
    size_t n = 0;
    err[0] = 0;
    fm_openai_prompt_item *items = NULL;
    int n_items = 0;
    if (fm_openai_prompts(&q, &t, &items, &n_items, err, sizeof err)) {
        if (!err[0]) abort();
    } else {
        if (n_items < 1 || (chat && n_items != 1) || n_items * q.n > FM_OPENAI_MAX_CHOICES) abort();
        const json_t *prompt = json_object_get(q.body, "prompt");
        for (int i = 0; i < n_items; i++) {
            const fm_openai_prompt_item *it = &items[i];
            if (!it->text == !it->ids) abort(); /* text or ids, never both */
            if (it->ids && (it->n_ids < 1 || chat)) abort();
            for (int64_t k = 0; it->ids && k < it->n_ids; k++)
                if (it->ids[k] < 0) abort();
            if (!it->text) continue;
            if (it->text[it->len]) abort();
            n += it->len;
            if (chat && (it->len < strlen(t.generation) ||
                         memcmp(it->text + it->len - strlen(t.generation), t.generation, strlen(t.generation))))
                abort();
            const json_t *sent = json_is_string(prompt) ? prompt : json_array_get(prompt, (size_t)i);
            if (!chat && (it->len != json_string_length(sent) || memcmp(it->text, json_string_value(sent), it->len))) abort();
        }
        if (q.p.n_stop > FM_TG_MAX_STOP) abort();
    }
    fm_openai_prompts_free(items, n_items);
    size_t tn = 0;
    char *text = fm_tg_sanitize_utf8((const char *)raw, raw_n, final, &tn);
    json_t *valid = text ? json_stringn(text, tn) : NULL; /* jansson refuses invalid UTF-8 */
    if (!valid || text[tn]) abort();
    json_decref(valid);
    fm_openai_reply o = {.id = "cmpl-1", .model = q.model, .chat = chat, .include_usage = q.include_usage,
                         .prompt_tokens = (int)(n & 0xffff), .completion_tokens = (int)(raw_n & 0xffff), .created = 1};
    check_reply(&o, text, tn);
    check_sample(&q.p, raw, raw_n);
    free(text);
    fm_openai_req_free(&q);
    fm_clear_error();
    return 0;
}
