/* Continuous batching for text generation: see textgen.h. The engine's mutex
 * guards the queues and the requests' scheduling fields (tokens, KV sequence,
 * cancelled); the scheduler releases it only around the decode step itself. Each
 * request's own mutex guards what its connection thread reads (the text, how much
 * was taken, done/finish, the published token count): the scheduler writes those
 * under it, so a connection thread taking its text never waits on the engine's
 * mutex, and the scheduler never waits on a connection. */
#include "serve/textgen.h"

#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>

#include "core/parallel.h"
#include "fathom/graph.h"
#include "fathom/hf.h"
#include "fathom/tokenizer.h"
#include "gpt/gpt_paged.h"
#include "graph/graph_gpt_paged.h"
#include "serve/batcher.h"

#define MAX_SEQS 64

struct fm_tg_req {
    atomic_int refs; /* the engine's and the caller's */
    fm_textgen *t;
    /* the engine's (under t->mu) */
    int32_t *toks;   /* prompt, then generated tokens */
    int n_prompt, n_toks, n_gen, seq;
    int64_t fed;     /* tokens in the KV cache */
    fm_tg_params p;  /* set at submit, then read only */
    float *lp, *top_lp; /* with p.logprobs: [block] and [block * top_logprobs] (fm_tg_req_logprobs) */
    int32_t *top_id;
    bool cancelled;
    bool ended;      /* the last token is an end-of-sequence or stop id: not part of the text */
    int64_t t_arrival, t_last; /* its arrival; its last token's sampling */
    fm_tg_req *next;
    /* shared with the connection thread: under mu, written by the engine only (so it
     * reads them without mu), except taken, which the connection writes */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *text;      /* the completion so far (valid UTF-8; cut at a stop string) */
    size_t text_len, taken;
    bool done;
    const char *finish;
    int pub_gen;     /* n_gen as of the text */
    int taken_gen;   /* pub_gen when the reader last took text */
    /* the waker's queue (under t->wmu): queued there, holding a reference */
    bool wake_queued;
    fm_tg_req *wake_next;
};

struct fm_textgen {
    fm_gpt *m;
    fm_paged_weights q; /* a graph's quantized weights (none for a trained model) */
    fm_tokenizer *tok;
    fm_gpt_paged *p;
    int max_seqs, V, V_tok, block;
    fm_chat_jinja *chat; /* the model's own chat template (fm_textgen_chat_template) */
    char chat_err[400];
    int n_eos;        /* the model's end-of-sequence ids (fm_tg_read_eos_ids) */
    int32_t eos[FM_TG_MAX_STOP_IDS];
    int chunk;        /* token budget of one step (text_generation.prefill_chunk_tokens) */
    int32_t *rows;    /* one step's tokens, [max_seqs + chunk] */
    int64_t max_queue, n_waiting;
    int64_t delay_ns; /* dynamic_batching.max_queue_delay_microseconds: an idle engine waits this long for company */
    bool lone;        /* the last wait for company ended with one request: lone ones start at once (tg_main) */
    int64_t serial_rows; /* steps of at most this many rows run on the scheduler thread alone */
    fm_serve_stats *stats;
    float *logits;
    float *raw;       /* [V]: a row's logits before adjust_logits, for logprobs */
    uint8_t *seen;    /* [V], all 0 between uses (adjust_logits) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool stop, started;
    fm_tg_req *wait_head, *wait_tail;
    fm_tg_req *active[MAX_SEQS];
    int n_active;
    /* The waker: a thread that wakes the connections a step has text for when there
     * are several (wake_main), so that the scheduler starts the next step instead */
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    pthread_t wth;
    fm_tg_req *wake_head;
    bool wstop, wstarted, wsleeping;
};

static bool has_files(const char *dir, int n, const char *const *need) {
    for (int i = 0; i < n; i++) {
        char p[PATH_MAX + 32];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, need[i]);
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) return false;
    }
    return true;
}

bool fm_textgen_dir_is_gpt(const char *dir) {
    if (has_files(dir, 3, (const char *[]){"config.json", "model.safetensors", "tokenizer.txt"})) return true;
    /* a Hugging Face GPT-2, Llama or Qwen2 with its tokenizer (its weights in one file or shards) */
    return fm_hf_is_model_dir(dir) && fm_hf_tokenizer_files(dir) &&
           (has_files(dir, 1, (const char *[]){"model.safetensors"}) || has_files(dir, 1, (const char *[]){"model.safetensors.index.json"}));
}

bool fm_textgen_dir_is_gpt_graph(const char *dir) {
    if (!has_files(dir, 2, (const char *[]){"graph.json", "weights.safetensors"}) || !fm_hf_tokenizer_files(dir)) return false;
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/graph.json", dir);
    json_t *j = json_load_file(p, 0, NULL), *kind = json_object_get(json_object_get(j, "meta"), "model_kind");
    bool gpt = json_is_string(kind) && !strcmp(json_string_value(kind), "gpt");
    json_decref(j);
    return gpt;
}

/* The model of a trained GPT directory, or of a GPT graph directory (compiled or
 * quantized: its quantized weights into t->q), and its tokenizer. */
