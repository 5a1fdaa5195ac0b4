/* What a profiler trace says: the op table, where the step time went, MFU and
 * a verdict. Behind `fathom profile`.
 *
 * The trace is read one event at a time (jansson with EOF checking off), not
 * as one JSON document, because the writer streams it: a running or crashed
 * run leaves a file with no closing bracket and perhaps half an event at the
 * end, and that is exactly when someone wants to look at it.
 *
 * Spans nest by time containment on one thread (Chrome's "X" events). Every
 * span's self time (its duration minus its direct children) is attributed to
 * one class, so the classes add up to the step time exactly:
 *   data       inside a span with category "data" (waiting for a batch)
 *   optimizer  inside a span with category "optimizer"
 *   compute    op spans of GEMM/conv/attention kind
 *   memory     every other op span (elementwise, reductions, norms, copies)
 *   overhead   time in a step, the autograd engine or any other wrapper span
 *              not covered by a child: dispatch, bookkeeping, allocation. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_kernels.h" /* fm_cpu_gemm: the GEMM path fathom's matmul uses */
#include "fathom/observe.h"

/* CAT_GPU: kernels and copies on a device's own track, timed with CUDA events
 * ("gpu kernel", "gpu memcpy"); they repeat work the host op spans already
 * account for, so they feed only the GPU busy time. */
enum { CAT_OTHER = 0, CAT_OP, CAT_STEP, CAT_DATA, CAT_OPT, CAT_GPU };
enum { CL_COMPUTE = 0, CL_MEMORY, CL_DATA, CL_OPT, CL_OVERHEAD, CL_COUNT };

typedef struct span {
    double ts, dur, child;
    double flops, bytes;
    double prof;     /* the profiler's own time charged to this op span (args.prof_us) */
    int64_t tid;
    int name;        /* index into the name table (op key: "matmul" or "matmul [bwd]") */
    int parent;
    signed char cat, cls;
    bool gpu, in_step, counted;
    bool lowp;       /* its products ran in bf16/f16 (args.products) */
} span;

typedef struct names {
    char **s;
    int n, cap;
    int *slot; /* open-addressing hash of indices, -1 empty */
    int nslot;
} names;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int names_get(names *t, const char *s) {
    if (t->n * 2 >= t->nslot) {
        int ns = t->nslot ? t->nslot * 2 : 256;
        int *nslots = malloc((size_t)ns * sizeof *nslots);
        if (!nslots) return -1;
        for (int i = 0; i < ns; i++) nslots[i] = -1;
        for (int i = 0; i < t->n; i++) {
            size_t h = hash_str(t->s[i]) & (size_t)(ns - 1);
            while (nslots[h] >= 0) h = (h + 1) & (size_t)(ns - 1);
            nslots[h] = i;
        }
        free(t->slot);
        t->slot = nslots;
        t->nslot = ns;
    }
    size_t h = hash_str(s) & (size_t)(t->nslot - 1);
    while (t->slot[h] >= 0) {
        if (!strcmp(t->s[t->slot[h]], s)) return t->slot[h];
        h = (h + 1) & (size_t)(t->nslot - 1);
    }
    if (t->n == t->cap) {
        int nc = t->cap ? t->cap * 2 : 64;
        char **nn = realloc(t->s, (size_t)nc * sizeof *nn);
        if (!nn) return -1;
        t->s = nn;
        t->cap = nc;
    }
    if (!(t->s[t->n] = strdup(s))) return -1;
    t->slot[h] = t->n;
    return t->n++;
}

static void names_free(names *t) {
    for (int i = 0; i < t->n; i++) free(t->s[i]);
    free(t->s);
    free(t->slot);
}

/* GEMM-like ops: the ones whose speed is bounded by arithmetic, not by bytes. */
static bool is_compute_op(const char *name) {
    static const char *const keys[] = {"matmul", "conv", "attention", "sdpa", "gemm", "linear", "bmm", "addmm", "einsum"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strstr(name, keys[i])) return true;
    return false;
}

static int cat_code(const char *cat) {
    if (!cat) return CAT_OTHER;
    if (!strcmp(cat, "forward") || !strcmp(cat, "backward") || !strcmp(cat, "kernel") || !strcmp(cat, "op") ||
        !strcmp(cat, "memcpy"))
        return CAT_OP;
    if (!strcmp(cat, "gpu kernel") || !strcmp(cat, "gpu memcpy")) return CAT_GPU;
    if (!strcmp(cat, "step")) return CAT_STEP;
    if (!strcmp(cat, "data") || !strcmp(cat, "dataloader")) return CAT_DATA;
    if (!strcmp(cat, "optimizer")) return CAT_OPT;
    return CAT_OTHER;
}

typedef struct parse_state {
    span *sp;
    int64_t n, cap;
    names nm;
    int64_t n_events;
    bool oom;
} parse_state;

