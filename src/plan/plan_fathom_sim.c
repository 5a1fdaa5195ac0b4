/* The allocation replay behind the recipe planner: see plan_fathom_sim.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_fathom_sim.h"

double pf_round(double nbytes) {
    /* the same rule as round_size() in src/core/memory.c: the allocator's
     * peak_allocated counts these rounded sizes, not the bytes asked for */
    uint64_t n = nbytes < 1 ? 1 : (uint64_t)(nbytes + 0.5);
    if (n <= 4096) return (double)((n + 63) & ~(uint64_t)63);
    uint64_t p = 1;
    while (p < n) p <<= 1;
    uint64_t step = (p >> 1) / 8;
    return (double)((n + step - 1) / step * step);
}

const char *pf_cat_name(pf_cat c) {
    static const char *names[PF_NCAT] = {"data", "weights", "gradients", "optimizer state", "activations", "workspace"};
    return (unsigned)c < PF_NCAT ? names[c] : "?";
}

const char *pf_mib(double bytes, char *buf, int cap) {
    if (bytes < 1024) snprintf(buf, (size_t)cap, "%.0f B", bytes);
    else if (bytes < 1024.0 * 1024) snprintf(buf, (size_t)cap, "%.1f KiB", bytes / 1024);
    else snprintf(buf, (size_t)cap, "%.2f MiB", bytes / (1024.0 * 1024));
    return buf;
}

static void close_line(pf_sim *s) {
    if (!s->log || !s->log_open) return;
    char b[32];
    plan_sb_printf(s->log, "  -> live %s\n", pf_mib(s->cur, b, sizeof b));
    s->log_open = 0;
}

void pf_phase(pf_sim *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char text[sizeof s->where];
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    /* leading spaces indent nested phases in the log only */
    const char *t = text;
    while (*t == ' ') t++;
    snprintf(s->where, sizeof s->where, "%s", t);
    if (!s->log) return;
    close_line(s);
    plan_sb_printf(s->log, "  %s:", text);
    s->log_open = 1;
}

void pf_end(pf_sim *s) { close_line(s); }

int pf_alloc(pf_sim *s, pf_cat cat, double elems, double esize, const char *what) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        pf_buf *nb = realloc(s->b, (size_t)cap * sizeof *nb);
        if (!nb) { s->failed = 1; return -1; }
        s->b = nb;
        s->cap = cap;
    }
    pf_buf *b = &s->b[s->n];
    b->bytes = pf_round(elems * esize);
    b->refs = 1;
    b->cat = cat;
    snprintf(b->what, sizeof b->what, "%s", what);
    s->cur += b->bytes;
    s->cat[cat] += b->bytes;
    if (s->cur > s->peak) {
        s->peak = s->cur;
        memcpy(s->peak_cat, s->cat, sizeof s->cat);
        int k = snprintf(s->peak_where, sizeof s->peak_where, "%s", s->where);
        if (k > 0 && (size_t)k + 4 < sizeof s->peak_where)
            snprintf(s->peak_where + k, sizeof s->peak_where - (size_t)k, " (%.*s)", (int)(sizeof s->peak_where - (size_t)k - 4), what);
    }
    if (s->log) {
        char sz[32];
        plan_sb_printf(s->log, " +%s %s", what, pf_mib(b->bytes, sz, sizeof sz));
    }
    return s->n++;
}

void pf_ref(pf_sim *s, int id) {
    if (id >= 0 && id < s->n && s->b[id].refs > 0) s->b[id].refs++;
}

void pf_unref(pf_sim *s, int id) {
    if (id < 0 || id >= s->n || s->b[id].refs <= 0) return;
    pf_buf *b = &s->b[id];
    if (--b->refs > 0) return;
    s->cur -= b->bytes;
    s->cat[b->cat] -= b->bytes;
    if (s->log) plan_sb_printf(s->log, " -%s", b->what);
}

void pf_recat(pf_sim *s, int id, pf_cat cat) {
    if (id < 0 || id >= s->n || s->b[id].refs <= 0) return;
    s->cat[s->b[id].cat] -= s->b[id].bytes;
    s->b[id].cat = cat;
    s->cat[cat] += s->b[id].bytes;
}

void pf_free(pf_sim *s) {
    free(s->b);
    memset(s, 0, sizeof *s);
}
