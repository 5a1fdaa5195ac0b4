/* bf16 GEMM with f32 accumulation on the CPU's bf16 hardware, through oneDNN.
 *
 * Why oneDNN: Debian's OpenBLAS 0.3.21 is built without its bf16 GEMM
 * (cblas_sbgemm is absent), and oneDNN is the library PyTorch and ONNX Runtime
 * use for CPU bf16: its brgemm kernels use AVX512-BF16 (vdpbf16ps) and AMX
 * tiles. On the 2-core EPYC Zen 4 (AVX512-BF16) a 2048^3 product ran at 41.7
 * GFLOP/s against OpenBLAS sgemm's 19.5 in the same program (both under load).
 *
 * Like OpenBLAS (openblas_load.c), oneDNN is dlopened, not linked: fathom
 * builds and runs without it, and says in `fathom info` which path bf16 takes.
 * Only oneDNN 2.x (libdnnl.so.2, the C API compiled against here) is loaded.
 * FATHOM_DNNL=off keeps bf16 on the widen-to-f32 path; FATHOM_DNNL=/path names
 * the library (FATHOM_DNNL=on: the default one, also in an AddressSanitizer
 * build, which otherwise does not load it: see load()).
 *
 * f32 too, where it measured faster than OpenBLAS: on an Intel CPU with AVX-512,
 * oneDNN 2.6.3's f32 matmul (brg:avx512_core) ran 1.15-1.6x OpenBLAS 0.3.21's
 * Cooperlake sgemm on one thread at the training shapes (K = 128..1024: kjv-gpt's
 * and the MLP recipe's linears) and 1.0-1.1x on 1024^3-2048^3 (Intel Xeon model
 * 207, bench/bench_gemm_providers.py, docs/PERFORMANCE.md); on an AMD EPYC Zen 4
 * 1.08-1.1x at 1024^3 and 4096x1024x1024 and the MLP train step 1.11x on one
 * thread. FATHOM_GEMM_F32=openblas keeps f32 on OpenBLAS, =onednn asks for oneDNN
 * on any CPU; CPUs without AVX-512 keep OpenBLAS (not measured against oneDNN).
 * On Intel CPUs the large f32 products go to fathom's own AVX-512 kernel instead
 * (gemm_f32_avx512.c; gemm_cpu.c decides, =fathom sends it every product).
 * `fathom info` says which runs f32.
 *
 * Threads: fathom's pool splits C into one part per thread and each part is
 * one single-threaded oneDNN call (its OpenMP team is set to one thread in each
 * pool thread), for the reason gemm_cpu.c gives: one pool for everything, no
 * second set of spinning workers. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
#define FM_HAVE_DNNL_HEADERS 1
#else
#define FM_HAVE_DNNL_HEADERS 0
#endif

static fm_bf16_gemm_info g_info;
static fm_f32_gemm_info g_f32;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Multiply-adds per second of vdpbf16ps (2 bf16 products into each f32 lane)
 * over those of vfmadd231ps (one), both on 512-bit registers, 12 independent
 * accumulators each (more than either instruction's latency needs). 2 where
 * the bf16 dot product issues as often as the FMA; 0.50-0.57 on the Intel
 * Xeon model 207 (Emerald Rapids, no AMX exposed), where one vdpbf16ps takes
 * four times a vfmadd231ps (docs/PERFORMANCE.md). Each
 * side's time is the shortest of 7 alternating runs of 12,000 instructions, so
 * a preemption by another process only lengthens runs that are not kept. */