static void add_event(parse_state *ps, json_t *e) {
    ps->n_events++;
    if (!json_is_object(e)) return;
    const char *ph = json_string_value(json_object_get(e, "ph"));
    if (!ph || strcmp(ph, "X")) return; /* metadata, counters, instants: not time spans */
    const char *name = json_string_value(json_object_get(e, "name"));
    const char *cat = json_string_value(json_object_get(e, "cat"));
    json_t *ts = json_object_get(e, "ts"), *dur = json_object_get(e, "dur");
    if (!name || !json_is_number(ts)) return;
    if (ps->n == ps->cap) {
        int64_t nc = ps->cap ? ps->cap * 2 : 4096;
        span *ns = realloc(ps->sp, (size_t)nc * sizeof *ns);
        if (!ns) { ps->oom = true; return; }
        ps->sp = ns;
        ps->cap = nc;
    }
    span *s = &ps->sp[ps->n];
    memset(s, 0, sizeof *s);
    s->ts = json_number_value(ts);
    s->dur = json_is_number(dur) ? json_number_value(dur) : 0;
    if (s->dur < 0) s->dur = 0;
    json_t *tid = json_object_get(e, "tid");
    /* A thread id written as a real number is truncated; one outside int64's range (or not a number)
       cannot name a real thread, so it files under thread 0 rather than overflow the conversion. */
    double tidr = json_number_value(tid);
    s->tid = json_is_integer(tid) ? (int64_t)json_integer_value(tid)
             : (tidr > -9.2e18 && tidr < 9.2e18) ? (int64_t)tidr : 0;
    s->cat = (signed char)cat_code(cat);
    json_t *args = json_object_get(e, "args");
    s->flops = json_number_value(json_object_get(args, "flops"));
    s->bytes = json_number_value(json_object_get(args, "bytes"));
    s->prof = json_number_value(json_object_get(args, "prof_us"));
    if (!(s->prof > 0) || s->prof > 1e12) s->prof = 0;
    const char *dev = json_string_value(json_object_get(args, "device"));
    s->gpu = dev && !strncmp(dev, "cuda", 4);
    const char *prod = json_string_value(json_object_get(args, "products"));
    s->lowp = prod && (!strcmp(prod, "bf16") || !strcmp(prod, "f16"));
    char key[160];
    if (s->cat == CAT_OP && cat && !strcmp(cat, "backward")) snprintf(key, sizeof key, "%s [bwd]", name);
    else snprintf(key, sizeof key, "%s", name);
    s->name = names_get(&ps->nm, key);
    if (s->name < 0) { ps->oom = true; return; }
    s->parent = -1;
    ps->n++;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { fm_set_error(FM_ERR_IO, "profile: cannot read trace '%s' (%s)", path, strerror(errno)); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf) { fm_set_error(FM_ERR_OOM, "profile: out of memory reading '%s'", path); return NULL; }
    if (err) { free(buf); fm_set_error(FM_ERR_IO, "profile: cannot read trace '%s' (read error)", path); return NULL; }
    *len = n;
    return buf;
}

static int line_of(const char *buf, size_t pos) {
    int line = 1;
    for (size_t i = 0; i < pos; i++) line += buf[i] == '\n';
    return line;
}

static fm_status parse_trace(const char *path, parse_state *ps, bool *truncated) {
    size_t len = 0;
    char *buf = slurp(path, &len);
    if (!buf) return fm_last_status();
    size_t i = 0;
    while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t')) i++;
    fm_status st = FM_OK;
    if (i == len) {
        st = fm_set_error(FM_ERR_FORMAT, "profile: '%s' is empty, not a trace", path);
    } else if (buf[i] == '{') {
        /* the object form: {"traceEvents": [...], ...} must be complete */
        json_error_t err;
        json_t *root = json_loadb(buf, len, 0, &err);
        json_t *evs = root ? json_object_get(root, "traceEvents") : NULL;
        if (!root) st = fm_set_error(FM_ERR_FORMAT, "profile: '%s' is not valid JSON (line %d: %s)", path, err.line, err.text);
        else if (!json_is_array(evs)) st = fm_set_error(FM_ERR_FORMAT, "profile: '%s' has no \"traceEvents\" array; not a Chrome trace", path);
        else {
            size_t k;
            json_t *e;
            json_array_foreach(evs, k, e) add_event(ps, e);
        }
        json_decref(root);
    } else if (buf[i] != '[') {
        st = fm_set_error(FM_ERR_FORMAT, "profile: '%s' is not a Chrome trace (expected a JSON array of events, found '%c' at the start)",
                          path, buf[i]);
    } else {
        i++;
        for (;;) {
            while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t' || buf[i] == ',')) i++;
            if (i >= len) { *truncated = true; break; } /* no closing bracket: the writer is still running or crashed */
            if (buf[i] == ']') break;
            json_error_t err;
            size_t used = 0;
            json_t *e = json_loadb(buf + i, len - i, JSON_DISABLE_EOF_CHECK, &err);
            if (!e) {
                /* An error that runs into the end of the file is a half-written last event. */
                if ((size_t)(err.position < 0 ? 0 : err.position) + 1 >= len - i || strstr(err.text, "premature end")) { *truncated = true; break; }
                st = fm_set_error(FM_ERR_FORMAT, "profile: '%s' is not valid trace JSON (line %d: %s)", path,
                                  line_of(buf, i) + err.line - 1, err.text);
                break;
            }
            used = (size_t)err.position;
            add_event(ps, e);
            json_decref(e);
            if (used == 0) { st = fm_set_error(FM_ERR_INTERNAL, "profile: JSON reader made no progress"); break; }
            i += used;
            if (ps->oom) break;
        }
    }
    free(buf);
    if (st == FM_OK && ps->oom) st = fm_set_error(FM_ERR_OOM, "profile: out of memory reading '%s'", path);
    if (st == FM_OK && ps->n_events == 0)
        st = fm_set_error(FM_ERR_FORMAT, "profile: '%s' holds no trace events", path);
    return st;
}

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    if (x->dur != y->dur) return x->dur > y->dur ? -1 : 1; /* the enclosing span first */
    return x->cat == CAT_STEP ? -1 : (y->cat == CAT_STEP ? 1 : 0);
}