static fm_status load_model(fm_textgen *t, const char *dir) {
    if (!fm_graph_dir_is_graph(dir)) {
        t->m = fm_hf_is_model_dir(dir) ? fm_hf_gpt_load(dir, &t->tok) : fm_gpt_load_dir(dir, &t->tok);
        return t->m && t->tok ? FM_OK : fm_last_status();
    }
    fm_graph *g = fm_graph_load(dir);
    t->m = g ? fm_graph_gpt_unpack(g, dir, &t->q) : NULL;
    fm_graph_free(g);
    if (!t->m) return fm_last_status();
    /* tokenizer.txt (all of the model's ids), or the Hugging Face model's files it was made from */
    t->tok = fm_hf_tokenizer_load(dir, fm_gpt_get_config(t->m)->vocab_size);
    return t->tok ? FM_OK : fm_last_status();
}

int fm_textgen_block_size(const fm_textgen *t) { return t->block; }

/* Length of the UTF-8 sequence starting at s[0..n), 0 if invalid, -1 if cut short. */
static int utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (len <= 1) return len;
    unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n) return -1;
        unsigned b = s[k];
        if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
    }
    return len;
}

char *fm_tg_sanitize_utf8(const char *in, size_t n, bool final, size_t *out_n) {
    char *o = malloc(n * 3 + 1);
    size_t k = 0;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        int l = utf8_len((const unsigned char *)in + i, n - i);
        if (l < 0 && !final) break;
        if (l <= 0) {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        } else {
            memcpy(o + k, in + i, (size_t)l);
            k += (size_t)l;
            i += (size_t)l;
        }
    }
    o[k] = 0;
    *out_n = k;
    return o;
}

