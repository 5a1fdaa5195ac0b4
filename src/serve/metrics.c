/* Counters and histograms of the inference server. Names follow Triton's
 * (nv_inference_*), prefixed fathom_ instead of nv_. The histograms are ours:
 * Triton exposes summaries; a histogram lets Prometheus compute p50/p99 over any
 * window (histogram_quantile). */
#include "serve/metrics.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

const double fm_hist_bounds_us[FM_HIST_BUCKETS] = {50,    100,   250,    500,    1000,   2500,    5000,    10000,   25000,
                                                   50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000};

void fm_serve_stats_init(fm_serve_stats *s) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
}

void fm_serve_stats_destroy(fm_serve_stats *s) { pthread_mutex_destroy(&s->mu); }

void fm_hist_add(fm_hist *h, double us) {
    int b = 0;
    while (b < FM_HIST_BUCKETS && us > fm_hist_bounds_us[b]) b++;
    h->count[b]++;
    h->n++;
    h->sum_us += us;
}

void fm_serve_stats_request(fm_serve_stats *s, int ok, uint64_t total_us, uint64_t queue_us) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    pthread_mutex_lock(&s->mu);
    if (ok) {
        s->success++;
        s->request_us += total_us;
        s->queue_us += queue_us;
        fm_hist_add(&s->request_hist, (double)total_us);
        fm_hist_add(&s->queue_hist, (double)queue_us);
    } else {
        s->failure++;
        s->fail_us += total_us;
    }
    s->last_inference_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    pthread_mutex_unlock(&s->mu);
}

void fm_serve_stats_exec(fm_serve_stats *s, uint64_t rows, uint64_t requests, uint64_t input_us, uint64_t infer_us,
                         uint64_t output_us) {
    pthread_mutex_lock(&s->mu);
    s->exec_count++;
    s->inference_count += rows;
    s->compute_input_us += input_us;
    s->compute_infer_us += infer_us;
    s->compute_output_us += output_us;
    s->req_compute_input_us += requests * input_us;
    s->req_compute_infer_us += requests * infer_us;
    s->req_compute_output_us += requests * output_us;
    fm_hist_add(&s->compute_hist, (double)infer_us);
    int k = 0;
    while (k < s->n_batch_sizes && s->batch[k].size != (int64_t)rows) k++;
    if (k == s->n_batch_sizes && k < FM_SERVE_BATCH_SIZES) s->batch[s->n_batch_sizes++].size = (int64_t)rows;
    if (k < s->n_batch_sizes) {
        s->batch[k].count++;
        s->batch[k].input_us += input_us;
        s->batch[k].infer_us += infer_us;
        s->batch[k].output_us += output_us;
    }
    pthread_mutex_unlock(&s->mu);
}

static json_t *duration(uint64_t count, uint64_t us) {
    return json_pack("{s:I,s:I}", "count", (json_int_t)count, "ns", (json_int_t)(us * 1000));
}

/* Triton's figures from fathom's: successes, failures and queue per request; the compute
 * times per request (an execution counted for each request it ran); batch_stats per
 * execution, by batch size in rows. No response cache: cache_hit/miss are 0. */
json_t *fm_serve_stats_json(const fm_serve_stats *s, const char *model, long long version) {
    char v[24];
    snprintf(v, sizeof v, "%lld", version);
    json_t *batch = json_array();
    for (int k = 0; k < s->n_batch_sizes; k++)
        json_array_append_new(batch, json_pack("{s:I,s:o,s:o,s:o}", "batch_size", (json_int_t)s->batch[k].size,
                                               "compute_input", duration(s->batch[k].count, s->batch[k].input_us),
                                               "compute_infer", duration(s->batch[k].count, s->batch[k].infer_us),
                                               "compute_output", duration(s->batch[k].count, s->batch[k].output_us)));
    json_t *inf = json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "success", duration(s->success, s->request_us), "fail",
                            duration(s->failure, s->fail_us), "queue", duration(s->success, s->queue_us), "compute_input",
                            duration(s->success, s->req_compute_input_us), "compute_infer",
                            duration(s->success, s->req_compute_infer_us), "compute_output",
                            duration(s->success, s->req_compute_output_us), "cache_hit", duration(0, 0), "cache_miss",
                            duration(0, 0));
    return json_pack("{s:s,s:s,s:I,s:I,s:I,s:o,s:o}", "name", model, "version", v, "last_inference",
                     (json_int_t)s->last_inference_ms, "inference_count", (json_int_t)s->inference_count,
                     "execution_count", (json_int_t)s->exec_count, "inference_stats", inf, "batch_stats", batch);
}

void fm_hist_write(FILE *f, const char *family, const char *labels, const fm_hist *h) {
    uint64_t cum = 0;
    for (int b = 0; b < FM_HIST_BUCKETS; b++) {
        cum += h->count[b];
        fprintf(f, "%s_bucket{%s,le=\"%g\"} %llu\n", family, labels, fm_hist_bounds_us[b], (unsigned long long)cum);
    }
    cum += h->count[FM_HIST_BUCKETS];
    fprintf(f, "%s_bucket{%s,le=\"+Inf\"} %llu\n", family, labels, (unsigned long long)cum);
    fprintf(f, "%s_sum{%s} %.0f\n%s_count{%s} %llu\n", family, labels, h->sum_us, family, labels, (unsigned long long)h->n);
}

