/* The profiler: the trace parses as Chrome trace-event JSON, spans on each thread
 * nest properly, op spans carry hand-checkable FLOP counts (GEMM, conv), forward
 * and backward are told apart, an unwritable path is a clear error, and a
 * process killed mid-run leaves a trace that `fathom profile` still reads. */
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cpu/cpu_kernels.h" /* fm_cpu_gemm_bf16: whether this CPU has the bf16 path */
#include "core/parallel.h"
#include "ops/ops_internal.h"                /* fm_linear_mixed */
#include "profile/op_cost.h"                 /* fm_op_flops */
#include "fathom/fathom.h"
#include "fathom/observe.h"
#include "fathom/profile.h"
#include "test_util.h"

/* A child process profiles a few small ops (far less than the 64 KiB write
 * threshold), idles past the half-second flush interval, runs one more op and is
 * killed without stopping the profiler. What reached the file must be a readable,
 * truncated trace holding the ops. */
static void test_crash_leaves_trace(void) {
    char path[] = "/tmp/fathom_crash_trace_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (fm_profiler_start(path) != FM_OK) _exit(3);
        int64_t sa[2] = {4, 4};
        fm_tensor *a = fm_tensor_ones(2, sa, FM_F32, FM_CPU);
        fm_profile_push("step", "step");
        fm_tensor *y = fm_matmul(a, a);
        fm_profile_pop();
        usleep(600 * 1000);
        fm_tensor *z = fm_matmul(y, a); /* the first event after the interval writes everything out */
        fm_tensor_release_n(3, a, y, z); /* (only so that valgrind's report on the child stays clean) */
        raise(SIGKILL);
        _exit(4);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %d", status);
    fm_trace_summary s;
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    CHECK(s.truncated); /* no closing bracket: the run never stopped the profiler */
    int64_t mm = 0;
    for (int i = 0; i < s.n_ops; i++)
        if (!strcmp(s.ops[i].name, "matmul")) mm = s.ops[i].calls;
    CHECK_MSG(mm == 2, "matmul calls in the crashed trace: %lld", (long long)mm);
    CHECK(s.n_steps == 1);
    fm_trace_summary_free(&s);
    unlink(path);
}

/* With a CUDA device (skipped elsewhere): kernels and copies get spans on the
 * device's own track, timed by CUDA events, inside the host spans of the same
 * work, and the summary takes the GPU idle time from them. */
static void test_cuda_track(void) {
    fm_cuda_info ci;
    fm_cuda_query(&ci);
    if (ci.n_devices == 0) {
        TEST_SKIP("test_profile: no CUDA device (%s): the device-track checks did not run", ci.reason);
        return;
    }
    char path[] = "/tmp/fathom_cuda_trace_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    fm_device gpu = {FM_DEV_CUDA, 0};
    int64_t sa[2] = {256, 256};
    fm_tensor *a = fm_tensor_randn(2, sa, FM_F32, NULL);
    CHECK(fm_profiler_start(path) == FM_OK);
    fm_profile_push("step", "step");
    fm_tensor *ga = fm_tensor_to(a, gpu), *gy = ga ? fm_matmul(ga, ga) : NULL, *y = gy ? fm_tensor_to(gy, FM_CPU) : NULL;
    fm_profile_pop();
    CHECK(fm_profiler_stop() == FM_OK);
    CHECK(y != NULL);
    fm_tensor_release_n(4, a, ga, gy, y);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK(root != NULL);
    int kernels = 0, copies = 0, host_copies = 0, named = 0;
    double host_mm_start = -1, host_mm_end = -1, dev_mm_start = -1, dev_mm_end = -1;
    for (size_t i = 0; root && i < json_array_size(root); i++) {
        json_t *e = json_array_get(root, i);
        const char *name = json_string_value(json_object_get(e, "name")), *cat = json_string_value(json_object_get(e, "cat"));
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        double ts = json_number_value(json_object_get(e, "ts")), dur = json_number_value(json_object_get(e, "dur"));
        if (name && !strcmp(name, "thread_name") && tid >= 1000000000) named++;
        if (!name || !cat) continue;
        if (!strcmp(cat, "gpu kernel")) { kernels++; CHECK(tid >= 1000000000); }
        if (!strcmp(cat, "gpu memcpy")) copies++;
        if (!strcmp(cat, "memcpy")) host_copies++;
        if (!strcmp(name, "matmul") && !strcmp(cat, "forward")) { host_mm_start = ts; host_mm_end = ts + dur; }
        if (!strcmp(name, "matmul") && !strcmp(cat, "gpu kernel")) { dev_mm_start = ts; dev_mm_end = ts + dur; }
    }
    json_decref(root);
    CHECK(kernels >= 1 && copies >= 2 && host_copies >= 2 && named == 1);
    /* the kernel ran while its host span (which waits for the device) was open; allow the anchor's latency */
    CHECK_MSG(dev_mm_start >= host_mm_start - 50 && dev_mm_end <= host_mm_end + 50,
              "device matmul [%.1f, %.1f] outside host [%.1f, %.1f]", dev_mm_start, dev_mm_end, host_mm_start, host_mm_end);
    fm_trace_summary s;
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    CHECK(s.has_gpu && s.gpu_event_timed && s.gpu_idle_pct >= 0 && s.gpu_idle_pct < 100);
    fm_trace_summary_free(&s);
    unlink(path);
}

