/* The f32 GEMM providers fathom could use, on the machine at hand (issue #22: "the GEMM
 * provider is a measured decision"): fathom's fm_matmul (its chosen provider, single-threaded
 * calls under fathom's pool), OpenBLAS driving its own threads (the same library),
 * oneDNN's f32 matmul (libdnnl.so.2, OpenMP threads) and BLIS (libblis.so.4, cblas_sgemm).
 * fathom's own row runs whichever of OpenBLAS and oneDNN fathom chose for f32 (`fathom info`).
 * The libraries other than OpenBLAS are dlopened, so a missing one is reported as missing,
 * not a build failure. Prints one JSON line per shape and provider: the median of the timed
 * repetitions in GFLOP/s, with the kernel or core each library says it runs.
 * bench/bench_gemm_providers.py runs PyTorch's torch.mm (MKL) on the same shapes beside it.
 *
 *   FATHOM_NUM_THREADS=2 build/bench_gemm_providers [reps]
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/openblas_load.h"
#include "bench_util.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "fathom/fathom.h"

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);

#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
/* oneDNN's C API (2.x), dlopened: the calls a plain row-major f32 matmul needs */
static struct {
    void *lib;
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_t prim;
    dnnl_memory_t mem[3];
    dnnl_status_t (*engine_create)(dnnl_engine_t *, dnnl_engine_kind_t, size_t);
    dnnl_status_t (*stream_create)(dnnl_stream_t *, dnnl_engine_t, unsigned);
    dnnl_status_t (*md_init_by_tag)(dnnl_memory_desc_t *, int, const dnnl_dims_t, dnnl_data_type_t, dnnl_format_tag_t);
    dnnl_status_t (*matmul_desc_init)(dnnl_matmul_desc_t *, const dnnl_memory_desc_t *, const dnnl_memory_desc_t *,
                                      const dnnl_memory_desc_t *, const dnnl_memory_desc_t *);
    dnnl_status_t (*pd_create)(dnnl_primitive_desc_t *, const_dnnl_op_desc_t, const_dnnl_primitive_attr_t, dnnl_engine_t,
                               const_dnnl_primitive_desc_t);
    dnnl_status_t (*pd_query)(const_dnnl_primitive_desc_t, dnnl_query_t, int, void *);
    dnnl_status_t (*pd_destroy)(dnnl_primitive_desc_t);
    dnnl_status_t (*prim_create)(dnnl_primitive_t *, const_dnnl_primitive_desc_t);
    dnnl_status_t (*prim_destroy)(dnnl_primitive_t);
    dnnl_status_t (*prim_execute)(const_dnnl_primitive_t, dnnl_stream_t, int, const dnnl_exec_arg_t *);
    dnnl_status_t (*stream_wait)(dnnl_stream_t);
    dnnl_status_t (*mem_create)(dnnl_memory_t *, const dnnl_memory_desc_t *, dnnl_engine_t, void *);
    dnnl_status_t (*mem_destroy)(dnnl_memory_t);
    void (*omp_set_num_threads)(int);
} D;

static bool dnnl_load(void) {
    D.lib = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!D.lib) return false;
    const char *names[] = {"dnnl_engine_create", "dnnl_stream_create", "dnnl_memory_desc_init_by_tag",
                           "dnnl_matmul_desc_init", "dnnl_primitive_desc_create", "dnnl_primitive_desc_query",
                           "dnnl_primitive_desc_destroy", "dnnl_primitive_create", "dnnl_primitive_destroy",
                           "dnnl_primitive_execute", "dnnl_stream_wait", "dnnl_memory_create", "dnnl_memory_destroy",
                           "omp_set_num_threads"};
    void **slots[] = {(void **)&D.engine_create, (void **)&D.stream_create, (void **)&D.md_init_by_tag,
                      (void **)&D.matmul_desc_init, (void **)&D.pd_create, (void **)&D.pd_query, (void **)&D.pd_destroy,
                      (void **)&D.prim_create, (void **)&D.prim_destroy, (void **)&D.prim_execute,
                      (void **)&D.stream_wait, (void **)&D.mem_create, (void **)&D.mem_destroy,
                      (void **)&D.omp_set_num_threads};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*slots[i] = dlsym(D.lib, names[i]))) return false;
    return D.engine_create(&D.engine, dnnl_cpu, 0) == dnnl_success &&
           D.stream_create(&D.stream, D.engine, dnnl_stream_default_flags) == dnnl_success;
}