static void req_release_locked_free(fm_tg_req *r) {
    free(r->toks);
    free(r->text);
    free(r->lp);
    free(r->top_lp);
    free(r->top_id);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* The engine ends a request (if not ended yet) and wakes its connection. */
static void finish_req(fm_tg_req *r, const char *reason) {
    pthread_mutex_lock(&r->mu);
    if (!r->done) { r->done = true; r->finish = reason; }
    pthread_mutex_unlock(&r->mu);
    pthread_cond_broadcast(&r->cv);
}

void fm_tg_req_release(fm_tg_req *r) {
    if (r && atomic_fetch_sub(&r->refs, 1) == 1) req_release_locked_free(r);
}

/* Under t->mu: decodes the completion, applies stop strings and the limits, and
 * publishes the text under r->mu. Whether the reader is to be woken now (the
 * caller wakes it; an error or the end wakes it here). */
static bool update_text(fm_textgen *t, fm_tg_req *r) {
    char *raw = NULL;
    size_t raw_n = 0;
    if (fm_tokenizer_decode(t->tok, r->toks + r->n_prompt, r->n_gen - r->ended, &raw, &raw_n) != FM_OK) {
        finish_req(r, "error");
        return false;
    }
    const char *finish = r->ended ? "stop" : NULL;
    for (int i = 0; i < r->p.n_stop; i++) {
        char *hit = memmem(raw, raw_n, r->p.stop[i], strlen(r->p.stop[i]));
        if (hit) { raw_n = (size_t)(hit - raw); finish = "stop"; }
    }
    if (!finish && (r->n_gen >= r->p.max_tokens || r->n_toks >= t->block)) finish = "length";
    size_t n;
    char *s = fm_tg_sanitize_utf8(raw, raw_n, finish != NULL, &n);
    free(raw);
    if (!s) { finish_req(r, "error"); return false; }
    pthread_mutex_lock(&r->mu);
    char *old = r->text;
    r->text = s;
    r->text_len = n < r->taken ? r->taken : n; /* never shrinks below what was handed out */
    r->pub_gen = r->n_gen;
    if (finish && !r->done) { r->done = true; r->finish = finish; }
    int k = r->p.wake_every;
    /* until the reader has taken text (taken == 0) every token may bring its first */
    bool wake = r->done || (k > 0 && (r->taken == 0 || r->pub_gen - r->taken_gen >= k));
    pthread_mutex_unlock(&r->mu);
    free(old);
    return wake;
}

/* Under t->mu: takes the request off the active list and lets go of it. */
static void retire(fm_textgen *t, int i) {
    fm_tg_req *r = t->active[i];
    fm_gpt_paged_close(t->p, r->seq);
    r->seq = -1;
    memmove(t->active + i, t->active + i + 1, sizeof *t->active * (size_t)(t->n_active - i - 1));
    t->n_active--;
    finish_req(r, r->cancelled ? "cancelled" : "error"); /* keeps the reason of one already done */
    fm_tg_req_release(r);
}

static void admit(fm_textgen *t) {
    while (t->wait_head && t->n_active < t->max_seqs && fm_gpt_paged_free_blocks(t->p) > 0) {
        fm_tg_req *r = t->wait_head;
        t->wait_head = r->next;
        if (!t->wait_head) t->wait_tail = NULL;
        t->n_waiting--;
        if (r->cancelled) { finish_req(r, "cancelled"); fm_tg_req_release(r); continue; }
        r->seq = fm_gpt_paged_open(t->p);
        r->fed = 0;
        r->next = NULL;
        t->active[t->n_active++] = r;
    }
}

/* Under t->mu: frees KV blocks for this step by preempting the newest requests. */
static void make_room(fm_textgen *t) {
    for (;;) {
        int need = 0;
        for (int i = 0; i < t->n_active; i++) need += fm_gpt_paged_need(t->p, t->active[i]->seq);
        if (need <= fm_gpt_paged_free_blocks(t->p) || t->n_active == 0) return;
        fm_tg_req *r = t->active[t->n_active - 1];
        if (t->n_active == 1) { finish_req(r, "length"); retire(t, 0); return; } /* the pool holds less than one context */
        t->n_active--;
        fm_gpt_paged_close(t->p, r->seq);
        r->seq = -1;
        r->fed = 0; /* recomputed when readmitted */
        r->next = t->wait_head;
        t->wait_head = r;
        if (!t->wait_tail) t->wait_tail = r;
        t->n_waiting++;
        pthread_mutex_lock(&t->stats->mu);
        t->stats->gen_preemptions++;
        pthread_mutex_unlock(&t->stats->mu);
    }
}

/* Under t->mu: the tokens each active request feeds this step. A decoding request
 * feeds one; a prompt (or a preempted request recomputing its tokens) feeds a
 * chunk, from the step's token budget (prefill_chunk_tokens) and the KV blocks
 * left once every request has the block for its first token (make_room saw to
 * those), so a whole prompt goes through the model in one forward when it fits. */
static int plan_step(fm_textgen *t, int *counts) {
    int free_blocks = fm_gpt_paged_free_blocks(t->p), budget = t->chunk - t->n_active, rows = 0;
    for (int i = 0; i < t->n_active; i++) {
        counts[i] = 1;
        free_blocks -= fm_gpt_paged_need(t->p, t->active[i]->seq);
    }
    for (int i = 0; i < t->n_active && budget > 0; i++) {
        fm_tg_req *r = t->active[i];
        int64_t left = r->n_toks - r->fed;
        if (left <= 1) continue;
        int want = (int)(left < 1 + budget ? left : 1 + budget), base = fm_gpt_paged_need(t->p, r->seq);
        while (want > 1 && fm_gpt_paged_need_n(t->p, r->seq, want) - base > free_blocks) want--;
        free_blocks -= fm_gpt_paged_need_n(t->p, r->seq, want) - base;
        budget -= want - 1;
        counts[i] = want;
    }
    for (int i = 0; i < t->n_active; i++) rows += counts[i];
    return rows;
}

/* The request's penalties and logit_bias on its row of logits (fm_tg_params). t->seen
 * marks the ids a penalty has been applied to once (cleared again on the way out). */
static void adjust_logits(fm_textgen *t, const fm_tg_req *r, float *row) {
    const fm_tg_params *p = &r->p;
    const int32_t *gen = r->toks + r->n_prompt;
    if (p->frequency_penalty != 0)
        for (int k = 0; k < r->n_gen; k++) row[gen[k]] -= p->frequency_penalty;
    if (p->presence_penalty != 0) {
        for (int k = 0; k < r->n_gen; k++)
            if (!t->seen[gen[k]]) { t->seen[gen[k]] = 1; row[gen[k]] -= p->presence_penalty; }
        for (int k = 0; k < r->n_gen; k++) t->seen[gen[k]] = 0;
    }
    if (p->repetition_penalty != 1 && p->repetition_penalty > 0) {
        for (int k = 0; k < r->n_toks; k++) {
            int32_t id = r->toks[k];
            if (t->seen[id]) continue;
            t->seen[id] = 1;
            row[id] = row[id] > 0 ? row[id] / p->repetition_penalty : row[id] * p->repetition_penalty;
        }
        for (int k = 0; k < r->n_toks; k++) t->seen[r->toks[k]] = 0;
    }
    for (int k = 0; k < p->n_bias; k++) row[p->bias_id[k]] += p->bias[k];
    /* min_p on the distribution the sampler draws from (after the temperature):
     * p_i < min_p * p_max <=> l_i < l_max + T log(min_p) */
    if (p->min_p > 0 && p->sample.temperature > 0) {
        float mx = -INFINITY;
        for (int j = 0; j < t->V_tok; j++)
            if (row[j] > mx) mx = row[j];
        float cut = mx + (float)(p->sample.temperature * log((double)p->min_p));
        for (int j = 0; j < t->V_tok; j++)
            if (row[j] < cut) row[j] = -INFINITY;
    }
}

/* Whether id ends the request's text: the model's end-of-sequence ids (unless
 * ignore_eos) and the request's stop ids. */
static bool ends_text(const fm_textgen *t, const fm_tg_req *r, int id) {
    for (int k = 0; !r->p.ignore_eos && k < t->n_eos; k++)
        if (t->eos[k] == id) return true;
    for (int k = 0; k < r->p.n_stop_ids; k++)
        if (r->p.stop_ids[k] == id) return true;
    return false;
}

const fm_chat_jinja *fm_textgen_chat_template(const fm_textgen *t, const char **refusal) {
    *refusal = t->chat_err[0] ? t->chat_err : NULL;
    return t->chat;
}

/* The model's own chat template, and the prefix its tokenizer adds to every text
 * (Llama's <s>): encoding "" gives that prefix alone. */
static void load_chat_template(fm_textgen *t, const char *dir) {
    if (!(t->chat = fm_chat_jinja_load(dir, t->chat_err, sizeof t->chat_err))) return;
    int32_t *ids = NULL;
    int64_t n = 0;
    const char *bos = json_string_value(json_object_get(t->chat->vars, "bos_token"));
    const char *b = NULL;
    size_t bn = 0;
    if (bos && fm_tokenizer_encode(t->tok, "", 0, &ids, &n) == FM_OK && n == 1 &&
        fm_tokenizer_token_bytes(t->tok, ids[0], &b, &bn) == FM_OK && bn == strlen(bos) && !memcmp(b, bos, bn) &&
        bn < sizeof t->chat->strip)
        memcpy(t->chat->strip, bos, bn + 1);
    free(ids);
    fm_clear_error();
}

int fm_tg_read_eos_ids(const char *dir, int32_t *ids) {
    const char *files[] = {"generation_config.json", "config.json"};
    int n = 0;
    for (int f = 0; f < 2 && n == 0; f++) {
        char p[PATH_MAX + 32];
        snprintf(p, sizeof p, "%s/%s", dir, files[f]);
        json_t *j = json_load_file(p, 0, NULL), *e = json_object_get(j, "eos_token_id");
        for (size_t i = 0; i < (json_is_array(e) ? json_array_size(e) : 1) && n < FM_TG_MAX_STOP_IDS; i++) {
            const json_t *v = json_is_array(e) ? json_array_get(e, i) : e;
            if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= INT32_MAX)
                ids[n++] = (int32_t)json_integer_value(v);
        }
        json_decref(j);
    }
    return n;
}

