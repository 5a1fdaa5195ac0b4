/* Recipe files: parsing (libinih) and building the model they describe.
 *
 * inih reports only the line of a syntax error, so lines are counted in a
 * custom reader; every value error then names file:line and the expected form.
 * Layers are listed one per `layer =` line; input sizes (in_features,
 * in_channels) are inferred from the running shape, so a recipe states only
 * what a reader needs, and a stack that cannot fit is caught while building. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <ini.h>

#include "fathom/recipe.h"
#include "io/io_internal.h" /* fm_ini_text: inih over text, long lines refused */

#ifndef FATHOM_DATA_DIR
#define FATHOM_DATA_DIR "data"
#endif
#ifndef FATHOM_INSTALL_DATA_DIR
#define FATHOM_INSTALL_DATA_DIR "/usr/local/share/fathom"
#endif

/* Whether a layer spec ("embedding 256 16") is of that kind: its first word, whole. */
static bool spec_is(const char *spec, const char *kind) {
    size_t n = strlen(kind);
    return !strncmp(spec, kind, n) && (spec[n] == 0 || spec[n] == ' ' || spec[n] == '\t');
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

const char *fm_recipe_dir(char *buf, size_t n) {
    const char *env = getenv("FATHOM_DATA");
    if (env && *env) {
        snprintf(buf, n, "%s/recipes", env);
        if (is_dir(buf)) return buf;
    }
    snprintf(buf, n, "%s/recipes", FATHOM_DATA_DIR);
    if (is_dir(buf)) return buf;
    snprintf(buf, n, "%s/recipes", FATHOM_INSTALL_DATA_DIR);
    return buf;
}

bool fm_recipe_resolve(const char *name_or_path, char *buf, size_t n) {
    if (strchr(name_or_path, '/') || strstr(name_or_path, ".ini")) {
        snprintf(buf, n, "%s", name_or_path);
        return false;
    }
    char dir[PATH_MAX - 80];
    snprintf(buf, n, "%s/%.64s.ini", fm_recipe_dir(dir, sizeof dir), name_or_path);
    return true;
}

/* ---------------- parsing ---------------- */

typedef struct parse_ctx {
    fm_recipe *r;
    fm_ini_text src; /* src.line: the line inih is on (it reports only syntax errors' lines) */
    int err_line;
    char err[400];
} parse_ctx;

static char *reader(char *str, int num, void *stream) {
    parse_ctx *c = stream;
    return fm_ini_text_reader(str, num, &c->src);
}

static int fail(parse_ctx *c, const char *fmt, ...) {
    if (c->err_line) return 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    c->err_line = c->src.line;
    return 0;
}

static bool parse_i64(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s) return false;
    while (isspace((unsigned char)*end)) end++;
    if (*end) return false;
    *out = v;
    return true;
}

/* A finite number (inf and nan are refused: no recipe value means them). */
static bool parse_f64(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v)) return false;
    while (isspace((unsigned char)*end)) end++;
    if (*end) return false;
    *out = v;
    return true;
}

static bool parse_bool(const char *s, bool *out) {
    if (!strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcmp(s, "1") || !strcasecmp(s, "on")) { *out = true; return true; }
    if (!strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcmp(s, "0") || !strcasecmp(s, "off")) { *out = false; return true; }
    return false;
}

/* Up to max numbers separated by spaces, commas or 'x' ("1 28 28", "1x28x28"). */
static int parse_list(const char *s, double *out, int max) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    int n = 0;
    for (char *tok = strtok(buf, " ,x\t"); tok; tok = strtok(NULL, " ,x\t")) {
        if (n == max || !parse_f64(tok, &out[n])) return -1;
        n++;
    }
    return n;
}

/* Integers are range-checked against the field they are stored in (an int
 * field refuses 4294967296 instead of wrapping it to 0). */
#define FIELD_MAX(field) (sizeof(field) < sizeof(int64_t) ? (int64_t)INT_MAX : INT64_MAX)
#define WANT_INT(field, lo, what) do { int64_t _v; if (!parse_i64(value, &_v) || _v < (lo) || _v > FIELD_MAX(field)) \
    { return fail(c, "%s.%s: expected %s, at most %" PRId64 ", got '%s'", section, name, what, FIELD_MAX(field), value); } \
    field = _v; } while (0)