#if defined(__x86_64__)
#define FM_DOT_RUN(ins)                                                                                        \
    __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n\t"                                                      \
                     "vmovdqa64 %%zmm0, %%zmm1\n\tvmovdqa64 %%zmm0, %%zmm2\n\tvmovdqa64 %%zmm0, %%zmm3\n\t"   \
                     "vmovdqa64 %%zmm0, %%zmm4\n\tvmovdqa64 %%zmm0, %%zmm5\n\tvmovdqa64 %%zmm0, %%zmm6\n\t"   \
                     "vmovdqa64 %%zmm0, %%zmm7\n\tvmovdqa64 %%zmm0, %%zmm8\n\tvmovdqa64 %%zmm0, %%zmm9\n\t"   \
                     "vmovdqa64 %%zmm0, %%zmm10\n\tvmovdqa64 %%zmm0, %%zmm11\n\t"                              \
                     "vmovdqa64 %%zmm0, %%zmm12\n\tvmovdqa64 %%zmm0, %%zmm13\n\t"                              \
                     "mov $1000, %%ecx\n"                                                                     \
                     "1:\n\t" ins " %%zmm12, %%zmm13, %%zmm0\n\t" ins " %%zmm12, %%zmm13, %%zmm1\n\t"         \
                     ins " %%zmm12, %%zmm13, %%zmm2\n\t" ins " %%zmm12, %%zmm13, %%zmm3\n\t"                  \
                     ins " %%zmm12, %%zmm13, %%zmm4\n\t" ins " %%zmm12, %%zmm13, %%zmm5\n\t"                  \
                     ins " %%zmm12, %%zmm13, %%zmm6\n\t" ins " %%zmm12, %%zmm13, %%zmm7\n\t"                  \
                     ins " %%zmm12, %%zmm13, %%zmm8\n\t" ins " %%zmm12, %%zmm13, %%zmm9\n\t"                  \
                     ins " %%zmm12, %%zmm13, %%zmm10\n\t" ins " %%zmm12, %%zmm13, %%zmm11\n\t"                \
                     "dec %%ecx\n\tjnz 1b\n\tvzeroupper"                                                      \
                     :                                                                                        \
                     :                                                                                        \
                     : "ecx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                       "xmm10", "xmm11", "xmm12", "xmm13", "cc")

static double dot_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double fm_bf16_dot_rate(void) {
    if (!fm_cpu_get_features()->avx512_bf16) return 0.0;
    double best_fma = 1e30, best_dp = 1e30;
    for (int r = 0; r < 8; r++) { /* run 0 warms the units up and is not kept */
        double t0 = dot_now();
        FM_DOT_RUN("vfmadd231ps");
        double t1 = dot_now();
        FM_DOT_RUN("vdpbf16ps");
        double t2 = dot_now();
        if (r && t1 - t0 < best_fma) best_fma = t1 - t0;
        if (r && t2 - t1 < best_dp) best_dp = t2 - t1;
    }
    /* vdpbf16ps does two multiply-adds per lane, vfmadd231ps one */
    return best_dp > 0 ? 2.0 * best_fma / best_dp : 0.0;
}
#undef FM_DOT_RUN
#else
double fm_bf16_dot_rate(void) { return 0.0; }
#endif

/* The rate, measured once per process: the GEMM's choice (bf16_wanted) and the
 * attention's (fm_cpu_bf16_dot_fast) read the same measurement, so they cannot disagree. */
static double g_dot_rate;
static pthread_once_t g_dot_once = PTHREAD_ONCE_INIT;
static void dot_rate_init(void) { g_dot_rate = fm_bf16_dot_rate(); }
static double dot_rate_once(void) {
    pthread_once(&g_dot_once, dot_rate_init);
    return g_dot_rate;
}
bool fm_cpu_bf16_dot_fast(void) {
    return fm_cpu_get_features()->avx512_bf16 && dot_rate_once() >= FM_BF16_DOT_MIN_RATE;
}

