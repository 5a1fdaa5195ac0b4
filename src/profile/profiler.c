/* The trace writer behind fathom/profile.h.
 *
 * Events are formatted on the recording thread into a shared buffer under a
 * mutex and written out when it passes 64 KiB, when half a second has gone by
 * since the last write (so a slow run that crashes loses at most the last half
 * second), and at stop. Spans use the
 * "complete" event form (ph "X": start + duration), so nesting is implied by
 * time containment on one thread's track, which is how the viewers draw it. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dispatch/dispatch.h"
#include "fathom/memory.h"
#include "fathom/profile.h"
#include "profile/op_cost.h"

#define FLUSH_AT (64 * 1024)
#define FLUSH_EVERY_S 0.5
#define MAX_DEPTH 64

static struct {
    pthread_mutex_t mu;
    FILE *f;
    char *buf;
    size_t len, cap;
    double t0, last_flush_s;
    int n_events;
    uint64_t session;
    uint64_t named_tracks; /* device tracks whose name has been written in this trace */
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

int fm_profiler_on = 0; /* read without the lock: a stale value only drops or adds one event */

static _Thread_local struct { const char *name, *cat; double start; } t_stack[MAX_DEPTH];
static _Thread_local int t_depth;
static _Thread_local double t_prof_carry; /* the last op span's writing, charged to the next one */

static double mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

bool fm_profiler_enabled(void) { return __atomic_load_n(&fm_profiler_on, __ATOMIC_RELAXED) != 0; }
double fm_profiler_now_us(void) { return mono_us() - g.t0; }

/* pid and thread id: system calls (glibc caches neither), so each is asked once,
 * and again in a forked child, whose ids differ. */
static int g_pid;
static _Thread_local long t_tid;
static void forget_ids(void) {
    g_pid = 0;
    t_tid = 0;
}
static int pid(void) {
    if (!g_pid) g_pid = (int)getpid();
    return g_pid;
}
static long tid(void) {
    if (!t_tid) t_tid = (long)syscall(SYS_gettid);
    return t_tid;
}
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void install_atfork(void) { pthread_atfork(NULL, NULL, forget_ids); }

/* coarse clock: a few ns, and resolution of a few ms is plenty for a flush timer */
static double coarse_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void flush_locked(void) {
    g.last_flush_s = coarse_s();
    if (g.f && g.len) {
        fwrite(g.buf, 1, g.len, g.f);
        fflush(g.f);
    }
    g.len = 0;
}

/* One event (a whole JSON object, n bytes) into the buffer. */
static void emit_line(const char *line, size_t n) {
    pthread_mutex_lock(&g.mu);
    if (!g.f) { pthread_mutex_unlock(&g.mu); return; }
    if (g.len + (size_t)n + 2 > g.cap) {
        size_t nc = (g.cap ? g.cap * 2 : FLUSH_AT * 2) + (size_t)n;
        char *nb = realloc(g.buf, nc);
        if (!nb) { pthread_mutex_unlock(&g.mu); return; }
        g.buf = nb;
        g.cap = nc;
    }
    /* events are separated by ",\n"; the first follows the opening "[" directly */
    if (g.n_events++) { g.buf[g.len++] = ','; g.buf[g.len++] = '\n'; }
    memcpy(g.buf + g.len, line, n);
    g.len += n;
    if (g.len >= FLUSH_AT || coarse_s() - g.last_flush_s >= FLUSH_EVERY_S) flush_locked();
    pthread_mutex_unlock(&g.mu);
}

/* Events are built without printf: its format parsing and floating-point path were
 * most of a profiled op's own cost (perf of bench_profiler_overhead --only
 * tiny: printf_positional, __parse_one_specmb, _IO_default_xsputn and __printf_fp_l,
 * about 30% of the run). A line builder over a fixed buffer; `over` marks a line that
 * did not fit, which is then dropped rather than written cut. */
typedef struct lb {
    char *p;
    size_t len, cap;
    bool over;
} lb;

static void lb_put(lb *b, const char *s, size_t n) {
    if (b->len + n >= b->cap) { b->over = true; return; }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}