#define WANT_NUM(field, lo, what) do { double _v; if (!parse_f64(value, &_v) || !(_v >= (lo))) \
    { return fail(c, "%s.%s: expected %s, got '%s'", section, name, what, value); } \
    field = _v; } while (0)
#define WANT_BOOL(field) do { bool _v; if (!parse_bool(value, &_v)) \
    { return fail(c, "%s.%s: expected true or false, got '%s'", section, name, value); } \
    field = _v; } while (0)
#define WANT_STR(field) do { if (strlen(value) >= sizeof(field)) { \
    return fail(c, "%s.%s: value too long", section, name); } \
    snprintf(field, sizeof(field), "%s", value); } while (0)

/* One key of [data]. */
static int data_key(parse_ctx *c, fm_recipe *r, const char *section, const char *name, const char *value) {
    if (!strcmp(name, "dataset")) {
        if (strcmp(value, "fashion-mnist") && strcmp(value, "mnist") && strcmp(value, "idx") && strcmp(value, "csv"))
            return fail(c, "data.dataset: expected fashion-mnist, mnist, idx or csv, got '%s'", value);
        WANT_STR(r->dataset);
    } else if (!strcmp(name, "path")) WANT_STR(r->data_dir);
    else if (!strcmp(name, "train_csv")) WANT_STR(r->train_csv);
    else if (!strcmp(name, "test_csv")) WANT_STR(r->test_csv);
    else if (!strcmp(name, "label_column")) WANT_STR(r->label_column);
    else if (!strcmp(name, "train_images")) WANT_STR(r->train_images);
    else if (!strcmp(name, "train_labels")) WANT_STR(r->train_labels);
    else if (!strcmp(name, "test_images")) WANT_STR(r->test_images);
    else if (!strcmp(name, "test_labels")) WANT_STR(r->test_labels);
    else if (!strcmp(name, "limit")) WANT_INT(r->limit, 0, "a sample count >= 0");
    else if (!strcmp(name, "test_limit")) WANT_INT(r->test_limit, 0, "a sample count >= 0");
    else if (!strcmp(name, "workers")) {
        WANT_INT(r->workers, 0, "a thread count >= 0");
        if (r->workers > 256) return fail(c, "data.workers: expected a thread count in [0, 256], got '%s'", value);
    }
    else if (!strcmp(name, "crop_padding")) WANT_INT(r->transforms.crop_padding, 0, "padding >= 0");
    else if (!strcmp(name, "hflip")) WANT_BOOL(r->transforms.hflip);
    else if (!strcmp(name, "normalize")) {
        double v[2];
        if (parse_list(value, v, 2) != 2 || !(v[1] > 0) || !(fabs(v[0]) < 1e30 && v[1] < 1e30))
            return fail(c, "data.normalize: expected 'MEAN STD' with 0 < STD < 1e30 and |MEAN| < 1e30, got '%s'", value);
        r->transforms.normalize_channels = 1;
        r->transforms.mean[0] = (float)v[0];
        r->transforms.std[0] = (float)v[1];
    } else return fail(c, "unknown key '%s' in [data] (expected dataset, path, train_images, train_labels, "
                          "test_images, test_labels, train_csv, test_csv, label_column, limit, test_limit, workers, "
                          "normalize, crop_padding, hflip)", name);
    return 1;
}

