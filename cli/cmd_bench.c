/* `fathom bench MODEL [--device D] [--batch N] [--dim NAME=V ...] [--warmup N] [--iters N]
 * [--json] [--profile FILE]`: the inference latency of any model fathom runs - a trained model directory
 * (traced), a graph directory (compiled, quantized, imported) or an .onnx file - on
 * generated inputs of the model's declared shapes, as onnxruntime_perf_test or trtexec
 * report it: median, 90th and 99th percentile, mean and throughput. Each timed run
 * includes copying the outputs to the host (what a caller reading them waits for), so
 * device work cannot escape the clock. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "gpt_dir.h"
#include "device_arg.h"
#include "fathom/graph.h"
#include "fathom/profile.h"

#define BENCH_MAX_IO 256
#define BENCH_MAX_DIMS 16

static void bench_usage(FILE *f) {
    fprintf(f, "usage: fathom bench MODEL [--device D] [--batch N] [--dim NAME=V ...] [--warmup N] [--iters N] [--json]\n"
               "                    [--profile FILE]\n\n"
               "Times inference of MODEL on generated inputs of its declared shapes. MODEL is a trained\n"
               "model directory (traced as `fathom compile` does), a graph directory, or an .onnx file.\n\n"
               "  --device D      cpu (default), cuda, cuda:N, check\n"
               "  --batch N       the batch dim: the dynamic dim named \"batch\", else the first input's\n"
               "                  dim 0 when it is dynamic (an ONNX file's \"N\", \"b\", ...) (default 1)\n"
               "  --dim NAME=V    another dynamic dim (a GPT graph's \"seq\" and \"past\"); unset ones are 1\n"
               "  --warmup N      untimed runs first (default 3)\n"
               "  --iters N       timed runs (default 20)\n"
               "  --json          one JSON object on stdout instead of the text\n"
               "  --profile FILE  a Chrome trace of the timed runs, op by op (`fathom profile FILE` sums it;\n"
               "                  chrome://tracing or Perfetto shows it)\n\n"
               "Float inputs are N(0,1) values, integer inputs ids below the table they index (else 1).\n"
               "A run's time includes copying every output to the host.\n");
}

typedef struct bench_dims {
    int n;
    const char *name[BENCH_MAX_DIMS];
    long long value[BENCH_MAX_DIMS];
} bench_dims;

typedef struct bench_opts {
    fm_device dev;
    long long warmup, iters, batch;
    bool batch_given, json;
    const char *profile; /* --profile FILE, or NULL */
} bench_opts;

static long long dim_value(const bench_dims *d, const char *name) {
    for (int i = 0; i < d->n; i++)
        if (name && !strcmp(d->name[i], name)) return d->value[i];
    return 1;
}

/* input i of g at the dims asked for, generated on the host */
static fm_tensor *bench_input(const fm_graph *g, int i, const bench_dims *d, fm_rng *rng, char *desc, size_t nd) {
    fm_graph_io io;
    if (fm_graph_input_info(g, i, &io)) return NULL;
    int64_t sh[FM_MAX_DIMS];
    for (int k = 0; k < io.ndim; k++) sh[k] = io.shape[k] == FM_DIM_DYNAMIC ? dim_value(d, io.dim_names[k]) : io.shape[k];
    char s[128];
    snprintf(desc, nd, "%s %s %s", io.name, fm_dtype_name(io.dtype), fm_shape_str(io.ndim, sh, s, sizeof s));
    if (fm_dtype_is_float(io.dtype)) return fm_tensor_randn(io.ndim, sh, io.dtype, rng);
    fm_tensor *t = fm_tensor_empty(io.ndim, sh, io.dtype, FM_CPU), *u = fm_tensor_rand(io.ndim, sh, FM_F64, rng);
    int64_t lim = fm_graph_input_id_limit(g, i), n = t && u ? fm_tensor_numel(t) : 0;
    for (int64_t e = 0; e < n; e++) fm_tensor_set(t, e, lim > 0 ? floor(fm_tensor_get(u, e) * (double)lim) : 1.0);
    fm_tensor_release(u);
    return t;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* one run: the graph, then every output to the host */
static double bench_once(const fm_graph *g, fm_tensor *const *ins, int n_out) {
    fm_tensor *outs[BENCH_MAX_IO] = {0};
    double t0 = now_s();
    fm_status st = fm_graph_run(g, ins, outs);
    for (int j = 0; j < n_out && st == FM_OK; j++) {
        fm_tensor *h = fm_tensor_to(outs[j], FM_CPU);
        if (!h) st = fm_last_status();
        fm_tensor_release(h);
    }
    double t = now_s() - t0;
    for (int j = 0; j < n_out; j++) fm_tensor_release(outs[j]);
    return st == FM_OK ? t : -1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *s, int n, double p) {
    int i = (int)ceil(p * n) - 1;
    return s[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static void bench_report(const char *model, fm_device dev, long long batch, const char *inputs, double *t, int n, bool json) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += t[i];
    double med = pct(t, n, 0.5), p90 = pct(t, n, 0.9), p99 = pct(t, n, 0.99), mean = sum / n;
    char dn[32];
    fm_device_name(dev, dn, sizeof dn);
    if (json) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "model", model, "device", dn, "batch",
                              (json_int_t)batch, "inputs", inputs, "iters", n, "median_ms", med * 1e3, "p90_ms", p90 * 1e3,
                              "p99_ms", p99 * 1e3, "mean_ms", mean * 1e3, "min_ms", t[0] * 1e3, "items_per_s", batch / med);
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        printf("%s\n", s ? s : "{}");
        free(s);
        json_decref(o);
        return;
    }
    printf("model:   %s on %s\ninputs:  %s\n", model, dn, inputs);
    printf("latency over %d runs: median %.3f ms, p90 %.3f, p99 %.3f, mean %.3f, min %.3f\n", n, med * 1e3, p90 * 1e3,
           p99 * 1e3, mean * 1e3, t[0] * 1e3);
    printf("throughput: %.1f items/s (batch %lld at the median)\n", batch / med, batch);
}

