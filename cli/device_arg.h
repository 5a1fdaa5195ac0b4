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
#endif
