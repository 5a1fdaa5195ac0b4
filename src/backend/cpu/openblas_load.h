/* OpenBLAS, loaded at run time so that fathom can choose its kernels.
 *
 * A DYNAMIC_ARCH OpenBLAS picks its kernels ("core") once, when it is loaded,
 * from cpuid or from OPENBLAS_CORETYPE. An OpenBLAS older than the CPU does
 * not know it and falls back to a generic SSE core (Prescott): 5x slower GEMM
 * on a current Xeon, and nothing says so. fathom therefore does not link
 * OpenBLAS: it dlopens it on first use, reads the core it chose, and if that
 * core is below what the CPU can run (and the user did not set
 * OPENBLAS_CORETYPE), loads it again with the right OPENBLAS_CORETYPE. Where
 * it cannot (OpenBLAS already loaded by the program, the user's own
 * OPENBLAS_CORETYPE, a build that ignores it), it warns once, naming the cause.
 * Without a loadable OpenBLAS, GEMM runs on fathom's portable loops
 * (gemm_portable.c), announced once. FATHOM_OPENBLAS=/path/libopenblas.so
 * names the library to load. */
#ifndef FATHOM_OPENBLAS_LOAD_H
#define FATHOM_OPENBLAS_LOAD_H
#include <stdbool.h>

#include "core/cpu_features.h"

/* CBLAS constants (the ABI passes these enums as int) */
enum { FM_CBLAS_ROW_MAJOR = 101, FM_CBLAS_NO_TRANS = 111, FM_CBLAS_TRANS = 112 };

typedef struct fm_openblas_fns {
    void (*sgemm)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                  int ldb, float beta, float *c, int ldc);
    void (*dgemm)(int order, int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda,
                  const double *b, int ldb, double beta, double *c, int ldc);
    void (*sgemv)(int order, int t, int m, int n, float alpha, const float *a, int lda, const float *x, int incx,
                  float beta, float *y, int incy);
    void (*dgemv)(int order, int t, int m, int n, double alpha, const double *a, int lda, const double *x, int incx,
                  double beta, double *y, int incy);
    void (*set_num_threads)(int n);
    int (*get_num_threads)(void);
    char *(*get_config)(void);
    char *(*get_corename)(void);
} fm_openblas_fns;

/* The loaded library's functions, or NULL when none could be loaded (GEMM then
 * uses the portable loops). Loads on the first call; thread-safe. */
const fm_openblas_fns *fm_openblas(void);

typedef struct fm_gemm_provider_info {
    bool loaded;
    char library[256]; /* what was dlopened */
    char core[32];     /* the kernels OpenBLAS uses, e.g. "SkylakeX" */
    char config[160];  /* openblas_get_config() */
    char note[512];    /* what fathom did about the core, or why it could not; "" when nothing was needed */
    int threads;       /* openblas_get_num_threads() */
} fm_gemm_provider_info;
void fm_gemm_provider_info_get(fm_gemm_provider_info *out);

/* For tests only, before the first fm_openblas(): load the library first with
 * OPENBLAS_CORETYPE=core, as if OpenBLAS had picked that core itself, so that
 * the replacement of a generic core can be exercised on any machine. */
void fm_openblas_test_first_core(const char *core);

/* The decision, pure so that tests can feed it made-up cores and CPUs. */
typedef enum fm_openblas_action {
    FM_OPENBLAS_KEEP,          /* the core uses the CPU's widest vectors (or is one fathom does not know) */
    FM_OPENBLAS_RELOAD,        /* reload with OPENBLAS_CORETYPE = *want */
    FM_OPENBLAS_WARN_USER_SET, /* below the CPU, but OPENBLAS_CORETYPE was set by the user: respected */
    FM_OPENBLAS_WARN_PRELOADED /* below the CPU, and OpenBLAS was loaded before fathom could choose */
} fm_openblas_action;
/* The OpenBLAS core for the widest vectors the CPU has ("Cooperlake",
 * "SkylakeX", "Haswell", "Sandybridge"), or NULL for none of those. */
const char *fm_openblas_core_for(const fm_cpu_features *f);
/* Vector width class of an OpenBLAS core name: 0 SSE, 1 AVX, 2 AVX2, 3 AVX-512;
 * -1 for a name fathom does not know (a newer core is assumed to be right). */
int fm_openblas_core_level(const char *core);
fm_openblas_action fm_openblas_decide(const char *core, const fm_cpu_features *f, const char *user_coretype,
                                      bool preloaded, const char **want);

/* The portable fallback GEMM (row-major, alpha = 1): C = op(A) op(B) + beta C. */
void fm_gemm_portable_f32(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                          float beta, float *c, int ldc);
void fm_gemm_portable_f64(bool ta, bool tb, int m, int n, int k, const double *a, int lda, const double *b, int ldb,
                          double beta, double *c, int ldc);
#endif
