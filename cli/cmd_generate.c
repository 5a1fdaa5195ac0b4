/* `fathom generate MODEL_DIR --prompt TEXT --tokens N [--temperature T]
 *  [--top-k K] [--top-p P] [--seed S] [--no-cache]`: streams sampled text from a
 * model directory written by `fathom train` (config.json, model.safetensors,
 * tokenizer.txt), or a GPT-2 / Llama checkpoint in Hugging Face layout (config.json
 * with model_type, model.safetensors or shards, vocab.json + merges.txt or tokenizer.json; fathom/hf.h).
 * Thin: parsing, then fm_gpt_generate with a printing callback. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "device_arg.h"
#include "fathom/gpt.h"
#include "fathom/graph.h"
#include "fathom/hf.h"

static int emit(int tok, void *ctx) {
    const char *b;
    size_t n;
    if (fm_tokenizer_token_bytes(ctx, tok, &b, &n) == FM_OK) fwrite(b, 1, n, stdout);
    fflush(stdout); /* streaming: each token appears as soon as it is sampled */
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: fathom generate MODEL_DIR --prompt TEXT --tokens N [--temperature T] [--top-k K]\n"
               "                      [--top-p P] [--seed S] [--no-cache] [--device D] [--quiet]\n"
               "  --device D   where the model and its KV cache live: cpu (default), cuda, cuda:N, check\n");
}

/* a real number from the whole of v (no trailing text, not NaN or infinite) */
static bool parse_real(const char *opt, const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x)) {
        fm_cli_error("generate: %s needs a number, got '%s'", opt, v);
        return false;
    }
    *out = x;
    return true;
}

/* a graph meta value that must be a whole number in [1, INT_MAX] */
static bool meta_whole(const char *v, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < 1 || x > INT_MAX) return false;
    *out = x;
    return true;
}