static int cmp_interval(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmp_op(const void *a, const void *b) {
    const fm_trace_op_stat *x = a, *y = b;
    return x->self_us < y->self_us ? 1 : (x->self_us > y->self_us ? -1 : strcmp(x->name, y->name));
}

/* Nest spans per thread and attribute every span's self time to a class. */
static void analyze(span *sp, int64_t n, const names *nm) {
    const double eps = 0.01; /* timestamps are printed to the nanosecond */
    int64_t *stack = malloc((size_t)(n > 0 ? n : 1) * sizeof *stack);
    if (!stack) return;
    int64_t depth = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || sp[i].tid != sp[i - 1].tid) depth = 0;
        double end = sp[i].ts + sp[i].dur;
        while (depth) {
            const span *t = &sp[stack[depth - 1]];
            if (sp[i].ts >= t->ts - eps && end <= t->ts + t->dur + eps) break;
            depth--;
        }
        sp[i].parent = depth ? (int)stack[depth - 1] : -1;
        stack[depth++] = i;
        const span *par = sp[i].parent >= 0 ? &sp[sp[i].parent] : NULL;
        if (par) sp[sp[i].parent].child += sp[i].dur;
        int own;
        switch (sp[i].cat) {
        case CAT_DATA: own = CL_DATA; break;
        case CAT_OPT: own = CL_OPT; break;
        case CAT_OP: own = is_compute_op(nm->s[sp[i].name]) ? CL_COMPUTE : CL_MEMORY; break;
        default: own = CL_OVERHEAD;
        }
        sp[i].cls = (signed char)(par && (par->cls == CL_DATA || par->cls == CL_OPT) ? par->cls : own);
        sp[i].in_step = sp[i].cat == CAT_STEP || (par && par->in_step);
    }
    free(stack);
}

/* Without step spans, the busiest thread's whole traced interval stands in for one step. */
static bool add_whole_trace_step(parse_state *p) {
    /* ops per thread (few threads: a small table) */
    int64_t best_tid = p->sp[0].tid, best = -1, tids[64], cnt[64];
    int nt = 0;
    for (int64_t i = 0; i < p->n; i++) {
        if (p->sp[i].cat != CAT_OP) continue;
        int k = 0;
        while (k < nt && tids[k] != p->sp[i].tid) k++;
        if (k == nt) {
            if (nt == 64) continue;
            tids[nt] = p->sp[i].tid;
            cnt[nt++] = 0;
        }
        cnt[k]++;
    }
    for (int k = 0; k < nt; k++)
        if (cnt[k] > best) { best = cnt[k]; best_tid = tids[k]; }
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < p->n; i++) {
        if (p->sp[i].tid != best_tid) continue;
        lo = fmin(lo, p->sp[i].ts);
        hi = fmax(hi, p->sp[i].ts + p->sp[i].dur);
    }
    if (p->n == p->cap) {
        span *ns = realloc(p->sp, (size_t)(p->cap + 1) * sizeof *ns);
        if (!ns) return false;
        p->sp = ns;
        p->cap++;
    }
    span *v = &p->sp[p->n++];
    memset(v, 0, sizeof *v);
    v->ts = lo;
    v->dur = hi - lo;
    v->tid = best_tid;
    v->cat = CAT_STEP;
    v->parent = -1;
    v->name = -1;
    return true;
}