/* Names with quotes, backslashes and control bytes come out escaped (spans and track names); counters keep whole
 * and fractional values; an event too long for the writer's line (3 KiB of args) is
 * dropped, and the trace around it still parses. */
static void test_escapes_and_limits(void) {
    char path[] = "/tmp/fathom_trace_esc_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    char big[3200];
    memset(big, ' ', sizeof big);
    big[0] = '{';
    memcpy(big + sizeof big - 2, "}", 2);
    CHECK(fm_profiler_start(path) == FM_OK);
    fm_profile_span("a \"quoted\" \\ name\twith\x01bytes", "cat", 1.5, 2.25, "{\"k\":1}");
    fm_profile_span("too long", "cat", 3, 1, big);
    fm_profile_counter("mem", "bytes", 123456789.0);
    fm_profile_counter("mem", "ratio", 0.125);
    fm_profile_span("after", "cat", 5, 1, NULL);
    fm_profile_thread_name("loader \"0\"");
    CHECK(fm_profiler_stop() == FM_OK);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK_MSG(root && json_is_array(root), "trace does not parse: %s", err.text);
    int named = 0, long_one = 0, after = 0, counters = 0, process = 0, thread = 0;
    for (size_t i = 0; root && i < json_array_size(root); i++) {
        json_t *e = json_array_get(root, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name) continue;
        if (!strcmp(name, "a \"quoted\" \\ name\twith\x01bytes")) {
            named++;
            CHECK_NEAR(json_number_value(json_object_get(e, "ts")), 1.5, 1e-9);
            CHECK_NEAR(json_number_value(json_object_get(e, "dur")), 2.25, 1e-9);
            CHECK(json_integer_value(json_object_get(json_object_get(e, "args"), "k")) == 1);
        }
        if (!strcmp(name, "too long")) long_one++;
        const char *meta = json_string_value(json_object_get(json_object_get(e, "args"), "name"));
        if (!strcmp(name, "process_name")) process += meta && !strcmp(meta, "fathom");
        if (!strcmp(name, "thread_name")) thread += meta && !strcmp(meta, "loader \"0\"");
        if (!strcmp(name, "after")) after++;
        if (!strcmp(name, "mem")) {
            json_t *a = json_object_get(e, "args");
            if (json_object_get(a, "bytes")) { counters++; CHECK(json_integer_value(json_object_get(a, "bytes")) == 123456789); }
            if (json_object_get(a, "ratio")) { counters++; CHECK_NEAR(json_number_value(json_object_get(a, "ratio")), 0.125, 0); }
        }
    }
    CHECK_MSG(named == 1 && long_one == 0 && after == 1 && counters == 2, "named %d, too long %d, after %d, counters %d", named,
              long_one, after, counters);
    CHECK_MSG(process == 1 && thread == 1, "process_name %d, thread_name %d", process, thread);
    json_decref(root);
    unlink(path);
}

/* Spans say when their products ran on bf16 hardware (args.products): a mixed linear
 * under bf16 (f32 activations, bf16 GEMMs) is marked exactly where this CPU has the
 * bf16 path (a direct bf16 GEMM of its shape says whether it does); an f32 matmul never. */