/* Whether some input of g has a dynamic dim called name. */
static bool has_dim(const fm_graph *g, const char *name) {
    for (int i = 0; i < fm_graph_num_inputs(g); i++) {
        fm_graph_io io;
        if (fm_graph_input_info(g, i, &io)) continue;
        for (int k = 0; k < io.ndim; k++)
            if (io.shape[k] == FM_DIM_DYNAMIC && io.dim_names[k] && !strcmp(io.dim_names[k], name)) return true;
    }
    return false;
}

/* The graph's batch dim: one named "batch", else the first input's dim 0 when it is
 * dynamic (an ONNX import keeps the file's name for it: "N", "b", ...); NULL if none. */
static const char *batch_dim(const fm_graph *g) {
    fm_graph_io io;
    if (has_dim(g, "batch")) return "batch";
    return fm_graph_num_inputs(g) > 0 && !fm_graph_input_info(g, 0, &io) && io.ndim > 0 && io.shape[0] == FM_DIM_DYNAMIC
               ? io.dim_names[0] : NULL;
}

/* Items per run of a model with no dynamic batch dim: its first input's first dim
 * (an export at a fixed batch of 2 runs 2 items), 1 for a scalar input. */
static long long fixed_batch(const fm_graph *g) {
    fm_graph_io io;
    return fm_graph_num_inputs(g) > 0 && !fm_graph_input_info(g, 0, &io) && io.ndim > 0 && io.shape[0] > 0 ? io.shape[0] : 1;
}

/* --batch onto the graph's batch dim (d gets it unless --dim named it), and every
 * --dim checked against the graph's dynamic dims; 0 or 2 after saying why. */
static int resolve_dims(const fm_graph *g, bench_dims *d, long long batch, bool batch_given, const char **bname) {
    *bname = batch_dim(g);
    for (int i = 0; i < d->n; i++)
        if (!has_dim(g, d->name[i])) {
            fm_cli_error("bench: --dim %s: the model has no dynamic dim of that name%s", d->name[i],
                         *bname ? "" : " (it has no dynamic dims at all)");
            return 2;
        }
    if (!*bname && batch_given && batch != fixed_batch(g)) {
        fm_cli_error("bench: --batch %lld: the model's inputs have no dynamic batch dim (its batch is fixed at %lld)", batch,
                     fixed_batch(g));
        return 2;
    }
    for (int i = 0; *bname && i < d->n; i++)
        if (!strcmp(d->name[i], *bname)) return 0; /* --dim set it */
    if (*bname) d->name[d->n] = *bname, d->value[d->n++] = batch;
    return 0;
}

/* the warm-up and timed runs (the timed ones traced with --profile); 0 or 1 after saying why */
static int bench_runs(const char *model, fm_graph *g, fm_tensor **ins, int n_out, const bench_opts *o, double *t) {
    for (long long i = 0; i < o->warmup + o->iters; i++) {
        if (i == o->warmup && o->profile && fm_profiler_start(o->profile)) {
            fm_cli_error("bench: --profile %s: %s", o->profile, fm_last_error());
            return 1;
        }
        double s = bench_once(g, ins, n_out);
        if (s < 0) {
            fm_cli_error("bench: %s: %s", model, fm_last_error());
            if (o->profile && fm_profiler_enabled()) fm_profiler_stop();
            return 1;
        }
        if (i >= o->warmup) t[i - o->warmup] = s;
    }
    if (o->profile && fm_profiler_stop()) { fm_cli_error("bench: --profile %s: %s", o->profile, fm_last_error()); return 1; }
    return 0;
}

