/* Text generation for GPT/Llama models (a version folder written by
 * `fathom train` for a GPT recipe: config.json, model.safetensors, tokenizer.txt)
 * with continuous batching: one scheduler thread per loaded version runs decode
 * steps over every active request (src/gpt/gpt_paged.c); a request joins at the
 * next step once a sequence slot and a KV block are free, and leaves at the step
 * that finishes it. A prompt goes through the model in chunks of up to
 * prefill_chunk_tokens in the same steps as the others' decoding (one forward
 * per chunk). When a step needs more KV blocks than are free, the most recently
 * admitted request is preempted: its blocks are freed and it is queued again at
 * the front, to recompute its tokens when readmitted. */
#ifndef FATHOM_SERVE_TEXTGEN_H
#define FATHOM_SERVE_TEXTGEN_H
#include "fathom/gpt.h"
#include "serve/jinja.h"
#include "serve/metrics.h"
#include "serve/model_config.h"

#define FM_TG_MAX_STOP 4
#define FM_TG_MAX_BIAS 1024
#define FM_TG_MAX_TOP 20
#define FM_TG_MAX_STOP_IDS 16

typedef struct fm_textgen fm_textgen;

typedef struct fm_tg_params {
    int max_tokens;
    /* when the reader (fm_tg_req_take) is woken: 1, at every token; k > 1, at the
     * first token, then once k more are out or at the end (a stream's events then
     * carry up to k tokens each); 0, only at the end (a whole response) */
    int wake_every;
    fm_gpt_sample_params sample;
    int n_stop;
    char stop[FM_TG_MAX_STOP][64];
    /* applied to each step's logits before sampling (and before the temperature):
     * OpenAI's penalties, subtracted once per token id generated so far (presence) and
     * once per time it was generated (frequency), 0 is off; the repetition penalty of
     * vLLM and transformers over the prompt's and generated ids (a positive logit is
     * divided by it, a negative one multiplied), 1 is off; logit_bias, added */
    float presence_penalty, frequency_penalty, repetition_penalty;
    int n_bias;
    int32_t bias_id[FM_TG_MAX_BIAS];
    float bias[FM_TG_MAX_BIAS];
    /* vLLM's: min_p (0: off) drops ids less likely than min_p times the most likely
     * one; ignore_eos keeps going past the model's end-of-sequence ids; stop_ids end
     * the text as those do (finish "stop"; the id is counted, not shown) */
    float min_p;
    bool ignore_eos;
    int n_stop_ids;
    int32_t stop_ids[FM_TG_MAX_STOP_IDS];
    /* each generated token's log-probability, and those of the top_logprobs (0 to
     * FM_TG_MAX_TOP) most likely ids at its step (fm_tg_req_logprobs) */
    bool logprobs;
    int top_logprobs;
} fm_tg_params;

typedef struct fm_tg_req fm_tg_req;

/* A text model's end-of-sequence ids: eos_token_id (a whole number or an array) of the
 * directory's generation_config.json, else of its config.json (what transformers'
 * generate stops at); none for fathom's own GPT recipes. At most FM_TG_MAX_STOP_IDS. */
int fm_tg_read_eos_ids(const char *dir, int32_t *ids);

/* A trained GPT directory (config.json, model.safetensors, tokenizer.txt) or a GPT-2,
 * Llama or Qwen2 in Hugging Face layout with its tokenizer (vocab.json + merges.txt or
 * tokenizer.json); or a GPT inference graph directory (graph.json whose metadata says
 * model_kind gpt, weights.safetensors, and either tokenizer: what `fathom compile` and
 * `fathom quantize` write from those), which text generation serves too. */
bool fm_textgen_dir_is_gpt(const char *dir);
bool fm_textgen_dir_is_gpt_graph(const char *dir);
/* Valid UTF-8 of raw bytes (a tokenizer's output: bad bytes become U+FFFD); without
 * `final`, a sequence cut short at the end is left out (more bytes may complete
 * it). malloc'd, NUL-terminated, its length in *out_n; NULL if out of memory. */
char *fm_tg_sanitize_utf8(const char *in, size_t n, bool final, size_t *out_n);
fm_textgen *fm_textgen_open(const char *dir, const fm_model_config *c, fm_serve_stats *stats);
void fm_textgen_stop(fm_textgen *t);
int fm_textgen_block_size(const fm_textgen *t);
/* The model's own chat template (jinja.h), when its config gives none: NULL when it
 * has none, or has one fathom could not parse (*refusal then says which and why,
 * else NULL). */
const fm_chat_jinja *fm_textgen_chat_template(const fm_textgen *t, const char **refusal);

/* Queues a completion of `prompt` (text of n bytes), or of the token ids ids[n_ids]
 * when ids is not NULL; NULL with an HTTP status and message (400 for a prompt that
 * does not fit, an id or a logit_bias id outside the vocabulary; 503 for a full
 * queue). The request is shared with the caller until fm_tg_req_release. */
fm_tg_req *fm_textgen_submit(fm_textgen *t, const char *prompt, size_t n, const int32_t *ids, int64_t n_ids,
                             const fm_tg_params *p, int *status, char *err, size_t errn);
/* The prompt's ids decoded (for echoing a prompt given as ids): malloc'd valid
 * UTF-8, its length in *n; NULL if out of memory or the tokenizer failed. */
char *fm_tg_req_prompt_text(fm_tg_req *r, size_t *n);
/* Waits until new text is ready (as the request's wake_every says) or the request
 * finished (timeout_ms < 0: no limit).
 * Copies the text not yet taken into *buf (malloc'd, valid UTF-8) and returns
 * its length; *done is set once everything is out. */
size_t fm_tg_req_take(fm_tg_req *r, char **buf, bool *done, int timeout_ms);
/* The calling thread (a stream's connection, the waker) in SCHED_BATCH when on, else
 * back to SCHED_OTHER: its wake-ups then do not preempt the scheduler's decode step
 * on the same core; see textgen.c. */
void fm_tg_thread_background(bool on);
const char *fm_tg_req_finish_reason(fm_tg_req *r);
/* With p.logprobs: the generated tokens as of the last fm_tg_req_take, their count
 * returned: ids[i], lp[i] its log-probability, and top_id/top_lp[i * k + j] the j-th
 * most likely id at that step and its log-probability (k = p.top_logprobs), all under
 * the model's own distribution (the raw logits: before penalties, logit_bias and the
 * temperature; -9999 where the model gave no finite value). Pointers into the
 * request, valid until fm_tg_req_release; an entry never changes once counted. */
int fm_tg_req_logprobs(fm_tg_req *r, const int32_t **ids, const float **lp, const int32_t **top_id, const float **top_lp);
/* One token's decoded bytes (malloc'd, *n; not necessarily UTF-8 on its own). */
char *fm_tg_req_token_bytes(fm_tg_req *r, int32_t id, size_t *n);
void fm_tg_req_counts(fm_tg_req *r, int *prompt_tokens, int *completion_tokens);
/* The caller is gone (client disconnected): the engine drops the request. */
void fm_tg_req_cancel(fm_tg_req *r);
void fm_tg_req_release(fm_tg_req *r);
#endif