#if FM_HAVE_DNNL_HEADERS
static struct {
    void *lib;
    dnnl_engine_t engine;
    void (*omp_set_num_threads)(int);
    dnnl_status_t (*engine_create)(dnnl_engine_t *, dnnl_engine_kind_t, size_t);
    dnnl_status_t (*stream_create)(dnnl_stream_t *, dnnl_engine_t, unsigned);
    dnnl_status_t (*stream_destroy)(dnnl_stream_t);
    dnnl_status_t (*stream_wait)(dnnl_stream_t);
    dnnl_status_t (*md_init_by_strides)(dnnl_memory_desc_t *, int, const dnnl_dims_t, dnnl_data_type_t, const dnnl_dims_t);
    dnnl_status_t (*matmul_desc_init)(dnnl_matmul_desc_t *, const dnnl_memory_desc_t *, const dnnl_memory_desc_t *,
                                      const dnnl_memory_desc_t *, const dnnl_memory_desc_t *);
    dnnl_status_t (*pd_create)(dnnl_primitive_desc_t *, const_dnnl_op_desc_t, const_dnnl_primitive_attr_t, dnnl_engine_t,
                               const_dnnl_primitive_desc_t);
    dnnl_status_t (*pd_query)(const_dnnl_primitive_desc_t, dnnl_query_t, int, void *);
    dnnl_status_t (*pd_destroy)(dnnl_primitive_desc_t);
    dnnl_status_t (*prim_create)(dnnl_primitive_t *, const_dnnl_primitive_desc_t);
    dnnl_status_t (*prim_destroy)(dnnl_primitive_t);
    dnnl_status_t (*prim_execute)(const_dnnl_primitive_t, dnnl_stream_t, int, const dnnl_exec_arg_t *);
    dnnl_status_t (*mem_create)(dnnl_memory_t *, const dnnl_memory_desc_t *, dnnl_engine_t, void *);
    dnnl_status_t (*mem_destroy)(dnnl_memory_t);
    const dnnl_version_t *(*version)(void);
    dnnl_status_t (*attr_create)(dnnl_primitive_attr_t *);
    dnnl_status_t (*attr_destroy)(dnnl_primitive_attr_t);
    dnnl_status_t (*attr_set_scratchpad_mode)(dnnl_primitive_attr_t, dnnl_scratchpad_mode_t);
    const dnnl_memory_desc_t *(*pd_query_md)(const_dnnl_primitive_desc_t, dnnl_query_t, int);
    size_t (*md_get_size)(const dnnl_memory_desc_t *);
} D;

/* One compiled product per shape and layout. Entries are never evicted (a
 * primitive may be running in another thread); when the table is full a call
 * builds and frees its own, relying on oneDNN's internal primitive cache. */
typedef struct prim_key {
    int64_t M, N, K, sa[2], sb[2], ldc;
    bool bias;
    bool f32;    /* A and B f32 (else bf16) */
    bool c_bf16; /* C bf16, rounded by oneDNN as it stores (else f32) */
} prim_key;
#define PRIM_CACHE 128
typedef struct cache_entry {
    prim_key key;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t scratch; /* the primitive's scratchpad, passed in by each call */
} cache_entry;
static cache_entry g_cache[PRIM_CACHE];
static int g_cached;
static pthread_mutex_t g_cache_mu = PTHREAD_MUTEX_INITIALIZER;

static bool load_syms(void) {
#define SYM(field, name)                                  \
    do {                                                  \
        *(void **)&D.field = dlsym(D.lib, name);          \
        if (!D.field) {                                   \
            snprintf(g_info.note, sizeof g_info.note, "%.200s has no %.40s", g_info.library, name); \
            return false;                                 \
        }                                                 \
    } while (0)
    SYM(engine_create, "dnnl_engine_create");
    SYM(stream_create, "dnnl_stream_create");
    SYM(stream_destroy, "dnnl_stream_destroy");
    SYM(stream_wait, "dnnl_stream_wait");
    SYM(md_init_by_strides, "dnnl_memory_desc_init_by_strides");
    SYM(matmul_desc_init, "dnnl_matmul_desc_init");
    SYM(pd_create, "dnnl_primitive_desc_create");
    SYM(pd_query, "dnnl_primitive_desc_query");
    SYM(pd_destroy, "dnnl_primitive_desc_destroy");
    SYM(prim_create, "dnnl_primitive_create");
    SYM(prim_destroy, "dnnl_primitive_destroy");
    SYM(prim_execute, "dnnl_primitive_execute");
    SYM(mem_create, "dnnl_memory_create");
    SYM(mem_destroy, "dnnl_memory_destroy");
    SYM(version, "dnnl_version");
    SYM(attr_create, "dnnl_primitive_attr_create");
    SYM(attr_destroy, "dnnl_primitive_attr_destroy");
    SYM(attr_set_scratchpad_mode, "dnnl_primitive_attr_set_scratchpad_mode");
    SYM(pd_query_md, "dnnl_primitive_desc_query_md");
    SYM(md_get_size, "dnnl_memory_desc_get_size");
    SYM(omp_set_num_threads, "omp_set_num_threads"); /* oneDNN's OpenMP runtime, loaded with it */
#undef SYM
    return true;
}