/* builds the primitive for C = A B (row-major, no transposes) on the given buffers */
static bool dnnl_prepare(int64_t M, int64_t N, int64_t K, float *a, float *b, float *c, char *impl, size_t impl_len) {
    dnnl_memory_desc_t md[3];
    dnnl_matmul_desc_t op;
    dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N};
    if (D.md_init_by_tag(&md[0], 2, da, dnnl_f32, dnnl_ab) || D.md_init_by_tag(&md[1], 2, db, dnnl_f32, dnnl_ab) ||
        D.md_init_by_tag(&md[2], 2, dc, dnnl_f32, dnnl_ab) || D.matmul_desc_init(&op, &md[0], &md[1], NULL, &md[2]))
        return false;
    dnnl_primitive_desc_t pd = NULL;
    if (D.pd_create(&pd, &op, NULL, D.engine, NULL)) return false;
    const char *s = NULL;
    if (!D.pd_query(pd, dnnl_query_impl_info_str, 0, &s) && s) snprintf(impl, impl_len, "%s", s);
    dnnl_status_t bad = D.prim_create(&D.prim, pd);
    D.pd_destroy(pd);
    if (bad) return false;
    float *bufs[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (D.mem_create(&D.mem[i], &md[i], D.engine, bufs[i])) return false;
    return true;
}

static void dnnl_run(void) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, D.mem[0]}, {DNNL_ARG_WEIGHTS, D.mem[1]}, {DNNL_ARG_DST, D.mem[2]}};
    D.prim_execute(D.prim, D.stream, 3, args);
    D.stream_wait(D.stream);
}

static void dnnl_threads(int n) { D.omp_set_num_threads(n); }

static void dnnl_release(void) {
    for (int i = 0; i < 3; i++) D.mem_destroy(D.mem[i]);
    D.prim_destroy(D.prim);
}
#else
static bool dnnl_load(void) { return false; }
static bool dnnl_prepare(int64_t M, int64_t N, int64_t K, float *a, float *b, float *c, char *impl, size_t impl_len) {
    (void)M, (void)N, (void)K, (void)a, (void)b, (void)c, (void)impl, (void)impl_len;
    return false;
}
static void dnnl_run(void) {}
static void dnnl_threads(int n) { (void)n; }
static void dnnl_release(void) {}
#endif

static double median(double *v, int n) { qsort(v, (size_t)n, sizeof *v, bench_cmp_d); return v[n / 2]; }

static void report(const char *provider, const char *kernel, int64_t M, int64_t N, int64_t K, double *t, int n,
                   double err) {
    double ms = median(t, n);
    printf("{\"bench\":\"gemm_provider\",\"provider\":\"%s\",\"kernel\":\"%s\",\"shape\":[%lld,%lld,%lld],"
           "\"ms\":%.3f,\"gflops\":%.1f,\"max_rel_err_vs_fathom\":%.2e,\"threads\":%d}\n",
           provider, kernel, (long long)M, (long long)N, (long long)K, ms, 2.0 * M * N * K / ms / 1e6, err,
           fm_num_threads());
    fflush(stdout);
}

