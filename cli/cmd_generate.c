/* `fathom generate MODEL_DIR --prompt TEXT --tokens N [--temperature T]
 *  [--top-k K] [--top-p P] [--seed S] [--no-cache] [--ignore-eos]`: streams sampled text from a
 * model directory written by `fathom train` (config.json, model.safetensors,
 * tokenizer.txt), or a GPT-2 / Llama / Qwen2 checkpoint in Hugging Face layout (config.json
 * with model_type, model.safetensors or shards, vocab.json + merges.txt or tokenizer.json; fathom/hf.h).
 * Thin: parsing, then fm_gpt_generate with a printing callback, which ends the text at
 * a Hugging Face model's end-of-sequence id (fm_tg_read_eos_ids). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "gpt_dir.h"
#include "device_arg.h"
#include "fathom/amp.h" /* fm_autocast_set */
#include "fathom/gpt.h"
#include "fathom/graph.h"
#include "fathom/hf.h"
#include "serve/textgen.h" /* fm_tg_read_eos_ids: the end-of-sequence ids serving stops at too */

typedef struct emit_ctx {
    fm_tokenizer *tok;
    int n_eos; /* the model's end-of-sequence ids (none with --ignore-eos) */
    int32_t eos[FM_TG_MAX_STOP_IDS];
    int eos_hit; /* the id that ended the text, or -1 */
} emit_ctx;

static int emit(int tok, void *ctx) {
    emit_ctx *e = ctx;
    for (int k = 0; k < e->n_eos; k++)
        if (e->eos[k] == tok) { e->eos_hit = tok; return 1; } /* as transformers' generate: not printed, the end */
    const char *b;
    size_t n;
    if (fm_tokenizer_token_bytes(e->tok, tok, &b, &n) == FM_OK) fwrite(b, 1, n, stdout);
    fflush(stdout); /* streaming: each token appears as soon as it is sampled */
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: fathom generate MODEL_DIR --prompt TEXT --tokens N [--temperature T] [--top-k K]\n"
               "                      [--top-p P] [--seed S] [--no-cache] [--device D] [--precision P]\n"
               "                      [--kv-cache f32|f16] [--ignore-eos] [--quiet]\n"
               "  --device D   where the model and its KV cache live: cpu (default), cuda, cuda:N, check\n"
               "  --precision P  fp32 (default), bf16 or fp16: the forward (prompt and every decode step)\n"
               "               autocast to that dtype, as `fathom train --precision P` runs it; the weights\n"
               "               and the KV cache stay f32 (not for graphs, which run as they were compiled)\n"
               "  --kv-cache T  a compiled graph's KV cache in f32 (default) or f16 (half its memory and\n"
               "               of the bytes each token reads; logits within the f16 rounding of keys and values)\n"
               "  --ignore-eos  go on past the model's end-of-sequence token (a Hugging Face model's\n"
               "               eos_token_id in generation_config.json or config.json; the text ends there otherwise)\n");
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

/* An option generate does not take (or one missing its value): the message, the usage, 2. */
static int bad_option(const char *a) {
    static const char *const flags[] = {"--help", "--prompt", "--tokens", "--temperature", "--top-k", "--top-p", "--seed",
                                        "--no-cache", "--quiet", "--device", "--precision", "--kv-cache", "--ignore-eos"};
    int known = 0;
    for (int k = 0; k < 13; k++) known |= !strcmp(a, flags[k]);
    if (known || a[0] != '-') fm_cli_error("unknown or incomplete option '%s'", a);
    else fm_cli_unknown_option("generate", a, flags, 13);
    usage(stderr);
    return 2;
}