static int handler(void *user, const char *section, const char *name, const char *value) {
    parse_ctx *c = user;
    fm_recipe *r = c->r;
    if (!strcmp(section, "data")) {
        return data_key(c, r, section, name, value);
    } else if (!strcmp(section, "model")) {
        if (!strcmp(name, "input")) {
            double v[FM_MAX_DIMS - 1];
            int n = parse_list(value, v, FM_MAX_DIMS - 1);
            if (n < 1) return fail(c, "model.input: expected the sample shape, e.g. '1 28 28', got '%s'", value);
            for (int i = 0; i < n; i++) {
                if (!(v[i] >= 1 && v[i] <= (double)(1ll << 40)) || v[i] != (double)(int64_t)v[i])
                    return fail(c, "model.input: sizes must be positive integers, got '%s'", value);
                r->input_shape[i] = (int64_t)v[i];
            }
            r->input_ndim = n;
        } else if (!strcmp(name, "layer")) {
            if (r->n_layers == FM_RECIPE_MAX_LAYERS) return fail(c, "model: more than %d layers", FM_RECIPE_MAX_LAYERS);
            if (!*value) return fail(c, "model.layer: expected a layer, e.g. 'linear 10'");
            if (strlen(value) >= sizeof r->layers[0].spec)
                return fail(c, "model.layer: longer than %d characters: '%.40s...'", (int)sizeof r->layers[0].spec - 1, value);
            /* an embedding looks up token ids, which only the data give: a layer before it turns them into
             * floats (the lookup would fail at the first batch, or an export would take a float input) */
            if (r->n_layers > 0 && spec_is(value, "embedding"))
                return fail(c, "layer '%s' comes after %d other layer%s, but an embedding takes the token ids of "
                            "the data and only the first layer gets them: make it the first 'layer =' line (after "
                            "a layer the values are vectors, not ids)", value, r->n_layers, r->n_layers == 1 ? "" : "s");
            fm_recipe_layer *l = &r->layers[r->n_layers++];
            snprintf(l->spec, sizeof l->spec, "%s", value);
            l->line = c->src.line;
        } else if (!strcmp(name, "init")) {
            static const char *inits[] = {"default", "kaiming", "xavier", "normal"};
            int k = -1;
            for (int i = 0; i < 4; i++)
                if (!strcmp(value, inits[i])) k = i;
            if (k < 0) return fail(c, "model.init: expected default, kaiming, xavier or normal, got '%s'", value);
            r->init = (fm_init_kind)k;
        } else return fail(c, "unknown key '%s' in [model] (expected input, layer, init)", name);
    } else if (!strcmp(section, "train")) {
        if (!strcmp(name, "epochs")) WANT_INT(r->epochs, 1, "a number of epochs >= 1");
        else if (!strcmp(name, "batch")) WANT_INT(r->batch_size, 1, "a batch size >= 1");
        else if (!strcmp(name, "seed")) { int64_t s; WANT_INT(s, 0, "a seed >= 0"); r->seed = (uint64_t)s; }
        else if (!strcmp(name, "label_smoothing")) {
            WANT_NUM(r->label_smoothing, 0, "a number in [0, 1)");
            if (!(r->label_smoothing < 1)) return fail(c, "train.label_smoothing: expected a number in [0, 1), got '%s'", value);
        }
        else if (!strcmp(name, "clip_grad_norm")) WANT_NUM(r->clip_grad_norm, 0, "a norm >= 0 (0: off)");
        else if (!strcmp(name, "checkpoint_every")) WANT_INT(r->checkpoint_every, 0, "a step count >= 0");
        else if (!strcmp(name, "threads")) {
            WANT_INT(r->threads, 0, "a thread count >= 0");
            if (r->threads > 256) return fail(c, "train.threads: expected a thread count in [0, 256], got '%s'", value);
        }
        else if (!strcmp(name, "keep_checkpoints")) WANT_INT(r->keep_checkpoints, 1, "a count >= 1");
        else if (!strcmp(name, "divergence_factor")) WANT_NUM(r->divergence_factor, 0, "a factor >= 0 (0: off)");
        else return fail(c, "unknown key '%s' in [train] (expected epochs, batch, seed, label_smoothing, "
                            "clip_grad_norm, checkpoint_every, keep_checkpoints, divergence_factor, threads)", name);
    } else if (!strcmp(section, "optimizer")) {
        if (!strcmp(name, "name")) {
            fm_optim_kind k;
            if (fm_optim_kind_parse(value, &k) != FM_OK)
                return fail(c, "optimizer.name: expected sgd, adam or adamw, got '%s'", value);
            double lr = r->optim.lr, wd = r->optim.weight_decay, mom = r->optim.momentum;
            bool nest = r->optim.nesterov;
            r->optim = fm_optim_default_config(k);
            /* keys given before `name` keep their values */
            if (lr > 0) r->optim.lr = lr;
            if (wd > 0) r->optim.weight_decay = wd;
            r->optim.momentum = mom;
            r->optim.nesterov = nest;
        } else if (!strcmp(name, "lr")) WANT_NUM(r->optim.lr, 0, "a learning rate >= 0");
        else if (!strcmp(name, "weight_decay")) WANT_NUM(r->optim.weight_decay, 0, "a weight decay >= 0");
        else if (!strcmp(name, "momentum")) WANT_NUM(r->optim.momentum, 0, "a momentum >= 0");
        else if (!strcmp(name, "nesterov")) WANT_BOOL(r->optim.nesterov);
        else if (!strcmp(name, "eps")) WANT_NUM(r->optim.eps, 0, "an epsilon >= 0");
        else if (!strcmp(name, "betas")) {
            double v[2];
            if (parse_list(value, v, 2) != 2 || !(v[0] >= 0 && v[0] < 1 && v[1] >= 0 && v[1] < 1))
                return fail(c, "optimizer.betas: expected 'BETA1 BETA2' in [0, 1), got '%s'", value);
            r->optim.beta1 = v[0];
            r->optim.beta2 = v[1];
        } else return fail(c, "unknown key '%s' in [optimizer] (expected name, lr, weight_decay, momentum, nesterov, "
                              "betas, eps)", name);
    } else if (!strcmp(section, "schedule")) {
        if (!strcmp(name, "name")) {
            if (fm_sched_kind_parse(value, &r->sched.kind) != FM_OK)
                return fail(c, "schedule.name: expected constant, step, warmup or cosine, got '%s'", value);
        } else if (!strcmp(name, "warmup_steps")) WANT_INT(r->sched.warmup_steps, 0, "a step count >= 0");
        else if (!strcmp(name, "total_steps")) WANT_INT(r->sched.total_steps, 0, "a step count >= 0");
        else if (!strcmp(name, "step_size")) WANT_INT(r->sched.step_size, 1, "a step count >= 1");
        else if (!strcmp(name, "gamma")) WANT_NUM(r->sched.gamma, 0, "a factor >= 0");
        else if (!strcmp(name, "min_lr")) WANT_NUM(r->sched.min_lr, 0, "a learning rate >= 0");
        else return fail(c, "unknown key '%s' in [schedule] (expected name, warmup_steps, total_steps, step_size, "
                            "gamma, min_lr)", name);
    } else {
        return fail(c, "unknown section [%s] (expected [data], [model], [train], [optimizer] or [schedule])", section);
    }
    return 1;
}