/* Step time, its split into classes, and the host-side GPU busy time (returned). */
static double split_step_time(parse_state *ps, bool any_step, fm_trace_summary *out) {
    /* Threads that run steps: a top-level "data" span there is the loop waiting for its next batch. */
    int64_t step_tids[64];
    int n_step_tids = 0;
    for (int64_t i = 0; i < ps->n; i++) {
        if (ps->sp[i].cat != CAT_STEP) continue;
        int k = 0;
        while (k < n_step_tids && step_tids[k] != ps->sp[i].tid) k++;
        if (k == n_step_tids && n_step_tids < 64) step_tids[n_step_tids++] = ps->sp[i].tid;
    }
    double split[CL_COUNT] = {0}, gpu_busy = 0, prof = 0;
    for (int64_t i = 0; i < ps->n; i++) {
        span *s = &ps->sp[i];
        const span *par = s->parent >= 0 ? &ps->sp[s->parent] : NULL;
        bool on_step_thread = false;
        for (int k = 0; k < n_step_tids; k++) on_step_thread |= step_tids[k] == s->tid;
        s->counted = s->in_step || (par && par->counted) || (!par && s->cat == CAT_DATA && on_step_thread);
        if (s->cat == CAT_STEP && !(par && par->in_step)) {
            out->step_us += s->dur;
            if (any_step) out->n_steps++;
        } else if (!par && s->counted) {
            out->step_us += s->dur; /* a batch wait between steps */
        }
        double self = s->dur - s->child;
        if (self < 0) self = 0;
        if (s->counted) {
            prof += s->prof;
            split[(int)s->cls] += self;
            if (s->cat == CAT_OP) out->step_flops += s->flops;
            if (s->cat == CAT_OP && s->lowp) out->lowp_flops += s->flops;
            if (s->gpu && s->cat == CAT_OP) gpu_busy += self;
            if (s->gpu) out->has_gpu = true;
        }
    }
    out->compute_us = split[CL_COMPUTE];
    out->memory_us = split[CL_MEMORY];
    out->data_us = split[CL_DATA];
    out->optimizer_us = split[CL_OPT];
    /* the profiler's own work (formatting and writing events) runs between the ops, where
     * it would read as framework overhead: its measured time is taken out of that */
    out->profiler_us = prof < split[CL_OVERHEAD] ? prof : split[CL_OVERHEAD];
    out->overhead_us = split[CL_OVERHEAD] - out->profiler_us;
    return gpu_busy;
}

/* With CUDA-event spans the GPU's busy time is theirs, clipped to the steps; otherwise the
 * host spans of ops that ran on a GPU stand in (the profiler synchronizes after each op).
 * Returns false when out of memory; leaves *gpu_busy alone without GPU spans. */
static bool gpu_busy_from_events(const parse_state *ps, fm_trace_summary *out, double *gpu_busy) {
    int64_t n_gpu = 0, n_iv = 0;
    for (int64_t i = 0; i < ps->n; i++) n_gpu += ps->sp[i].cat == CAT_GPU;
    if (!n_gpu) return true;
    double *iv = malloc(sizeof(double) * 2 * (size_t)(ps->n > 0 ? ps->n : 1));
    if (!iv) return false;
    for (int64_t i = 0; i < ps->n; i++) {
        const span *st_ = &ps->sp[i];
        const span *par = st_->parent >= 0 ? &ps->sp[st_->parent] : NULL;
        if (st_->cat == CAT_STEP && !(par && par->in_step)) { iv[2 * n_iv] = st_->ts; iv[2 * n_iv + 1] = st_->ts + st_->dur; n_iv++; }
    }
    qsort(iv, (size_t)n_iv, 2 * sizeof(double), cmp_interval);
    double busy = 0;
    for (int64_t i = 0; i < ps->n; i++) {
        const span *g = &ps->sp[i];
        if (g->cat != CAT_GPU) continue;
        /* first step that ends after the span starts, then every step it overlaps */
        int64_t lo = 0, hi = n_iv;
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (iv[2 * mid + 1] <= g->ts) lo = mid + 1;
            else hi = mid;
        }
        for (int64_t k = lo; k < n_iv && iv[2 * k] < g->ts + g->dur; k++)
            busy += fmax(0, fmin(iv[2 * k + 1], g->ts + g->dur) - fmax(iv[2 * k], g->ts));
    }
    free(iv);
    *gpu_busy = busy;
    out->has_gpu = out->gpu_event_timed = true;
    return true;
}