/* t->raw's log-probability of token tok and the request's top ids, at index r->n_gen
 * (before it counts tok). Not finite (a NaN or -inf logit, or no finite one): -9999,
 * as OpenAI reports a probability too small to show. */
static void record_logprobs(fm_textgen *t, fm_tg_req *r, int tok) {
    const float *x = t->raw;
    float mx = -INFINITY;
    for (int j = 0; j < t->V_tok; j++)
        if (x[j] > mx) mx = x[j];
    double sum = 0;
    for (int j = 0; j < t->V_tok && isfinite(mx); j++)
        if (x[j] == x[j]) sum += exp((double)x[j] - mx);
    double lse = mx + log(sum);
#define FM_LP(v) (isfinite((double)(v) - lse) ? (float)((double)(v) - lse) : -9999.0f)
    r->lp[r->n_gen] = FM_LP(x[tok]);
    int k = r->p.top_logprobs, have = 0;
    int32_t *id = r->top_id + (size_t)r->n_gen * (size_t)k;
    float *v = r->top_lp + (size_t)r->n_gen * (size_t)k;
    for (int j = 0; j < t->V_tok && k > 0; j++) { /* insertion into the k largest, in order */
        if (!(x[j] == x[j]) || (have == k && !(x[j] > v[k - 1]))) continue;
        int at = have < k ? have++ : k - 1;
        while (at > 0 && x[j] > v[at - 1]) { v[at] = v[at - 1]; id[at] = id[at - 1]; at--; }
        v[at] = x[j];
        id[at] = j;
    }
    for (int j = 0; j < have; j++) v[j] = FM_LP(v[j]);
    for (int j = have; j < k; j++) { id[j] = tok; v[j] = r->lp[r->n_gen]; } /* fewer ids than asked: never with V >= k */
#undef FM_LP
}

/* Under t->mu, after a step: each request that consumed its last known token
 * samples the next and publishes its text; the readers that are due (wake_every)
 * are woken once all that is done. */
