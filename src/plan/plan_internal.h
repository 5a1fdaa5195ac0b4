/* Helpers shared by the planner's source files (src/plan/): a growable string
 * for rendering and explanations, and name matching for suggestions. */
#ifndef FATHOM_PLAN_INTERNAL_H
#define FATHOM_PLAN_INTERNAL_H

#include <stddef.h>

#include "fathom/plan.h"

#define FM_GIB (1024.0 * 1024.0 * 1024.0)

/* A growable, always NUL-terminated string. On allocation failure it stops
 * growing and sets `failed`, so callers check once at the end. */
typedef struct plan_sb {
    char *buf;
    size_t len, cap;
    int failed;
} plan_sb;

void plan_sb_printf(plan_sb *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hand over the buffer (NULL if anything failed) and reset the builder. */
char *plan_sb_take(plan_sb *sb);

/* Edit distance between two names after lower-casing and dropping
 * everything but letters and digits. */
int plan_name_distance(const char *a, const char *b);
/* Lower-case, letters and digits only, into out (size cap). */
void plan_name_normalize(const char *in, char *out, size_t cap);
/* Append ", did you mean X or Y?" built from the closest of `names`. */
void plan_suggest(plan_sb *sb, const char *wanted, const char *const *names, int n);

/* Bytes per weight in storage for each precision (quantized formats include
 * their block scales), and per activation / KV element. */
double plan_weight_bytes(fm_plan_precision p);
double plan_act_bytes(fm_plan_precision p);
/* Bytes per KV-cache element: 1 with an 8-bit (fp8 or int8) KV cache, else the activations'. */
double plan_kv_bytes(const fm_plan_job *job);
/* The effective defaults the job resolves to (seq, mfu). */
int64_t plan_resolved_seq(const fm_plan_model *m, const fm_plan_job *job);
double plan_resolved_mfu(const fm_plan_job *job);
/* The MFU a row assumes: --mfu, else the GPU's figure for the precision. */
double plan_gpu_mfu(const fm_plan_gpu *g, const fm_plan_job *job);
/* Micro-batches per step: --micro-batches, else 1 (4 x stages with a pipeline). */
int plan_micro_batches(const fm_plan_job *job);
/* LoRA trainable parameters at the job's rank (adapters on every block linear). */
double plan_lora_params(const fm_plan_model *m, int rank);
int plan_is_training(fm_plan_task t);
/* Width of one attention head, and the parameters one token runs through
 * (a mixture of experts runs experts_active of its experts' MLPs). */
double plan_head_dim(const fm_plan_model *m);
double plan_active_params(const fm_plan_model *m);
/* Time (plan_time.c): the dense peak a precision runs at (< 0: none), FLOPs
 * per token with recompute, the training step and the serving solver; each
 * writes its terms with numbers into `ex` when given. plan_time_serving
 * returns 1, 0 when nothing fits beside the weights, -1 when the rate needs
 * more GPUs than exist. */
double plan_peak_tflops(const fm_plan_gpu *g, fm_plan_precision p);
double plan_flops_per_token(const fm_plan_model *m, const fm_plan_job *job, plan_sb *ex);
void plan_time_training(const fm_plan_model *m, const fm_plan_job *job, double fpt, fm_plan_row *row, plan_sb *ex);
int plan_time_serving(const fm_plan_model *m, const fm_plan_job *job, fm_plan_row *row, plan_sb *ex);
/* A Hugging Face (or fathom GPT) config.json: dimensions, validated with
 * file:line messages (plan_hf.c). */
fm_status plan_model_from_config(const char *path, fm_plan_model *out);
/* A directory `fathom train` wrote for a layer-list recipe: a CNN or an MLP
 * (plan_hf.c). Returns 1 and fills `out` if `dir` is one, 0 if not, -1 on error. */
int plan_model_from_fathom_dir(const char *dir, fm_plan_model *out);

#endif