/* The primitive for one part (into e->prim, e->scratch), and the kernel name
 * oneDNN chose for it when impl != NULL. The scratchpad is the caller's (user
 * mode): oneDNN's own is one global buffer unless the library was built for
 * concurrent execution, and the parts run at the same time in fathom's pool
 * (with the library's scratchpad, bf16 training losses changed run to run). */
/* The layouts of one part's operands: md[0] A, md[1] B (bf16 or f32), md[2] C (f32 or bf16), md[3] bias (f32). */
static bool part_descs(const prim_key *k, dnnl_memory_desc_t md[4]) {
    dnnl_dims_t da = {k->M, k->K}, db = {k->K, k->N}, dc = {k->M, k->N}, dbias = {1, k->N};
    dnnl_dims_t sa = {k->sa[0], k->sa[1]}, sb = {k->sb[0], k->sb[1]}, sc = {k->ldc, 1}, sbias = {k->N, 1};
    dnnl_data_type_t in = k->f32 ? dnnl_f32 : dnnl_bf16;
    return !D.md_init_by_strides(&md[0], 2, da, in, sa) && !D.md_init_by_strides(&md[1], 2, db, in, sb) &&
           !D.md_init_by_strides(&md[2], 2, dc, k->c_bf16 ? dnnl_bf16 : dnnl_f32, sc) && !D.md_init_by_strides(&md[3], 2, dbias, dnnl_f32, sbias);
}

static bool make_prim(const prim_key *k, cache_entry *e, char *impl, size_t impl_len) {
    dnnl_memory_desc_t d[4];
    if (!part_descs(k, d)) return false;
    dnnl_matmul_desc_t md;
    if (D.matmul_desc_init(&md, &d[0], &d[1], k->bias ? &d[3] : NULL, &d[2])) return false;
    dnnl_primitive_attr_t attr;
    if (D.attr_create(&attr)) return false;
    dnnl_primitive_desc_t pd;
    bool ok = !D.attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) && !D.pd_create(&pd, &md, attr, D.engine, NULL);
    D.attr_destroy(attr);
    if (!ok) return false;
    const char *name = NULL;
    if (D.pd_query(pd, dnnl_query_impl_info_str, 0, &name) != dnnl_success) name = NULL;
    if (impl && name) snprintf(impl, impl_len, "%s", name);
    /* oneDNN's reference loops are many times slower than OpenBLAS: leave such a layout to it */
    if (!name || !strncmp(name, "ref", 3)) {
        D.pd_destroy(pd);
        return false;
    }
    const dnnl_memory_desc_t *sm = D.pd_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (sm) e->scratch = *sm;
    else memset(&e->scratch, 0, sizeof e->scratch);
    e->key = *k;
    ok = sm && !D.prim_create(&e->prim, pd);
    D.pd_destroy(pd);
    return ok;
}

#if defined(__SANITIZE_ADDRESS__)
#define FM_ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FM_ASAN_BUILD 1
#endif
#endif

