/* fathom: the command. Thin: it picks the subcommand and hands over argv. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "core/cpu_features.h"
#include "fathom/memory.h" /* fm_parse_size, fm_memory_mode_parse: the environment check */

typedef int (*cmd_fn)(int, char **);
struct command { const char *name; cmd_fn fn; const char *help; };

static void usage(FILE *f, const struct command *cmds, int n) {
    fprintf(f, "usage: fathom <command> [options]\n\ncommands:\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "  %-10s %s%s\n", cmds[i].name, cmds[i].help, cmds[i].fn ? "" : " (not in this build)");
    fprintf(f, "\nRun `fathom <command> --help` for a command's options.\n");
}

void fm_cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fathom: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

bool fm_cli_parse_int_range(const char *cmd, const char *opt, const char *v, long long min, long long max,
                            long long *out) {
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < min || x > max) {
        if (max == LLONG_MAX) fm_cli_error("%s: %s needs a whole number >= %lld, got '%s'", cmd, opt, min, v ? v : "nothing");
        else fm_cli_error("%s: %s needs a whole number in [%lld, %lld], got '%s'", cmd, opt, min, max, v ? v : "nothing");
        return false;
    }
    *out = x;
    return true;
}

/* Edit distance with adjacent swaps (optimal string alignment): "trian" is one edit
 * from "train". Names are short. */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < d[i][j])
                d[i][j] = d[i - 2][j - 2] + 1;
        }
    return d[la][lb];
}

const char *fm_cli_suggest(const char *given, const char *const *names, int n) {
    char g[64];
    snprintf(g, sizeof g, "%.*s", (int)strcspn(given, "="), given); /* --lrr=3: the name only */
    int len = (int)strlen(g), lim = len / 3 < 3 ? len / 3 : 3, best = 99;
    if (lim < 1) lim = 1;
    const char *pick = NULL;
    for (int i = 0; i < n; i++) {
        int dist = edit_distance(g, names[i]);
        if (dist < best) { best = dist; pick = names[i]; }
    }
    return best <= lim ? pick : NULL;
}

void fm_cli_unknown_option(const char *cmd, const char *given, const char *const *names, int n) {
    const char *s = fm_cli_suggest(given, names, n);
    if (s) fm_cli_error("%s: unknown option '%s' (did you mean '%s'?)", cmd, given, s);
    else fm_cli_error("%s: unknown option '%s'", cmd, given);
}

bool fm_cli_parse_int(const char *cmd, const char *opt, const char *v, long long min, long long *out) {
    return fm_cli_parse_int_range(cmd, opt, v, min, LLONG_MAX, out);
}

/* The environment variables the library reads are checked here, once: a value
 * the library cannot use would otherwise be ignored without a word. */
static bool env_ok(void) {
    const char *v;
    size_t sz;
    fm_memory_mode mode;
    if ((v = getenv("FATHOM_MEMORY_LIMIT")) && *v && fm_parse_size(v, &sz) != FM_OK) {
        fm_cli_error("FATHOM_MEMORY_LIMIT='%s' is not a size (expected bytes such as 512M, 2G or 1073741824)", v);
        return false;
    }
    if ((v = getenv("FATHOM_MEMORY_MODE")) && *v && fm_memory_mode_parse(v, &mode) != FM_OK) {
        fm_cli_error("FATHOM_MEMORY_MODE='%s': expected grow or preallocate", v);
        return false;
    }
    if ((v = getenv("FATHOM_MEMORY_PREALLOCATE")) && *v) {
        char *end;
        double f = strtod(v, &end);
        if (!(*end == 0 && f > 0 && f <= 1) && fm_parse_size(v, &sz) != FM_OK) {
            fm_cli_error("FATHOM_MEMORY_PREALLOCATE='%s': expected a fraction in (0, 1] or a size such as 2G", v);
            return false;
        }
    }
    long long n;
    if ((v = getenv("FATHOM_NUM_THREADS")) && *v && !fm_cli_parse_int_range("fathom", "FATHOM_NUM_THREADS", v, 1, 256, &n)) /* the pool's MAX_THREADS */
        return false;
    /* the crash tests' hooks (src/io): a misspelt fault would inject nothing, and the test pass unexercised */
    if ((v = getenv("FATHOM_FAULT")) && *v) {
        size_t k = !strncmp(v, "write:", 6) ? 6 : !strncmp(v, "rename:", 7) ? 7 : 0;
        char *end = NULL;
        errno = 0;
        long long at = k ? strtoll(v + k, &end, 10) : 0;
        if (!k || errno || end == v + k || at < 1 || (*end && strcmp(end, ":eio") && strcmp(end, ":kill"))) {
            fm_cli_error("FATHOM_FAULT='%s': expected KIND:N[:ACTION] with KIND write or rename, N >= 1, ACTION eio or kill", v);
            return false;
        }
    }
    if ((v = getenv("FATHOM_TEST_FAIL_WRITE_AFTER")) && *v &&
        !fm_cli_parse_int_range("fathom", "FATHOM_TEST_FAIL_WRITE_AFTER", v, 0, LLONG_MAX, &n))
        return false;
    return true;
}

