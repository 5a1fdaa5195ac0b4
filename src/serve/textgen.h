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
#include "serve/metrics.h"
#include "serve/model_config.h"

#define FM_TG_MAX_STOP 4

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
} fm_tg_params;

typedef struct fm_tg_req fm_tg_req;

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

/* Queues a completion of `prompt`; NULL with an HTTP status and message (400 for
 * a prompt that does not fit, 503 for a full queue). The request is shared with
 * the caller until fm_tg_req_release. */
fm_tg_req *fm_textgen_submit(fm_textgen *t, const char *prompt, size_t n, const fm_tg_params *p, int *status, char *err,
                             size_t errn);
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
void fm_tg_req_counts(fm_tg_req *r, int *prompt_tokens, int *completion_tokens);
/* The caller is gone (client disconnected): the engine drops the request. */
void fm_tg_req_cancel(fm_tg_req *r);
void fm_tg_req_release(fm_tg_req *r);
#endif
