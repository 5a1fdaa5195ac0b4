/* `fathom quantize MODEL_DIR|MODEL.onnx -o OUT_DIR (--int8 --dynamic | --int8 --calibrate DATA | --int4)`
 * [--reduce-range]:
 * the model's inference graph (traced as `fathom compile` does, or a graph
 * directory) with its linear/matmul and embedding weights (int8 also its
 * convolutions) quantized (docs/QUANTIZE.md); --ops and --exclude narrow which.
 * Prints what was quantized and what stays fp32, and writes OUT_DIR atomically
 * (nothing on any error). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "gpt_dir.h"
#include "fathom/data.h"
#include "fathom/graph.h"
#include "fathom/memory.h"
#include "fathom/ops.h"
#include "fathom/quant.h"
#include "fathom/recipe.h"

static void usage(FILE *f) {
    fprintf(f, "usage: fathom quantize MODEL_DIR|MODEL.onnx -o OUT_DIR MODE [options]\n\n"
               "Quantizes a trained model (or a graph directory made by `fathom compile`, or an ONNX file) and writes\n"
               "a graph directory that predict, eval, generate, serve and the graph API run.\n\n"
               "modes:\n"
               "  --int8 --dynamic            int8 weights (per output channel), activations quantized per batch\n"
               "  --int8 --calibrate DATA     int8 with fixed activation scales from calibration; DATA is\n"
               "                              `recipe` (the training data the model's recipe names), a data set\n"
               "                              directory (its training split), or an input file (.npy, idx, PNG)\n"
               "                              of samples as predict takes them\n"
               "     --method minmax|percentile|entropy   how the ranges are chosen (default minmax)\n"
               "     --percentile P           share of values kept by --method percentile (default 99.99)\n"
               "     --samples N              calibration samples (default 512)\n"
               "  --reduce-range              int8: 7-bit weight codes ([-63, 63], ONNX Runtime's reduce_range):\n"
               "                              faster on AVX2 CPUs without VNNI, half the weight resolution\n"
               "  --int4 [--group 32|64|128]  weight-only int4 for linear/matmul and embedding (default group 32)\n"
               "     --with-min               an f16 offset per group as well as the scale\n"
               "  --ops LIST                  quantize only these kinds (comma-separated: linear, matmul, conv2d,\n"
               "                              embedding; default all), e.g. --ops linear keeps convolutions fp32\n"
               "  --exclude NODES             these nodes (comma-separated names, as the report lists them) stay fp32\n\n"
               "  -q, --quiet                 print only the summary line\n");
}

typedef struct {
    const char *in, *out, *calib;
    int int8, int4, dynamic, quiet;
    fm_quant_options o;
    long long samples;
} qargs;

static int parse(int argc, char **argv, qargs *a) {
    memset(a, 0, sizeof *a);
    fm_quant_options_init(&a->o);
    a->samples = 512;
    long long v = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        bool more = i + 1 < argc;
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) { usage(stdout); return 0; }
        if (!strcmp(s, "--int8")) a->int8 = 1;
        else if (!strcmp(s, "--int4")) a->int4 = 1;
        else if (!strcmp(s, "--dynamic")) a->dynamic = 1;
        else if (!strcmp(s, "--with-min")) a->o.with_min = true;
        else if (!strcmp(s, "--reduce-range")) a->o.reduce_range = true;
        else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) a->quiet = 1;
        else if ((!strcmp(s, "-o") || !strcmp(s, "--out")) && more) a->out = argv[++i];
        else if (!strcmp(s, "--calibrate") && more) a->calib = argv[++i];
        else if (!strcmp(s, "--ops") && more) a->o.op_types = argv[++i];
        else if (!strcmp(s, "--exclude") && more) a->o.exclude = argv[++i];
        else if (!strcmp(s, "--group") && more) {
            if (!fm_cli_parse_int_range("quantize", s, argv[++i], 1, 1 << 20, &v)) return 2;
            if (v != 32 && v != 64 && v != 128) { fm_cli_error("quantize: --group %lld must be 32, 64 or 128", v); return 2; }
            a->o.group = (int)v;
        } else if (!strcmp(s, "--samples") && more) {
            if (!fm_cli_parse_int_range("quantize", s, argv[++i], 1, 1 << 24, &a->samples)) return 2;
        } else if (!strcmp(s, "--percentile") && more) {
            char *end;
            const char *pv = argv[++i];
            a->o.percentile = strtod(pv, &end);
            if (*end || end == pv || !(a->o.percentile > 50 && a->o.percentile <= 100)) {
                fm_cli_error("quantize: --percentile must be in (50, 100], got '%s'", pv);
                return 2;
            }
        } else if (!strcmp(s, "--method") && more) {
            const char *m = argv[++i];
            if (!strcmp(m, "minmax")) a->o.method = FM_CALIB_MINMAX;
            else if (!strcmp(m, "percentile")) a->o.method = FM_CALIB_PERCENTILE;
            else if (!strcmp(m, "entropy")) a->o.method = FM_CALIB_ENTROPY;
            else { fm_cli_error("quantize: --method '%s': expected minmax, percentile or entropy", m); return 2; }
        } else if (s[0] != '-' && !a->in) a->in = s;
        else {
            static const char *const flags[] = {"--help", "--int8", "--int4", "--dynamic", "--calibrate", "--method", "--percentile",
                                                "--samples", "--group", "--with-min", "--out", "--quiet", "--ops", "--exclude", "--reduce-range"};
            if (s[0] == '-') fm_cli_unknown_option("quantize", s, flags, (int)(sizeof flags / sizeof *flags));
            else fm_cli_error("quantize: more than one model directory given ('%s')", s);
            return 2;
        }
    }
    const char *bad = !a->in ? "no model directory given" : !a->out ? "no output directory (-o OUT_DIR)"
                      : a->int8 + a->int4 != 1 ? "choose one of --int8 and --int4"
                      : a->int8 && a->dynamic == !!a->calib ? "--int8 needs exactly one of --dynamic and --calibrate DATA"
                      : a->int4 && (a->dynamic || a->calib) ? "--int4 is weight-only: --dynamic and --calibrate do not apply"
                      : a->int4 && a->o.reduce_range ? "--reduce-range (7-bit int8 weights) applies to --int8, not to --int4" : NULL;
    if (bad) { fm_cli_error("quantize: %s", bad); return 2; }
    a->o.mode = a->int4 ? FM_QUANT_INT4 : a->dynamic ? FM_QUANT_INT8_DYNAMIC : FM_QUANT_INT8_STATIC;
    return -1;
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A graph without a recipe (an imported ONNX model): DATA is a file of the graph's own inputs,
 * already preprocessed as the model takes them ([N, ...] along dim 0, f32 or f64), as ONNX
 * Runtime's calibration reader hands it model inputs; the first `samples` of them. The shape
 * is checked against the graph's input by the calibration itself. */