int main(int argc, char **argv) {
    const struct command cmds[] = {
        {"info", fm_cmd_info, "version, build options, CPU features, BLAS, CUDA devices"},
        {"train", fm_cmd_train, "train a model from a recipe"},
        {"eval", fm_cmd_eval, "evaluate a saved model"},
        {"predict", fm_cmd_predict, "run a saved model on inputs"},
        {"run", fm_cmd_run, "run an ONNX model on arrays"},
        {"bench", fm_cmd_bench, "inference latency and throughput of a model on a device"},
        {"import", fm_cmd_import, "convert an ONNX model to an inference graph directory"},
        {"export", fm_cmd_export, "write a model as an ONNX file"},
        {"compile", fm_cmd_compile, "make an optimized inference graph of a model"},
        {"prune", fm_cmd_prune, "make a trained model sparse or smaller (weights, channels)"},
        {"distill", fm_cmd_distill, "train a small classifier from a trained teacher's soft targets"},
        {"quantize", fm_cmd_quantize, "int8 (dynamic or calibrated) and int4 weight quantization of a model"},
        {"recipes", fm_cmd_recipes, "list the built-in recipes"},
        {"plan", fm_cmd_plan, "memory, time and cost of a job on every GPU"},
        {"tokenizer", fm_cmd_tokenizer, "train or apply a BPE tokenizer"},
        {"generate", fm_cmd_generate, "generate text with a language model"},
        {"embed", fm_cmd_embed, "sentence embeddings with a BERT encoder (Hugging Face layout)"},
        {"summary", fm_cmd_summary, "layer table: shapes, parameters, FLOPs, memory"},
        {"profile", fm_cmd_profile, "summarize a profiler trace"},
        {"plot", fm_cmd_plot, "plot training curves from a log directory"},
        {"serve", fm_cmd_serve, "serve models over HTTP (KServe v2 / Triton protocol, metrics)"},
    };
    int n = (int)(sizeof cmds / sizeof cmds[0]);
    if (argc < 2) { usage(stderr, cmds, n); return 2; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout, cmds, n);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) { printf("fathom %s\n", "0.1.0"); return 0; }
    char isa_msg[256];
    if (!fm_isa_check(isa_msg, sizeof isa_msg)) { /* before any work: a forced level the CPU lacks */
        fm_cli_error("%s", isa_msg);
        return 2;
    }
    if (!env_ok()) return 2;
    for (int i = 0; i < n; i++) {
        if (strcmp(argv[1], cmds[i].name)) continue;
        if (!cmds[i].fn) {
            fm_cli_error("the '%s' command is not part of this build", cmds[i].name);
            return 2;
        }
        return cmds[i].fn(argc - 1, argv + 1);
    }
    const char *names[sizeof cmds / sizeof cmds[0]];
    for (int i = 0; i < n; i++) names[i] = cmds[i].name;
    const char *near = fm_cli_suggest(argv[1], names, n);
    if (near) fm_cli_error("unknown command '%s' (did you mean '%s'?)", argv[1], near);
    else fm_cli_error("unknown command '%s'", argv[1]);
    usage(stderr, cmds, n);
    return 2;
}