int fm_cmd_generate(int argc, char **argv) {
    const char *dir = NULL, *prompt = NULL;
    long long tokens = 100, top_k = 0, seed = 0;
    fm_gpt_sample_params sp = {0.8, 0, 1.0, 0};
    bool cache = true, quiet = false, ignore_eos = false;
    fm_device dev = FM_CPU;
    fm_dtype prec = FM_F32, kv = FM_F32;
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
        else if (!strcmp(a, "--precision") || !strncmp(a, "--precision=", 12)) {
            const char *v = a[11] == '=' ? a + 12 : (has ? argv[++i] : NULL);
            int prc = fm_cli_precision("generate", v, &prec);
            if (prc) return prc;
        }
        else if (!strcmp(a, "--kv-cache") && has) {
            const char *v = argv[++i];
            if (!strcmp(v, "f16")) kv = FM_F16;
            else if (strcmp(v, "f32")) {
                fm_cli_error("generate: --kv-cache takes f32 or f16, got '%s'", v);
                return 2;
            }
        }
        else if (!strcmp(a, "--quiet")) quiet = true;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (a[0] != '-' && !dir) dir = a;
        else return bad_option(a);
        if (!ok) return 2;
    }
    if (!dir || !prompt) { usage(stderr); return 2; }
    if (fm_cli_refuse_onnx("generate", dir)) return 1;
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
    if (fm_graph_dir_is_graph(dir) && fm_cli_precision_for_graph("generate", dir, prec)) return 2;
    if (kv == FM_F16 && !fm_graph_dir_is_graph(dir)) {
        fm_cli_error("generate: --kv-cache f16 is for compiled graphs; %s is a trained model: run `fathom compile %s -o DIR` and generate from DIR", dir, dir);
        return 2;
    }
    fm_cli_gpt gp; /* a graph directory (`fathom compile`) runs its KV-cache graph */
    if (fm_cli_gpt_open(dir, NULL, &gp)) { fm_cli_error("%s", fm_last_error()); return 1; }
    fm_tokenizer *tok = gp.tok;
    fm_gpt *m = gp.m;
    fm_graph *g = gp.g;
    int ctx_len = gp.ctx_len;
    int32_t *ids = NULL;
    if (fm_cli_gpt_to(&gp, dev) != FM_OK) {
        fm_cli_error("%s", fm_last_error());
        fm_cli_gpt_close(&gp);
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
    emit_ctx ec = {.tok = tok, .eos_hit = -1};
    if (!ignore_eos) ec.n_eos = fm_tg_read_eos_ids(dir, ec.eos);
    fm_dtype prev_ac = fm_autocast_set(prec); /* fp32: off */
    fm_status gst = g ? fm_graph_generate_ex(g, ids, (int)n, (int)tokens, &sp, kv, NULL, &made, &limit, emit, &ec)
                      : fm_gpt_generate(m, ids, (int)n, (int)tokens, &sp, cache, NULL, &made, &limit, emit, &ec);
    fm_autocast_set(prev_ac);
    if (gst != FM_OK) {
        fputc('\n', stdout);
        fm_cli_error("%s", fm_last_error());
        rc = 1;
        goto done;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fputc('\n', stdout);
    fflush(stdout); /* the text's last line before the report on stderr, also when both go to one pipe */
    if (ec.eos_hit >= 0 && !quiet)
        fprintf(stderr, "fathom: the model ended the text (end-of-sequence id %d) after %d tokens; --ignore-eos goes on\n",
                ec.eos_hit, made);
    if (limit)
        fprintf(stderr, "fathom: stopped after %d tokens: the context limit of %d tokens (prompt %lld + generated) "
                        "was reached\n", made, ctx_len, (long long)n);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!quiet)
        fprintf(stderr, "fathom: %d tokens in %.2f s (%.1f tokens/s, %s, %s)\n", made, s, made / (s > 0 ? s : 1),
                g ? (kv == FM_F16 ? "graph, f16 KV cache" : "graph, KV cache") : cache ? "KV cache" : "no cache", fm_precision_name(prec));
done:
    free(ids);
    fm_cli_gpt_close(&gp);
    return rc;
}
