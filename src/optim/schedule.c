/* Learning-rate schedules as pure functions of the step.
 *
 * Keeping the schedule stateless means a resumed run needs only the step count
 * to continue with exactly the learning rates the uninterrupted run would use. */
#include <math.h>
#include <string.h>

#include "fathom/optim.h"

static const char *sched_names[] = {"constant", "step", "warmup", "cosine"};

fm_status fm_sched_kind_parse(const char *name, fm_sched_kind *out) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, sched_names[i])) { *out = (fm_sched_kind)i; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "unknown schedule '%s' (expected constant, step, warmup or cosine)", name);
}

const char *fm_sched_kind_name(fm_sched_kind kind) { return (unsigned)kind < 4 ? sched_names[kind] : "?"; }

double fm_lr_at(const fm_lr_schedule *s, int64_t step) {
    double lr = s->base_lr;
    if (step < 0) step = 0;
    /* the ramp reaches base_lr at the end of step warmup_steps - 1 (no zero-LR first step) */
    if (s->warmup_steps > 0 && step < s->warmup_steps)
        return s->base_lr * (double)(step + 1) / (double)s->warmup_steps;
    switch (s->kind) {
    case FM_SCHED_STEP:
        if (s->step_size > 0) lr = s->base_lr * pow(s->gamma, (double)(step / s->step_size));
        break;
    case FM_SCHED_COSINE: {
        int64_t span = s->total_steps - s->warmup_steps;
        if (span <= 0) return s->min_lr;
        double t = (double)(step - s->warmup_steps) / (double)span;
        if (t > 1) t = 1;
        lr = s->min_lr + 0.5 * (s->base_lr - s->min_lr) * (1.0 + cos(M_PI * t));
        break;
    }
    default: break;
    }
    return lr;
}