static const char *const k_help[][3] = {
    {"fathom_inference_request_success", "counter", "Successful inference requests"},
    {"fathom_inference_request_failure", "counter", "Failed inference requests (bad input, queue full, timeout, model error)"},
    {"fathom_inference_count", "counter", "Inferences performed: samples, counting each row of a batched request"},
    {"fathom_inference_exec_count", "counter", "Model executions (batches); inference_count / exec_count is the average batch"},
    {"fathom_inference_request_duration_us", "counter", "Cumulative end-to-end time of successful requests (us)"},
    {"fathom_inference_queue_duration_us", "counter", "Cumulative time successful requests waited in the queue (us)"},
    {"fathom_inference_compute_input_duration_us", "counter", "Cumulative time gathering batch inputs (us)"},
    {"fathom_inference_compute_infer_duration_us", "counter", "Cumulative time running the model (us)"},
    {"fathom_inference_compute_output_duration_us", "counter", "Cumulative time splitting batch outputs (us)"},
    {"fathom_inference_pending_request_count", "gauge", "Requests queued and not yet taken by an instance"},
    {"fathom_inference_request_latency_us", "histogram", "End-to-end latency of successful requests (us)"},
    {"fathom_inference_queue_latency_us", "histogram", "Queue time of successful requests (us)"},
    {"fathom_inference_compute_latency_us", "histogram", "Model execution time per batch (us)"},
    {"fathom_inference_prompt_tokens", "counter", "Text generation: prompt tokens received"},
    {"fathom_inference_generated_tokens", "counter", "Text generation: tokens generated"},
    {"fathom_generation_step_count", "counter", "Text generation: decode steps (one batched model execution each)"},
    {"fathom_generation_step_sequences", "counter",
     "Text generation: sequences summed over decode steps; / step_count = sequences sharing a step"},
    {"fathom_generation_step_tokens", "counter",
     "Text generation: tokens fed to the model summed over steps (prompt chunks count each token)"},
    {"fathom_generation_preemptions", "counter", "Text generation: requests preempted for KV blocks (recomputed later)"},
    {"fathom_kv_cache_blocks_used", "gauge", "Text generation: KV cache blocks in use"},
    {"fathom_kv_cache_blocks_total", "gauge", "Text generation: KV cache blocks in the pool"},
    {"fathom_time_to_first_token_us", "histogram", "Text generation: time from arrival to the first generated token (us)"},
    {"fathom_generation_running_sequences", "gauge", "Text generation: sequences decoding (admitted, not finished) after the last step"},
    {"fathom_time_per_output_token_us", "histogram",
     "Text generation: time between a request's successive generated tokens (inter-token latency, us)"},
};

void fm_serve_stats_snapshot(fm_serve_stats *s, fm_serve_stats *out) {
    pthread_mutex_lock(&s->mu);
    memcpy(out, s, sizeof *out);
    pthread_mutex_unlock(&s->mu);
}

static unsigned long long counter(const fm_serve_stats *s, size_t i) {
    const uint64_t v[] = {s->success,          s->failure,         s->inference_count,
                          s->exec_count,       s->request_us,      s->queue_us,
                          s->compute_input_us, s->compute_infer_us, s->compute_output_us};
    if (i < sizeof v / sizeof *v) return v[i];
    if (i == 9) return (unsigned long long)(s->pending > 0 ? s->pending : 0);
    if (i == 22) return (unsigned long long)(s->gen_running > 0 ? s->gen_running : 0);
    const uint64_t g[] = {s->prompt_tokens, s->generated_tokens, s->gen_steps, s->gen_step_seqs, s->gen_step_rows, s->gen_preemptions,
                          (uint64_t)s->kv_blocks_used, (uint64_t)s->kv_blocks_total};
    return g[i - 13];
}

void fm_serve_stats_write(FILE *f, int n, const fm_serve_stats *snaps, const char *const *models, const long long *versions) {
    for (size_t k = 0; k < sizeof k_help / sizeof *k_help; k++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", k_help[k][0], k_help[k][2], k_help[k][0], k_help[k][1]);
        for (int i = 0; i < n; i++) {
            char l[160];
            snprintf(l, sizeof l, "model=\"%s\",version=\"%lld\"", models[i], versions[i]);
            if (k < 10 || (k >= 13 && k < 21) || k == 22) fprintf(f, "%s{%s} %llu\n", k_help[k][0], l, counter(&snaps[i], k));
            else if (k == 10) fm_hist_write(f, k_help[k][0], l, &snaps[i].request_hist);
            else if (k == 11) fm_hist_write(f, k_help[k][0], l, &snaps[i].queue_hist);
            else if (k == 12) fm_hist_write(f, k_help[k][0], l, &snaps[i].compute_hist);
            else if (k == 21) fm_hist_write(f, k_help[k][0], l, &snaps[i].ttft_hist);
            else fm_hist_write(f, k_help[k][0], l, &snaps[i].itl_hist);
        }
    }
}