/* Whether f32 products should go to oneDNN: FATHOM_GEMM_F32 decides when set;
 * else a CPU with AVX-512, where it measured faster (an Intel Xeon model 207 and an
 * AMD EPYC Zen 4: docs/PERFORMANCE.md). The reason it does not goes to g_f32.note. */
static bool f32_wanted(const fm_cpu_features *f) {
    fm_f32_provider asked = fm_cpu_gemm_f32_asked();
    if (asked == FM_F32_PROVIDER_OPENBLAS) {
        snprintf(g_f32.note, sizeof g_f32.note, "FATHOM_GEMM_F32=openblas");
        return false;
    }
    if (asked == FM_F32_PROVIDER_FATHOM && fm_isa_max_for(f) < FM_ISA_AVX512) { /* no kernel of fathom's own here */
        snprintf(g_f32.note, sizeof g_f32.note,
                 "FATHOM_GEMM_F32=fathom asks for fathom's f32 kernel, which needs AVX-512: this CPU's default (OpenBLAS) is used");
        return false;
    }
    if (asked != FM_F32_PROVIDER_DEFAULT) return true; /* fathom: gemm_f32_avx512.c, the rest oneDNN */
    if (fm_isa_max_for(f) < FM_ISA_AVX512) {
        snprintf(g_f32.note, sizeof g_f32.note,
                 "oneDNN's f32 matmul was measured faster only on CPUs with AVX-512 (FATHOM_GEMM_F32=onednn to try it)");
        return false;
    }
    return true;
}

/* Whether bf16 products should go to oneDNN (else the reason goes to g_info.note). */
static bool bf16_wanted(const fm_cpu_features *f, const char *env) {
    if (!f->avx512_bf16 && !(f->amx_bf16 && f->amx_usable)) {
        snprintf(g_info.note, sizeof g_info.note, "the CPU has neither AVX512-BF16 nor AMX-BF16: bf16 is widened to f32");
        return false;
    }
    /* Without usable AMX the bf16 products are vdpbf16ps, which not every core runs
     * faster than its f32 FMAs: on the Intel Xeon model 207 one vdpbf16ps (32
     * multiply-adds) takes 2 cycles against the FMA's half cycle (16), so bf16 math
     * runs at half the f32 rate (bench/bench_dot_rates.c), and oneDNN 2.6.3's bf16
     * matmul ran at 0.52-0.77x of OpenBLAS f32 on bf16 values widened to f32
     * (docs/PERFORMANCE.md; PyTorch's bf16 torch.mm there is 0.55-0.77x its f32 one
     * too). AMD Zen 4 runs f32 FMAs at half the width and gains 2x from bf16. So the
     * rate is measured (fm_bf16_dot_rate) and below FM_BF16_DOT_MIN_RATE bf16 is
     * widened: the same products (a bf16 x bf16 product is exact in f32), f32
     * accumulation both ways. */
    if (!(f->amx_bf16 && f->amx_usable) && f->avx512_bf16) {
        g_info.dp_rate = dot_rate_once();
        if (g_info.dp_rate < FM_BF16_DOT_MIN_RATE && !(env && *env)) {
            snprintf(g_info.note, sizeof g_info.note,
                     "AVX512-BF16 but no usable AMX: this core's bf16 dot product (vdpbf16ps) does %.2fx the f32 FMA's "
                     "multiply-adds per second (measured), so bf16 is widened to f32 (FATHOM_DNNL=on uses oneDNN anyway)",
                     g_info.dp_rate);
            return false;
        }
    }
    return true;
}

static void both_notes(const char *fmt, const char *arg) {
    char msg[200];
    snprintf(msg, sizeof msg, fmt, arg);
    if (!g_info.note[0]) snprintf(g_info.note, sizeof g_info.note, "%s: bf16 is widened to f32", msg);
    if (!g_f32.note[0]) snprintf(g_f32.note, sizeof g_f32.note, "%s", msg);
}