void fm_recipe_free(fm_recipe *r) {
    if (!r) return;
    free(r->text);
    r->text = NULL;
}

fm_status fm_recipe_parse(const char *text, const char *path, fm_recipe *r) {
    memset(r, 0, sizeof *r);
    snprintf(r->path, sizeof r->path, "%s", path ? path : "<string>");
    const char *base = strrchr(r->path, '/');
    snprintf(r->name, sizeof r->name, "%.63s", base ? base + 1 : r->path);
    char *dot = strstr(r->name, ".ini");
    if (dot) *dot = 0;
    snprintf(r->dataset, sizeof r->dataset, "fashion-mnist");
    r->epochs = 1;
    r->batch_size = 64;
    r->optim = fm_optim_default_config(FM_OPTIM_SGD);
    r->sched.kind = FM_SCHED_CONSTANT;
    r->sched.gamma = 0.1;
    r->workers = 1;
    r->keep_checkpoints = 2;
    r->divergence_factor = 1e3;
    r->text = strdup(text);
    if (!r->text) return fm_set_error(FM_ERR_OOM, "out of host memory");
    parse_ctx c;
    memset(&c, 0, sizeof c);
    c.r = r;
    c.src.text = text;
    int line = ini_parse_stream(reader, &c, handler, &c);
    if (c.src.long_line && !c.err_line) {
        fm_recipe_free(r);
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: the line is longer than %d characters (the most a recipe line may "
                            "have): shorten it or move its comment to a line of its own", r->path, c.src.long_line,
                            c.src.max_len);
    }
    if (c.err_line) {
        fm_recipe_free(r);
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: %s", r->path, c.err_line, c.err);
    }
    if (line != 0) {
        fm_recipe_free(r);
        return fm_set_error(FM_ERR_FORMAT, "%s:%d: expected 'key = value', '[section]' or a comment", r->path,
                            line < 0 ? c.src.line : line);
    }
    if (!r->input_ndim || !r->n_layers) {
        fm_recipe_free(r);
        return fm_set_error(FM_ERR_FORMAT, "%s: the [model] section needs 'input = ...' and at least one 'layer = ...'",
                            r->path);
    }
    if (!strcmp(r->dataset, "idx") && (!r->train_images[0] || !r->train_labels[0])) {
        fm_recipe_free(r);
        return fm_set_error(FM_ERR_FORMAT, "%s: dataset = idx needs train_images and train_labels in [data]", r->path);
    }
    if (!strcmp(r->dataset, "csv") && !r->train_csv[0]) {
        fm_recipe_free(r);
        return fm_set_error(FM_ERR_FORMAT, "%s: dataset = csv needs train_csv in [data] (and test_csv for the test set)",
                            r->path);
    }
    r->sched.base_lr = r->optim.lr;
    return FM_OK;
}