static void after_step(fm_textgen *t, int n, fm_tg_req **batch, const int *counts, uint64_t *new_tokens) {
    bool wake[MAX_SEQS] = {false};
    for (int i = 0; i < n; i++) {
        fm_tg_req *r = batch[i];
        r->fed += counts[i];
        if (r->fed < r->n_toks) continue;
        float *row = t->logits + (size_t)i * (size_t)t->V;
        if (r->p.logprobs) memcpy(t->raw, row, sizeof(float) * (size_t)t->V_tok);
        adjust_logits(t, r, row);
        int tok = fm_gpt_sample(row, t->V_tok, &r->p.sample, (uint64_t)r->n_gen);
        if (tok < 0) { finish_req(r, "error"); continue; }
        if (r->p.logprobs) record_logprobs(t, r, tok);
        r->toks[r->n_toks++] = tok;
        r->n_gen++;
        r->ended = ends_text(t, r, tok);
        (*new_tokens)++;
        int64_t now = fm_now_ns();
        pthread_mutex_lock(&t->stats->mu);
        if (r->n_gen == 1) fm_hist_add(&t->stats->ttft_hist, (double)(now - r->t_arrival) / 1000.0);
        else fm_hist_add(&t->stats->itl_hist, (double)(now - r->t_last) / 1000.0);
        pthread_mutex_unlock(&t->stats->mu);
        r->t_last = now;
        wake[i] = update_text(t, r);
    }
    /* the wake-ups after all the bookkeeping: a woken connection thread can then take
     * the scheduler's core without holding up the others' text. One is done here;
     * several go to the waker thread: each costs the waker a futex call and, on a
     * virtual machine, an interrupt to another core (13 us each measured on the
     * Intel Xeon model 207 here: 97 us of a 560 us step with 7-8 streams), and the
     * scheduler meanwhile runs the next step */
    int nw = 0;
    for (int i = 0; i < n; i++) nw += wake[i];
    if (nw == 1 || (nw > 1 && !t->wstarted)) {
        for (int i = 0; i < n; i++)
            if (wake[i]) pthread_cond_broadcast(&batch[i]->cv);
    } else if (nw > 1) {
        pthread_mutex_lock(&t->wmu);
        for (int i = 0; i < n; i++)
            if (wake[i] && !batch[i]->wake_queued) {
                batch[i]->wake_queued = true;
                atomic_fetch_add(&batch[i]->refs, 1);
                batch[i]->wake_next = t->wake_head;
                t->wake_head = batch[i];
            }
        bool sleeping = t->wsleeping;
        pthread_mutex_unlock(&t->wmu);
        if (sleeping) pthread_cond_signal(&t->wcv);
    }
}

/* A woken thread normally preempts the running one when it has had less CPU, so
 * each stream's connection thread, woken at every token, cut into the decode step
 * on its core: with 8 streams on 2 cores the scheduler thread was preempted about
 * once per step (2871 involuntary switches in 2.17 s, 3400 steps; from
 * /proc/PID/task/TID/status). SCHED_BATCH threads do not preempt on waking; they
 * run when a core is free or at the next tick. Allowed without privileges. */
void fm_tg_thread_background(bool on) {
#ifdef SCHED_BATCH
    struct sched_param sp = {0};
    pthread_setschedparam(pthread_self(), on ? SCHED_BATCH : SCHED_OTHER, &sp);
#else
    (void)on;
#endif
}

/* The waker thread: wakes each queued connection, and lets go of its reference. */
static void *wake_main(void *arg) {
    fm_textgen *t = arg;
    fm_tg_thread_background(true);
    pthread_mutex_lock(&t->wmu);
    for (;;) {
        while (!t->wake_head && !t->wstop) {
            t->wsleeping = true;
            pthread_cond_wait(&t->wcv, &t->wmu);
            t->wsleeping = false;
        }
        if (!t->wake_head) break; /* stopped, and nothing left */
        fm_tg_req *r = t->wake_head;
        t->wake_head = r->wake_next;
        r->wake_queued = false;
        pthread_mutex_unlock(&t->wmu);
        pthread_cond_broadcast(&r->cv);
        fm_tg_req_release(r);
        pthread_mutex_lock(&t->wmu);
    }
    pthread_mutex_unlock(&t->wmu);
    return NULL;
}

static void run_step(fm_textgen *t) {
    int n = t->n_active, seqs[MAX_SEQS], counts[MAX_SEQS];
    if (n >= 2) t->lone = false; /* company came: an idle engine waits for it again */
    fm_tg_req *batch[MAX_SEQS];
    int rows = plan_step(t, counts);
    for (int i = 0, k = 0; i < n; i++) {
        batch[i] = t->active[i];
        seqs[i] = batch[i]->seq;
        memcpy(t->rows + k, batch[i]->toks + batch[i]->fed, sizeof(int32_t) * (size_t)counts[i]);
        k += counts[i];
    }
    pthread_mutex_unlock(&t->mu);
    int64_t t0 = fm_now_ns();
    /* a small step (see serial_rows) is split over the pool at more cost than gain */
    fm_parallel_serial(rows <= t->serial_rows);
    fm_status st = fm_gpt_paged_step_n(t->m, t->p, n, seqs, counts, t->rows, t->logits);
    int64_t t1 = fm_now_ns();
    pthread_mutex_lock(&t->mu);
    uint64_t new_tokens = 0;
    if (st == FM_OK) after_step(t, n, batch, counts, &new_tokens);
    else
        for (int i = 0; i < n; i++) finish_req(batch[i], "error");
    pthread_mutex_lock(&t->stats->mu);
    t->stats->gen_steps++;
    t->stats->gen_step_seqs += (uint64_t)n;
    t->stats->gen_step_rows += (uint64_t)rows;
    t->stats->generated_tokens += new_tokens;
    t->stats->compute_infer_us += (uint64_t)(t1 - t0) / 1000;
    pthread_mutex_unlock(&t->stats->mu);
    for (int i = t->n_active - 1; i >= 0; i--)
        if (t->active[i]->done || t->active[i]->cancelled) retire(t, i);
    int64_t used = fm_gpt_paged_total_blocks(t->p) - fm_gpt_paged_free_blocks(t->p);
    pthread_mutex_lock(&t->stats->mu);
    t->stats->kv_blocks_used = used;
    t->stats->gen_running = t->n_active;
    pthread_mutex_unlock(&t->stats->mu);
}