/* The implementation oneDNN picks for a typical product, for `fathom info`; false if none. */
static bool probe(bool f32, char *kernel, size_t kernel_len) {
    prim_key k = {256, 256, 256, {256, 1}, {256, 1}, 256, false, f32, false};
    cache_entry e;
    if (!make_prim(&k, &e, kernel, kernel_len)) return false;
    D.prim_destroy(e.prim);
    return true;
}

static void load(void) {
    const fm_cpu_features *f = fm_cpu_get_features();
    const char *env = getenv("FATHOM_DNNL");
    bool want_f32 = f32_wanted(f); /* first: FATHOM_GEMM_F32 is read (and a bad value said) in every build */
    if (env && (!strcmp(env, "off") || !strcmp(env, "0"))) {
        both_notes("FATHOM_DNNL=%s", env);
        return;
    }
#ifdef FM_ASAN_BUILD
    /* LeakSanitizer's exit scan crashes on the dynamic TLS that oneDNN and its
     * OpenMP runtime bring in ("Tracer caught signal 11", DTLS with a bogus
     * range). Checked by hand instead: FATHOM_DNNL=on ASAN_OPTIONS=detect_leaks=0. */
    if (!env || strcmp(env, "on")) {
        both_notes("AddressSanitizer build: oneDNN not loaded (FATHOM_DNNL=on to load it, with detect_leaks=0)%s", "");
        return;
    }
#endif
    bool want_bf16 = bf16_wanted(f, env);
    if (!want_bf16 && !want_f32) return;
    snprintf(g_info.library, sizeof g_info.library, "%s", env && *env && strcmp(env, "on") ? env : "libdnnl.so.2");
    D.lib = dlopen(g_info.library, RTLD_NOW | RTLD_LOCAL);
    if (!D.lib) {
        both_notes("oneDNN not loadable (%.120s; apt-get install libdnnl2)", g_info.library);
        return;
    }
    if (!load_syms() || D.engine_create(&D.engine, dnnl_cpu, 0) != dnnl_success) {
        both_notes("oneDNN has no CPU engine (%.120s)", g_info.note);
        dlclose(D.lib);
        D.lib = NULL;
        return;
    }
    const dnnl_version_t *v = D.version();
    snprintf(g_info.version, sizeof g_info.version, "%d.%d.%d", v->major, v->minor, v->patch);
    D.omp_set_num_threads(1);
    if (want_bf16) {
        g_info.loaded = probe(false, g_info.kernel, sizeof g_info.kernel);
        if (!g_info.loaded)
            snprintf(g_info.note, sizeof g_info.note, "oneDNN %s has no bf16 matmul here: bf16 is widened to f32", g_info.version);
    }
    if (want_f32) {
        g_f32.onednn = probe(true, g_f32.kernel, sizeof g_f32.kernel);
        if (!g_f32.onednn) snprintf(g_f32.note, sizeof g_f32.note, "oneDNN %s has no fast f32 matmul here", g_info.version);
    }
}

/* The cached entry for k (copied to *e); *owned when the table was full and
 * the caller must destroy e->prim. */
static bool get_prim(const prim_key *k, cache_entry *e, bool *owned) {
    *owned = false;
    pthread_mutex_lock(&g_cache_mu);
    for (int i = 0; i < g_cached; i++)
        if (!memcmp(&g_cache[i].key, k, sizeof *k)) {
            *e = g_cache[i];
            pthread_mutex_unlock(&g_cache_mu);
            return true;
        }
    bool ok = make_prim(k, e, NULL, 0);
    if (ok && g_cached < PRIM_CACHE) g_cache[g_cached++] = *e;
    else *owned = ok;
    pthread_mutex_unlock(&g_cache_mu);
    return ok;
}

typedef struct part_ctx {
    const fm_cpu_gemm_args *g;
    const float *bias;
    bool c_bf16;
    bool by_cols;
    int64_t step; /* rows or columns per part */
    _Atomic int failed;
} part_ctx;

static _Thread_local bool t_omp_single;