/* The per-op table, by self time; also the GEMM rate of the counted compute ops. */
static bool build_op_table(const parse_state *ps, fm_trace_summary *out) {
    int nn = ps->nm.n;
    fm_trace_op_stat *ops = calloc((size_t)(nn > 0 ? nn : 1), sizeof *ops);
    bool *used = calloc((size_t)(nn > 0 ? nn : 1), sizeof *used);
    if (!ops || !used) {
        free(ops);
        free(used);
        return false;
    }
    double gemm_flops = 0, gemm_us = 0;
    for (int64_t i = 0; i < ps->n; i++) {
        const span *s = &ps->sp[i];
        if (s->cat != CAT_OP || s->name < 0) continue;
        fm_trace_op_stat *o = &ops[s->name];
        double self = fmax(0, s->dur - s->child);
        used[s->name] = true;
        o->calls++;
        o->total_us += s->dur;
        o->self_us += self;
        o->flops += s->flops;
        o->bytes += s->bytes;
        out->op_self_us += self;
        if (s->counted && s->cls == CL_COMPUTE) { gemm_flops += s->flops; gemm_us += self; }
    }
    int k = 0;
    for (int i = 0; i < nn; i++) {
        if (!used[i]) continue;
        ops[k] = ops[i];
        snprintf(ops[k].name, sizeof ops[k].name, "%s", ps->nm.s[i]);
        ops[k].compute = is_compute_op(ps->nm.s[i]);
        k++;
    }
    free(used);
    qsort(ops, (size_t)k, sizeof *ops, cmp_op);
    out->ops = ops;
    out->n_ops = k;
    if (gemm_us > 0) out->gemm_gflops = gemm_flops / gemm_us / 1e3;
    return true;
}

fm_status fm_trace_summarize(const char *path, double peak_gflops, fm_trace_summary *out) {
    memset(out, 0, sizeof *out);
    if (!path) return fm_set_error(FM_ERR_INVALID, "profile: no trace file given");
    parse_state ps = {0};
    bool truncated = false;
    fm_status st = parse_trace(path, &ps, &truncated);
    if (st != FM_OK) {
        free(ps.sp);
        names_free(&ps.nm);
        return st;
    }
    out->n_events = ps.n_events;
    out->truncated = truncated;
    out->path = strdup(path);

    bool any_step = false, ok = true;
    for (int64_t i = 0; i < ps.n; i++) any_step |= ps.sp[i].cat == CAT_STEP;
    if (!any_step && ps.n > 0) ok = add_whole_trace_step(&ps);
    double gpu_busy = 0;
    if (ok) {
        if (ps.n > 1) qsort(ps.sp, (size_t)ps.n, sizeof *ps.sp, cmp_span); /* ps.sp is NULL when there are no spans */
        analyze(ps.sp, ps.n, &ps.nm);
        gpu_busy = split_step_time(&ps, any_step, out);
        ok = gpu_busy_from_events(&ps, out, &gpu_busy) && build_op_table(&ps, out);
    }
    free(ps.sp);
    names_free(&ps.nm);
    if (!ok) {
        fm_trace_summary_free(out);
        return fm_set_error(FM_ERR_OOM, "profile: out of memory");
    }
    if (out->step_us > 0) out->achieved_gflops = out->step_flops / out->step_us / 1e3;
    if (out->has_gpu && out->step_us > 0) out->gpu_idle_pct = 100.0 * fmax(0, 1 - gpu_busy / out->step_us);
    fm_trace_summary_set_peak(out, peak_gflops);
    return FM_OK;
}

void fm_trace_summary_set_peak(fm_trace_summary *out, double peak_gflops) { fm_trace_summary_set_peaks(out, peak_gflops, -1); }

