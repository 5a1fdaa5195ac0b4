/* The subcommands of `fathom`. Each lives in its own cli/cmd_<name>.c and is
 * declared weak here, so that main.c can say plainly which ones a build lacks. */
#ifndef FATHOM_CLI_COMMANDS_H
#define FATHOM_CLI_COMMANDS_H
#define FM_CLI_WEAK __attribute__((weak))
/* argv[0] is the subcommand name. Return the process exit code:
 * 0 success, 1 runtime failure, 2 bad usage. */
int fm_cmd_info(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_train(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_eval(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_predict(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_recipes(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_plan(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_tokenizer(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_generate(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_summary(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_profile(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_plot(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_serve(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_run(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_bench(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_import(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_export(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_compile(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_quantize(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_embed(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_prune(int argc, char **argv) FM_CLI_WEAK;
int fm_cmd_distill(int argc, char **argv) FM_CLI_WEAK;

/* Shared helpers (cli/main.c). */
void fm_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A whole-number option value >= min; otherwise prints "<cmd>: <opt> needs a whole
 * number >= min, got '<v>'" and returns false (the caller prints usage, exits 2). */
#include <stdbool.h>
bool fm_cli_parse_int(const char *cmd, const char *opt, const char *v, long long min, long long *out);
/* The same with an upper bound (the range of the field the value goes into). */
bool fm_cli_parse_int_range(const char *cmd, const char *opt, const char *v, long long min, long long max,
                            long long *out);
/* Applies `--dim NAME=SIZE` specs (fm_onnx_set_dim) to an ONNX model; 0, or the
 * exit code after printing the error (2 for a malformed spec). */
struct fm_onnx_model;
int fm_cli_onnx_dims(const char *cmd, struct fm_onnx_model *m, int n, char *const *specs);
/* 1 (the error printed, exit 1) when `path` names an ONNX file (it ends in .onnx), which
 * commands that want a model directory (predict, eval, generate, embed, prune, distill)
 * do not take: the message names the commands that do (cli/cmd_import.c); else 0. */
int fm_cli_refuse_onnx(const char *cmd, const char *path);
/* Whether path names an ONNX file (it ends in .onnx): what every command that takes one tests. */
bool fm_cli_is_onnx(const char *path);
/* The name of names[0..n) closest to `given` by edit distance, when it is close enough
 * to be a likely typo (at most a third of its length, and at most 3); else NULL. */
const char *fm_cli_suggest(const char *given, const char *const *names, int n);
/* "unknown option '--x'" with " (did you mean '--y'?)" when one is close; prints fm_cli_error. */
void fm_cli_unknown_option(const char *cmd, const char *given, const char *const *names, int n);
/* 1 (the error printed) when OUT holds an earlier training run (a committed checkpoint or a
 * model file) that a fresh run would replace; 0 otherwise (cli/out_dir.c). can_resume: the
 * message offers --resume. The caller skips it for --resume and --overwrite. */
int fm_cli_out_guard(const char *cmd, const char *out, bool can_resume);
#endif