static fm_tensor *calib_inputs(const char *data, int64_t samples) {
    if (!strcmp(data, "recipe") || is_dir(data)) {
        fm_set_error(FM_ERR_INVALID, "--calibrate %s: this graph has no recipe (an imported model?), so it has no training data to name; "
                     "give a .npy file of its inputs, [N, ...] as the graph takes them, preprocessed, or use --int8 --dynamic", data);
        return NULL;
    }
    fm_tensor *raw = fm_data_read(data), *x = NULL;
    if (raw && raw->dtype != FM_F32 && raw->dtype != FM_F64)
        fm_set_error(FM_ERR_INVALID, "calibration data %s holds %s values; a graph without a recipe takes float samples of its input", data,
                     fm_dtype_name(raw->dtype));
    else if (raw && raw->ndim < 1)
        fm_set_error(FM_ERR_INVALID, "calibration data %s is a scalar; expected samples along dim 0", data);
    else if (raw) {
        fm_tensor *f = fm_to_dtype(raw, FM_F32), *head = f ? fm_slice(f, 0, 0, raw->shape[0] < samples ? raw->shape[0] : samples, 1) : NULL;
        x = head ? fm_contiguous(head) : NULL;
        fm_tensor_release_n(2, f, head);
    }
    fm_tensor_release(raw);
    return x;
}