int fm_cmd_generate(int argc, char **argv) {
    const char *dir = NULL, *prompt = NULL;
    long long tokens = 100, top_k = 0, seed = 0;
    fm_gpt_sample_params sp = {0.8, 0, 1.0, 0};
    bool cache = true, quiet = false;
    fm_device dev = FM_CPU;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc, ok = true;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--prompt") && has) prompt = argv[++i];
        else if (!strcmp(a, "--tokens") && has) ok = fm_cli_parse_int("generate", a, argv[++i], 0, &tokens);
        else if (!strcmp(a, "--temperature") && has) ok = parse_real(a, argv[++i], &sp.temperature);
        else if (!strcmp(a, "--top-k") && has) ok = fm_cli_parse_int("generate", a, argv[++i], 0, &top_k);
        else if (!strcmp(a, "--top-p") && has) ok = parse_real(a, argv[++i], &sp.top_p);
        else if (!strcmp(a, "--seed") && has) ok = fm_cli_parse_int("generate", a, argv[++i], 0, &seed);
        else if (!strcmp(a, "--no-cache")) cache = false;
        else if (!strcmp(a, "--device") && has) {
            int drc = fm_cli_device("generate", argv[++i], &dev);
            if (drc) return drc;
        }
        else if (!strcmp(a, "--quiet")) quiet = true;
        else if (a[0] != '-' && !dir) dir = a;
        else {
            static const char *const flags[] = {"--help", "--prompt", "--tokens", "--temperature", "--top-k", "--top-p",
                                                "--seed", "--no-cache", "--quiet", "--device"};
            int known = 0;
            for (int k = 0; k < 10; k++) known |= !strcmp(a, flags[k]);
            if (known || a[0] != '-') fm_cli_error("unknown or incomplete option '%s'", a);
            else fm_cli_unknown_option("generate", a, flags, 10);
            usage(stderr);
            return 2;
        }
        if (!ok) return 2;
    }
    if (!dir || !prompt) { usage(stderr); return 2; }
    if (tokens > INT_MAX || top_k > INT_MAX) {
        fm_cli_error("generate: --tokens and --top-k must be at most %d", INT_MAX);
        return 2;
    }
    if (sp.temperature < 0 || !(sp.top_p > 0 && sp.top_p <= 1)) {
        fm_cli_error("generate: --temperature must be >= 0 and --top-p in (0, 1]");
        return 2;
    }
    sp.top_k = (int)top_k;
    sp.seed = (uint64_t)seed;
    fm_tokenizer *tok = NULL;
    fm_gpt *m = NULL;
    fm_graph *g = NULL; /* a graph directory (`fathom compile`) runs its KV-cache graph */
    int ctx_len = 0;
    if (fm_graph_dir_is_graph(dir)) {
        char tp[4096];
        snprintf(tp, sizeof tp, "%s/tokenizer.txt", dir);
        const char *bs = (g = fm_graph_load(dir)) ? fm_graph_get_meta(g, "block_size") : NULL;
        const char *vs = g ? fm_graph_get_meta(g, "vocab_size") : NULL;
        long long block = 0, vocab = 0;
        if (g && !bs) fm_set_error(FM_ERR_INVALID, "%s: this graph is not a GPT graph (no block_size in its meta)", dir);
        /* the meta is a file header: whole numbers in range, or the graph is refused (atoi made 'x' a context of 0) */
        else if (g && (!meta_whole(bs, &block) || !meta_whole(vs ? vs : "", &vocab)))
            fm_set_error(FM_ERR_FORMAT, "%s/graph.json: meta block_size '%s' and vocab_size '%s' must be whole numbers in [1, %d]",
                         dir, bs, vs ? vs : "(missing)", INT_MAX);
        else if (bs) tok = fm_tokenizer_load(tp);
        if (tok && fm_tokenizer_vocab_size(tok) != vocab) {
            fm_set_error(FM_ERR_FORMAT, "%s: tokenizer.txt's vocabulary (%d) does not match the graph's", dir, fm_tokenizer_vocab_size(tok));
            fm_tokenizer_free(tok);
            tok = NULL;
        }
        if (!tok) { fm_cli_error("%s", fm_last_error()); fm_graph_free(g); return 1; }
        ctx_len = (int)block;
    } else {
        m = fm_hf_is_model_dir(dir) ? fm_hf_gpt_load(dir, &tok) : fm_gpt_load_dir(dir, &tok);
        if (!m) { fm_cli_error("%s", fm_last_error()); return 1; }
        ctx_len = fm_gpt_get_config(m)->block_size;
    }
    int32_t *ids = NULL;
    if ((g ? fm_graph_to_device(g, dev) : fm_gpt_to(m, dev)) != FM_OK) {
        fm_cli_error("%s", fm_last_error());
        fm_tokenizer_free(tok);
        fm_gpt_free(m);
        fm_graph_free(g);
        return 1;
    }
    int64_t n = 0;
    int rc = 0;
    if (fm_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n)) { fm_cli_error("%s", fm_last_error()); rc = 1; goto done; }
    int made = 0;
    bool limit = false;
    if (n > ctx_len) { /* before echoing anything */
        fm_cli_error("the prompt is %lld tokens but the model's context is %d (shorten the prompt)", (long long)n, ctx_len);
        rc = 1;
        goto done;
    }
    fputs(prompt, stdout);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (g ? fm_graph_generate(g, ids, (int)n, (int)tokens, &sp, NULL, &made, &limit, emit, tok)
          : fm_gpt_generate(m, ids, (int)n, (int)tokens, &sp, cache, NULL, &made, &limit, emit, tok)) {
        fputc('\n', stdout);
        fm_cli_error("%s", fm_last_error());
        rc = 1;
        goto done;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fputc('\n', stdout);
    if (limit)
        fprintf(stderr, "fathom: stopped after %d tokens: the context limit of %d tokens (prompt %lld + generated) "
                        "was reached\n", made, ctx_len, (long long)n);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!quiet)
        fprintf(stderr, "fathom: %d tokens in %.2f s (%.1f tokens/s, %s)\n", made, s, made / (s > 0 ? s : 1),
                g ? "graph, KV cache" : cache ? "KV cache" : "no cache");
done:
    free(ids);
    fm_tokenizer_free(tok);
    fm_gpt_free(m);
    fm_graph_free(g);
    return rc;
}