fm_status fm_recipe_load(const char *name_or_path, fm_recipe *out) {
    char path[PATH_MAX];
    bool builtin = fm_recipe_resolve(name_or_path, path, sizeof path);
    fm_status st;
    const char *why;
    char *buf = fm_read_text_file(path, 1 << 20, NULL, &st, &why);
    if (!buf) {
        if (st == FM_ERR_IO && builtin)
            return fm_set_error(FM_ERR_IO, "no built-in recipe named '%s' (looked for %s; `fathom recipes` lists them)",
                                name_or_path, path);
        if (st == FM_ERR_IO) return fm_set_error(FM_ERR_IO, "cannot open recipe %s: %s", path, strerror(errno));
        if (st == FM_ERR_OOM) return fm_set_error(FM_ERR_OOM, "out of host memory");
        return fm_set_error(FM_ERR_FORMAT, "%s: not a recipe (%s)", path, why);
    }
    st = fm_recipe_parse(buf, path, out);
    free(buf);
    return st;
}

/* ---------------- building the model ---------------- */

static const char *layer_names =
    "linear, conv2d, batchnorm2d, layernorm, rmsnorm, embedding, dropout, relu, gelu, silu, tanh, sigmoid, "
    "maxpool2d, avgpool2d, flatten, meanpool";

typedef struct layer_args {
    int npos;
    double pos[4];
    char ptxt[4][32]; /* as written (for messages) */
    int nkw;
    char key[8][32];
    char val[8][32];
} layer_args;

static const char *kw(const layer_args *a, const char *key) {
    for (int i = 0; i < a->nkw; i++)
        if (!strcmp(a->key[i], key)) return a->val[i];
    return NULL;
}

/* What each layer takes: positional numbers (at least, at most; whole numbers in
 * [1, INT_MAX] unless `real`) and key=value options. Anything else is refused: an
 * option with a typo ('pading=1') or a stray number was ignored before. */
typedef struct layer_form { const char *kind; int min_pos, max_pos; bool real; const char *opts; } layer_form;
static const layer_form layer_forms[] = {
    {"linear", 1, 2, false, "bias"},
    {"conv2d", 2, 2, false, "stride padding bias in"},
    {"batchnorm2d", 0, 0, false, "eps momentum"},
    {"layernorm", 0, 0, false, "eps"},
    {"rmsnorm", 0, 0, false, "eps"},
    {"embedding", 2, 2, false, ""},
    {"dropout", 0, 1, true, ""},
    {"maxpool2d", 1, 1, false, "stride padding"},
    {"avgpool2d", 1, 1, false, "stride padding"},
};

static bool word_in(const char *words, const char *w) {
    size_t n = strlen(w);
    for (const char *p = words; (p = strstr(p, w)) != NULL; p += n)
        if ((p == words || p[-1] == ' ') && (p[n] == ' ' || !p[n])) return true;
    return false;
}