static void lb_s(lb *b, const char *s) { lb_put(b, s, strlen(s)); }
static void lb_c(lb *b, char c) { lb_put(b, &c, 1); }
static void lb_i64(lb *b, long long v) {
    char d[24];
    int k = 0;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do { d[k++] = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) d[k++] = '-';
    char r[24];
    for (int i = 0; i < k; i++) r[i] = d[k - 1 - i];
    lb_put(b, r, (size_t)k);
}
/* JSON-escaped, at most 255 bytes of s */
static void lb_esc(lb *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; s && s[i] && i < 255; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { lb_c(b, '\\'); lb_c(b, (char)c); }
        else if (c < 0x20) { char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]}; lb_put(b, u, 6); }
        else lb_c(b, (char)c);
    }
}
/* microseconds with three decimals ("1234.567"), from whole nanoseconds */
static void lb_us(lb *b, double us) {
    if (!(us >= 0) || us > 9e15) { /* not a time a trace holds: printf's form */
        char t[48];
        int n = snprintf(t, sizeof t, "%.3f", us > 0 ? us : 0);
        if (n > 0 && (size_t)n < sizeof t) lb_put(b, t, (size_t)n);
        else b->over = true;
        return;
    }
    long long ns = (long long)(us * 1e3 + 0.5);
    lb_i64(b, ns / 1000);
    char f[4] = {'.', (char)('0' + ns % 1000 / 100), (char)('0' + ns % 100 / 10), (char)('0' + ns % 10)};
    lb_put(b, f, 4);
}
/* a count: whole numbers as integers (the range test first: converting a larger value to
 * long long is undefined), anything else in printf's %.17g */
static void lb_num(lb *b, double v) {
    if (v > -9e15 && v < 9e15 && v == (double)(long long)v) { lb_i64(b, (long long)v); return; }
    char t[40];
    int n = snprintf(t, sizeof t, "%.17g", v);
    if (n > 0 && (size_t)n < sizeof t && isfinite(v)) lb_put(b, t, (size_t)n);
    else lb_c(b, '0');
}
/* "[16, 128, 128]", as fm_shape_str writes it */
static void lb_shape(lb *b, int ndim, const int64_t *shape) {
    lb_c(b, '[');
    for (int i = 0; i < ndim; i++) {
        if (i) lb_put(b, ", ", 2);
        lb_i64(b, (long long)shape[i]);
    }
    lb_c(b, ']');
}
static void lb_emit(lb *b) {
    if (!b->over) emit_line(b->p, b->len);
}

/* {"name":..,"cat":..,"ph":"X","ts":..,"dur":..,"pid":..,"tid":..[,"args":ARGS]} */
static void span_line(lb *b, const char *name, const char *cat, double start_us, double dur_us, long t, const char *args) {
    lb_s(b, "{\"name\":\"");
    lb_esc(b, name);
    lb_s(b, "\",\"cat\":\"");
    lb_esc(b, cat ? cat : "");
    lb_s(b, "\",\"ph\":\"X\",\"ts\":");
    lb_us(b, start_us);
    lb_s(b, ",\"dur\":");
    lb_us(b, dur_us);
    lb_s(b, ",\"pid\":");
    lb_i64(b, pid());
    lb_s(b, ",\"tid\":");
    lb_i64(b, t);
    if (args) { lb_s(b, ",\"args\":"); lb_s(b, args); }
    lb_c(b, '}');
}

/* A metadata event naming a track: kind "process_name" (t 0) or "thread_name" */
static void name_event(const char *kind, long t, const char *name) {
    char line[768];
    lb b = {line, 0, sizeof line, false};
    lb_s(&b, "{\"name\":\"");
    lb_s(&b, kind);
    lb_s(&b, "\",\"ph\":\"M\",\"pid\":");
    lb_i64(&b, pid());
    lb_s(&b, ",\"tid\":");
    lb_i64(&b, t);
    lb_s(&b, ",\"args\":{\"name\":\"");
    lb_esc(&b, name);
    lb_s(&b, "\"}}");
    lb_emit(&b);
}

/* The dispatcher's hook while profiling: one span per kernel run, with its cost
 * model and the device's memory counters. A device kernel is synchronized so the
 * span covers its run, not only its launch. */
static void op_before(fm_dispatch_event *ev, void *user) {
    (void)user;
    ev->mark = fm_kernel_lowp_products();
    ev->stamp = fm_profiler_now_us();
}