static int bench_model(const char *model, bench_dims *d, const bench_opts *o) {
    const fm_device dev = o->dev;
    const long long iters = o->iters;
    fm_graph *g = fm_cli_graph_from_dir(model);
    if (!g) { fm_cli_error("bench: %s: %s", model, fm_last_error()); return 1; }
    const char *bname = NULL;
    int n_dims = d->n, rc = resolve_dims(g, d, o->batch, o->batch_given, &bname);
    if (rc) { fm_graph_free(g); return rc; }
    int n_in = fm_graph_num_inputs(g), n_out = fm_graph_num_outputs(g);
    fm_tensor *ins[BENCH_MAX_IO] = {0};
    char inputs[1024] = "", desc[256];
    double *t = calloc((size_t)iters, sizeof *t);
    fm_rng rng;
    fm_rng_init(&rng, 1);
    if (!t) { fm_cli_error("bench: out of memory"); rc = 1; }
    else if (n_in > BENCH_MAX_IO || n_out > BENCH_MAX_IO) { fm_cli_error("bench: %s has more than %d inputs or outputs", model, BENCH_MAX_IO); rc = 1; }
    else if (fm_graph_to_device(g, dev)) { fm_cli_error("bench: %s to the device: %s", model, fm_last_error()); rc = 1; }
    for (int i = 0; i < n_in && !rc; i++) {
        fm_tensor *h = bench_input(g, i, d, &rng, desc, sizeof desc);
        ins[i] = h ? fm_tensor_to(h, dev) : NULL;
        fm_tensor_release(h);
        if (!ins[i]) { fm_cli_error("bench: input %d: %s", i, fm_last_error()); rc = 1; }
        size_t l = strlen(inputs);
        snprintf(inputs + l, sizeof inputs - l, "%s%s", i ? ", " : "", desc);
    }
    if (!rc) rc = bench_runs(model, g, ins, n_out, o, t);
    if (!rc) bench_report(model, dev, bname ? dim_value(d, bname) : fixed_batch(g), inputs, t, (int)iters, o->json);
    if (!rc && o->profile && !o->json) printf("trace:   %s (the %lld timed runs; `fathom profile %s` sums it)\n", o->profile, iters, o->profile);
    for (int i = 0; i < n_in; i++) fm_tensor_release(ins[i]);
    free(t);
    d->n = n_dims; /* the batch entry names a string the graph owns */
    fm_graph_free(g);
    return rc;
}

/* the options after the model's name; 0, or the exit code (2: usage) after saying why */
static int bench_args(int argc, char **argv, const char **model, bench_dims *d, bench_opts *o) {
    static const char *const opts[] = {"--device", "--batch", "--dim", "--warmup", "--iters", "--json", "--profile", "--help"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) { o->json = true; continue; }
        if (a[0] != '-') {
            if (*model) { fm_cli_error("bench: more than one model given ('%s' and '%s')", *model, a); return 2; }
            *model = a;
            continue;
        }
        if (strcmp(a, "--device") && strcmp(a, "--batch") && strcmp(a, "--dim") && strcmp(a, "--warmup") && strcmp(a, "--iters") &&
            strcmp(a, "--profile")) {
            fm_cli_unknown_option("bench", a, opts, (int)(sizeof opts / sizeof *opts));
            return 2;
        }
        if (!v) { fm_cli_error("bench: %s needs a value", a); return 2; }
        i++;
        if (!strcmp(a, "--batch")) o->batch_given = true;
        if (!strcmp(a, "--profile")) {
            o->profile = v;
        } else if (!strcmp(a, "--device")) {
            int drc = fm_cli_device("bench", v, &o->dev);
            if (drc) return drc;
        } else if (!strcmp(a, "--dim")) {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || d->n == BENCH_MAX_DIMS - 1) {
                fm_cli_error("bench: --dim needs NAME=VALUE (at most %d), got '%s'", BENCH_MAX_DIMS - 1, v);
                return 2;
            }
            if (!fm_cli_parse_int_range("bench", "--dim", eq + 1, 0, 1 << 24, &d->value[d->n])) return 2;
            char *name = strndup(v, (size_t)(eq - v));
            if (!name) { fm_cli_error("bench: out of memory"); return 1; }
            d->name[d->n++] = name;
        } else if (!fm_cli_parse_int_range("bench", a, v, !strcmp(a, "--warmup") ? 0 : 1, !strcmp(a, "--batch") ? 1 << 20 : 1000000,
                                           !strcmp(a, "--batch") ? &o->batch : !strcmp(a, "--warmup") ? &o->warmup : &o->iters)) {
            return 2;
        }
    }
    if (!*model) { fm_cli_error("bench: no model given"); return 2; }
    return 0;
}

int fm_cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { bench_usage(stdout); return 0; }
    const char *model = NULL;
    bench_dims d = {0};
    bench_opts o = {.dev = FM_CPU, .warmup = 3, .iters = 20, .batch = 1};
    int rc = bench_args(argc, argv, &model, &d, &o);
    if (rc == 2) bench_usage(stderr);
    if (!rc) rc = bench_model(model, &d, &o);
    for (int i = 0; i < d.n; i++) free((char *)d.name[i]);
    return rc;
}
