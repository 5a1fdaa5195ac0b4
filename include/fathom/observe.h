/* fathom/observe.h: seeing a run from the outside.
 *
 *  - TensorBoard event files (TFRecord framing, hand-encoded Event protobufs),
 *    written by training and read back by `fathom plot`;
 *  - progress lines: a redrawn line on a terminal, plain periodic log lines
 *    otherwise, nothing when quiet;
 *  - trace summaries: what `fathom profile` prints about a profiler trace
 *    (fathom/profile.h writes the trace);
 *  - model summaries: the torchinfo-style layer table of `fathom summary`;
 *  - plots: training curves as SVG (and PNG when libpng is linked).
 *
 * Conventional scalar tags (what `fathom plot` looks for, by substring):
 *   train/loss, val/loss, val/accuracy, train/lr, train/throughput,
 *   train/grad_norm, train/loss_scale, memory/allocated_bytes. */
#ifndef FATHOM_OBSERVE_H
#define FATHOM_OBSERVE_H
#include "fathom/export.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fathom/error.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------- TensorBoard ---------------- */

/* CRC-32C (Castagnoli), and TFRecord's masked form of it. */
FM_API uint32_t fm_crc32c(const void *data, size_t n);
FM_API uint32_t fm_crc32c_extend(uint32_t crc, const void *data, size_t n);
FM_API uint32_t fm_tfrecord_mask_crc(uint32_t crc);

typedef struct fm_tb_writer fm_tb_writer;
/* Creates logdir (and parents) and a new events.out.tfevents.<time>.<host>.<pid>.0
 * file in it. NULL with a clear FM_ERR_IO message when it cannot be written. */
FM_API fm_tb_writer *fm_tb_writer_open(const char *logdir);
/* Each record is flushed to the file as it is written, so TensorBoard sees it
 * live and a crash loses nothing already logged. */
FM_API fm_status fm_tb_add_scalar(fm_tb_writer *w, const char *tag, int64_t step, double value);
/* Histogram of n values (30 equal-width buckets between min and max). */
FM_API fm_status fm_tb_add_histogram(fm_tb_writer *w, const char *tag, int64_t step, const double *values, size_t n);
/* Same, of a tensor of any float dtype and layout (host or device). */
FM_API fm_status fm_tb_add_histogram_tensor(fm_tb_writer *w, const char *tag, int64_t step, const fm_tensor *t);
typedef struct fm_named_list fm_named_list; /* fathom/nn.h */
/* One histogram per tensor of a named list, tagged "<prefix>/<name>" (prefix NULL:
 * "weights", or "grads" when grads is true); with grads, of each tensor's .grad,
 * skipping tensors that have none. Buffers are skipped. */
FM_API fm_status fm_tb_add_histograms(fm_tb_writer *w, const char *prefix, const fm_named_list *l, bool grads, int64_t step);
FM_API const char *fm_tb_writer_path(const fm_tb_writer *w);
/* Closes the file; returns the first write error seen, if any. NULL is fine. */
FM_API fm_status fm_tb_writer_close(fm_tb_writer *w);

/* Reading back (fathom's own files and TensorBoard's). */
typedef struct fm_tb_histo {
    double min, max, num, sum, sum_squares;
    int n_buckets;
    const double *bucket_limit, *bucket; /* valid during the callback only */
} fm_tb_histo;
/* Called for every summary value: histo is NULL for scalars. */
typedef void (*fm_tb_value_fn)(void *ctx, const char *tag, int64_t step, double wall_time, double value,
                               const fm_tb_histo *histo);
/* Reads one event file. A torn last record (a writer that crashed) ends the
 * file quietly; a CRC mismatch is FM_ERR_FORMAT. n_records (may be NULL) gets
 * the number of records read. */
FM_API fm_status fm_tb_read_file(const char *path, fm_tb_value_fn fn, void *ctx, int64_t *n_records);

typedef struct fm_tb_series {
    char *tag; /* "train/loss"; files in a run subdirectory get "<subdir>/" in front */
    int n, cap;
    int64_t *step;
    double *value, *wall_time;
} fm_tb_series;
typedef struct fm_tb_scalars {
    int n, cap;
    fm_tb_series *series;
    /* histograms, one series per tag: value = how many values each one summarized */
    int n_histograms, cap_histograms;
    fm_tb_series *histograms;
} fm_tb_scalars;
/* Every scalar (and which histograms there are) in a log directory (event files
 * in it and in its subdirectories, oldest file first) or in one event file.
 * Series are sorted by step. */
FM_API fm_status fm_tb_read_scalars(const char *path, fm_tb_scalars *out);
FM_API const fm_tb_series *fm_tb_scalars_find(const fm_tb_scalars *s, const char *tag);
FM_API void fm_tb_scalars_free(fm_tb_scalars *s);