static void test_products_marked(void) {
    char path[] = "/tmp/fathom_trace_lowp_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    enum { M = 64, K = 256, N = 256 };
    uint16_t *ab = calloc(M * K, 2), *bb = calloc(K * N, 2);
    float *cb = calloc(M * N, 4);
    fm_cpu_gemm_args g = {FM_BF16, false, true, M, N, K, ab, K, bb, K, 0.0, cb, N};
    bool hw = ab && bb && cb && fm_cpu_gemm_bf16(&g, NULL, false);
    free(ab);
    free(bb);
    free(cb);
    fm_tensor *x = fm_tensor_randn(2, (int64_t[]){M, K}, FM_F32, NULL), *w = fm_tensor_randn(2, (int64_t[]){N, K}, FM_F32, NULL);
    fm_tensor_requires_grad_(w, true);
    CHECK(fm_profiler_start(path) == FM_OK);
    fm_tensor *y = fm_linear_mixed(x, w, NULL, FM_BF16), *s = y ? fm_sum(y, 0, NULL, false) : NULL;
    CHECK(s && fm_backward(s, NULL, false) == FM_OK);
    fm_tensor *wt = fm_transpose(w, 0, 1), *z = fm_matmul(x, wt); /* f32 products */
    CHECK(fm_profiler_stop() == FM_OK);
    fm_tensor_release_n(6, x, w, y, s, wt, z);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK_MSG(root && json_is_array(root), "trace does not parse: %s", err.text);
    int marked = 0, mm = 0;
    size_t n = root ? json_array_size(root) : 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(root, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name || strcmp(name, "matmul")) continue;
        const char *pd = json_string_value(json_object_get(json_object_get(e, "args"), "products"));
        mm++;
        if (pd) { CHECK(!strcmp(pd, "bf16")); marked++; }
    }
    /* forward, dW: two bf16 products; the f32 matmul's span is the last and unmarked */
    CHECK_MSG(mm == 3 && marked == (hw ? 2 : 0), "%d matmul spans, %d marked bf16 (bf16 hardware path: %d)", mm, marked, hw);
    fm_trace_summary ts;
    CHECK(fm_trace_summarize(path, 0, &ts) == FM_OK);
    CHECK_NEAR(ts.lowp_flops, hw ? 2.0 * (2.0 * M * N * K) : 0, 0);
    fm_trace_summary_free(&ts);
    json_decref(root);
    unlink(path);
}

/* The inference ops' FLOPs (profile/op_cost.c): a compiled graph's fused linears and
 * convolutions and a quantized model's int8/int4 linears count their products, not one
 * FLOP per output element as an elementwise op would */
static void test_inference_op_flops(void) {
    int64_t sx[3] = {2, 3, 64}, sw[2] = {10, 64}, sy[3] = {2, 3, 10};
    fm_tensor *x = fm_tensor_randn(3, sx, FM_F32, NULL), *w = fm_tensor_randn(2, sw, FM_F32, NULL);
    fm_tensor *y = fm_tensor_randn(3, sy, FM_F32, NULL);
    fm_op_id lin[3] = {FM_OP_LINEAR_FUSED, FM_OP_QLINEAR_INT8, FM_OP_QLINEAR_INT4};
    for (int i = 0; i < 3; i++) {
        fm_op_call c = {lin[i], 2, 1, {x, w}, {y}, NULL, NULL};
        CHECK_MSG(fm_op_flops(&c) == 2.0 * (2 * 3 * 10) * 64, "op %d: %g", (int)lin[i], fm_op_flops(&c));
    }
    fm_op_call e = {FM_OP_QEMBEDDING_INT4, 2, 1, {w, x}, {y}, NULL, NULL}; /* a lookup: no products */
    CHECK(fm_op_flops(&e) == 0);
    /* conv 3->5, 3x3, padding 1 on 2x3x10x10, then a 2x2 max pool: the FLOPs of the 10x10 outputs */
    int64_t cx[4] = {2, 3, 10, 10}, cw[4] = {5, 3, 3, 3}, cy[4] = {2, 5, 5, 5};
    fm_tensor *xc = fm_tensor_randn(4, cx, FM_F32, NULL), *wc = fm_tensor_randn(4, cw, FM_F32, NULL);
    fm_tensor *yc = fm_tensor_randn(4, cy, FM_F32, NULL);
    fm_conv2d_fused_attrs a = {fm_conv2d_default_params(), 1, 2, INFINITY};
    a.p.padding[0] = a.p.padding[1] = 1;
    fm_op_call cf = {FM_OP_CONV2D_FUSED, 2, 1, {xc, wc}, {yc}, NULL, &a};
    CHECK_NEAR(fm_op_flops(&cf), 2.0 * (2 * 5 * 10 * 10) * (3 * 3 * 3), 0);
    fm_tensor_release_n(6, x, w, y, xc, wc, yc);
}

