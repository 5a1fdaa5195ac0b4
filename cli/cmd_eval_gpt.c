/* `fathom eval GPT_DIR`: the mean next-token loss and perplexity of a GPT (a `fathom
 * train` directory, a Hugging Face layout, or a compiled or quantized graph of one) on
 * the held-out tail of the directory's tokens.bin (the split the trainer validated on) or
 * on a text file, in non-overlapping windows of the model's context. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "eval_gpt.h"
#include "gpt_dir.h"
#include "io/io_internal.h" /* fm_read_file */
#include "fathom/amp.h" /* fm_autocast_set */
#include "fathom/autograd.h"

/* the whole file (a text to evaluate on): bytes, at most 16 GiB, a pipe too (fm_read_file) */
static char *slurp(const char *path, size_t *n) {
    fm_status st;
    const char *why;
    char *buf = fm_read_file(path, (size_t)16 << 30, n, &st, &why);
    if (!buf) fm_set_error(st, "%s: cannot open the text to evaluate on: %s", path, why);
    return buf;
}

/* sum over the rows of -log softmax(logits)[target], in double */
static double nll_sum(const float *lg, const int64_t *y, int64_t rows, int64_t V) {
    double s = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *l = lg + r * V;
        double mx = l[0], z = 0;
        for (int64_t j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
        for (int64_t j = 0; j < V; j++) z += exp(l[j] - mx);
        s += mx + log(z) - l[y[r]];
    }
    return s;
}