/* C[i0:i1, j0:j1] as one oneDNN call. */
static bool run_part(const fm_cpu_gemm_args *g, const float *bias, bool c_bf16, int64_t i0, int64_t i1, int64_t j0,
                     int64_t j1) {
    if (!t_omp_single) { D.omp_set_num_threads(1); t_omp_single = true; }
    prim_key k;
    memset(&k, 0, sizeof k); /* the key is compared bytewise: no stray padding */
    k.M = i1 - i0; k.N = j1 - j0; k.K = g->K; k.ldc = g->ldc; k.bias = bias != NULL; k.f32 = g->dt == FM_F32;
    k.c_bf16 = c_bf16;
    /* op(A) [M,K]: A stored [M,K] (lda) or [K,M] (ta); op(B) [K,N]: B stored [K,N] or [N,K] (tb) */
    k.sa[0] = g->ta ? 1 : g->lda; k.sa[1] = g->ta ? g->lda : 1;
    k.sb[0] = g->tb ? 1 : g->ldb; k.sb[1] = g->tb ? g->ldb : 1;
    size_t es = k.f32 ? sizeof(float) : sizeof(uint16_t);
    const char *A = (const char *)g->A + (size_t)(i0 * k.sa[0]) * es;
    const char *B = (const char *)g->B + (size_t)(j0 * k.sb[1]) * es;
    char *C = (char *)g->C + (size_t)(i0 * g->ldc + j0) * (c_bf16 ? sizeof(uint16_t) : sizeof(float));
    bool owned;
    cache_entry e;
    if (!get_prim(&k, &e, &owned)) return false;
    dnnl_memory_desc_t d[4];
    dnnl_memory_t mem[5] = {0};
    dnnl_stream_t s = NULL;
    size_t scratch_bytes = D.md_get_size(&e.scratch);
    void *scratch = scratch_bytes ? malloc(scratch_bytes) : NULL;
    bool ok = (!scratch_bytes || scratch) && part_descs(&k, d) &&
              !D.mem_create(&mem[0], &d[0], D.engine, (void *)A) && !D.mem_create(&mem[1], &d[1], D.engine, (void *)B) &&
              !D.mem_create(&mem[2], &d[2], D.engine, C) && !D.mem_create(&mem[3], &e.scratch, D.engine, scratch) &&
              (!bias || !D.mem_create(&mem[4], &d[3], D.engine, (void *)(bias + j0))) &&
              !D.stream_create(&s, D.engine, dnnl_stream_default_flags);
    if (ok) {
        dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]},
                                   {DNNL_ARG_SCRATCHPAD, mem[3]}, {DNNL_ARG_BIAS, mem[4]}};
        ok = !D.prim_execute(e.prim, s, bias ? 5 : 4, args) && !D.stream_wait(s);
    }
    if (s) D.stream_destroy(s);
    for (int i = 0; i < 5; i++)
        if (mem[i]) D.mem_destroy(mem[i]);
    free(scratch);
    if (owned) D.prim_destroy(e.prim);
    return ok;
}

static void part_task(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    part_ctx *c = vctx;
    const fm_cpu_gemm_args *g = c->g;
    for (int64_t u = b; u < e; u++) {
        int64_t lo = u * c->step, hi = lo + c->step;
        bool ok = c->by_cols ? run_part(g, c->bias, c->c_bf16, 0, g->M, lo, hi < g->N ? hi : g->N)
                             : run_part(g, c->bias, c->c_bf16, lo, hi < g->M ? hi : g->M, 0, g->N);
        if (!ok) c->failed = 1;
    }
}
#endif /* FM_HAVE_DNNL_HEADERS */

#if !FM_HAVE_DNNL_HEADERS
static void load(void) {
    snprintf(g_info.note, sizeof g_info.note, "built without oneDNN's headers (libdnnl-dev): bf16 is widened to f32");
    snprintf(g_f32.note, sizeof g_f32.note, "built without oneDNN's headers (libdnnl-dev)");
}
#endif