/* The scheduler. Idle, it sleeps on t->cv, which a new request (or a cancel, or
 * stop) signals, so the first step starts as soon as the request is queued.
 *
 * With dynamic_batching's delay, an idle engine waits up to that long after a
 * request arrives for others to start with it. That wait is adaptive, as the
 * KServe batcher's: a lone closed-loop client never has company, so once a wait
 * has ended with one request waiting (t->lone), a request that finds the engine
 * idle and nobody else waiting starts at once; waiting resumes as soon as a step
 * runs two or more sequences, which requests arriving while the engine is busy
 * bring about without any wait. */
static void *tg_main(void *arg) {
    fm_textgen *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        for (int i = t->n_active - 1; i >= 0; i--)
            if (t->active[i]->cancelled) retire(t, i);
        if (t->n_active == 0 && t->wait_head && t->delay_ns > 0 && t->n_waiting < t->max_seqs && !t->stop &&
            !(t->lone && t->n_waiting == 1)) {
            int64_t left = t->wait_head->t_arrival + t->delay_ns - fm_now_ns();
            if (left <= 0 && t->n_waiting == 1) t->lone = true;
            if (left > 0) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                int64_t ns = ts.tv_nsec + left;
                ts.tv_sec += ns / 1000000000LL;
                ts.tv_nsec = ns % 1000000000LL;
                pthread_cond_timedwait(&t->cv, &t->mu, &ts);
                continue;
            }
        }
        admit(t);
        if (t->n_active == 0) {
            if (t->stop && !t->wait_head) break;
            pthread_cond_wait(&t->cv, &t->mu);
            continue;
        }
        make_room(t);
        if (t->n_active) run_step(t);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

fm_textgen *fm_textgen_open(const char *dir, const fm_model_config *c, fm_serve_stats *stats) {
    if (c->device.type != FM_DEV_CPU) {
        fm_set_error(FM_ERR_UNSUPPORTED, "%s: text generation runs on the CPU only (paged KV cache)", dir);
        return NULL;
    }
    fm_textgen *t = calloc(1, sizeof *t);
    if (!t) { fm_set_error(FM_ERR_OOM, "serve: out of memory"); return NULL; }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    pthread_mutex_init(&t->wmu, NULL);
    pthread_cond_init(&t->wcv, NULL);
    t->stats = stats;
    if (load_model(t, dir) != FM_OK) { fm_textgen_stop(t); return NULL; }
    if (!c->chat.set) load_chat_template(t, dir);
    /* A step of under 2^24 multiply-adds (rows times about the parameter count:
     * ~0.3 ms on one core) runs on the scheduler thread alone: its products are a
     * few us each, so split over the pool they gain little, and while the
     * connection threads and clients want the other cores a preempted worker holds
     * up the whole step. kjv-gpt (0.9 M parameters) then runs steps of up to 19
     * rows serially: 8 streaming clients measured 2.77-3.08x the tokens/s of one at
     * a time against 1.78-2.40x with the pool (docs/SERVING.md). A model of over
     * 2^24 parameters uses the pool at every step, one row included (its GEMVs
     * stream more weight than one core's bandwidth). FATHOM_TG_POOL_ALL=1: every
     * step uses the pool (for comparison). */
    const char *pa = getenv("FATHOM_TG_POOL_ALL");
    int64_t np = fm_gpt_num_params(t->m);
    t->serial_rows = pa && !strcmp(pa, "1") ? 0 : ((int64_t)1 << 24) / (np > 0 ? np : 1);
    fm_gpt_train_mode(t->m, false);
    const fm_gpt_config *g = fm_gpt_get_config(t->m);
    t->V = g->vocab_size;
    /* ids the tokenizer has: a Hugging Face vocabulary padded past it is never sampled */
    t->V_tok = fm_tokenizer_vocab_size(t->tok) < t->V ? fm_tokenizer_vocab_size(t->tok) : t->V;
    int32_t eos[FM_TG_MAX_STOP_IDS];
    for (int i = 0, n = fm_tg_read_eos_ids(dir, eos); i < n; i++)
        if (eos[i] < t->V_tok) t->eos[t->n_eos++] = eos[i];
    t->block = g->block_size;
    t->max_seqs = (int)(c->max_batch_size < MAX_SEQS ? c->max_batch_size : MAX_SEQS);
    t->max_queue = c->max_queue_size;
    t->delay_ns = c->dynamic_batching ? c->max_queue_delay_us * 1000 : 0;
    int bt = c->kv_block_tokens > 0 ? c->kv_block_tokens : 16;
    int per_seq = (t->block + bt - 1) / bt;
    /* default: half of what every sequence at full length would take, and at least one full context */
    int nb = c->kv_cache_blocks > 0 ? c->kv_cache_blocks : (t->max_seqs * per_seq + 1) / 2;
    if (c->kv_cache_blocks <= 0 && nb < per_seq) nb = per_seq;
    t->p = fm_gpt_paged_new_ex(t->m, &t->q, nb, bt, t->max_seqs, c->kv_cache_dtype);
    t->chunk = c->prefill_chunk_tokens > 0 ? c->prefill_chunk_tokens : 256;
    if (t->chunk < t->max_seqs) t->chunk = t->max_seqs;
    t->logits = malloc(sizeof(float) * (size_t)t->V * (size_t)t->max_seqs);
    t->rows = malloc(sizeof(int32_t) * ((size_t)t->max_seqs + (size_t)t->chunk));
    t->seen = calloc((size_t)t->V, 1);
    t->raw = malloc(sizeof(float) * (size_t)t->V);
    if (!t->p || !t->logits || !t->rows || !t->seen || !t->raw) { if (t->p) fm_set_error(FM_ERR_OOM, "serve: out of memory"); fm_textgen_stop(t); return NULL; }
    pthread_mutex_lock(&stats->mu);
    stats->kv_blocks_total = nb;
    pthread_mutex_unlock(&stats->mu);
    const char *wk = getenv("FATHOM_TG_WAKER"); /* 0: the scheduler wakes every connection itself (for comparison) */
    t->wstarted = !(wk && !strcmp(wk, "0")) && pthread_create(&t->wth, NULL, wake_main, t) == 0;
    t->started = pthread_create(&t->th, NULL, tg_main, t) == 0;
    if (!t->started) { fm_set_error(FM_ERR_INTERNAL, "serve: could not start the generation thread"); fm_textgen_stop(t); return NULL; }
    return t;
}