/* The first `samples` inputs of DATA, shaped and normalized as the classifier takes them. */
static fm_tensor *calib_data(const fm_graph *g, const char *data, int64_t samples) {
    fm_recipe r;
    fm_graph_io in;
    const bool one_float = fm_graph_num_inputs(g) == 1 && fm_graph_input_info(g, 0, &in) == FM_OK && (in.dtype == FM_F32 || in.dtype == FM_F64);
    if (fm_graph_classifier_recipe(g, &r) != FM_OK) {
        if (one_float) return calib_inputs(data, samples); /* an imported model: samples of its input as they are */
        fm_set_error(FM_ERR_INVALID, "--calibrate works on graphs with one float input (a classifier; an imported image model); this "
                     "graph has %d input(s)%s%s. Use --int8 --dynamic", fm_graph_num_inputs(g), fm_graph_num_inputs(g) == 1 ? " of dtype " : "",
                     fm_graph_num_inputs(g) == 1 && fm_graph_input_info(g, 0, &in) == FM_OK ? fm_dtype_name(in.dtype) : "");
        return NULL;
    }
    bool own = !strcmp(data, "recipe"); /* the training data the recipe names */
    fm_dataset *d = own || is_dir(data) ? fm_recipe_dataset(&r, FM_SPLIT_TRAIN, own ? NULL : data) : NULL;
    fm_tensor *x = NULL;
    if (d) {
        fm_loader_options lo;
        fm_loader_options_init(&lo);
        lo.batch_size = samples;
        lo.transforms.normalize_channels = r.transforms.normalize_channels;
        memcpy(lo.transforms.mean, r.transforms.mean, sizeof lo.transforms.mean);
        memcpy(lo.transforms.std, r.transforms.std, sizeof lo.transforms.std);
        fm_dataloader *l = fm_dataloader_create(d, &lo);
        fm_batch b;
        if (l && fm_dataloader_next(l, &b) == FM_OK && b.x) x = fm_contiguous(b.x);
        fm_dataloader_free(l);
        fm_dataset_release(d);
    } else if (!own && !is_dir(data)) {
        fm_tensor *raw = fm_data_read(data); /* u8 data comes back scaled to [0, 1] */
        if (raw && (raw->dtype == FM_F32 || raw->dtype == FM_F64)) {
            int64_t per = 1, shape[FM_MAX_DIMS];
            for (int i = 0; i < r.input_ndim; i++) per *= r.input_shape[i];
            char s1[96], s2[96];
            if (fm_tensor_numel(raw) % per)
                fm_set_error(FM_ERR_INVALID, "calibration data %s: shape %s does not fit the model's input %s", data,
                             fm_shape_str(raw->ndim, raw->shape, s1, sizeof s1), fm_shape_str(r.input_ndim, r.input_shape, s2, sizeof s2));
            else {
                int64_t n = fm_tensor_numel(raw) / per;
                shape[0] = n < samples ? n : samples;
                memcpy(shape + 1, r.input_shape, sizeof(int64_t) * (size_t)r.input_ndim);
                fm_tensor *f = fm_to_dtype(raw, FM_F32), *fl = f ? fm_reshape(f, 2, (int64_t[]){n, per}) : NULL;
                fm_tensor *head = fl ? fm_slice(fl, 0, 0, shape[0], 1) : NULL, *hc = head ? fm_contiguous(head) : NULL;
                fm_tensor *c = hc ? fm_reshape(hc, r.input_ndim + 1, shape) : NULL;
                fm_tensor *m = c && r.transforms.normalize_channels ? fm_add_scalar(c, -r.transforms.mean[0]) : NULL;
                x = m ? fm_mul_scalar(m, 1.0 / r.transforms.std[0]) : c ? fm_tensor_retain(c) : NULL;
                fm_tensor_release_n(6, f, fl, head, hc, c, m);
            }
        } else if (raw) {
            fm_set_error(FM_ERR_INVALID, "calibration data %s holds %s values; expected images or float samples", data, fm_dtype_name(raw->dtype));
        }
        fm_tensor_release(raw);
    }
    fm_recipe_free(&r);
    return x;
}

/* Quantized nodes one per line; the fp32 ones grouped by op, with the reason. */
static void print_report(const fm_quant_report *r) {
    for (int i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].quantized) printf("  %-28s %-10s -> %s\n", r->nodes[i].node, r->nodes[i].op, r->nodes[i].how);
    bool *done = calloc((size_t)r->n_nodes + 1, sizeof *done);
    for (int i = 0; done && i < r->n_nodes; i++) {
        if (r->nodes[i].quantized || done[i]) continue;
        int count = 0;
        for (int j = i; j < r->n_nodes; j++)
            if (!r->nodes[j].quantized && !strcmp(r->nodes[j].op, r->nodes[i].op) && !strcmp(r->nodes[j].how, r->nodes[i].how)) { done[j] = true; count++; }
        char name[48];
        snprintf(name, sizeof name, "(%d nodes)", count);
        printf("  %-28s %-10s -> %s\n", count > 1 ? name : r->nodes[i].node, r->nodes[i].op, r->nodes[i].how);
    }
    free(done);
}

int fm_cmd_quantize(int argc, char **argv) {
    qargs a;
    int rc = parse(argc, argv, &a);
    if (rc >= 0) {
        if (rc) usage(stderr);
        return rc;
    }
    bool traced = !fm_graph_dir_is_graph(a.in);
    fm_graph *g = fm_cli_graph_from_dir(a.in);
    if (g && traced) { /* a trained model gets the compile passes first (batch norm folded into its conv, ...) */
        fm_compile_report crep;
        fm_graph *c = fm_graph_compile(g, &crep);
        fm_graph_free(g);
        g = c;
    }
    if (!g) { fm_cli_error("%s", fm_last_error()); return 1; }
    fm_tensor *x = NULL;
    if (a.calib && !(x = calib_data(g, a.calib, a.samples))) { fm_cli_error("%s", fm_last_error()); fm_graph_free(g); return 1; }
    a.o.calib = x;
    fm_quant_report rep;
    fm_graph *q = fm_graph_quantize(g, &a.o, &rep);
    rc = 0;
    if (!q || fm_graph_save(q, a.out) != FM_OK) { fm_cli_error("%s", fm_last_error()); rc = 1; }
    if (rc == 0) {
        char b1[32], b2[32];
        if (!a.quiet) print_report(&rep);
        printf("%s: %d of %d nodes quantized (%s), weights %s -> %s -> %s\n", a.in, rep.n_quantized, rep.n_nodes,
               a.int4 ? "int4" : a.dynamic ? "int8 dynamic" : "int8 static", fm_format_bytes(rep.bytes_before, b1, sizeof b1),
               fm_format_bytes(rep.bytes_after, b2, sizeof b2), a.out);
    }
    fm_quant_report_free(&rep);
    fm_tensor_release(x);
    fm_graph_free(q);
    fm_graph_free(g);
    return rc;
}
