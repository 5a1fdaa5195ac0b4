/* A replay of fathom's own CPU allocations for one training run, used by the
 * recipe planner (plan_fathom.c, plan_fathom_gpt.c).
 *
 * Why a replay and not a formula: fathom's peak is a moment, not a sum. Which
 * tensors are alive at that moment depends on what each op saves for its
 * backward, when the backward walk frees it, when a gradient is handed to its
 * parameter and when the optimizer creates its state. The trainers' op
 * sequences are short and fixed, so the planner walks them buffer by buffer,
 * with the reference counting fathom's storages use and the size rounding of
 * the CPU caching allocator (src/core/memory.c), and reports the largest total
 * and what made it up. No tensor is allocated: only sizes are added up. */
#ifndef FATHOM_PLAN_FATHOM_SIM_H
#define FATHOM_PLAN_FATHOM_SIM_H

#include <stdint.h>

#include "fathom/plan.h"
#include "plan/plan_internal.h"

/* What a buffer is for, as the planner reports it. Gradients in flight during
 * the backward walk count as gradients once they belong to a parameter; the
 * rest of backward's temporaries (and kernels' scratch) are workspace. */
typedef enum pf_cat { PF_DATA = 0, PF_WEIGHTS, PF_GRADS, PF_OPTIM, PF_ACT, PF_WORK, PF_NCAT } pf_cat;

typedef struct pf_buf {
    double bytes; /* rounded, as fathom's allocator counts them */
    int refs;
    pf_cat cat;
    char what[40];
} pf_buf;

typedef struct pf_sim {
    pf_buf *b;
    int n, cap;
    double cur, peak;
    double cat[PF_NCAT], peak_cat[PF_NCAT];
    char where[128], peak_where[128];
    int failed;
    plan_sb *log;  /* --explain: one line per phase (NULL: no log) */
    int log_open;
} pf_sim;

/* fathom's CPU allocator rounding: 64 B below 4 KiB, eighths of the power of two above. */
double pf_round(double nbytes);
/* A new buffer of `elems` elements of `esize` bytes, with one reference. */
int pf_alloc(pf_sim *s, pf_cat cat, double elems, double esize, const char *what);
void pf_ref(pf_sim *s, int id);
/* Drops one reference; the buffer is freed at zero. id < 0 is ignored. */
void pf_unref(pf_sim *s, int id);
/* Moves a live buffer to another category (a gradient leaving the walk). */
void pf_recat(pf_sim *s, int id, pf_cat cat);
/* Names the moment the next allocations belong to (for the peak's "where" and the log). */
void pf_phase(pf_sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pf_end(pf_sim *s);
void pf_free(pf_sim *s);
const char *pf_cat_name(pf_cat c);
/* "1.25 MiB" */
const char *pf_mib(double bytes, char *buf, int cap);

#endif
