/* `fathom eval` of a GPT (cli/cmd_eval_gpt.c). */
#ifndef FATHOM_CLI_EVAL_GPT_H
#define FATHOM_CLI_EVAL_GPT_H
#include <stdbool.h>
#include <stdint.h>

#include "fathom/graph.h"
#include "fathom/tensor.h"

typedef struct fm_eval_gpt_opts {
    const char *text;    /* a text file to evaluate on; NULL: a token file's held-out tail */
    const char *tokens;  /* that token file; NULL: DIR/tokens.bin */
    double val_fraction; /* that tail's fraction (the trainer's val_fraction; 0.1) */
    int64_t batch;       /* windows per forward */
    fm_device device;
    fm_dtype precision;  /* the forward's autocast dtype (FM_F32: off) */
    bool json, quiet;
} fm_eval_gpt_opts;

/* The exit code: 0, or 1 with the error printed. g: dir's graph when dir is a graph
 * directory and the caller loaded it (taken over: freed here), else NULL. */
int fm_eval_gpt(const char *dir, fm_graph *g, const fm_eval_gpt_opts *o);
#endif
