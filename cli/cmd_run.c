/* `fathom run MODEL.onnx --input NAME=FILE ... [--output DIR | --json]`: runs an
 * ONNX model on arrays (.npy, or ONNX TensorProto .pb) and prints, writes or
 * returns as JSON every output. */
#include <ctype.h>
#include <jansson.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "device_arg.h"
#include "fathom/data.h"
#include "fathom/io.h"
#include "fathom/onnx.h"

#define MAX_RUN_INPUTS 64

/* What runs: an ONNX file (the interpreter) or an inference graph directory
 * (`fathom import`, `fathom compile`). */
typedef struct {
    fm_onnx_model *onnx;
    fm_graph *graph;
} run_target;

static int n_outputs(const run_target *t) { return t->onnx ? fm_onnx_output_count(t->onnx) : fm_graph_num_outputs(t->graph); }
static int n_inputs(const run_target *t) { return t->onnx ? fm_onnx_input_count(t->onnx) : fm_graph_num_inputs(t->graph); }
static const char *io_name(const run_target *t, int i, bool out) {
    fm_graph_io io;
    if (t->onnx) return out ? fm_onnx_output_name(t->onnx, i) : fm_onnx_input_name(t->onnx, i);
    return (out ? fm_graph_output_info(t->graph, i, &io) : fm_graph_input_info(t->graph, i, &io)) ? "" : io.name;
}
static const char *output_name(const run_target *t, int i) { return io_name(t, i, true); }

static void run_usage(FILE *f) {
    fprintf(f, "usage: fathom run MODEL.onnx|GRAPH_DIR --input NAME=FILE [--input NAME=FILE ...] [--output DIR | --json]\n"
               "                  [--device D] [--max-iterations N]\n\n"
               "Runs an ONNX model (opsets 7 and later; docs/ONNX.md lists the ops), or an inference\n"
               "graph directory (`fathom import`, `fathom compile`), on arrays.\n"
               "FILE is a .npy array or a serialized ONNX TensorProto (.pb). With one model\n"
               "input, NAME= may be left out. Without --output or --json, prints each\n"
               "output's name, dtype, shape and first values.\n\n"
               "  --input NAME=FILE  feed the model input NAME from FILE (every input is needed)\n"
               "  --output DIR       write each output to DIR/<name>.npy, with DIR/outputs.json naming\n"
               "                     each output's file, dtype and shape; DIR is written as one unit\n"
               "                     (a crash leaves the old DIR or the complete new one). An existing\n"
               "                     DIR must be empty or an earlier `fathom run --output` (replaced whole)\n"
               "  --json             print the outputs (name, dtype, shape, values) as one JSON object\n"
               "                     (NaN and infinities as the strings \"nan\", \"inf\", \"-inf\")\n"
               "  --device D         run the model on D: cpu (default), cuda, cuda:N, check; the inputs\n"
               "                     are copied there, the outputs back\n"
               "  --max-iterations N an ONNX Loop that would run more than N iterations fails instead\n"
               "                     (default: no limit, as ONNX Runtime)\n");
}

static fm_tensor *read_array(const char *path) {
    size_t n = strlen(path);
    if (n > 3 && !strcmp(path + n - 3, ".pb")) return fm_onnx_read_tensor(path);
    return fm_npy_read(path);
}

/* An output name as a file name: anything but [A-Za-z0-9._-] becomes '_', at most
 * 200 characters (with ".npy", within any file system's name limit). */
static void file_name(const char *name, char *out, size_t n) {
    size_t k = 0;
    if (n > 201) n = 201;
    for (; name[k] && k + 1 < n; k++) out[k] = isalnum((unsigned char)name[k]) || strchr("._-", name[k]) ? name[k] : '_';
    out[k] = 0;
    if (!k || out[0] == '.') out[0] = '_', out[k ? k : 1] = 0;
}

/* The manifest `fathom run --output` writes: it names every file, so a directory
 * holding it and nothing else is an earlier output that may be replaced whole. */
#define RUN_MANIFEST "outputs.json"

/* true when `dir` holds RUN_MANIFEST and nothing but regular files that it lists. */
static bool is_earlier_output(const char *dir) {
    char p[4096];
    struct stat sb;
    snprintf(p, sizeof p, "%s/" RUN_MANIFEST, dir);
    json_t *root = json_load_file(p, 0, NULL), *outs = root ? json_object_get(root, "outputs") : NULL;
    bool ok = json_is_array(outs) && json_is_string(json_object_get(root, "fathom"));
    DIR *d = ok ? opendir(dir) : NULL;
    struct dirent *e;
    while (ok && d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, RUN_MANIFEST)) continue;
        bool listed = false;
        size_t i;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) { ok = false; break; }
        json_t *o;
        json_array_foreach(outs, i, o) {
            const char *f = json_string_value(json_object_get(o, "file"));
            if (f && !strcmp(f, e->d_name)) listed = true;
        }
        ok = listed;
    }
    if (d) closedir(d);
    json_decref(root);
    return ok && d;
}