/* The precision the op's products ran in, when lower than f32: the CPU kernels
 * report bf16 hardware products themselves (fm_kernel_note_lowp_products); a
 * device's products are taken from the operands' dtype (tensor cores run
 * bf16/f16 GEMM, conv and attention in that dtype). NULL: f32 or wider, or not
 * a product op. */
static const char *products_dtype(const fm_dispatch_event *ev) {
    if (fm_kernel_lowp_products() != ev->mark) return "bf16";
    const fm_op_call *c = ev->call;
    if (ev->device.type != FM_DEV_CUDA || !c->n_in || !c->in[0]) return NULL;
    switch (c->op) {
    case FM_OP_MATMUL: case FM_OP_CONV2D: case FM_OP_CONV2D_BACKWARD: case FM_OP_SDPA: case FM_OP_SDPA_BACKWARD:
    case FM_OP_SDPA_QKV: case FM_OP_SDPA_QKV_BACKWARD: case FM_OP_LINEAR_FUSED: case FM_OP_CONV2D_FUSED:
        return c->in[0]->dtype == FM_BF16 || c->in[0]->dtype == FM_F16 ? fm_dtype_name(c->in[0]->dtype) : NULL;
    default:
        return NULL;
    }
}

static void op_after(fm_dispatch_event *ev, void *user) {
    (void)user;
    const fm_op_call *c = ev->call;
    const fm_backend *b = ev->backend;
    if (b->synchronize && ev->device.type != FM_DEV_CPU) b->synchronize(ev->device.index);
    double t1 = fm_profiler_now_us();
    char args[384];
    lb a = {args, 0, sizeof args, false};
    const char *pd = products_dtype(ev);
    fm_tensor *o = c->n_out ? c->out[0] : NULL;
    /* prof_us: this hook's own time after the op (the cost model here) plus what the
     * previous op's hook spent after its span's args were made (writing it and the memory
     * counters), all of it this thread's time between ops: the summary keeps it out of
     * "framework overhead" (a fifth of a GPT-2-small decode loop's traced time) */
    const double flops = fm_op_flops(c), bytes = fm_op_bytes(c), t2 = fm_profiler_now_us();
    lb_s(&a, "{\"flops\":");
    lb_num(&a, flops);
    lb_s(&a, ",\"bytes\":");
    lb_num(&a, bytes);
    lb_s(&a, ",\"out\":\"");
    if (o) lb_shape(&a, o->ndim, o->shape);
    lb_s(&a, "\",\"device\":\"");
    lb_esc(&a, b->name);
    lb_s(&a, "\",\"prof_us\":");
    lb_us(&a, t2 - t1 + t_prof_carry);
    if (pd) { lb_s(&a, ",\"products\":\""); lb_s(&a, pd); lb_c(&a, '"'); }
    lb_c(&a, '}');
    if (!a.over) args[a.len] = 0; /* lb_put keeps a byte free for it */
    fm_profile_span(fm_op_get_info(c->op)->name, fm_in_backward ? "backward" : "forward", ev->stamp, t1 - ev->stamp,
                    a.over ? NULL : args);
    fm_memory_stats ms;
    if (fm_memory_stats_get(ev->device, &ms) == FM_OK) {
        fm_profile_counter("memory", "allocated", (double)ms.allocated);
        fm_profile_counter("memory reserved", "reserved", (double)ms.reserved);
    }
    t_prof_carry = fm_profiler_now_us() - t2;
}

fm_status fm_profiler_start(const char *path) {
    if (!path || !*path) return fm_set_error(FM_ERR_INVALID, "profiler: no trace path given");
    pthread_once(&g_atfork_once, install_atfork);
    pthread_mutex_lock(&g.mu);
    if (g.f) { pthread_mutex_unlock(&g.mu); return fm_set_error(FM_ERR_STATE, "profiler: already started"); }
    FILE *f = fopen(path, "w");
    if (!f) {
        pthread_mutex_unlock(&g.mu);
        return fm_set_error(FM_ERR_IO, "profiler: cannot write trace file '%s' (%s)", path, strerror(errno));
    }
    fputs("[\n", f);
    g.f = f;
    g.len = 0;
    g.n_events = 0;
    g.t0 = mono_us();
    g.last_flush_s = coarse_s();
    g.session++;
    g.named_tracks = 0;
    pthread_mutex_unlock(&g.mu);
    name_event("process_name", 0, "fathom");
    __atomic_store_n(&fm_profiler_on, 1, __ATOMIC_RELEASE);
    fm_dispatch_set_hook(op_before, op_after, NULL);
    return FM_OK;
}

