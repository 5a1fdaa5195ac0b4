/* The dynamic batcher of one model version: a queue of requests and N instance
 * threads, each with its own servable. An instance takes the oldest requests
 * that fit in max_batch_size: at once when they fill it or reach a preferred
 * size, else when the oldest has waited max_queue_delay_us; then it runs them as
 * one batch (inputs concatenated on dim 0) and hands each its rows of the outputs.
 * Without dynamic batching each request runs alone. */
#ifndef FATHOM_SERVE_BATCHER_H
#define FATHOM_SERVE_BATCHER_H
#include <pthread.h>

#include "serve/metrics.h"
#include "serve/model_config.h"

typedef struct fm_serve_req {
    /* in: */
    fm_tensor *in[FM_SERVE_MAX_IO]; /* [rows, dims...] per model input, in the config's order */
    int64_t rows;
    int64_t deadline_ns;            /* CLOCK_MONOTONIC; 0: none */
    /* out: */
    fm_tensor *out[FM_SERVE_MAX_IO]; /* on 200: [rows, ...] per model output (new references) */
    int status;                      /* HTTP status: 200 or the error's */
    char err[256];
    int64_t t_enqueue_ns, t_start_ns;
    /* private */
    int state;
    pthread_cond_t cv;
    struct fm_serve_req *next;
} fm_serve_req;

typedef struct fm_batcher fm_batcher;

/* Takes ownership of the n servables (one per instance thread). NULL on failure
 * (the servables are freed). */
fm_batcher *fm_batcher_start(const fm_model_config *c, fm_servable **instances, int n, fm_serve_stats *stats);
/* Queues r and waits for its result; returns r->status. A full queue is 503 at
 * once; a deadline that passes while r is queued is 503 "timeout". */
int fm_batcher_submit(fm_batcher *b, fm_serve_req *r);
/* Fails anything still queued (503), joins the threads, frees the servables. */
void fm_batcher_stop(fm_batcher *b);
int64_t fm_now_ns(void);
#endif
