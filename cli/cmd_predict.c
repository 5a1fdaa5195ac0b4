/* `fathom predict MODEL_DIR INPUT...`: class predictions for images or arrays
 * (idx, .npy, PNG), one line (or JSON record) per sample. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "commands.h"
#include "device_arg.h"
#include "fathom/recipe.h"
#include "fathom/amp.h" /* fm_autocast_set */
#include "fathom/autograd.h"
#include "fathom/graph.h"

static const char *fashion_classes[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                          "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

static void predict_usage(FILE *f) {
    fprintf(f, "usage: fathom predict MODEL_DIR INPUT... [--device D] [--precision P] [--json]\n\n"
               "Runs a model saved by `fathom train` (or a graph of one made by `fathom compile`)\n"
               "on inputs: idx files (raw or .gz),\n"
               ".npy arrays, PNG images or .csv tables (one sample a row) whose size matches\n"
               "the model's input; a model whose first layer is an embedding takes token ids\n"
               "(whole numbers below its table's size) in .npy or .csv. An input\n"
               "holding several samples ([N, ...]) gives one prediction per sample. u8 arrays\n"
               "are scaled to [0, 1] as the training data was; an RGB PNG for a one-channel\n"
               "model is converted to grey.\n\n"
               "  --device D  where to run the model: cpu (default), cuda, cuda:N, check\n"
               "  --precision P  fp32 (default), bf16 or fp16: the forward autocast to that dtype, as\n"
               "              `fathom train --precision P` runs it (not for graphs)\n"
               "  --json      print one JSON object on stdout\n");
}

static bool is_png(const char *path) {
    unsigned char h[8] = {0};
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(h, 1, sizeof h, f) : 0;
    if (f) fclose(f);
    return got == 8 && !memcmp(h, "\x89PNG\r\n\x1a\n", 8);
}

static bool is_csv(const char *path) {
    size_t n = strlen(path);
    return n > 4 && !strcasecmp(path + n - 4, ".csv");
}

/* A CSV input: one sample a row, every column an input value (token ids for a model whose first
 * layer is an embedding), so a row must hold exactly one sample: a label column left in is refused. */
static fm_tensor *read_csv(const char *path, const fm_recipe *r) {
    fm_csv_options co;
    fm_csv_options_init(&co);
    fm_tensor *x = NULL;
    if (fm_csv_read(path, &co, &x, NULL) != FM_OK) return NULL;
    int64_t per = 1;
    for (int i = 0; i < r->input_ndim; i++) per *= r->input_shape[i];
    if (x->ndim == 2 && x->shape[1] == per) return x;
    fm_set_error(FM_ERR_INVALID, "%s: %lld columns, but the model takes %lld values per sample (one sample a row; "
                 "leave out the label column)", path, (long long)(x->ndim == 2 ? x->shape[1] : 0), (long long)per);
    fm_tensor_release(x);
    return NULL;
}

/* A PNG's channels made the model's: an RGB (or grey+alpha-stripped RGB) image for a
 * one-channel model becomes grey with ITU-R 601 weights (as PIL's convert("L")); a
 * grey image for a three-channel model is refused. Takes over x. */
static fm_tensor *png_channels(fm_tensor *x, const fm_recipe *r, const char *path) {
    if (x->ndim != 3 || r->input_ndim != 3 || x->shape[0] == r->input_shape[0]) return x;
    if (x->shape[0] == 3 && r->input_shape[0] == 1) {
        int64_t hw = x->shape[1] * x->shape[2], shape[3] = {1, x->shape[1], x->shape[2]};
        fm_tensor *g = fm_tensor_empty(3, shape, FM_F32, FM_CPU), *c = fm_contiguous(x);
        if (g && c) {
            const float *s = fm_tensor_data(c);
            float *d = fm_tensor_data(g);
            for (int64_t i = 0; i < hw; i++) d[i] = 0.299f * s[i] + 0.587f * s[hw + i] + 0.114f * s[2 * hw + i];
        }
        fm_tensor_release_n(2, x, c);
        return g;
    }
    fm_set_error(FM_ERR_INVALID, "%s: a %lld-channel PNG, but the model takes %lld channels (convert the image first)", path,
                 (long long)x->shape[0], (long long)r->input_shape[0]);
    fm_tensor_release(x);
    return NULL;
}

/* Reshapes a read input to [N, input...] for the model, or fails naming both shapes. */
static fm_tensor *as_batch(fm_tensor *x, const fm_recipe *r, const char *path) {
    int64_t per = 1;
    for (int i = 0; i < r->input_ndim; i++) per *= r->input_shape[i];
    int64_t n = fm_tensor_numel(x);
    if (per == 0 || n == 0 || n % per) {
        char s1[96], s2[96];
        fm_set_error(FM_ERR_INVALID, "%s: input of shape %s does not fit the model's input %s", path,
                     fm_shape_str(x->ndim, x->shape, s1, sizeof s1), fm_shape_str(r->input_ndim, r->input_shape, s2, sizeof s2));
        return NULL;
    }
    int64_t shape[FM_MAX_DIMS];
    shape[0] = n / per;
    for (int i = 0; i < r->input_ndim; i++) shape[i + 1] = r->input_shape[i];
    if (fm_recipe_token_vocab(r) > 0) { /* an embedding first: token ids, checked, as they are */
        fm_tensor *ids = fm_recipe_token_ids(r, x, path), *b = ids ? fm_reshape(ids, r->input_ndim + 1, shape) : NULL;
        fm_tensor_release(ids);
        return b;
    }
    fm_tensor *f = fm_to_dtype(x, FM_F32);
    fm_tensor *b = f ? fm_reshape(f, r->input_ndim + 1, shape) : NULL;
    fm_tensor_release(f);
    if (b && r->transforms.normalize_channels) {
        fm_tensor *c = fm_add_scalar(b, -r->transforms.mean[0]);
        fm_tensor *d = c ? fm_mul_scalar(c, 1.0 / r->transforms.std[0]) : NULL;
        fm_tensor_release_n(2, b, c);
        b = d;
    }
    return b;
}

int fm_cmd_predict(int argc, char **argv) {
    const char *dir = NULL;
    bool json = false;
    int n_inputs = 0;
    fm_device dev = FM_CPU;
    fm_dtype prec = FM_F32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { predict_usage(stdout); return 0; }
        if (!strcmp(argv[i], "--precision") || !strncmp(argv[i], "--precision=", 12)) {
            const char *v = argv[i][11] == '=' ? argv[i] + 12 : (i + 1 < argc ? argv[++i] : NULL);
            int prc = fm_cli_precision("predict", v, &prec);
            if (prc) return prc;
            continue;
        }
        if (!strcmp(argv[i], "--json")) { json = true; continue; }
        if (!strcmp(argv[i], "--device") || !strncmp(argv[i], "--device=", 9)) {
            const char *v = argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[++i] : NULL);
            int drc = fm_cli_device("predict", v, &dev);
            if (drc) return drc;
            continue;
        }
        if (argv[i][0] == '-') {
            static const char *const flags[] = {"--help", "--json", "--device", "--precision"};
            fm_cli_unknown_option("predict", argv[i], flags, 4);
            predict_usage(stderr);
            return 2;
        }
        if (!dir) dir = argv[i];
        else n_inputs++;
    }
    if (!dir || !n_inputs) {
        fm_cli_error("predict: %s", dir ? "no inputs given" : "no model directory given");
        predict_usage(stderr);
        return 2;
    }
    if (fm_cli_refuse_onnx("predict", dir)) return 1;
    fm_recipe r;
    fm_module *m = NULL;
    fm_graph *g = NULL; /* a graph directory runs as the model it was made from */
    if (fm_graph_dir_is_graph(dir)) {
        if (fm_cli_precision_for_graph("predict", dir, prec)) return 2;
        if (!(g = fm_graph_load(dir))) { fm_cli_error("%s: %s", dir, fm_last_error()); return 1; }
    }
    if (fm_cli_classifier_open(dir, g, dev, &r, &m)) return 1;
    bool fashion = !strcmp(r.dataset, "fashion-mnist");
    json_t *arr = json_array();
    int rc = 0;
    bool prev = fm_set_grad_enabled(false);
    bool seen_dir = false;
    for (int i = 1; i < argc && rc == 0; i++) {
        if (!strcmp(argv[i], "--device") || !strcmp(argv[i], "--precision")) { i++; continue; } /* and its value */
        if (argv[i][0] == '-') continue;
        if (!seen_dir) { seen_dir = true; continue; }
        const char *path = argv[i];
        fm_tensor *x = is_csv(path) ? read_csv(path, &r) : fm_data_read(path);
        if (x && is_png(path)) x = png_channels(x, &r, path);
        fm_tensor *b = x ? as_batch(x, &r, path) : NULL;
        fm_tensor *bd = b ? fm_tensor_to(b, dev) : NULL; /* the batch to the model's device */
        fm_dtype prev_ac = fm_autocast_set(prec); /* fp32: off */
        fm_tensor *logits = bd ? (g ? fm_graph_run1(g, bd) : fm_module_forward(m, bd)) : NULL;
        fm_autocast_set(prev_ac);
        fm_tensor *pd = logits ? fm_softmax(logits, 1) : NULL;
        fm_tensor *prob = pd ? fm_tensor_to(pd, FM_CPU) : NULL; /* read on the host */
        fm_tensor_release_n(2, bd, pd);
        if (!prob) {
            fm_cli_error("%s", fm_last_error());
            rc = 1;
        } else {
            int64_t N = prob->shape[0], C = prob->shape[1];
            for (int64_t s = 0; s < N; s++) {
                int64_t best = 0;
                double bp = -1;
                for (int64_t c = 0; c < C; c++) {
                    double p = fm_tensor_get(prob, s * C + c);
                    if (p > bp) { bp = p; best = c; }
                }
                const char *label = fashion && best < 10 ? fashion_classes[best] : NULL;
                if (json) {
                    json_t *o = json_object();
                    json_object_set_new(o, "input", json_string(path));
                    json_object_set_new(o, "index", json_integer(s));
                    json_object_set_new(o, "class", json_integer(best));
                    if (label) json_object_set_new(o, "label", json_string(label));
                    json_object_set_new(o, "probability", json_real(bp));
                    json_array_append_new(arr, o);
                } else {
                    printf("%s", path);
                    if (N > 1) printf("[%lld]", (long long)s);
                    printf(": class %lld", (long long)best);
                    if (label) printf(" (%s)", label);
                    printf(" p=%.3f\n", bp);
                }
            }
        }
        fm_tensor_release_n(4, x, b, logits, prob);
    }
    fm_set_grad_enabled(prev);
    if (json && rc == 0) {
        json_t *j = json_object();
        json_object_set_new(j, "model_path", json_string(dir));
        json_object_set_new(j, "precision", json_string(fm_precision_name(prec)));
        json_object_set_new(j, "predictions", arr);
        char *s = json_dumps(j, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        json_decref(arr);
    }
    fm_module_free(m);
    fm_graph_free(g);
    fm_recipe_free(&r);
    return rc;
}