/* Checks --output DIR before any work: a new path, an empty directory or an
 * earlier output (*replace). Creates DIR's parent directories. */
static int check_out_dir(const char *dir, bool *replace) {
    struct stat sb;
    *replace = false;
    if (!*dir) { fm_cli_error("run: --output needs a directory name"); return 2; }
    if (lstat(dir, &sb) == 0) {
        DIR *d = S_ISDIR(sb.st_mode) ? opendir(dir) : NULL;
        if (!S_ISDIR(sb.st_mode)) {
            fm_cli_error("run: --output %s exists and is not a directory; not replacing it (choose a new path)", dir);
            return 1;
        }
        if (!d) { fm_cli_error("run: --output %s: %s", dir, strerror(errno)); return 1; }
        int n = 0;
        struct dirent *e;
        while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
        closedir(d);
        if (n && !(*replace = is_earlier_output(dir))) {
            fm_cli_error("run: --output %s is a directory holding files that no earlier `fathom run --output` wrote "
                         "(no %s lists them); not replacing it (choose a new or empty directory)", dir, RUN_MANIFEST);
            return 1;
        }
        return 0;
    }
    if (errno != ENOENT) { fm_cli_error("run: --output %s: %s", dir, strerror(errno)); return 1; }
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    size_t len = strlen(parent);
    while (len > 1 && parent[len - 1] == '/') parent[--len] = 0;
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        if (fm_mkdir_p(parent)) { fm_cli_error("run: %s", fm_last_error()); return 1; }
    }
    return 0;
}

/* Writes every output to DIR as one unit: DIR.tmp.<pid>/<name>.npy and
 * outputs.json, then one rename (or exchange with the earlier DIR). */
static int write_outputs(const run_target *m, fm_tensor **outs, const char *model, const char *out_dir, bool replace) {
    int n = n_outputs(m);
    fm_dir_writer *w = fm_dir_writer_begin(out_dir, replace, "run --output");
    if (!w) { fm_cli_error("run: %s", fm_last_error()); return 1; }
    char (*fns)[208] = calloc((size_t)(n ? n : 1), sizeof *fns);
    json_t *root = json_object(), *arr = json_array();
    json_object_set_new(root, "fathom", json_string("run"));
    json_object_set_new(root, "model", json_string(model));
    int rc = fns ? 0 : 1;
    if (!fns) fm_cli_error("run: out of host memory");
    for (int i = 0; i < n && !rc; i++) {
        const char *name = output_name(m, i);
        char base[208], fn[208], path[4096];
        file_name(name, base, sizeof base);
        snprintf(fn, sizeof fn, "%s", base);
        /* two names that make the same file name (a/b and a_b): the later one gets a number */
        for (int j = 0, k = 1; j < i; j++)
            if (!strcmp(fns[j], fn)) snprintf(fn, sizeof fn, "%.190s_%d", base, k++), j = -1;
        snprintf(fns[i], sizeof fns[i], "%s", fn);
        snprintf(path, sizeof path, "%s/%s.npy", fm_dir_writer_path(w), fn);
        if (fm_npy_write(path, outs[i])) { fm_cli_error("run: output '%s': %s", name, fm_last_error()); rc = 1; break; }
        json_t *o = json_object(), *shape = json_array();
        char file[216];
        snprintf(file, sizeof file, "%s.npy", fn);
        json_object_set_new(o, "name", json_string(name));
        json_object_set_new(o, "file", json_string(file));
        json_object_set_new(o, "dtype", json_string(fm_dtype_name(outs[i]->dtype)));
        for (int d = 0; d < outs[i]->ndim; d++) json_array_append_new(shape, json_integer(outs[i]->shape[d]));
        json_object_set_new(o, "shape", shape);
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "outputs", arr);
    if (!rc) {
        char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER), path[4096];
        snprintf(path, sizeof path, "%s/" RUN_MANIFEST, fm_dir_writer_path(w));
        fm_io_chunk c[2] = {{text, text ? strlen(text) : 0}, {"\n", 1}};
        if (!text) { fm_cli_error("run: out of host memory"); rc = 1; }
        else if (fm_atomic_write(path, 2, c)) { fm_cli_error("run: %s", fm_last_error()); rc = 1; }
        free(text);
    }
    json_decref(root);
    if (rc) {
        fm_dir_writer_abort(w);
        fm_cli_error("run: %s was not written; any previous version is unchanged", out_dir);
    } else if (fm_dir_writer_commit(w)) {
        fm_cli_error("run: %s", fm_last_error());
        rc = 1;
    } else {
        for (int i = 0; i < n; i++) printf("%s: wrote %s/%s.npy\n", output_name(m, i), out_dir, fns[i]);
    }
    free(fns);
    return rc;
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

