/* --device for the commands that run a model (eval, predict, generate; train
 * parses its own flag set): cpu, cuda, cuda:N, check or check:N. */
#ifndef FATHOM_CLI_DEVICE_ARG_H
#define FATHOM_CLI_DEVICE_ARG_H
#include <stdbool.h>

#include "fathom/tensor.h"

/* Parses v and checks that the device exists here, before any work. Returns the
 * exit code after printing why: 0 ok; 2 (usage) for a string that does not parse or
 * an index out of range; 1 for a device this build or machine lacks ("not usable:
 * no CUDA device was found", "this build has no CUDA backend"). */
int fm_cli_device(const char *cmd, const char *v, fm_device *out);
/* The check alone, for a device parsed already (v: the string, for the message). */
int fm_cli_device_check(const char *cmd, const char *v, fm_device dev);

/* --precision for eval and predict: fp32, bf16 or fp16, the autocast dtype of the
 * forward (fp32: autocast off), as `fathom train --precision` trains. Returns the
 * exit code after printing why: 0 ok, 2 for anything else. */
int fm_cli_precision(const char *cmd, const char *v, fm_dtype *out);
/* 0, or 2 after printing why: a graph directory runs in the precision it was
 * compiled or quantized in, so --precision other than fp32 is refused for one. */
int fm_cli_precision_for_graph(const char *cmd, const char *dir, fm_dtype precision);

typedef struct fm_graph fm_graph;   /* fathom/graph.h */
typedef struct fm_module fm_module; /* fathom/nn.h */
typedef struct fm_recipe fm_recipe; /* fathom/recipe.h */
/* A classifier for eval and predict, on dev: g (dir's graph, loaded by the caller; NULL for a
 * `fathom train` directory, loaded here into *m) with its recipe in *r. 0, or 1 after
 * printing why, with nothing left to free (g freed too). */
int fm_cli_classifier_open(const char *dir, fm_graph *g, fm_device dev, fm_recipe *r, fm_module **m);
#endif