void fm_trace_summary_set_peaks(fm_trace_summary *out, double f32_peak, double lowp_peak) {
    f32_peak = f32_peak > 0 ? f32_peak : 0;
    out->f32_peak_gflops = f32_peak;
    out->lowp_peak_gflops = lowp_peak > 0 ? lowp_peak : 0;
    out->lowp_peak_known = lowp_peak >= 0;
    /* The peak of this trace's mix: the time its FLOPs would take with the f32 ones at the
     * f32 rate and the low-precision ones at theirs, as one rate. */
    double lo = out->lowp_flops < out->step_flops ? out->lowp_flops : out->step_flops, hi = out->step_flops - lo;
    if (f32_peak > 0 && out->lowp_peak_gflops > 0 && lo > 0)
        out->peak_gflops = out->step_flops / (hi / f32_peak + lo / out->lowp_peak_gflops);
    else
        out->peak_gflops = f32_peak;
    out->mfu = out->peak_gflops > 0 ? out->achieved_gflops / out->peak_gflops : 0;
    static const char *const cls_name[CL_COUNT] = {"compute", "memory", "data", "optimizer", "overhead"};
    const double split[CL_COUNT] = {out->compute_us, out->memory_us, out->data_us, out->optimizer_us, out->overhead_us};
    int b = 0;
    for (int c = 1; c < CL_COUNT; c++)
        if (split[c] > split[b]) b = c;
    double pct = out->step_us > 0 ? 100.0 * split[b] / out->step_us : 0;
    out->bottleneck = out->step_us > 0 ? cls_name[b] : "none";
    const char *top_mem = NULL;
    for (int i = 0; i < out->n_ops; i++)
        if (!out->ops[i].compute) { top_mem = out->ops[i].name; break; }
    char *v = out->verdict;
    size_t vn = sizeof out->verdict;
    if (out->step_us <= 0) {
        snprintf(v, vn, "no timed spans in the trace: nothing to judge (was the profiler stopped right after it started?)");
    } else if (b == CL_DATA) {
        snprintf(v, vn, "data-bound: %.0f%% of step time waits for batches; add data-loader workers or prefetch more batches", pct);
    } else if (b == CL_MEMORY) {
        snprintf(v, vn, "memory-bound: elementwise/reduction/norm ops (top: %s) take %.0f%% of step time; fuse elementwise chains, or use bf16 to halve the bytes moved",
                 top_mem ? top_mem : "?", pct);
    } else if (b == CL_COMPUTE) {
        if (out->peak_gflops > 0 && out->gemm_gflops < 0.5 * out->peak_gflops)
            snprintf(v, vn, "compute-bound on small GEMMs: %.0f%% of step time in matmul/conv at %.1f GFLOP/s (%.0f%% of the %.0f GFLOP/s peak); a bigger batch makes the matrices larger and faster",
                     pct, out->gemm_gflops, 100.0 * out->gemm_gflops / out->peak_gflops, out->peak_gflops);
        else if (out->peak_gflops > 0 && out->step_flops > 0 && out->lowp_flops >= 0.5 * out->step_flops)
            snprintf(v, vn, "compute-bound: %.0f%% of step time in matmul/conv/attention running near peak, with %.0f%% of the FLOPs already in bf16/f16 products; more speed needs faster hardware or fewer FLOPs",
                     pct, 100.0 * out->lowp_flops / out->step_flops);
        else if (out->peak_gflops > 0 && out->lowp_peak_gflops > 1.2 * out->f32_peak_gflops)
            snprintf(v, vn, "compute-bound: %.0f%% of step time in matmul/conv/attention running near peak; more speed needs bf16 products (--precision bf16: bf16 GEMM runs at %.0f GFLOP/s here, f32 at %.0f) or faster hardware",
                     pct, out->lowp_peak_gflops, out->f32_peak_gflops);
        else if (out->peak_gflops > 0 && out->f32_peak_gflops > 0 && out->lowp_peak_known)
            snprintf(v, vn, "compute-bound: %.0f%% of step time in matmul/conv/attention running near peak; more speed needs faster hardware (bf16 products are no faster than f32 on this CPU)", pct);
        else if (out->peak_gflops > 0)
            snprintf(v, vn, "compute-bound: %.0f%% of step time in matmul/conv/attention running near peak; more speed needs lower precision (bf16) or faster hardware", pct);
        else
            snprintf(v, vn, "compute-bound: %.0f%% of step time in matmul/conv/attention at %.1f GFLOP/s; give the peak to judge how far from it that is, and use a bigger batch if it is low",
                     pct, out->gemm_gflops);
    } else if (b == CL_OPT) {
        snprintf(v, vn, "optimizer-bound: the optimizer step takes %.0f%% of step time; use a fused (multi-tensor) optimizer step or fewer, larger parameter tensors", pct);
    } else {
        snprintf(v, vn, "framework overhead: %.0f%% of step time is outside any op (dispatch, autograd bookkeeping, allocation); the ops are too small to amortize it: increase the batch size or fuse ops", pct);
    }
}

void fm_trace_summary_free(fm_trace_summary *s) {
    if (!s) return;
    free(s->ops);
    free(s->path);
    memset(s, 0, sizeof *s);
}

static double pct_of(double a, double b) { return b > 0 ? 100.0 * a / b : 0; }

