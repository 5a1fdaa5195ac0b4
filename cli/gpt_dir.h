/* A GPT opened from a directory for the CLI (cli/gpt_dir.c): a graph (with its
 * tokenizer.txt), a Hugging Face layout or a `fathom train` GPT directory. */
#ifndef FATHOM_CLI_GPT_DIR_H
#define FATHOM_CLI_GPT_DIR_H
#include <stdbool.h>

#include "fathom/gpt.h"
#include "fathom/graph.h"

typedef struct fm_cli_gpt {
    fm_gpt *m;   /* a model directory, or */
    fm_graph *g; /* a graph directory */
    fm_tokenizer *tok;
    int ctx_len, vocab;
    fm_device dev; /* where fm_cli_gpt_to put it (the CPU until then) */
} fm_cli_gpt;

/* Opens dir; on failure nothing to close and the error says why. `loaded`: dir's graph when
 * the caller has already loaded it (fathom eval looks at its meta first), so it is not read a
 * second time; taken over (freed on failure). NULL: dir is read here. */
fm_status fm_cli_gpt_open(const char *dir, fm_graph *loaded, fm_cli_gpt *out);
/* The inference graph of a directory, for compile, quantize, export and bench: a graph
 * directory, a trained model traced (fm_graph_from_model_dir), a GPT in Hugging
 * Face layout (its KV-cache graph, with its tokenizer files attached), or a path
 * ending in .onnx: that file as a graph (fm_onnx_to_graph, its dynamic dims kept). */
fm_graph *fm_cli_graph_from_dir(const char *dir);
fm_status fm_cli_gpt_to(fm_cli_gpt *p, fm_device dev);
/* logits [B, T, V] for tokens [B, T] (no tape is wanted: the caller turns grad off) */
fm_tensor *fm_cli_gpt_logits(fm_cli_gpt *p, fm_tensor *tokens);
void fm_cli_gpt_close(fm_cli_gpt *p);
#endif
