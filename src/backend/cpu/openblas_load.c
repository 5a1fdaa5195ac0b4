/* Loading OpenBLAS with the right kernels (see openblas_load.h for why). */
#include "backend/cpu/openblas_load.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* OpenBLAS's x86 core names by vector width. Cores not listed (newer ones
 * such as SapphireRapids, or other architectures) are left alone. */
static const char *const sse_cores[] = {"Unknown", "Katmai", "Coppermine", "Northwood", "Prescott", "Banias",
                                        "Atom", "Core2", "Penryn", "Dunnington", "Nehalem", "Athlon", "Opteron",
                                        "Opteron_SSE3", "Barcelona", "Nano", "Bobcat"};
static const char *const avx_cores[] = {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller", "Excavator"};
static const char *const avx2_cores[] = {"Haswell", "Zen"};
static const char *const avx512_cores[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};

static bool in(const char *core, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcasecmp(core, list[i])) return true;
    return false;
}
#define IN(core, list) in(core, list, sizeof list / sizeof list[0])

int fm_openblas_core_level(const char *core) {
    if (!core) return -1;
    if (IN(core, sse_cores)) return 0;
    if (IN(core, avx_cores)) return 1;
    if (IN(core, avx2_cores)) return 2;
    if (IN(core, avx512_cores)) return 3;
    return -1;
}

const char *fm_openblas_core_for(const fm_cpu_features *f) {
    /* SkylakeX's kernels use AVX-512 F/CD/BW/DQ/VL; Cooperlake adds the bf16 ones */
    if (f->avx512f && f->avx512cd && f->avx512bw && f->avx512dq && f->avx512vl)
        return f->avx512_bf16 ? "Cooperlake" : "SkylakeX";
    if (f->avx2 && f->fma) return "Haswell";
    if (f->avx) return "Sandybridge";
    return NULL;
}

fm_openblas_action fm_openblas_decide(const char *core, const fm_cpu_features *f, const char *user_coretype,
                                      bool preloaded, const char **want) {
    *want = fm_openblas_core_for(f);
    int have = fm_openblas_core_level(core), best = fm_openblas_core_level(*want);
    if (have < 0 || !*want || have >= best) return FM_OPENBLAS_KEEP;
    if (user_coretype && *user_coretype) return FM_OPENBLAS_WARN_USER_SET;
    return preloaded ? FM_OPENBLAS_WARN_PRELOADED : FM_OPENBLAS_RELOAD;
}

static fm_openblas_fns g_fns;
static bool g_ok;
static fm_gemm_provider_info g_info;
static bool g_fixed; /* a generic core was replaced: the note is news, not a warning */
static const char *g_test_first_core;

void fm_openblas_test_first_core(const char *core) { g_test_first_core = core; }
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static bool bind(void *h) {
#define SYM(field, name)                                                   \
    do {                                                                   \
        *(void **)&g_fns.field = dlsym(h, name);                           \
        if (!g_fns.field) {                                                \
            snprintf(g_info.note, sizeof g_info.note, "%s lacks %s", g_info.library, name); \
            return false;                                                  \
        }                                                                  \
    } while (0)
    SYM(sgemm, "cblas_sgemm");
    SYM(dgemm, "cblas_dgemm");
    SYM(sgemv, "cblas_sgemv");
    SYM(dgemv, "cblas_dgemv");
    SYM(set_num_threads, "openblas_set_num_threads");
    SYM(get_num_threads, "openblas_get_num_threads");
    SYM(get_config, "openblas_get_config");
    SYM(get_corename, "openblas_get_corename");
#undef SYM
    return true;
}

/* OpenBLAS reads OPENBLAS_CORETYPE and its thread count only while it loads: set
 * them for the dlopen, then put the environment back as the user left it (this
 * runs once, at the CPU backend's start-up). The thread count: fathom runs
 * OpenBLAS single-threaded under its own pool (gemm_cpu.c), yet a library loaded
 * with the default count starts a worker per core that spins in sched_yield for
 * about 0.1 s before it sleeps: on 2 cores, a tenth of a second at start-up with one
 * core taken from fathom's threads (perf: 6% of a short int8 prefill run's samples).
 * So it loads with one thread, unless the user set OPENBLAS_NUM_THREADS or asked for
 * OpenBLAS's own threads (FATHOM_GEMM_THREADS=openblas). */
static void *load_env(const char *lib, const char *core) {
    char *saved_core = getenv("OPENBLAS_CORETYPE") ? strdup(getenv("OPENBLAS_CORETYPE")) : NULL;
    const char *gt = getenv("FATHOM_GEMM_THREADS");
    const bool one = !getenv("OPENBLAS_NUM_THREADS") && !(gt && !strcmp(gt, "openblas"));
    if (core) setenv("OPENBLAS_CORETYPE", core, 1);
    if (one) setenv("OPENBLAS_NUM_THREADS", "1", 1);
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (core) {
        if (saved_core) setenv("OPENBLAS_CORETYPE", saved_core, 1);
        else unsetenv("OPENBLAS_CORETYPE");
    }
    if (one) unsetenv("OPENBLAS_NUM_THREADS");
    free(saved_core);
    return h;
}