static double max_rel(const float *x, const float *ref, int64_t n) {
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - ref[i]) / (scale + 1e-30);
        worst = e > worst ? e : worst;
    }
    return worst;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 9, nt = fm_num_threads();
    /* "fathom": fathom's rows only, so that no other library's threads (oneDNN's OpenMP team,
     * BLIS's, OpenBLAS's) are still spinning from the previous shape while fathom is timed */
    bool only_fathom = argc > 2 && !strcmp(argv[2], "fathom");
    if (reps < 1 || reps > 64) reps = 9;
    const fm_openblas_fns *ob = fm_openblas();
    if (!ob) { fprintf(stderr, "bench_gemm_providers: OpenBLAS is not loaded\n"); return 1; }
    char dnnl_impl[128] = "?";
    bool have_dnnl = dnnl_load();
    if (!have_dnnl) fprintf(stderr, "bench_gemm_providers: oneDNN (libdnnl.so.2) not usable: its rows are left out\n");
    void *blis = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    sgemm_fn blis_sgemm = blis ? (sgemm_fn)dlsym(blis, "cblas_sgemm") : NULL;
    void (*blis_threads)(long) = blis ? (void (*)(long))dlsym(blis, "bli_thread_set_num_threads") : NULL;
    const char *(*blis_arch_str)(int) = blis ? (const char *(*)(int))dlsym(blis, "bli_arch_string") : NULL;
    int (*blis_arch)(void) = blis ? (int (*)(void))dlsym(blis, "bli_arch_query_id") : NULL;
    if (!blis_sgemm || !blis_threads)
        fprintf(stderr, "bench_gemm_providers: BLIS (libblis.so.4; Debian libblis-dev) not usable: its rows are left out\n");
    /* the square shapes, then training shapes: kjv-gpt's linears (2048 tokens, width 128:
     * qkv 128->384, projection 128->128, MLP 128->512 and 512->128) and the MLP recipe's
     * (batch 128: 784->1024, 1024->1024) */
    static const int64_t shapes[][3] = {{1024, 1024, 1024}, {4096, 1024, 1024}, {2048, 2048, 2048}, {2048, 384, 128},
                                        {2048, 128, 128},   {2048, 512, 128},   {2048, 128, 512},   {128, 1024, 784},
                                        {128, 1024, 1024}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        int64_t sa[2] = {M, K}, sb[2] = {K, N};
        fm_tensor *a = fm_tensor_randn(2, sa, FM_F32, NULL), *b = fm_tensor_randn(2, sb, FM_F32, NULL);
        float *pa = fm_tensor_data(a), *pb = fm_tensor_data(b), *c = malloc((size_t)(M * N) * sizeof(float));
        fm_tensor *ref = fm_matmul(a, b);
        const float *pr = fm_tensor_data(ref);
        double t[64];
        /* fathom: fm_matmul (OpenBLAS, one thread per part under fathom's pool) */
        for (int r = -1; r < reps; r++) {
            double t0 = bench_now_ms();
            fm_tensor *y = fm_matmul(a, b);
            double t1 = bench_now_ms();
            fm_tensor_release(y);
            if (r >= 0) t[r] = t1 - t0;
        }
        char fk[96];
        fm_f32_gemm_info fi;
        fm_f32_gemm_info_get(&fi);
        fm_cpu_gemm_args ga = {FM_F32, false, false, M, N, K, pa, K, pb, N, 0.0, c, N};
        snprintf(fk, sizeof fk, "%s",
                 fm_cpu_gemm_f32_avx512_takes(&ga)                ? "fathom avx512 14x32"
                 : fi.onednn && M * N * K >= ((int64_t)1 << 21) ? fi.kernel
                                                                  : ob->get_corename());
        report("fathom", fk, M, N, K, t, reps, 0.0);
        if (only_fathom) {
            free(c);
            fm_tensor_release_n(3, a, b, ref);
            continue;
        }
        /* OpenBLAS driving its own threads, same library and core */
        ob->set_num_threads(nt);
        for (int r = -1; r < reps; r++) {
            double t0 = bench_now_ms();
            ob->sgemm(101, 111, 111, (int)M, (int)N, (int)K, 1.0f, pa, (int)K, pb, (int)N, 0.0f, c, (int)N);
            double t1 = bench_now_ms();
            if (r >= 0) t[r] = t1 - t0;
        }
        ob->set_num_threads(1);
        report("openblas_threads", ob->get_corename(), M, N, K, t, reps, max_rel(c, pr, M * N));
        if (have_dnnl && dnnl_prepare(M, N, K, pa, pb, c, dnnl_impl, sizeof dnnl_impl)) {
            dnnl_threads(nt);
            for (int r = -1; r < reps; r++) {
                double t0 = bench_now_ms();
                dnnl_run();
                double t1 = bench_now_ms();
                if (r >= 0) t[r] = t1 - t0;
            }
            report("onednn", dnnl_impl, M, N, K, t, reps, max_rel(c, pr, M * N));
            dnnl_release();
        }
        if (blis_sgemm && blis_threads) {
            blis_threads(nt);
            for (int r = -1; r < reps; r++) {
                double t0 = bench_now_ms();
                blis_sgemm(101, 111, 111, (int)M, (int)N, (int)K, 1.0f, pa, (int)K, pb, (int)N, 0.0f, c, (int)N);
                double t1 = bench_now_ms();
                if (r >= 0) t[r] = t1 - t0;
            }
            report("blis", blis_arch_str && blis_arch ? blis_arch_str(blis_arch()) : "?", M, N, K, t, reps,
                   max_rel(c, pr, M * N));
        }
        free(c);
        fm_tensor_release_n(3, a, b, ref);
    }
    return 0;
}