/* Checks a layer's arguments against its form; NULL when they fit, else why not. */
static const char *layer_args_misfit(const char *kind, const layer_args *a, char *why, size_t n) {
    const layer_form *f = NULL;
    for (size_t i = 0; i < sizeof layer_forms / sizeof layer_forms[0]; i++)
        if (!strcmp(layer_forms[i].kind, kind)) f = &layer_forms[i];
    static const layer_form simple = {"", 0, 0, false, ""};
    static const char *const simple_kinds = "relu gelu silu tanh sigmoid flatten meanpool";
    if (!f && !word_in(simple_kinds, kind)) return NULL; /* an unknown kind: refused by name below */
    if (!f) f = &simple;
    if (a->npos < f->min_pos || a->npos > f->max_pos) {
        if (f->min_pos == f->max_pos) snprintf(why, n, "%s takes %d number%s, got %d", kind, f->min_pos, f->min_pos == 1 ? "" : "s", a->npos);
        else snprintf(why, n, "%s takes %d to %d numbers, got %d", kind, f->min_pos, f->max_pos, a->npos);
        return why;
    }
    for (int i = 0; i < a->npos && !f->real; i++)
        if (!(a->pos[i] == floor(a->pos[i]) && a->pos[i] >= 1 && a->pos[i] <= INT_MAX)) {
            snprintf(why, n, "%s's sizes are whole numbers in [1, %d], got %s", kind, INT_MAX, a->ptxt[i]);
            return why;
        }
    for (int i = 0; i < a->nkw; i++) {
        const char *k = a->key[i], *v = a->val[i];
        if (!word_in(f->opts, k)) {
            if (*f->opts) snprintf(why, n, "unknown option '%s' (%s takes %s)", k, kind, f->opts);
            else snprintf(why, n, "unknown option '%s' (%s takes no options)", k, kind);
            return why;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(a->key[j], k)) { snprintf(why, n, "option '%s' is given twice", k); return why; }
        char *end;
        errno = 0;
        if (!strcmp(k, "bias")) {
            if (strcmp(v, "true") && strcmp(v, "false")) { snprintf(why, n, "bias must be true or false, got '%s'", v); return why; }
        } else if (!strcmp(k, "eps") || !strcmp(k, "momentum")) {
            double x = strtod(v, &end);
            bool eps = k[0] == 'e';
            if (errno || end == v || *end || !isfinite(x) || (eps ? !(x > 0) : !(x >= 0 && x <= 1))) {
                snprintf(why, n, "%s must be %s, got '%s'", k, eps ? "a number > 0" : "a number in [0, 1]", v);
                return why;
            }
        } else { /* stride, padding, in: whole numbers */
            long long x = strtoll(v, &end, 10);
            long long lo = !strcmp(k, "padding") ? 0 : 1;
            if (errno || end == v || *end || x < lo || x > INT_MAX) {
                snprintf(why, n, "%s must be a whole number in [%lld, %d], got '%s'", k, lo, INT_MAX, v);
                return why;
            }
        }
    }
    return NULL;
}

int64_t fm_recipe_token_vocab(const fm_recipe *r) {
    if (!r || r->n_layers < 1 || !spec_is(r->layers[0].spec, "embedding")) return 0;
    char *end;
    errno = 0;
    double v = strtod(r->layers[0].spec + 9, &end); /* checked as a whole number when the model is built */
    return errno == 0 && v >= 1 && v <= INT_MAX && v == floor(v) ? (int64_t)v : 0;
}

fm_tensor *fm_recipe_token_ids(const fm_recipe *r, fm_tensor *x, const char *what) {
    const int64_t V = fm_recipe_token_vocab(r);
    if (!V || !x) {
        fm_set_error(FM_ERR_INVALID, "%s: %s", what, !x ? "no data" : "the recipe's first layer is no embedding: it takes "
                     "no token ids");
        return NULL;
    }
    fm_tensor *h = fm_tensor_to(x, FM_CPU), *c = h ? fm_contiguous(h) : NULL;
    fm_tensor *out = c ? fm_tensor_empty(c->ndim, c->shape, FM_I64, FM_CPU) : NULL;
    fm_tensor_release(h);
    if (!out) { fm_tensor_release(c); return NULL; }
    int64_t n = fm_tensor_numel(c), per = c->ndim > 1 ? n / (c->shape[0] ? c->shape[0] : 1) : 1;
    int64_t *d = fm_tensor_data(out);
    for (int64_t i = 0; i < n; i++) {
        double v = fm_tensor_get(c, i);
        if (!(v >= 0 && v < (double)V && v == floor(v))) { /* the range first: no cast of a value out of it */
            fm_set_error(FM_ERR_INVALID, "%s: sample %" PRId64 ", position %" PRId64 ": %.17g is not a token id of "
                         "layer '%s' (whole numbers in [0, %" PRId64 "); the recipe's first layer looks ids up in a "
                         "table of %" PRId64 " rows)", what, i / per, i % per, v, r->layers[0].spec, V, V);
            fm_tensor_release_n(2, c, out);
            return NULL;
        }
        d[i] = (int64_t)v;
    }
    fm_tensor_release(c);
    return out;
}

