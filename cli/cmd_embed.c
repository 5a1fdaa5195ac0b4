/* `fathom embed MODEL_DIR TEXT... [--file PATH] [--out FILE.npy] [--tokens] [--int8]`:
 * sentence embeddings from a BERT encoder in sentence-transformers layout
 * (fathom/hf.h). Prints one line per text (dim numbers, pooled and normalized as
 * the model's configuration says), or writes them as one [n, dim] f32 .npy.
 * --tokens prints the token ids instead; --int8 runs the encoder's linears in
 * dynamic int8. Thin: parsing, then fm_hf_encoder_*. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "io/io_internal.h" /* fm_read_file, fm_read_text_file */
#include "fathom/data.h" /* fm_npy_write */
#include "fathom/hf.h"

static void usage(FILE *f) {
    fprintf(f, "usage: fathom embed MODEL_DIR TEXT... [--file PATH] [--out FILE.npy] [--tokens] [--int8]\n"
               "  MODEL_DIR  a sentence-transformers BERT model (config.json, model.safetensors, vocab.txt, ...)\n"
               "  --file     read texts from PATH, one per line (as well as any TEXT arguments)\n"
               "  --out      write the embeddings as an [n, dim] float32 .npy instead of printing them\n"
               "  --tokens   print each text's token ids instead of embedding it\n"
               "  --int8     dynamic int8 linears (weights per output row, activations per call)\n");
}

typedef struct { char **v; int n, cap; } strs;
static int add(strs *s, char *t) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        char **v = realloc(s->v, sizeof *v * (size_t)cap);
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = t;
    return 0;
}

/* Lines of path (without their newlines) appended to s; *buf keeps the text. */
static int read_lines(const char *path, strs *s, char **buf) {
    fm_status st; /* whole, through fm_read_text_file: 1 GiB at most, a pipe read to its end */
    const char *why;
    *buf = fm_read_text_file(path, (size_t)1 << 30, NULL, &st, &why);
    if (!*buf) {
        if (st == FM_ERR_IO && errno == EISDIR) fm_cli_error("embed: %s: is a directory, not a text file", path);
        else if (st == FM_ERR_IO) fm_cli_error("embed: %s: %s (%s)", path, why, strerror(errno));
        else fm_cli_error("embed: %s: %s (a text file of at most 1 GiB, one text per line)", path, why);
        return 1;
    }
    for (char *p = *buf; *p;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        size_t l = strlen(p);
        if (l && p[l - 1] == '\r') p[l - 1] = 0;
        if (add(s, p)) { fm_cli_error("out of memory"); return 1; }
        if (!nl) break;
        p = nl + 1;
    }
    return 0;
}

static int print_tokens(fm_hf_encoder *e, const strs *t) {
    for (int i = 0; i < t->n; i++) {
        int32_t *ids = NULL;
        int64_t n = 0;
        if (fm_hf_encoder_tokenize(e, t->v[i], &ids, &n)) { fm_cli_error("%s", fm_last_error()); return 1; }
        for (int64_t k = 0; k < n; k++) printf("%s%d", k ? " " : "", ids[k]);
        putchar('\n');
        free(ids);
    }
    return 0;
}

static int embed(fm_hf_encoder *e, const strs *t, const char *out) {
    fm_tensor *x = fm_hf_encoder_embed(e, (const char *const *)t->v, t->n);
    if (!x) { fm_cli_error("%s", fm_last_error()); return 1; }
    int rc = 0;
    if (out) {
        if (fm_npy_write(out, x)) { fm_cli_error("%s", fm_last_error()); rc = 1; }
    } else {
        const float *p = fm_tensor_data(x);
        int64_t dim = x->shape[1];
        for (int64_t i = 0; i < x->shape[0]; i++) {
            for (int64_t j = 0; j < dim; j++) printf("%s%.8g", j ? " " : "", p[i * dim + j]);
            putchar('\n');
        }
    }
    fm_tensor_release(x);
    return rc;
}

int fm_cmd_embed(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *file = NULL;
    bool tokens = false, int8 = false;
    strs texts = {NULL, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); free(texts.v); return 0; }
        if (!strcmp(a, "--out") && has) out = argv[++i];
        else if (!strcmp(a, "--file") && has) file = argv[++i];
        else if (!strcmp(a, "--tokens")) tokens = true;
        else if (!strcmp(a, "--int8")) int8 = true;
        else if (!strncmp(a, "--", 2)) { fm_cli_error("unknown or incomplete option '%s'", a); usage(stderr); free(texts.v); return 2; }
        else if (!dir) dir = a;
        else if (add(&texts, argv[i])) { fm_cli_error("out of memory"); free(texts.v); return 1; }
    }
    char *buf = NULL;
    int rc = 0;
    if (file && read_lines(file, &texts, &buf)) rc = 1;
    else if (!dir || texts.n == 0) {
        fm_cli_error("embed: %s", !dir ? "no MODEL_DIR given" : "no text given (TEXT arguments or --file)");
        usage(stderr);
        rc = 2;
    } else if (fm_cli_refuse_onnx("embed", dir)) {
        rc = 1;
    } else {
        fm_hf_encoder *e = fm_hf_encoder_load(dir);
        if (!e || (int8 && fm_hf_encoder_quantize_int8(e))) { fm_cli_error("%s", fm_last_error()); rc = 1; }
        else rc = tokens ? print_tokens(e, &texts) : embed(e, &texts, out);
        fm_hf_encoder_free(e);
    }
    free(buf);
    free(texts.v);
    return rc;
}
