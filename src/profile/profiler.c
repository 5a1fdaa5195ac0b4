/* The trace writer behind fathom/profile.h.
 *
 * Events are formatted on the recording thread into a shared buffer under a
 * mutex and written out when it passes 64 KiB, when half a second has gone by
 * since the last write (so a slow run that crashes loses at most the last half
 * second), and at stop. Spans use the
 * "complete" event form (ph "X": start + duration), so nesting is implied by
 * time containment on one thread's track, which is how the viewers draw it. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
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

static void emit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emit(const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line) n = (int)sizeof line - 1;
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
    memcpy(g.buf + g.len, line, (size_t)n);
    g.len += (size_t)n;
    if (g.len >= FLUSH_AT || coarse_s() - g.last_flush_s >= FLUSH_EVERY_S) flush_locked();
    pthread_mutex_unlock(&g.mu);
}

/* JSON-escape a short string into out. */
static const char *esc(const char *s, char *out, size_t n) {
    size_t j = 0;
    for (; s && *s && j + 7 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { out[j++] = '\\'; out[j++] = (char)c; }
        else if (c < 0x20) j += (size_t)snprintf(out + j, n - j, "\\u%04x", c);
        else out[j++] = (char)c;
    }
    out[j] = 0;
    return out;
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
    char args[320], sh[128], prod[32] = "";
    const char *pd = products_dtype(ev);
    if (pd) snprintf(prod, sizeof prod, ",\"products\":\"%s\"", pd);
    fm_tensor *o = c->n_out ? c->out[0] : NULL;
    /* prof_us: this hook's own time after the op (the cost model here) plus what the
     * previous op's hook spent after its span's args were made (writing it and the memory
     * counters), all of it this thread's time between ops: the summary keeps it out of
     * "framework overhead" (a fifth of a GPT-2-small decode loop's traced time) */
    const double flops = fm_op_flops(c), bytes = fm_op_bytes(c), t2 = fm_profiler_now_us();
    snprintf(args, sizeof args, "{\"flops\":%.0f,\"bytes\":%.0f,\"out\":\"%s\",\"device\":\"%s\",\"prof_us\":%.3f%s}", flops, bytes,
             o ? fm_shape_str(o->ndim, o->shape, sh, sizeof sh) : "", b->name, t2 - t1 + t_prof_carry, prod);
    fm_profile_span(fm_op_get_info(c->op)->name, fm_in_backward ? "backward" : "forward", ev->stamp, t1 - ev->stamp, args);
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
    emit("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"fathom\"}}", pid());
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

/* Microseconds with three decimals ("1234.567"), formatted from whole nanoseconds:
 * printf's floating-point path was most of the cost of a profiled op. */
static const char *fmt_us(double us, char *buf, size_t n) {
    if (!(us >= 0) || us > 9e15) {
        snprintf(buf, n, "%.3f", us > 0 ? us : 0);
        return buf;
    }
    long long ns = (long long)(us * 1e3 + 0.5);
    snprintf(buf, n, "%lld.%03d", ns / 1000, (int)(ns % 1000));
    return buf;
}

void fm_profile_span(const char *name, const char *cat, double start_us, double dur_us, const char *args) {
    if (!fm_profiler_enabled()) return;
    char n1[256], c1[64], t1[32], d1[32];
    emit("{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%s,\"dur\":%s,\"pid\":%d,\"tid\":%ld%s%s}",
         esc(name, n1, sizeof n1), esc(cat ? cat : "", c1, sizeof c1), fmt_us(start_us, t1, sizeof t1),
         fmt_us(dur_us, d1, sizeof d1), pid(), tid(), args ? ",\"args\":" : "", args ? args : "");
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
    char t1[128], s1[128], ts[32], v[40];
    /* counters are mostly byte counts: whole numbers print without the floating-point path (the range
       test comes first: converting a larger value to long long is undefined) */
    if (value > -9e15 && value < 9e15 && value == (double)(long long)value) snprintf(v, sizeof v, "%lld", (long long)value);
    else snprintf(v, sizeof v, "%.17g", value);
    emit("{\"name\":\"%s\",\"ph\":\"C\",\"ts\":%s,\"pid\":%d,\"tid\":0,\"args\":{\"%s\":%s}}", esc(track, t1, sizeof t1),
         fmt_us(fm_profiler_now_us(), ts, sizeof ts), pid(), esc(series, s1, sizeof s1), v);
}

void fm_profile_thread_name(const char *name) {
    if (!fm_profiler_enabled()) return;
    char n1[256];
    emit("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%ld,\"args\":{\"name\":\"%s\"}}", pid(), tid(),
         esc(name, n1, sizeof n1));
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
    char n1[256], c1[64];
    if (first)
        emit("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%ld,\"args\":{\"name\":\"%s\"}}", pid(), t,
             esc(track_name ? track_name : "device", n1, sizeof n1));
    char t1[32], d1[32];
    emit("{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%s,\"dur\":%s,\"pid\":%d,\"tid\":%ld%s%s}",
         esc(name, n1, sizeof n1), esc(cat ? cat : "", c1, sizeof c1), fmt_us(start_us, t1, sizeof t1),
         fmt_us(dur_us, d1, sizeof d1), pid(), t, args ? ",\"args\":" : "", args ? args : "");
}

uint64_t fm_profiler_session(void) {
    pthread_mutex_lock(&g.mu);
    uint64_t s = g.session;
    pthread_mutex_unlock(&g.mu);
    return s;
}