int fm_recipe_num_blocks(const fm_recipe *r) {
    int n = 0;
    for (int i = 0; r && i < r->n_layers; i++)
        n += !strncmp(r->layers[i].spec, "maxpool2d", 9) || !strncmp(r->layers[i].spec, "avgpool2d", 9);
    return n;
}

fm_module *fm_recipe_build_model(const fm_recipe *r, fm_rng *rng) {
    fm_module *seq = fm_nn_sequential();
    if (!seq) return NULL;
    int ndim = r->input_ndim + 1;
    int64_t shape[FM_MAX_DIMS];
    shape[0] = 1;
    for (int i = 0; i < r->input_ndim; i++) shape[i + 1] = r->input_shape[i];
    char s1[96];
    for (int li = 0; li < r->n_layers; li++) {
        const fm_recipe_layer *L = &r->layers[li];
        char buf[192], kind[32] = "";
        snprintf(buf, sizeof buf, "%s", L->spec);
        layer_args a;
        memset(&a, 0, sizeof a);
        bool bad_arg = false;
        int tokn = 0;
        for (char *tok = strtok(buf, " \t"); tok; tok = strtok(NULL, " \t"), tokn++) {
            if (tokn == 0) { snprintf(kind, sizeof kind, "%s", tok); continue; }
            char *eq = strchr(tok, '=');
            if (eq) {
                if (a.nkw == 8 || eq - tok >= 32 || strlen(eq + 1) >= 32) { bad_arg = true; break; } /* never cut short */
                *eq = 0;
                snprintf(a.key[a.nkw], 32, "%s", tok);
                snprintf(a.val[a.nkw], 32, "%s", eq + 1);
                a.nkw++;
            } else if (a.npos == 4 || (snprintf(a.ptxt[a.npos], 32, "%s", tok), !parse_f64(tok, &a.pos[a.npos++]))) {
                bad_arg = true;
                break;
            }
        }
#define LAYER_FAIL(...) do { fm_set_error(FM_ERR_FORMAT, __VA_ARGS__); fm_module_free(seq); return NULL; } while (0)
        if (bad_arg) LAYER_FAIL("%s:%d: layer '%s': expected numbers and key=value options", r->path, L->line, L->spec);
        char why[256];
        if (layer_args_misfit(kind, &a, why, sizeof why)) LAYER_FAIL("%s:%d: layer '%s': %s", r->path, L->line, L->spec, why);
        fm_module *m = NULL;
        double eps = 1e-5;
        const char *v;
        if ((v = kw(&a, "eps")) && !parse_f64(v, &eps))
            LAYER_FAIL("%s:%d: layer '%s': eps must be a number", r->path, L->line, L->spec);
        int64_t last = shape[ndim - 1];
        bool bias = !(v = kw(&a, "bias")) || strcmp(v, "false");
        if (!strcmp(kind, "linear")) {
            if (a.npos < 1 || a.npos > 2)
                LAYER_FAIL("%s:%d: layer '%s': expected 'linear OUT' or 'linear IN OUT'", r->path, L->line, L->spec);
            if (ndim != 2)
                LAYER_FAIL("%s:%d: layer '%s' expects input [N, features] but the previous layers give %s "
                           "(add 'layer = flatten' before it)", r->path, L->line, L->spec,
                           fm_shape_str(ndim, shape, s1, sizeof s1));
            int64_t in = a.npos == 2 ? (int64_t)a.pos[0] : last, out = (int64_t)a.pos[a.npos - 1];
            m = fm_nn_linear(in, out, bias, rng);
        } else if (!strcmp(kind, "conv2d")) {
            if (a.npos != 2)
                LAYER_FAIL("%s:%d: layer '%s': expected 'conv2d OUT_CHANNELS KERNEL [stride=S] [padding=P]'", r->path,
                           L->line, L->spec);
            int stride = (v = kw(&a, "stride")) ? atoi(v) : 1, pad = (v = kw(&a, "padding")) ? atoi(v) : 0;
            int64_t in = (v = kw(&a, "in")) ? atoll(v) : (ndim == 4 ? shape[1] : 0);
            if (ndim != 4)
                LAYER_FAIL("%s:%d: layer '%s' expects input [N, C, H, W] but the previous layers give %s", r->path,
                           L->line, L->spec, fm_shape_str(ndim, shape, s1, sizeof s1));
            m = fm_nn_conv2d(in, (int64_t)a.pos[0], (int)a.pos[1], stride, pad, bias, rng);
        } else if (!strcmp(kind, "batchnorm2d")) {
            double mom = 0.1;
            if ((v = kw(&a, "momentum"))) mom = atof(v);
            if (ndim != 4)
                LAYER_FAIL("%s:%d: layer '%s' expects input [N, C, H, W] but the previous layers give %s", r->path,
                           L->line, L->spec, fm_shape_str(ndim, shape, s1, sizeof s1));
            m = fm_nn_batchnorm2d(shape[1], eps, mom);
        } else if (!strcmp(kind, "layernorm")) {
            m = fm_nn_layernorm(last, eps);
        } else if (!strcmp(kind, "rmsnorm")) {
            m = fm_nn_rmsnorm(last, eps);
        } else if (!strcmp(kind, "embedding")) {
            if (a.npos != 2) LAYER_FAIL("%s:%d: layer '%s': expected 'embedding NUM DIM'", r->path, L->line, L->spec);
            m = fm_nn_embedding((int64_t)a.pos[0], (int64_t)a.pos[1], rng);
        } else if (!strcmp(kind, "dropout")) {
            m = fm_nn_dropout(a.npos ? a.pos[0] : 0.5, NULL);
        } else if (!strcmp(kind, "maxpool2d") || !strcmp(kind, "avgpool2d")) {
            if (a.npos != 1)
                LAYER_FAIL("%s:%d: layer '%s': expected '%s KERNEL [stride=S] [padding=P]'", r->path, L->line, L->spec,
                           kind);
            int stride = (v = kw(&a, "stride")) ? atoi(v) : 0, pad = (v = kw(&a, "padding")) ? atoi(v) : 0;
            m = kind[0] == 'm' ? fm_nn_maxpool2d((int)a.pos[0], stride, pad) : fm_nn_avgpool2d((int)a.pos[0], stride, pad);
        } else {
            static const struct { const char *n; fm_module_kind k; } simple[] = {
                {"relu", FM_MOD_RELU}, {"gelu", FM_MOD_GELU}, {"silu", FM_MOD_SILU}, {"tanh", FM_MOD_TANH},
                {"sigmoid", FM_MOD_SIGMOID}, {"flatten", FM_MOD_FLATTEN}, {"meanpool", FM_MOD_MEANPOOL}};
            for (size_t k = 0; k < sizeof simple / sizeof simple[0]; k++)
                if (!strcmp(kind, simple[k].n)) m = fm_nn_simple(simple[k].k);
            if (!m) LAYER_FAIL("%s:%d: unknown layer '%s' (expected one of: %s)", r->path, L->line, kind, layer_names);
        }
        if (!m) {
            fm_error_prefix("%s:%d: layer '%s'", r->path, L->line, L->spec);
            fm_module_free(seq);
            return NULL;
        }
        int nn;
        int64_t nx[FM_MAX_DIMS];
        if (fm_module_infer_shape(m, ndim, shape, &nn, nx) != FM_OK) {
            fm_error_prefix("%s:%d: layer %d ('%s') does not fit", r->path, L->line, li, L->spec);
            fm_module_free(m);
            fm_module_free(seq);
            return NULL;
        }
        if (fm_sequential_add(seq, m) != FM_OK) { fm_module_free(seq); return NULL; }
        ndim = nn;
        for (int i = 0; i < nn; i++) shape[i] = nx[i];
#undef LAYER_FAIL
    }
    if (ndim != 2) {
        fm_set_error(FM_ERR_FORMAT, "%s: the model's output is %s but a classifier must produce [N, classes] "
                     "(end with 'layer = linear CLASSES')", r->path, fm_shape_str(ndim, shape, s1, sizeof s1));
        fm_module_free(seq);
        return NULL;
    }
    if (r->init != FM_INIT_DEFAULT && fm_module_init(seq, r->init, rng) != FM_OK) { fm_module_free(seq); return NULL; }
    return seq;
}