static int emit(const run_target *m, fm_tensor **outs, const char *model, const char *out_dir, bool replace, bool json) {
    if (out_dir) return write_outputs(m, outs, model, out_dir, replace);
    int n = n_outputs(m);
    json_t *arr = json ? json_array() : NULL;
    for (int i = 0; i < n; i++) {
        const char *name = output_name(m, i);
        if (json) json_array_append_new(arr, tensor_json(name, outs[i]));
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

/* Loads MODEL: a graph directory, or else an ONNX file. */
static int load_target(const char *model, run_target *t, fm_device dev) {
    struct stat sb;
    if (stat(model, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (!fm_graph_dir_is_graph(model)) {
            fm_cli_error("run: %s is a directory without a graph.json: give an .onnx file or a graph directory "
                         "(`fathom import`, `fathom compile`)", model);
            return 1;
        }
        t->graph = fm_graph_load(model);
        if (t->graph && dev.type != FM_DEV_CPU && fm_graph_to_device(t->graph, dev)) {
            fm_cli_error("run: %s to the device: %s", model, fm_last_error());
            return 1;
        }
    } else t->onnx = fm_onnx_load(model);
    if (!t->graph && !t->onnx) { fm_cli_error("%s", fm_last_error()); return 1; }
    return 0;
}

static fm_status run_target_run(const run_target *t, int n_in, const char *const *names, fm_tensor *const *ins, fm_tensor **outs) {
    if (t->onnx) return fm_onnx_run(t->onnx, n_in, names, ins, outs);
    const char *on[256];
    for (int i = 0; i < n_outputs(t); i++) on[i] = output_name(t, i);
    return fm_graph_run_named(t->graph, n_in, names, ins, n_outputs(t), on, outs);
}

static int run_model(const char *model, int n_in, char **specs, const char *out_dir, bool json, fm_device dev, long long max_iter) {
    bool replace = false;
    int crc = out_dir ? check_out_dir(out_dir, &replace) : 0;
    if (crc) return crc;
    run_target m = {0};
    int rc = load_target(model, &m, dev);
    if (!rc && m.onnx && max_iter) fm_onnx_set_max_iterations(m.onnx, max_iter);
    const char *names[MAX_RUN_INPUTS];
    fm_tensor *ins[MAX_RUN_INPUTS] = {0}, *outs[256] = {0};
    if (!rc && n_outputs(&m) > 256) { fm_cli_error("run: %s has more than 256 outputs", model); rc = 1; }
    for (int i = 0; i < n_in && !rc; i++) {
        char *eq = strchr(specs[i], '=');
        const char *path = eq ? eq + 1 : specs[i];
        if (eq) *eq = 0;
        names[i] = eq ? specs[i] : io_name(&m, 0, false);
        if (!eq && n_inputs(&m) != 1) {
            fm_cli_error("run: --input %s: the model has %d inputs; give them as NAME=FILE", specs[i], n_inputs(&m));
            rc = 2;
        } else if (!(ins[i] = read_array(path))) {
            fm_cli_error("run: input '%s': %s", names[i] ? names[i] : "", fm_last_error());
            rc = 1;
        } else if (dev.type != FM_DEV_CPU) {
            fm_tensor *d = fm_tensor_to(ins[i], dev);
            fm_tensor_release(ins[i]);
            if (!(ins[i] = d)) { fm_cli_error("run: input '%s' to the device: %s", names[i] ? names[i] : "", fm_last_error()); rc = 1; }
        }
    }
    if (!rc && run_target_run(&m, n_in, names, ins, outs)) { fm_cli_error("%s", fm_last_error()); rc = 1; }
    for (int i = 0; !rc && i < n_outputs(&m); i++) { /* back to the host to print or write */
        fm_tensor *h = outs[i] && outs[i]->storage->device.type != FM_DEV_CPU ? fm_tensor_to(outs[i], FM_CPU) : NULL;
        if (outs[i] && outs[i]->storage->device.type != FM_DEV_CPU && !h) { fm_cli_error("run: output %d: %s", i, fm_last_error()); rc = 1; }
        if (h) fm_tensor_release(outs[i]), outs[i] = h;
    }
    if (!rc) rc = emit(&m, outs, model, out_dir, replace, json);
    for (int i = 0; i < n_in; i++) fm_tensor_release(ins[i]);
    for (int i = 0; (m.onnx || m.graph) && i < n_outputs(&m) && i < 256; i++) fm_tensor_release(outs[i]);
    fm_onnx_free(m.onnx);
    fm_graph_free(m.graph);
    return rc;
}

int fm_cmd_run(int argc, char **argv) {
    const char *model = NULL, *out_dir = NULL;
    char *specs[MAX_RUN_INPUTS];
    int n_in = 0;
    bool json = false;
    long long max_iter = 0;
    fm_device dev = FM_CPU;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { run_usage(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--max-iterations")) {
            if (!fm_cli_parse_int("run", a, i + 1 < argc ? argv[++i] : NULL, 1, &max_iter)) { run_usage(stderr); return 2; }
            continue;
        }
        if (!strcmp(a, "--device") || !strncmp(a, "--device=", 9)) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            int drc = fm_cli_device("run", v, &dev);
            if (drc) return drc;
            continue;
        }
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
    return run_model(model, n_in, specs, out_dir, json, dev, max_iter);
}