void fm_textgen_stop(fm_textgen *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (t->started) pthread_join(t->th, NULL);
    if (t->wstarted) { /* after the scheduler: it queues no more; the waker drains what is queued */
        pthread_mutex_lock(&t->wmu);
        t->wstop = true;
        pthread_cond_signal(&t->wcv);
        pthread_mutex_unlock(&t->wmu);
        pthread_join(t->wth, NULL);
    }
    fm_gpt_paged_free(t->p);
    fm_gpt_free(t->m);
    fm_paged_weights_free(&t->q);
    fm_tokenizer_free(t->tok);
    fm_chat_jinja_free(t->chat);
    free(t->logits);
    free(t->rows);
    free(t->seen);
    free(t->raw);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->wmu);
    pthread_cond_destroy(&t->wcv);
    free(t);
}

/* 0, or 400 with the message: ids given as a prompt, and logit_bias's, lie in the vocabulary. */
static int check_ids(const fm_textgen *t, const int32_t *ids, int64_t n_ids, const fm_tg_params *p, char *err, size_t errn) {
    for (int64_t i = 0; ids && i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= t->V_tok)
            return snprintf(err, errn, "prompt token %lld is id %d; this model's vocabulary has ids 0 to %d", (long long)i,
                            (int)ids[i], t->V_tok - 1), 400;
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= t->V_tok)
            return snprintf(err, errn, "stop_token_ids names token id %d; this model's vocabulary has ids 0 to %d",
                            (int)p->stop_ids[i], t->V_tok - 1), 400;
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_id[i] < 0 || p->bias_id[i] >= t->V_tok)
            return snprintf(err, errn, "logit_bias names token id %d; this model's vocabulary has ids 0 to %d", (int)p->bias_id[i],
                            t->V_tok - 1), 400;
    return 0;
}

fm_tg_req *fm_textgen_submit(fm_textgen *t, const char *prompt, size_t n, const int32_t *given, int64_t n_ids,
                             const fm_tg_params *p, int *status, char *err, size_t errn) {
    int32_t *ids = NULL;
    *status = 400;
    if (check_ids(t, given, n_ids, p, err, errn)) return NULL;
    if (!given && fm_tokenizer_encode(t->tok, prompt, n, &ids, &n_ids) != FM_OK) {
        snprintf(err, errn, "could not tokenize the prompt: %s", fm_last_error());
        return NULL;
    }
    if (n_ids < 1 || n_ids >= t->block) {
        snprintf(err, errn, "the prompt is %lld tokens; this model takes 1 to %d (its context is %d)", (long long)n_ids,
                 t->block - 1, t->block);
        free(ids);
        return NULL;
    }
    fm_tg_req *r = calloc(1, sizeof *r);
    int32_t *toks = r ? malloc(sizeof(int32_t) * (size_t)t->block) : NULL;
    if (!toks) { free(r); free(ids); *status = 500; snprintf(err, errn, "out of memory"); return NULL; }
    memcpy(toks, given ? given : ids, sizeof(int32_t) * (size_t)n_ids);
    free(ids);
    atomic_init(&r->refs, 2);
    r->t = t;
    r->toks = toks;
    r->n_prompt = r->n_toks = (int)n_ids;
    r->seq = -1;
    r->p = *p;
    if (p->logprobs) {
        int k = p->top_logprobs;
        r->lp = malloc(sizeof(float) * (size_t)t->block);
        r->top_lp = k ? malloc(sizeof(float) * (size_t)t->block * (size_t)k) : NULL;
        r->top_id = k ? malloc(sizeof(int32_t) * (size_t)t->block * (size_t)k) : NULL;
        if (!r->lp || (k && (!r->top_lp || !r->top_id))) {
            *status = 500;
            snprintf(err, errn, "out of memory");
            free(r->lp);
            free(r->top_lp);
            free(r->top_id);
            free(toks);
            free(r);
            return NULL;
        }
    }
    r->t_arrival = fm_now_ns();
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    pthread_mutex_lock(&t->mu);
    if (t->stop || (t->max_queue > 0 && t->n_waiting >= t->max_queue)) {
        pthread_mutex_unlock(&t->mu);
        *status = 503;
        snprintf(err, errn, t->stop ? "the model is unloading" : "Exceeds maximum queue size (%lld)", (long long)t->max_queue);
        req_release_locked_free(r);
        return NULL;
    }
    if (t->wait_tail) t->wait_tail->next = r;
    else t->wait_head = r;
    t->wait_tail = r;
    t->n_waiting++;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_lock(&t->stats->mu);
    t->stats->prompt_tokens += (uint64_t)n_ids;
    pthread_mutex_unlock(&t->stats->mu);
    *status = 200;
    return r;
}

