/* Shared by the recipe planner's files: plan_fathom.c (layer-list recipes,
 * entry point, output) and plan_fathom_gpt.c (GPT recipes). Both run the
 * trainer's model and steps on the meta device (plan_step.c). */
#ifndef FATHOM_PLAN_FATHOM_H
#define FATHOM_PLAN_FATHOM_H

#include "fathom/plan.h"
#include "plan/plan_step.h"

/* `path` is the resolved recipe file, known to hold [model] type = gpt. */
fm_status plan_fathom_gpt(const char *path, const fm_plan_run_opts *o, int explain, fm_plan_run *out);
/* fp32/bf16/fp16 as the autocast dtype */
fm_dtype plan_fathom_dtype(fm_plan_precision p);
/* The run's figures from a meta step: the peak is the step's plus `data` (the
 * host data sets and loader buffers the step does not see), less `batch` (the
 * step's own batch tensors, which the loader's buffers in `data` stand for). */
void plan_fathom_fill(fm_plan_run *out, const plan_step_mem *m, double data, double batch);
#endif