void fm_trace_summary_print(const fm_trace_summary *s, FILE *f, int max_rows) {
    fprintf(f, "trace: %s (%lld events%s)\n\n", s->path ? s->path : "?", (long long)s->n_events,
            s->truncated ? "; the file ends early, summarized up to the last complete event" : "");
    fprintf(f, "%-28s %8s %10s %10s %7s %10s %9s %11s %8s\n", "op", "calls", "total ms", "self ms", "self %", "GFLOP",
            "GFLOP/s", "MB moved", "GB/s");
    int rows = max_rows > 0 && max_rows < s->n_ops ? max_rows : s->n_ops;
    for (int i = 0; i < rows; i++) {
        const fm_trace_op_stat *o = &s->ops[i];
        double t = o->self_us > 0 ? o->self_us : o->total_us;
        fprintf(f, "%-28.28s %8lld %10.3f %10.3f %6.1f%% %10.4f %9.2f %11.3f %8.2f\n", o->name, (long long)o->calls,
                o->total_us / 1e3, o->self_us / 1e3, pct_of(o->self_us, s->op_self_us), o->flops / 1e9,
                t > 0 ? o->flops / t / 1e3 : 0, o->bytes / 1e6, t > 0 ? o->bytes / t / 1e3 : 0);
    }
    if (rows < s->n_ops) {
        double rest = 0;
        for (int i = rows; i < s->n_ops; i++) rest += s->ops[i].self_us;
        fprintf(f, "... %d more ops, %.3f ms self time (%.1f%%)\n", s->n_ops - rows, rest / 1e3, pct_of(rest, s->op_self_us));
    }
    fprintf(f, "\n");
    if (s->n_steps) fprintf(f, "step time: %lld steps, %.3f ms total, %.3f ms per step\n", (long long)s->n_steps, s->step_us / 1e3,
                            s->step_us / 1e3 / (double)s->n_steps);
    else fprintf(f, "step time: no \"step\" spans; the busiest thread's traced interval, %.3f ms\n", s->step_us / 1e3);
    const struct { const char *what; double us; } rows2[] = {
        {"compute (matmul/conv/attention)", s->compute_us},
        {"memory-bound ops", s->memory_us},
        {"data waiting", s->data_us},
        {"optimizer", s->optimizer_us},
        {"framework overhead", s->overhead_us},
        {"the profiler's own time", s->profiler_us},
    };
    for (size_t i = 0; i < sizeof rows2 / sizeof rows2[0]; i++)
        fprintf(f, "  %-34s %10.3f ms %6.1f%%\n", rows2[i].what, rows2[i].us / 1e3, pct_of(rows2[i].us, s->step_us));
    double per = s->n_steps ? s->step_flops / (double)s->n_steps : s->step_flops;
    fprintf(f, "\nFLOPs: %.4f GFLOP%s; achieved %.2f GFLOP/s (matmul/conv alone %.2f GFLOP/s)\n", per / 1e9,
            s->n_steps ? " per step" : "", s->achieved_gflops, s->gemm_gflops);
    if (s->step_flops > 0 && s->lowp_flops > 0)
        fprintf(f, "products: %.1f%% of the FLOPs ran in bf16/f16\n", 100.0 * s->lowp_flops / s->step_flops);
    if (s->peak_gflops > 0 && s->lowp_flops > 0 && s->lowp_peak_gflops > 0)
        fprintf(f, "MFU: %.1f%% of %.1f GFLOP/s peak (this mix at %.1f GFLOP/s f32 and %.1f GFLOP/s bf16)\n", 100.0 * s->mfu,
                s->peak_gflops, s->f32_peak_gflops, s->lowp_peak_gflops);
    else if (s->peak_gflops > 0) fprintf(f, "MFU: %.1f%% of %.1f GFLOP/s peak\n", 100.0 * s->mfu, s->peak_gflops);
    else fprintf(f, "MFU: unknown (no peak given)\n");
    if (s->peak_gflops > 0 && s->mfu > 1.0)
        fprintf(f, "note: the trace ran above that peak, so this MFU means nothing: a peak measured while other work "
                   "holds the cores reads low, and a trace from another machine needs that machine's peak "
                   "(give it with --peak-gflops)\n");
    if (s->has_gpu)
        fprintf(f, "GPU idle: %.1f%% of step time (%s)\n", s->gpu_idle_pct,
                s->gpu_event_timed ? "kernel and copy times from CUDA events" : "host spans of GPU ops");
    fprintf(f, "\nverdict: %s\n", s->verdict);
}