/* ---------------- progress ---------------- */

typedef enum fm_progress_mode {
    FM_PROGRESS_AUTO = 0, /* TTY if the stream is a terminal (and TERM is not "dumb"), else PLAIN */
    FM_PROGRESS_TTY,      /* one line redrawn in place with \r, at most 10 times a second */
    FM_PROGRESS_PLAIN,    /* a log line at every 10% and at least every interval_s seconds */
    FM_PROGRESS_QUIET     /* nothing */
} fm_progress_mode;

typedef struct fm_progress fm_progress;
/* label: "epoch 1/10", "eval", "calibrate"; total: steps (0 when unknown);
 * unit: what throughput counts ("samples", "tokens"; NULL: "steps");
 * out: the stream (NULL: stderr, so that --json output on stdout stays clean). */
FM_API fm_progress *fm_progress_begin(const char *label, int64_t total, const char *unit, fm_progress_mode mode, FILE *out);
/* done: steps finished so far; items: cumulative units processed (throughput);
 * loss: current loss, NAN to leave it out. Cheap enough to call every step. */
FM_API void fm_progress_update(fm_progress *p, int64_t done, int64_t items, double loss);
/* A loop that resumes part-way: done starts at this value, and the ETA and
 * throughput count only what this run does (the line still shows done/total). */
FM_API void fm_progress_set_start(fm_progress *p, int64_t done);
/* Seconds between plain lines (default 30). */
FM_API void fm_progress_set_interval(fm_progress *p, double seconds);
/* A message that must not be garbled by the progress line (epoch results).
 * Quiet mode drops it too. */
