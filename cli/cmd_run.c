/* `fathom run MODEL.onnx --input NAME=FILE ... [--output DIR | --json]`: runs an
 * ONNX model on arrays (.npy, or ONNX TensorProto .pb) and prints, writes or
 * returns as JSON every output. */
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "fathom/data.h"
#include "fathom/io.h"
#include "fathom/onnx.h"

#define MAX_RUN_INPUTS 64

static void run_usage(FILE *f) {
    fprintf(f, "usage: fathom run MODEL.onnx --input NAME=FILE [--input NAME=FILE ...] [--output DIR | --json]\n\n"
               "Runs an ONNX model (opsets 7 and later; docs/ONNX.md lists the ops) on arrays.\n"
               "FILE is a .npy array or a serialized ONNX TensorProto (.pb). With one model\n"
               "input, NAME= may be left out. Without --output or --json, prints each\n"
               "output's name, dtype, shape and first values.\n\n"
               "  --input NAME=FILE  feed the model input NAME from FILE (every input is needed)\n"
               "  --output DIR       write each output to DIR/<name>.npy\n"
               "  --json             print the outputs (name, dtype, shape, values) as one JSON object\n"
               "                     (NaN and infinities as the strings \"nan\", \"inf\", \"-inf\")\n");
}

static fm_tensor *read_array(const char *path) {
    size_t n = strlen(path);
    if (n > 3 && !strcmp(path + n - 3, ".pb")) return fm_onnx_read_tensor(path);
    return fm_npy_read(path);
}

/* An output name as a file name: anything but [A-Za-z0-9._-] becomes '_'. */
static void file_name(const char *name, char *out, size_t n) {
    size_t k = 0;
    for (; name[k] && k + 1 < n; k++) out[k] = isalnum((unsigned char)name[k]) || strchr("._-", name[k]) ? name[k] : '_';
    out[k] = 0;
    if (!k || out[0] == '.') out[0] = '_', out[k ? k : 1] = 0;
}

static json_t *tensor_json(const char *name, const fm_tensor *t) {
    json_t *o = json_object(), *shape = json_array(), *vals = json_array();
    json_object_set_new(o, "name", json_string(name));
    json_object_set_new(o, "dtype", json_string(fm_dtype_name(t->dtype)));
    for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    json_object_set_new(o, "shape", shape);
    int64_t n = fm_tensor_numel(t);
    bool fl = fm_dtype_is_float(t->dtype);
    for (int64_t i = 0; i < n; i++) {
        double v = fm_tensor_get(t, i);
        /* JSON has no NaN or infinity: those are the strings "nan", "inf", "-inf" */
        json_t *j = !fl ? json_integer((json_int_t)v) : isnan(v) ? json_string("nan") : isinf(v) ? json_string(v > 0 ? "inf" : "-inf")
                                                                                       : json_real(v);
        json_array_append_new(vals, j);
    }
    json_object_set_new(o, "data", vals);
    return o;
}

static void print_tensor(const char *name, const fm_tensor *t) {
    char sh[128];
    printf("%s: %s %s", name, fm_dtype_name(t->dtype), fm_shape_str(t->ndim, t->shape, sh, sizeof sh));
    int64_t n = fm_tensor_numel(t), show = n < 8 ? n : 8;
    printf(" [");
    for (int64_t i = 0; i < show; i++) printf("%s%.6g", i ? ", " : "", fm_tensor_get(t, i));
    printf("%s]\n", n > show ? ", ..." : "");
}

static int emit(fm_onnx_model *m, fm_tensor **outs, const char *out_dir, bool json) {
    int n = fm_onnx_output_count(m);
    if (out_dir && fm_mkdir_p(out_dir)) { fm_cli_error("run: %s", fm_last_error()); return 1; }
    json_t *arr = json ? json_array() : NULL;
    for (int i = 0; i < n; i++) {
        const char *name = fm_onnx_output_name(m, i);
        if (out_dir) {
            char fn[256], path[4096];
            file_name(name, fn, sizeof fn);
            snprintf(path, sizeof path, "%s/%s.npy", out_dir, fn);
            if (fm_npy_write(path, outs[i])) { fm_cli_error("run: output '%s': %s", name, fm_last_error()); return 1; }
            printf("%s: wrote %s\n", name, path);
        } else if (json) json_array_append_new(arr, tensor_json(name, outs[i]));
        else print_tensor(name, outs[i]);
    }
    if (json) {
        json_t *root = json_object();
        json_object_set_new(root, "outputs", arr);
        char *s = json_dumps(root, JSON_COMPACT);
        printf("%s\n", s ? s : "{}");
        free(s);
        json_decref(root);
    }
    return 0;
}

static int run_model(const char *model, int n_in, char **specs, const char *out_dir, bool json) {
    fm_onnx_model *m = fm_onnx_load(model);
    if (!m) { fm_cli_error("%s", fm_last_error()); return 1; }
    const char *names[MAX_RUN_INPUTS];
    fm_tensor *ins[MAX_RUN_INPUTS] = {0}, *outs[256] = {0};
    int rc = 0;
    if (fm_onnx_output_count(m) > 256) { fm_cli_error("run: %s has more than 256 outputs", model); rc = 1; }
    for (int i = 0; i < n_in && !rc; i++) {
        char *eq = strchr(specs[i], '=');
        const char *path = eq ? eq + 1 : specs[i];
        if (eq) *eq = 0;
        names[i] = eq ? specs[i] : fm_onnx_input_name(m, 0);
        if (!eq && fm_onnx_input_count(m) != 1) {
            fm_cli_error("run: --input %s: the model has %d inputs; give them as NAME=FILE", specs[i], fm_onnx_input_count(m));
            rc = 2;
        } else if (!(ins[i] = read_array(path))) {
            fm_cli_error("run: input '%s': %s", names[i] ? names[i] : "", fm_last_error());
            rc = 1;
        }
    }
    if (!rc && fm_onnx_run(m, n_in, names, ins, outs)) { fm_cli_error("%s", fm_last_error()); rc = 1; }
    if (!rc) rc = emit(m, outs, out_dir, json);
    for (int i = 0; i < n_in; i++) fm_tensor_release(ins[i]);
    for (int i = 0; i < fm_onnx_output_count(m) && i < 256; i++) fm_tensor_release(outs[i]);
    fm_onnx_free(m);
    return rc;
}

int fm_cmd_run(int argc, char **argv) {
    const char *model = NULL, *out_dir = NULL;
    char *specs[MAX_RUN_INPUTS];
    int n_in = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { run_usage(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--input") || !strcmp(a, "--output")) {
            if (i + 1 >= argc) { fm_cli_error("run: %s needs a value", a); run_usage(stderr); return 2; }
            if (a[2] == 'o') out_dir = argv[++i];
            else if (n_in == MAX_RUN_INPUTS) { fm_cli_error("run: more than %d inputs", MAX_RUN_INPUTS); return 2; }
            else specs[n_in++] = argv[++i];
            continue;
        }
        if (a[0] == '-') { fm_cli_error("run: unknown option '%s'", a); run_usage(stderr); return 2; }
        if (model) { fm_cli_error("run: more than one model given ('%s' and '%s')", model, a); run_usage(stderr); return 2; }
        model = a;
    }
    if (!model) { fm_cli_error("run: no model given"); run_usage(stderr); return 2; }
    if (json && out_dir) { fm_cli_error("run: --json and --output exclude each other"); run_usage(stderr); return 2; }
    return run_model(model, n_in, specs, out_dir, json);
}
