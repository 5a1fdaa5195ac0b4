/* Small pieces the planner files share: the string builder used for rendering
 * and explanations, name matching for "did you mean" suggestions, and the
 * names of the job's enums. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_internal.h"

void plan_sb_printf(plan_sb *sb, const char *fmt, ...) {
    if (sb->failed) return;
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) { sb->failed = 1; va_end(ap2); return; }
    size_t need = sb->len + (size_t)n + 1;
    if (need > sb->cap) {
        size_t cap = sb->cap ? sb->cap : 256;
        while (cap < need) cap *= 2;
        char *nb = realloc(sb->buf, cap);
        if (!nb) { sb->failed = 1; va_end(ap2); return; }
        sb->buf = nb;
        sb->cap = cap;
    }
    vsnprintf(sb->buf + sb->len, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    sb->len += (size_t)n;
}

char *plan_sb_take(plan_sb *sb) {
    char *out = sb->buf;
    if (sb->failed) { free(out); out = NULL; }
    else if (!out) out = calloc(1, 1);
    sb->buf = NULL;
    sb->len = sb->cap = 0;
    sb->failed = 0;
    return out;
}

void plan_name_normalize(const char *in, char *out, size_t cap) {
    size_t j = 0;
    for (size_t i = 0; in[i] && j + 1 < cap; i++)
        if (isalnum((unsigned char)in[i])) out[j++] = (char)tolower((unsigned char)in[i]);
    out[j] = 0;
}

/* Optimal-string-alignment distance: Levenshtein plus adjacent swaps, the
 * commonest typo ("4009" for "4090"). */
static int osa_distance(const char *x, const char *y) {
    size_t n = strlen(x), m = strlen(y);
    int d[128][128];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int best = d[i - 1][j - 1] + (x[i - 1] != y[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && x[i - 1] == y[j - 2] && x[i - 2] == y[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

int plan_name_distance(const char *a, const char *b) {
    char x[128], y[128], word[128];
    plan_name_normalize(a, x, sizeof x);
    plan_name_normalize(b, y, sizeof y);
    int best = osa_distance(x, y);
    /* Also compare with each leading run of words of the candidate, so that
     * "RTX 4009" is close to "RTX 4090 24GB" despite the memory suffix. */
    size_t len = strlen(b);
    for (size_t i = 1; i < len && i < sizeof word; i++) {
        if (b[i] != ' ') continue;
        memcpy(word, b, i);
        word[i] = 0;
        char w[128];
        plan_name_normalize(word, w, sizeof w);
        int d = osa_distance(x, w);
        if (d < best) best = d;
    }
    return best;
}

void plan_suggest(plan_sb *sb, const char *wanted, const char *const *names, int n) {
    int best[3] = {-1, -1, -1}, bestd[3] = {1 << 30, 1 << 30, 1 << 30};
    for (int i = 0; i < n; i++) {
        int d = plan_name_distance(wanted, names[i]);
        for (int k = 0; k < 3; k++) {
            if (d < bestd[k]) {
                for (int j = 2; j > k; j--) { best[j] = best[j - 1]; bestd[j] = bestd[j - 1]; }
                best[k] = i;
                bestd[k] = d;
                break;
            }
        }
    }
    if (best[0] < 0) return;
    plan_sb_printf(sb, "; did you mean \"%s\"", names[best[0]]);
    /* Offer runners-up only when they are about as close as the best. */
    for (int k = 1; k < 3; k++)
        if (best[k] >= 0 && bestd[k] <= bestd[0] + 1) plan_sb_printf(sb, " or \"%s\"", names[best[k]]);
    plan_sb_printf(sb, "?");
}

static const char *const task_names[] = {"inference", "finetune", "train", "lora", "qlora"};
static const char *const prec_names[] = {"fp32", "bf16", "fp16", "int8", "int4", "fp8"};
static const char *const opt_names[] = {"adamw", "sgd", "adam8bit"};
static const char *const ckpt_names[] = {"none", "selective", "full"};
static const char *const pricing_names[] = {"on-demand", "spot", "reserved"};

static int parse_in(const char *s, const char *const *names, int n) {
    if (!s) return -1;
    for (int i = 0; i < n; i++)
        if (!strcasecmp(s, names[i])) return i;
    return -1;
}

const char *fm_plan_task_name(fm_plan_task t) { return (unsigned)t < 5 ? task_names[t] : "?"; }
const char *fm_plan_precision_name(fm_plan_precision p) { return (unsigned)p < 6 ? prec_names[p] : "?"; }
const char *fm_plan_optimizer_name(fm_plan_optimizer o) { return (unsigned)o < 3 ? opt_names[o] : "?"; }
const char *fm_plan_ckpt_name(fm_plan_ckpt c) { return (unsigned)c < 3 ? ckpt_names[c] : "?"; }
const char *fm_plan_pricing_name(fm_plan_pricing p) { return (unsigned)p < 3 ? pricing_names[p] : "?"; }
int fm_plan_task_parse(const char *s) { return parse_in(s, task_names, 5); }
int fm_plan_precision_parse(const char *s) { return parse_in(s, prec_names, 6); }
int fm_plan_optimizer_parse(const char *s) { return parse_in(s, opt_names, 3); }
int fm_plan_ckpt_parse(const char *s) { return parse_in(s, ckpt_names, 3); }
int fm_plan_pricing_parse(const char *s) {
    if (s && (!strcasecmp(s, "ondemand") || !strcasecmp(s, "on_demand"))) return FM_PLAN_ON_DEMAND;
    return parse_in(s, pricing_names, 3);
}