char *fm_tg_req_prompt_text(fm_tg_req *r, size_t *n) {
    char *raw = NULL, *s = NULL;
    size_t raw_n = 0;
    if (fm_tokenizer_decode(r->t->tok, r->toks, r->n_prompt, &raw, &raw_n) == FM_OK) s = fm_tg_sanitize_utf8(raw, raw_n, true, n);
    free(raw);
    return s;
}

/* Under r->mu: how much of the text may go out now (a possible stop string's start is held back). */
static size_t available(const fm_tg_req *r) {
    if (r->done) return r->text_len;
    size_t hold = 0;
    for (int i = 0; i < r->p.n_stop; i++)
        if (strlen(r->p.stop[i]) > hold + 1) hold = strlen(r->p.stop[i]) - 1;
    size_t a = r->text_len > hold ? r->text_len - hold : 0;
    while (a > r->taken && a < r->text_len && ((unsigned char)r->text[a] & 0xC0) == 0x80) a--; /* a char boundary */
    return a < r->taken ? r->taken : a;
}

/* Under r->mu: whether the reader takes text now. A whole reply's (wake_every 0)
 * at the end; a stream's first text at once, later text once wake_every tokens
 * came since the last take (a reader still busy with the last event when they
 * come takes them together), and the rest at the end. */
static bool ready(const fm_tg_req *r) {
    if (r->done) return true;
    int k = r->p.wake_every;
    if (k == 0 || available(r) <= r->taken) return false;
    return r->taken == 0 || k == 1 || r->pub_gen - r->taken_gen >= k;
}

size_t fm_tg_req_take(fm_tg_req *r, char **buf, bool *done, int timeout_ms) {
    pthread_mutex_lock(&r->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    while (!ready(r)) {
        if (timeout_ms < 0) pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &ts)) break;
    }
    size_t a = available(r), n = a - r->taken;
    *buf = malloc(n + 1);
    if (*buf) {
        if (n) memcpy(*buf, r->text + r->taken, n);
        (*buf)[n] = 0;
        r->taken = a;
        r->taken_gen = r->pub_gen;
    } else {
        n = 0;
    }
    *done = r->done && r->taken == r->text_len;
    pthread_mutex_unlock(&r->mu);
    return n;
}

const char *fm_tg_req_finish_reason(fm_tg_req *r) {
    pthread_mutex_lock(&r->mu);
    const char *f = r->finish ? r->finish : "length";
    pthread_mutex_unlock(&r->mu);
    return f;
}

int fm_tg_req_logprobs(fm_tg_req *r, const int32_t **ids, const float **lp, const int32_t **top_id, const float **top_lp) {
    pthread_mutex_lock(&r->mu);
    int n = r->p.logprobs ? r->taken_gen : 0;
    pthread_mutex_unlock(&r->mu);
    *ids = r->toks + r->n_prompt;
    *lp = r->lp;
    *top_id = r->top_id;
    *top_lp = r->top_lp;
    return n;
}

char *fm_tg_req_token_bytes(fm_tg_req *r, int32_t id, size_t *n) {
    char *raw = NULL;
    *n = 0;
    if (fm_tokenizer_decode(r->t->tok, &id, 1, &raw, n) != FM_OK) return NULL;
    return raw;
}

void fm_tg_req_counts(fm_tg_req *r, int *prompt_tokens, int *completion_tokens) {
    pthread_mutex_lock(&r->mu);
    *prompt_tokens = r->n_prompt;
    *completion_tokens = r->pub_gen;
    pthread_mutex_unlock(&r->mu);
}

void fm_tg_req_cancel(fm_tg_req *r) {
    pthread_mutex_lock(&r->t->mu);
    r->cancelled = true;
    pthread_cond_signal(&r->t->cv);
    pthread_mutex_unlock(&r->t->mu);
}