void fm_bf16_gemm_info_get(fm_bf16_gemm_info *out) {
    pthread_once(&g_once, load);
    *out = g_info;
}

void fm_f32_gemm_info_get(fm_f32_gemm_info *out) {
    pthread_once(&g_once, load);
    *out = g_f32;
}

/* A product through oneDNN when its path was chosen for dt (chosen) and the product
 * is worth it: below ~2M multiply-adds building the call costs more than it saves;
 * FATHOM_ISA below avx512 keeps the OpenBLAS / widened path too. One part per pool
 * thread, each a single-threaded oneDNN call. */
static bool onednn_product(const fm_cpu_gemm_args *g, const float *bias, bool c_bf16, bool chosen, fm_dtype dt) {
#if FM_HAVE_DNNL_HEADERS
    if (!chosen || g->dt != dt || g->beta != 0 || !fm_cpu_use_avx512() || g->M * g->N * g->K < ((int64_t)1 << 21) ||
        g->M < 2)
        return false;
    int nt = fm_num_threads();
    /* Rows per part unless that leaves each part fewer than 256 rows of a wide C. On the
     * AMD EPYC Zen 4, 2 threads (bench_core bf16 M N K): 1024^3 rose from 384-410 to
     * 397-441 GFLOP/s split by rows, 512x2048x512 from 382 to 415; by columns kept
     * 64x4096x512 (352 against 322) and 128x2048x512 (390 against 382). f32 products
     * with at least 512 columns per part split by columns too: each part's oneDNN call
     * packs only its columns of B instead of all of B. On the Intel Xeon with AMX
     * (model 167), 2 threads, alternated twice (bench_gemm_providers 21): 1024^3
     * 359-397 -> 408-413 GFLOP/s, 4096x1024x1024 362-390 -> 391-428, 2048^3 371-393
     * -> 412-414; the training shapes (N <= 512) keep rows. */
    bool by_cols = (g->M <= g->N && g->M < 256 * (int64_t)nt) || (dt == FM_F32 && g->N >= 512 * (int64_t)nt);
    part_ctx c = {g, bias, c_bf16, by_cols, 0, 0};
    int64_t len = c.by_cols ? g->N : g->M, parts = nt > 1 ? nt : 1;
    c.step = (len + parts - 1) / parts;
    c.step = (c.step + 31) / 32 * 32; /* whole register blocks per part */
    parts = (len + c.step - 1) / c.step;
    if (parts <= 1) part_task(&c, 0, 1, 0);
    else fm_parallel_for(parts, 1, part_task, &c);
    return !c.failed;
#else
    (void)g, (void)bias, (void)c_bf16, (void)chosen, (void)dt;
    return false;
#endif
}

bool fm_cpu_gemm_bf16(const fm_cpu_gemm_args *g, const float *bias, bool c_bf16) {
    /* a few rows against a weight: streamed from the weight's bf16 rows (tiles or
     * oneDNN would pack the whole weight for one to four rows) */
    if (!c_bf16 && fm_cpu_gemv_bf16(g, bias)) {
        fm_kernel_note_lowp_products();
        return true;
    }
    /* the level checked here, not only inside: gemm_amx.c is compiled for AMX and AVX-512,
     * and a sanitized build's prologue there already uses AVX-512 stores (an AVX2-only CPU
     * stopped on one: Illegal instruction, AMD EPYC Zen 3) */
    if (fm_cpu_use_amx() && fm_cpu_gemm_bf16_amx(g, bias, c_bf16)) {
        fm_kernel_note_lowp_products();
        return true;
    }
    pthread_once(&g_once, load);
    if (!onednn_product(g, bias, c_bf16, g_info.loaded, FM_BF16)) return false;
    fm_kernel_note_lowp_products();
    return true;
}

bool fm_cpu_gemm_f32_dnnl(const fm_cpu_gemm_args *g, const float *bias) {
    pthread_once(&g_once, load);
    return onednn_product(g, bias, false, g_f32.onednn, FM_F32);
}
