/* Per model-version counters and latency histograms, and their Prometheus text
 * form (Triton's metric names with a fathom_ prefix; docs/SERVING.md lists them). */
#ifndef FATHOM_SERVE_METRICS_H
#define FATHOM_SERVE_METRICS_H
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#define FM_HIST_BUCKETS 18
#define FM_SERVE_BATCH_SIZES 64

typedef struct fm_hist {
    uint64_t count[FM_HIST_BUCKETS + 1]; /* last: above the largest bound (+Inf) */
    uint64_t n;
    double sum_us;
} fm_hist;

typedef struct fm_serve_stats {
    pthread_mutex_t mu;
    uint64_t success, failure;
    uint64_t inference_count; /* samples (rows) inferred */
    uint64_t exec_count;      /* model executions (batches) */
    uint64_t request_us, queue_us, compute_input_us, compute_infer_us, compute_output_us;
    int64_t pending;          /* requests queued, not yet taken by an instance */
    /* Triton's statistics extension (GET /v2/models/.../stats): failed requests' time, the
     * last request's wall time, each execution's compute times counted once per request it
     * ran (Triton's per-request sums), and per batch size */
    uint64_t fail_us, req_compute_input_us, req_compute_infer_us, req_compute_output_us;
    int64_t last_inference_ms; /* milliseconds since 1970; 0: none yet */
    int n_batch_sizes;
    struct fm_batch_stat {
        int64_t size;
        uint64_t count, input_us, infer_us, output_us;
    } batch[FM_SERVE_BATCH_SIZES]; /* the first FM_SERVE_BATCH_SIZES sizes seen */
    fm_hist request_hist, queue_hist, compute_hist;
    /* text generation (textgen.c) */
    uint64_t prompt_tokens, generated_tokens, gen_steps, gen_step_seqs, gen_preemptions;
    uint64_t gen_step_rows; /* tokens fed summed over steps (a prompt chunk counts each) */
    int64_t kv_blocks_used, kv_blocks_total;
    int64_t gen_running;      /* sequences in the engine's active set after the last step */
    fm_hist ttft_hist;
    fm_hist itl_hist;         /* time between a request's successive generated tokens */
} fm_serve_stats;

void fm_serve_stats_init(fm_serve_stats *s);
void fm_serve_stats_destroy(fm_serve_stats *s);
/* One finished request: ok or not, its total, queue and compute (infer) times. */
void fm_serve_stats_request(fm_serve_stats *s, int ok, uint64_t total_us, uint64_t queue_us);
/* One execution of `rows` samples from `requests` requests. */
void fm_serve_stats_exec(fm_serve_stats *s, uint64_t rows, uint64_t requests, uint64_t input_us, uint64_t infer_us,
                         uint64_t output_us);
/* Triton's model_stat object for one version (a snapshot's figures). New reference. */
json_t *fm_serve_stats_json(const fm_serve_stats *s, const char *model, long long version);
void fm_hist_add(fm_hist *h, double us);
/* A consistent copy (its mutex is not to be used). */
void fm_serve_stats_snapshot(fm_serve_stats *s, fm_serve_stats *out);
/* Writes every per-version family once, each with its # HELP / # TYPE lines and
 * one series per version labelled {model="m",version="v"} (Prometheus wants a
 * family's lines together). */
void fm_serve_stats_write(FILE *f, int n, const fm_serve_stats *snaps, const char *const *models, const long long *versions);
/* A histogram family's bucket series, labelled. */
void fm_hist_write(FILE *f, const char *family, const char *labels, const fm_hist *h);
extern const double fm_hist_bounds_us[FM_HIST_BUCKETS];
#endif
