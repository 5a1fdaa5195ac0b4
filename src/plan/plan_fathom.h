/* Shared by the recipe planner's files: plan_fathom.c (sequential recipes,
 * entry point, output) and plan_fathom_gpt.c (GPT recipes). */
#ifndef FATHOM_PLAN_FATHOM_H
#define FATHOM_PLAN_FATHOM_H

#include "fathom/plan.h"
#include "plan/plan_fathom_sim.h"

/* `path` is the resolved recipe file, known to hold [model] type = gpt. */
fm_status plan_fathom_gpt(const char *path, const fm_plan_run_opts *o, int explain, fm_plan_run *out);

#endif