int main(void) {
    test_crash_leaves_trace(); /* first: fork before this process has started any threads */
    test_inference_op_flops();
    char path[] = "/tmp/fathom_trace_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK(fm_profiler_start(path) == FM_OK);
    CHECK(fm_profiler_start(path) != FM_OK); /* already running */
    int64_t sa[2] = {8, 16}, sb[2] = {16, 4};
    fm_tensor *a = fm_tensor_randn(2, sa, FM_F32, NULL), *b = fm_tensor_randn(2, sb, FM_F32, NULL);
    fm_tensor_requires_grad_(a, true);
    fm_profile_push("step", "step");
    fm_tensor *y = fm_matmul(a, b), *s = fm_sum(y, 0, NULL, false);
    CHECK(fm_backward(s, NULL, false) == FM_OK);
    int64_t sx[4] = {2, 3, 10, 10}, sw[4] = {5, 3, 3, 3};
    fm_tensor *x = fm_tensor_randn(4, sx, FM_F32, NULL), *w = fm_tensor_randn(4, sw, FM_F32, NULL);
    fm_conv2d_params p = fm_conv2d_default_params();
    p.padding[0] = p.padding[1] = 1;
    fm_tensor *c = fm_conv2d(x, w, NULL, &p);
    CHECK(c != NULL);
    fm_profile_pop();
    CHECK(fm_profiler_stop() == FM_OK);
    fm_tensor_release_n(7, a, b, y, s, x, w, c);

    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK_MSG(root && json_is_array(root), "trace does not parse: %s line %d", err.text, err.line);
    int n_mm = 0, n_conv = 0, n_bwd = 0, n_step = 0, n_mem = 0, bad_nest = 0;
    size_t n = root ? json_array_size(root) : 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(root, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *ph = json_string_value(json_object_get(e, "ph"));
        CHECK(name && ph);
        if (!name || !ph) continue;
        if (!strcmp(ph, "C") && !strcmp(name, "memory")) n_mem++;
        if (strcmp(ph, "X")) continue;
        CHECK(json_is_number(json_object_get(e, "ts")) && json_is_number(json_object_get(e, "dur")));
        const char *cat = json_string_value(json_object_get(e, "cat"));
        double flops = json_number_value(json_object_get(json_object_get(e, "args"), "flops"));
        if (!strcmp(name, "matmul") && cat && !strcmp(cat, "forward")) { n_mm++; CHECK_NEAR(flops, 2.0 * 8 * 4 * 16, 0); }
        if (!strcmp(name, "matmul") && cat && !strcmp(cat, "backward")) { n_bwd++; CHECK_NEAR(flops, 2.0 * 8 * 16 * 4, 0); }
        if (!strcmp(name, "conv2d")) { n_conv++; CHECK_NEAR(flops, 2.0 * (2 * 5 * 10 * 10) * (3 * 3 * 3), 0); }
        if (!strcmp(name, "step")) n_step++;
        /* nesting: any two spans on one thread are disjoint or one contains the other */
        double s0 = json_number_value(json_object_get(e, "ts")), e0 = s0 + json_number_value(json_object_get(e, "dur"));
        json_int_t t0 = json_integer_value(json_object_get(e, "tid"));
        for (size_t j = i + 1; j < n; j++) {
            json_t *f = json_array_get(root, j);
            const char *ph2 = json_string_value(json_object_get(f, "ph"));
            if (!ph2 || strcmp(ph2, "X") || json_integer_value(json_object_get(f, "tid")) != t0) continue;
            double s1 = json_number_value(json_object_get(f, "ts")), e1 = s1 + json_number_value(json_object_get(f, "dur"));
            bool disjoint = e0 <= s1 + 1e-3 || e1 <= s0 + 1e-3;
            bool contains = (s0 <= s1 + 1e-3 && e1 <= e0 + 1e-3) || (s1 <= s0 + 1e-3 && e0 <= e1 + 1e-3);
            if (!disjoint && !contains) bad_nest++;
        }
    }
    CHECK(n_mm == 1 && n_conv == 1 && n_step == 1 && n_mem > 0);
    CHECK(n_bwd >= 1); /* dA = dY @ B^T (b does not require grad) */
    CHECK_MSG(bad_nest == 0, "%d overlapping spans", bad_nest);
    json_decref(root);
    unlink(path);

    CHECK(fm_profiler_start("/nonexistent-dir/trace.json") != FM_OK);
    CHECK_ERR_CONTAINS("cannot write trace file");
    test_cuda_track();
    test_products_marked();
    test_escapes_and_limits();
    fm_parallel_shutdown();
    TEST_DONE();
}