static void *open_library(const char **which) {
    const char *env = getenv("FATHOM_OPENBLAS");
    static const char *const names[] = {"libopenblas.so.0", "libopenblas.so"};
    if (env && *env) { *which = env; return load_env(env, NULL); }
    if (g_test_first_core) return load_env(*which = names[0], g_test_first_core);
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++) h = load_env(*which = names[i], NULL);
    return h;
}

static bool already_loaded(void) {
    const char *env = getenv("FATHOM_OPENBLAS");
    const char *lib = env && *env ? env : "libopenblas.so.0";
    void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    if (h) dlclose(h);
    return h != NULL;
}

/* Replaces a generic core: unload (only works if nothing else holds the
 * library) and load again with OPENBLAS_CORETYPE. */
static void *reload(void *h, const char *lib, const char *was, const char *want) {
    dlclose(h);
    void *still = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    if (still) {
        snprintf(g_info.note, sizeof g_info.note,
                 "OpenBLAS chose its generic %s kernels on this CPU and could not be unloaded to choose again; "
                 "GEMM will be slow: start the program with OPENBLAS_CORETYPE=%s", was, want);
        return still;
    }
    h = load_env(lib, want);
    if (!h) return NULL;
    g_fixed = true;
    snprintf(g_info.note, sizeof g_info.note,
             "OpenBLAS chose its generic %s kernels on this CPU; fathom loaded it again with OPENBLAS_CORETYPE=%s",
             was, want);
    return h;
}

static void load(void) {
    const char *lib = NULL, *want = NULL;
    bool preloaded = already_loaded(), quiet_note = false;
    void *h = open_library(&lib);
    snprintf(g_info.library, sizeof g_info.library, "%s", lib);
    if (!h) {
        const char *e = dlerror();
        snprintf(g_info.note, sizeof g_info.note,
                 "OpenBLAS could not be loaded (%s): matrix products use fathom's portable loops, many times slower; "
                 "install OpenBLAS (Debian: libopenblas0) or name it with FATHOM_OPENBLAS=/path/libopenblas.so",
                 e ? e : lib);
        fprintf(stderr, "fathom: warning: %s\n", g_info.note);
        return;
    }
    if (!bind(h)) goto unusable;
    const char *core = g_fns.get_corename(), *user = getenv("OPENBLAS_CORETYPE");
    char was[32];
    snprintf(was, sizeof was, "%s", core);
    switch (fm_openblas_decide(was, fm_cpu_get_features(), user, preloaded, &want)) {
    case FM_OPENBLAS_KEEP: break;
    case FM_OPENBLAS_RELOAD:
        h = reload(h, lib, was, want);
        if (!h || !bind(h)) goto unusable;
        if (g_fixed && fm_openblas_core_level(g_fns.get_corename()) < fm_openblas_core_level(want)) {
            g_fixed = false;
            snprintf(g_info.note, sizeof g_info.note,
                     "OpenBLAS chose its generic %s kernels on this CPU and still uses %s when asked for %s with "
                     "OPENBLAS_CORETYPE (a build without DYNAMIC_ARCH?); GEMM will be slow: install an OpenBLAS "
                     "that knows this CPU", was, g_fns.get_corename(), want);
        }
        break;
    case FM_OPENBLAS_WARN_USER_SET:
        snprintf(g_info.note, sizeof g_info.note,
                 "OPENBLAS_CORETYPE=%s is set, so OpenBLAS uses its %s kernels, though this CPU can run %s; "
                 "fathom leaves your setting alone", user, was, want);
        /* a setting that keeps AVX2 kernels is a choice (some machines set Haswell for every program):
         * `fathom info` shows the note; a generic core (SSE, AVX without FMA) is warned of as well */
        quiet_note = fm_openblas_core_level(was) >= 2;
        break;
    case FM_OPENBLAS_WARN_PRELOADED:
        snprintf(g_info.note, sizeof g_info.note,
                 "OpenBLAS was loaded before fathom (linked into the program?) and chose its generic %s kernels on "
                 "this CPU; GEMM will be slow: start the program with OPENBLAS_CORETYPE=%s", was, want);
        break;
    }
    if (g_info.note[0] && !g_fixed && !quiet_note)
        fprintf(stderr, "fathom: warning: %s\n", g_info.note);
    g_ok = true;
    g_info.loaded = true;
    snprintf(g_info.core, sizeof g_info.core, "%s", g_fns.get_corename());
    snprintf(g_info.config, sizeof g_info.config, "%s", g_fns.get_config());
    return;
unusable:
    if (!g_info.note[0]) snprintf(g_info.note, sizeof g_info.note, "%s could not be loaded again", lib);
    fprintf(stderr, "fathom: warning: %s: matrix products use fathom's portable loops, many times slower\n",
            g_info.note);
}

const fm_openblas_fns *fm_openblas(void) {
    pthread_once(&g_once, load);
    return g_ok ? &g_fns : NULL;
}

void fm_gemm_provider_info_get(fm_gemm_provider_info *out) {
    const fm_openblas_fns *f = fm_openblas();
    *out = g_info;
    out->threads = f ? f->get_num_threads() : 1;
}