/* the ids to evaluate on, into *ids and *n (malloc'd) */
static fm_status eval_ids(const char *dir, const fm_eval_gpt_opts *o, fm_cli_gpt *p, int64_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    if (o->text) {
        size_t len = 0;
        char *t = slurp(o->text, &len);
        if (!t) return fm_last_status();
        int32_t *tid = NULL;
        int64_t nt = 0;
        fm_status st = fm_tokenizer_encode(p->tok, t, len, &tid, &nt);
        free(t);
        if (st) return st;
        *ids = malloc(sizeof(int64_t) * (size_t)(nt + 1));
        if (!*ids) { free(tid); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
        for (int64_t i = 0; i < nt; i++) (*ids)[i] = tid[i];
        free(tid);
        *n = nt;
        return FM_OK;
    }
    char path[4096];
    if (o->tokens) snprintf(path, sizeof path, "%s", o->tokens);
    else snprintf(path, sizeof path, "%s/tokens.bin", dir);
    fm_token_data d;
    if (fm_token_file_read(path, p->vocab, &d)) {
        char why[512];
        snprintf(why, sizeof why, "%s", fm_last_error());
        return fm_set_error(FM_ERR_INVALID, "eval: %s; give a text to evaluate on with --text FILE, or the token file of "
                            "the model it was made from with --tokens FILE (graph and Hugging Face directories have "
                            "none)", why);
    }
    const int64_t lo = (int64_t)((double)d.n * (1.0 - o->val_fraction));
    *ids = malloc(sizeof(int64_t) * (size_t)(d.n - lo + 1));
    if (!*ids) { fm_token_data_free(&d); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
    for (int64_t i = lo; i < d.n; i++) (*ids)[i - lo] = d.ids[i];
    *n = d.n - lo;
    fm_token_data_free(&d);
    return FM_OK;
}

int fm_eval_gpt(const char *dir, fm_graph *g, const fm_eval_gpt_opts *o) {
    fm_cli_gpt p;
    if (fm_cli_gpt_open(dir, g, &p) || fm_cli_gpt_to(&p, o->device)) {
        fm_cli_error("%s", fm_last_error());
        if (p.m || p.g) fm_cli_gpt_close(&p);
        return 1;
    }
    int64_t *ids = NULL, n = 0;
    int rc = 1;
    const int64_t T = p.ctx_len, V = p.vocab;
    if (eval_ids(dir, o, &p, &ids, &n)) { fm_cli_error("%s", fm_last_error()); goto done; }
    const int64_t windows = n > T ? (n - 1) / T : 0;
    if (windows < 1) {
        fm_cli_error("eval: %lld tokens to evaluate on, too few for one window of the model's context (%lld + 1)",
                     (long long)n, (long long)T);
        goto done;
    }
    bool prev = fm_set_grad_enabled(false);
    /* bf16 on the CPU: the linears' bf16 copies made once for the whole evaluation
     * instead of at every batch (a no-op otherwise) */
    if (p.m) {
        fm_dtype ac = fm_autocast_set(o->precision);
        fm_status kst = fm_gpt_keep_lowp_weights(p.m, true);
        fm_autocast_set(ac);
        if (kst != FM_OK) {
            fm_cli_error("%s", fm_last_error());
            fm_set_grad_enabled(prev);
            rc = 1;
            goto done;
        }
    }
    double nll = 0;
    float *lg = malloc(sizeof(float) * (size_t)(o->batch * T * V));
    int64_t *x = malloc(sizeof(int64_t) * (size_t)(o->batch * T)), *y = malloc(sizeof(int64_t) * (size_t)(o->batch * T));
    fm_status st = lg && x && y ? FM_OK : fm_set_error(FM_ERR_OOM, "out of host memory (lower --batch)");
    const bool progress = !o->quiet && isatty(STDERR_FILENO); /* a counter redrawn with \r: for a terminal only, not a log */
    for (int64_t w0 = 0; st == FM_OK && w0 < windows; w0 += o->batch) {
        const int64_t B = windows - w0 < o->batch ? windows - w0 : o->batch;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++) {
                x[b * T + t] = ids[(w0 + b) * T + t];
                y[b * T + t] = ids[(w0 + b) * T + t + 1];
            }
        fm_tensor *xt = fm_tensor_from_data(x, 2, (int64_t[]){B, T}, FM_I64);
        fm_dtype prev_ac = fm_autocast_set(o->precision); /* fp32: off */
        fm_tensor *l = xt ? fm_cli_gpt_logits(&p, xt) : NULL;
        fm_autocast_set(prev_ac);
        st = l ? fm_tensor_copy_to_host(l, lg, FM_F32) : fm_last_status();
        if (st == FM_OK) nll += nll_sum(lg, y, B * T, V);
        fm_tensor_release_n(2, xt, l);
        if (progress) fprintf(stderr, "\reval: %lld / %lld windows", (long long)(w0 + B), (long long)windows);
    }
    if (progress) fputc('\n', stderr);
    if (p.m) fm_gpt_keep_lowp_weights(p.m, false);
    fm_set_grad_enabled(prev);
    free(lg);
    free(x);
    free(y);
    if (st) { fm_cli_error("%s", fm_last_error()); goto done; }
    const double loss = nll / (double)(windows * T);
    rc = 0;
    if (o->json) {
        json_t *j = json_object();
        json_object_set_new(j, "model_path", json_string(dir));
        json_object_set_new(j, "kind", json_string("gpt"));
        json_object_set_new(j, "loss", json_real(loss));
        json_object_set_new(j, "perplexity", json_real(exp(loss)));
        json_object_set_new(j, "tokens", json_integer(windows * T));
        json_object_set_new(j, "windows", json_integer(windows));
        json_object_set_new(j, "precision", json_string(fm_precision_name(o->precision)));
        json_object_set_new(j, "source", o->text ? json_string(o->text) : json_string(o->tokens ? o->tokens : "tokens.bin"));
        json_object_set_new(j, "val_fraction", o->text ? json_null() : json_real(o->val_fraction));
        char *s = json_dumps(j, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        printf("%s: loss %.4f, perplexity %.3f on %lld tokens (%lld windows of %lld, %s%s)\n", dir, loss, exp(loss),
               (long long)(windows * T), (long long)windows, (long long)T,
               o->text ? o->text : o->tokens ? "the held-out split of --tokens" : "the held-out split of tokens.bin",
               o->precision == FM_F32 ? "" : o->precision == FM_BF16 ? "; bf16" : "; fp16");
    }
done:
    free(ids);
    fm_cli_gpt_close(&p);
    return rc;
}