char *fm_trace_summary_json(const fm_trace_summary *s) {
    json_t *root = json_object(), *ops = json_array(), *split = json_object();
    if (!root || !ops || !split) { json_decref(root); json_decref(ops); json_decref(split); return NULL; }
    json_object_set_new(root, "trace", json_string(s->path ? s->path : ""));
    json_object_set_new(root, "events", json_integer(s->n_events));
    json_object_set_new(root, "truncated", json_boolean(s->truncated));
    for (int i = 0; i < s->n_ops; i++) {
        const fm_trace_op_stat *o = &s->ops[i];
        double t = o->self_us > 0 ? o->self_us : o->total_us;
        json_array_append_new(ops, json_pack("{s:s,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:s}", "name", o->name, "calls",
                                             (json_int_t)o->calls, "total_ms", o->total_us / 1e3, "self_ms", o->self_us / 1e3,
                                             "self_pct", pct_of(o->self_us, s->op_self_us), "flops", o->flops,
                                             "gflops_per_s", t > 0 ? o->flops / t / 1e3 : 0.0, "bytes", o->bytes,
                                             "gb_per_s", t > 0 ? o->bytes / t / 1e3 : 0.0, "class",
                                             o->compute ? "compute" : "memory"));
    }
    json_object_set_new(root, "ops", ops);
    json_object_set_new(root, "steps", json_integer(s->n_steps));
    json_object_set_new(root, "step_ms", json_real(s->step_us / 1e3));
    const struct { const char *k; double us; } parts[] = {
        {"compute", s->compute_us}, {"memory", s->memory_us}, {"data", s->data_us},
        {"optimizer", s->optimizer_us}, {"overhead", s->overhead_us}, {"profiler", s->profiler_us},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        json_object_set_new(split, parts[i].k, json_pack("{s:f,s:f}", "ms", parts[i].us / 1e3, "pct", pct_of(parts[i].us, s->step_us)));
    json_object_set_new(root, "split", split);
    json_object_set_new(root, "flops", json_real(s->step_flops));
    json_object_set_new(root, "achieved_gflops", json_real(s->achieved_gflops));
    json_object_set_new(root, "gemm_gflops", json_real(s->gemm_gflops));
    json_object_set_new(root, "lowp_flops", json_real(s->lowp_flops));
    json_object_set_new(root, "peak_gflops", s->peak_gflops > 0 ? json_real(s->peak_gflops) : json_null());
    json_object_set_new(root, "f32_peak_gflops", s->f32_peak_gflops > 0 ? json_real(s->f32_peak_gflops) : json_null());
    json_object_set_new(root, "bf16_peak_gflops", s->lowp_peak_known ? json_real(s->lowp_peak_gflops) : json_null());
    json_object_set_new(root, "mfu", s->peak_gflops > 0 ? json_real(s->mfu) : json_null());
    json_object_set_new(root, "gpu_idle_pct", s->has_gpu ? json_real(s->gpu_idle_pct) : json_null());
    json_object_set_new(root, "gpu_idle_from_events", json_boolean(s->gpu_event_timed));
    json_object_set_new(root, "bottleneck", json_string(s->bottleneck ? s->bottleneck : "none"));
    json_object_set_new(root, "verdict", json_string(s->verdict));
    char *txt = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return txt;
}

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The best rate of run(ctx) (a 1024^3 product) over repeats for about a quarter of a second;
 * 0 when run says it cannot. */
static double best_rate(bool (*run)(void *), void *ctx) {
    const double flops = 2.0 * 1024 * 1024 * 1024;
    double best = 0, start = mono();
    for (int rep = 0; rep < 50; rep++) {
        double t0 = mono();
        if (!run(ctx)) break;
        double t = mono() - t0;
        if (t > 0) best = fmax(best, flops / t / 1e9);
        if (mono() - start > 0.25 && rep >= 2) break;
    }
    return best;
}

static bool run_f32(void *g) { fm_cpu_gemm(g); return true; }
/* the products fathom's bf16 matmul runs; false: this CPU has no bf16 hardware path (its
 * bf16 products widen to the f32 GEMM) */
static bool run_bf16(void *g) { return fm_cpu_gemm_bf16(g, NULL, false); }

double fm_measure_peak_gflops_bf16(void) {
    enum { N = 1024 };
    uint16_t *a = malloc(sizeof(uint16_t) * N * N), *b = malloc(sizeof(uint16_t) * N * N);
    float *c = malloc(sizeof(float) * N * N);
    double best = 0;
    if (a && b && c) {
        for (int i = 0; i < N * N; i++) { a[i] = (uint16_t)(0x3c00 + i % 7); b[i] = (uint16_t)(0xbc00 + i % 5); }
        fm_cpu_gemm_args g = {FM_BF16, false, false, N, N, N, a, N, b, N, 0.0, c, N};
        if (run_bf16(&g)) best = best_rate(run_bf16, &g); /* the first call: oneDNN's primitive, warm-up */
    }
    free(a);
    free(b);
    free(c);
    return best;
}

double fm_measure_peak_gflops(void) {
    enum { N = 1024 };
    float *a = malloc(sizeof(float) * N * N), *b = malloc(sizeof(float) * N * N), *c = malloc(sizeof(float) * N * N);
    double best = 0;
    if (a && b && c) {
        for (int i = 0; i < N * N; i++) { a[i] = (float)((i % 7) - 3) * 0.01f; b[i] = (float)((i % 5) - 2) * 0.01f; }
        /* through fm_cpu_gemm, so the peak uses the same threads as training (OpenBLAS runs
         * single-threaded under fathom's pool: docs/ARCHITECTURE.md "Who drives GEMM threads") */
        fm_cpu_gemm_args g = {FM_F32, false, false, N, N, N, a, N, b, N, 0.0, c, N};
        run_f32(&g); /* warm-up: threads, caches */
        best = best_rate(run_f32, &g);
    }
    free(a);
    free(b);
    free(c);
    return best;
}