FM_API void fm_progress_log(fm_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
FM_API fm_progress_mode fm_progress_get_mode(const fm_progress *p);
/* Final line (with a newline on a terminal) and free. NULL is fine. */
FM_API void fm_progress_end(fm_progress *p);
/* Erases the redrawn line (terminal mode) so that other output can stream to
 * the stream; the next update draws it again. NULL is fine. */
FM_API void fm_progress_clear(fm_progress *p);
/* Erases the line and frees without a final line: a loop that failed, whose
 * error should not follow a "done". NULL is fine. */
FM_API void fm_progress_cancel(fm_progress *p);
/* The mode AUTO resolves to for a stream. */
FM_API fm_progress_mode fm_progress_detect(FILE *out);

/* ---------------- trace summary (`fathom profile`) ---------------- */

typedef struct fm_trace_op_stat {
    char name[64];
    int64_t calls;
    double total_us, self_us; /* self: total minus spans nested inside it on the same thread */
    double flops, bytes;
    bool compute;             /* GEMM/conv/attention class (else memory-bound) */
} fm_trace_op_stat;

typedef struct fm_trace_summary {
    char *path;            /* the trace file */
    int64_t n_events;      /* events parsed */
    bool truncated;        /* the file ended early (a run still writing, or one that crashed) */
    int n_ops;
    fm_trace_op_stat *ops; /* sorted by self time, largest first */
    double op_self_us;     /* sum of every op's self time */
    /* Step time and its split. Steps are spans with category "step"; without
     * any, the busiest thread's whole traced interval is one step. The parts
     * (with profiler_us below) add up to step_us. */
    int64_t n_steps;
    double step_us, compute_us, memory_us, data_us, optimizer_us, overhead_us;
    double step_flops;     /* FLOPs of the ops inside the steps */
    double peak_gflops;    /* what MFU is measured against (0: unknown); with bf16 products in
                            * the trace and both rates known, the rate of this FLOP mix */
    double lowp_flops;     /* FLOPs of ops whose products ran in bf16/f16 (part of step_flops) */
    double f32_peak_gflops, lowp_peak_gflops; /* the rates peak_gflops came from (0: unknown / none) */
    bool lowp_peak_known;  /* lowp_peak_gflops was measured (0 then: no bf16 hardware path) */
    double achieved_gflops, mfu;
    double gemm_gflops;    /* achieved rate of compute-class ops alone */
    bool has_gpu;          /* any op span ran on a CUDA device */
    double gpu_idle_pct;
    bool gpu_event_timed;  /* gpu_idle_pct from CUDA-event spans on the device tracks */
    const char *bottleneck; /* "compute", "memory", "data", "optimizer", "overhead" */
    char verdict[320];
    /* The profiler's own time between the ops (its events' args.prof_us), part of step_us:
     * taken out of overhead_us, where it would otherwise read as the framework's. */
    double profiler_us;
} fm_trace_summary;

/* Parses a Chrome trace-event JSON file (array form, possibly missing its
 * closing bracket and with a half-written last event, or {"traceEvents": [...]})
 * and summarizes it. peak_gflops <= 0: no MFU. Unreadable or not a trace:
 * FM_ERR_IO / FM_ERR_FORMAT with a message naming the file. */
FM_API fm_status fm_trace_summarize(const char *path, double peak_gflops, fm_trace_summary *out);
/* Sets the peak and recomputes MFU and the verdict (the peak may be measured
 * after the trace has been found readable). */
FM_API void fm_trace_summary_set_peak(fm_trace_summary *s, double peak_gflops);
/* The same with the bf16 rate too: the ops whose products ran in bf16 are held to
 * lowp_peak and the rest to f32_peak, and the verdict says whether bf16 would pay
 * here. lowp_peak 0: measured, no bf16 hardware path; < 0: unknown. */
FM_API void fm_trace_summary_set_peaks(fm_trace_summary *s, double f32_peak, double lowp_peak);
FM_API void fm_trace_summary_free(fm_trace_summary *s);
/* The human-readable report: op table (top max_rows ops; <= 0: all), the
 * step-time split, MFU and the verdict. */
FM_API void fm_trace_summary_print(const fm_trace_summary *s, FILE *f, int max_rows);
/* The same as one JSON object (malloc'd text; NULL on OOM). */
FM_API char *fm_trace_summary_json(const fm_trace_summary *s);
/* Single-precision GEMM rate of this machine through CBLAS (GFLOP/s), measured
 * on 1024x1024 matrices for about a quarter of a second. */
FM_API double fm_measure_peak_gflops(void);
/* bf16 GEMM rate (f32 accumulation) of this machine's bf16 hardware path, measured the
 * same way; 0 when the CPU has none (bf16 products then widen to the f32 GEMM). */
FM_API double fm_measure_peak_gflops_bf16(void);

/* ---------------- model summary (`fathom summary`) ---------------- */

typedef struct fm_module fm_module; /* fathom/nn.h */

typedef struct fm_layer_summary {
    char name[64];    /* index path, as in the state dict: "3", "1.0" */
    char desc[96];    /* "conv2d 1->32 k3 s1 p1" */
    int depth;        /* nesting level (0: a child of the root) */
    bool container;   /* a Sequential: its row shows the totals of its children */
    int out_ndim;
    int64_t out_shape[FM_MAX_DIMS];
    int64_t params, trainable, frozen; /* frozen: requires_grad off */
    int64_t buffer_elems;              /* BatchNorm running statistics */
    double flops;     /* forward FLOPs for the whole batch (a multiply-add is 2) */
    double act_bytes; /* bytes of the layer's output (0 for views such as flatten) */
    char tied_to[64]; /* weight tying: the parameter this layer reuses ("wte.weight"), counted in its own row */
    int64_t tied_params;
} fm_layer_summary;

typedef struct fm_model_summary {
    int n;
    fm_layer_summary *layers;
    int in_ndim;
    int64_t in_shape[FM_MAX_DIMS]; /* batch first */
    int64_t total_params, trainable, frozen, buffer_elems;
    double total_flops, act_bytes, input_bytes, param_bytes, buffer_bytes;
    int64_t tied_params;  /* parameters reused by another layer, counted once in the totals */
    char input_desc[32];  /* what the input is when not a float tensor ("token ids") */
} fm_model_summary;

/* Walks the model with an input shape (batch dim first), layer by layer.
 * A shape mismatch is the error fm_module_infer_shape gives. */
FM_API fm_status fm_model_summarize(fm_module *m, int ndim, const int64_t *in_shape, fm_model_summary *out);
FM_API void fm_model_summary_print(const fm_model_summary *s, FILE *f);
FM_API char *fm_model_summary_json(const fm_model_summary *s);
FM_API void fm_model_summary_free(fm_model_summary *s);

typedef struct fm_gpt fm_gpt; /* fathom/gpt.h */
/* The same table for a GPT model and an input of [batch, seq] token ids
 * (seq <= block_size): embeddings, per block the norms, attention (QKV, rotary,
 * attention, output projection) and MLP rows, the final norm and the tied LM
 * head. Parameters come from the model's tensors; the tied head weight is shown
 * on its row and counted once in the totals. */
FM_API fm_status fm_gpt_summarize(const fm_gpt *m, int64_t batch, int64_t seq, fm_model_summary *out);

/* ---------------- plots (`fathom plot`) ---------------- */

/* Loss (train + validation), accuracy (when logged), learning rate and
 * throughput panels from the scalars in a log directory. The format follows
 * the file name: .svg, or .png where FATHOM_HAVE_PNG was built in. */
FM_API fm_status fm_plot_curves(const fm_tb_scalars *s, const char *out_path, const char *title);
FM_API bool fm_plot_png_supported(void);

#ifdef __cplusplus
}
#endif
#endif
