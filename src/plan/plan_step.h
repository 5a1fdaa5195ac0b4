/* One training run's memory, measured by running fathom's own training code
 * (plan_step.c) on a device: the meta device for the planner, the CPU to
 * check the meta device against it (tests/test_meta_device.c). */
#ifndef FATHOM_PLAN_STEP_H
#define FATHOM_PLAN_STEP_H
#include "fathom/efficiency.h"
#include "fathom/gpt.h"
#include "fathom/memory.h"
#include "fathom/recipe.h"
#include "plan/plan_internal.h" /* plan_sb */

typedef struct plan_step_opts {
    fm_device dev;
    int64_t batch;            /* > 0 */
    fm_dtype precision;       /* FM_F32, FM_BF16 or FM_F16 (autocast) */
    fm_checkpointing checkpointing;
    int grad_accum;           /* >= 1 */
    int steps;                /* >= 1; two show a steady step (the sequential trainer makes its optimizer state in the first) */
    bool finish;              /* GPT: the run's end after the last step: a validation batch and the checkpoint's copies */
    int64_t eval_batch;       /* GPT: the validation batch (0: batch); each data-parallel rank validates whole batches */
    /* GPT, one rank of `mpirun -np ranks fathom train --tensor-parallel T [--zero 1]` (0/1: one
     * process): the model split T ways, and (zero) the optimizer state sharded over the
     * ranks/T data-parallel ranks; `batch` is then this rank's part. Run through stand-in
     * groups (collectives that move nothing), so the tensors are the rank's own. */
    int tensor_parallel, ranks, zero;
    plan_sb *log;             /* not NULL: one line per kernel from the first step on (bytes live after it) */
} plan_step_opts;

typedef struct plan_step_mem {
    /* bytes on opts.dev beyond what it held before: */
    size_t resident;                    /* when the trainer resets its peak (model, optimizer state, batch) */
    size_t peak;                        /* the peak from there on (what `fathom train --json` reports) */
    size_t peak_cat[FM_MEM_CAT_COUNT];  /* each category's own peak */
    size_t at_peak_cat[FM_MEM_CAT_COUNT]; /* each category at the moment of the peak (meta only) */
    size_t end;                         /* still held when the run ends (0 unless something leaked) */
    size_t batch;                       /* the batch tensors this made, in allocator blocks (the loader holds its own) */
    int64_t params;
    char peak_at[96];                   /* the kernel after which the peak was first seen */
} plan_step_mem;

void plan_step_defaults(plan_step_opts *o);
/* A layer-list recipe as `fathom train` (src/recipe/train.c) trains it. */
fm_status plan_step_recipe(const fm_recipe *r, const plan_step_opts *o, plan_step_mem *out);
/* A GPT as `fathom train` trains a GPT recipe (src/gpt/gpt_train.c), with go's
 * model, optimizer settings and seed. */
fm_status plan_step_gpt(const fm_gpt_train_opts *go, const plan_step_opts *o, plan_step_mem *out);
/* One inference of graph g by fathom's graph runner on o->dev (g moves there; its arena
 * off), its inputs zeros of shapes[i]: out->resident the weights and inputs, out->peak
 * the run's peak; the kernels' FLOPs and bytes, and the outputs' bytes. */
struct fm_graph;
fm_status plan_step_graph(struct fm_graph *g, const int64_t (*shapes)[FM_MAX_DIMS], const plan_step_opts *o, plan_step_mem *out,
                          double *flops, double *bytes, size_t *output_bytes);
#endif