fm_status fm_profiler_stop(void) {
    fm_dispatch_set_hook(NULL, NULL, NULL);
    __atomic_store_n(&fm_profiler_on, 0, __ATOMIC_RELEASE);
    pthread_mutex_lock(&g.mu);
    fm_status st = FM_OK;
    if (g.f) {
        flush_locked();
        fputs("\n]\n", g.f);
        if (fclose(g.f) != 0) st = fm_set_error(FM_ERR_IO, "profiler: closing the trace failed (%s)", strerror(errno));
        g.f = NULL;
    }
    free(g.buf);
    g.buf = NULL;
    g.cap = g.len = 0;
    pthread_mutex_unlock(&g.mu);
    return st;
}

void fm_profile_span(const char *name, const char *cat, double start_us, double dur_us, const char *args) {
    if (!fm_profiler_enabled()) return;
    char line[2048];
    lb b = {line, 0, sizeof line, false};
    span_line(&b, name, cat, start_us, dur_us, tid(), args);
    lb_emit(&b);
}

void fm_profile_push(const char *name, const char *cat) {
    if (__builtin_expect(!__atomic_load_n(&fm_profiler_on, __ATOMIC_RELAXED), 1)) return; /* the off path: one load */
    if (t_depth < MAX_DEPTH) {
        t_stack[t_depth].name = name;
        t_stack[t_depth].cat = cat;
        t_stack[t_depth].start = fm_profiler_now_us();
    }
    t_depth++;
}

void fm_profile_pop(void) {
    if (t_depth <= 0) return; /* nothing open: the usual off path */
    t_depth--;
    if (t_depth >= MAX_DEPTH || !__atomic_load_n(&fm_profiler_on, __ATOMIC_RELAXED)) return;
    double now = fm_profiler_now_us();
    fm_profile_span(t_stack[t_depth].name, t_stack[t_depth].cat, t_stack[t_depth].start, now - t_stack[t_depth].start, NULL);
}

void fm_profile_counter(const char *track, const char *series, double value) {
    if (!fm_profiler_enabled()) return;
    char line[768];
    lb b = {line, 0, sizeof line, false};
    lb_s(&b, "{\"name\":\"");
    lb_esc(&b, track);
    lb_s(&b, "\",\"ph\":\"C\",\"ts\":");
    lb_us(&b, fm_profiler_now_us());
    lb_s(&b, ",\"pid\":");
    lb_i64(&b, pid());
    lb_s(&b, ",\"tid\":0,\"args\":{\"");
    lb_esc(&b, series);
    lb_s(&b, "\":");
    lb_num(&b, value); /* counters are mostly byte counts: whole numbers */
    lb_s(&b, "}}");
    lb_emit(&b);
}

void fm_profile_thread_name(const char *name) {
    if (!fm_profiler_enabled()) return;
    name_event("thread_name", tid(), name);
}

/* Device tracks get tids far above any Linux thread id (at most 2^22), so they
 * never share a track with a host thread. */
#define DEVICE_TID_BASE 1000000000L

void fm_profile_device_span(int track, const char *track_name, const char *name, const char *cat, double start_us,
                            double dur_us, const char *args) {
    if (!fm_profiler_enabled() || track < 0 || track > 63) return;
    long t = DEVICE_TID_BASE + track;
    pthread_mutex_lock(&g.mu);
    bool first = !(g.named_tracks & (1ull << track));
    g.named_tracks |= 1ull << track;
    pthread_mutex_unlock(&g.mu);
    if (first) name_event("thread_name", t, track_name ? track_name : "device");
    char line[2048];
    lb b = {line, 0, sizeof line, false};
    span_line(&b, name, cat, start_us, dur_us, t, args);
    lb_emit(&b);
}

uint64_t fm_profiler_session(void) {
    pthread_mutex_lock(&g.mu);
    uint64_t s = g.session;
    pthread_mutex_unlock(&g.mu);
    return s;
}
