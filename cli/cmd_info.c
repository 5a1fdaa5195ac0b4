/* `fathom info`: version, build options, CPU features, BLAS and its threads,
 * CUDA toolkit/driver/devices (or exactly why there are none). */
#include <cblas.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "fathom/fathom.h"

/* OpenBLAS extensions (declared in its cblas.h on Debian; repeated for other CBLAS headers) */
extern char *openblas_get_config(void);
extern int openblas_get_num_threads(void);

int fm_cmd_info(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: fathom info [--json]\n\nPrints the version, build options, detected CPU features, the BLAS\n"
                   "library and its thread count, and the CUDA toolkit, driver and devices (or why none).\n");
            return 0;
        } else {
            fm_cli_error("info: unknown option '%s' (try --help)", argv[i]);
            return 2;
        }
    }
    const fm_cpu_features *f = fm_cpu_get_features();
    fm_build_info bi;
    fm_get_build_info(&bi);
    fm_cuda_info ci;
    fm_cuda_query(&ci);
    const char *blas = openblas_get_config();
    int blas_threads = openblas_get_num_threads();
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "version", json_string(bi.version));
        json_object_set_new(o, "build_type", json_string(bi.build_type));
        json_object_set_new(o, "sanitized", json_boolean(bi.sanitized));
        json_object_set_new(o, "cuda_built", json_boolean(bi.cuda_built));
        json_t *cpu = json_object();
        json_object_set_new(cpu, "avx", json_boolean(f->avx));
        json_object_set_new(cpu, "avx2", json_boolean(f->avx2));
        json_object_set_new(cpu, "fma", json_boolean(f->fma));
        json_object_set_new(cpu, "f16c", json_boolean(f->f16c));
        json_object_set_new(cpu, "avx512f", json_boolean(f->avx512f));
        json_object_set_new(cpu, "avx_vnni", json_boolean(f->avx_vnni));
        json_object_set_new(cpu, "simd_kernels", json_string(fm_cpu_use_avx2() ? "avx2" : "scalar"));
        json_object_set_new(cpu, "threads", json_integer(fm_num_threads()));
        json_object_set_new(o, "cpu", cpu);
        json_t *b = json_object();
        json_object_set_new(b, "library", json_string(blas ? blas : "unknown"));
        json_object_set_new(b, "threads", json_integer(blas_threads));
        json_object_set_new(o, "blas", b);
        json_t *cu = json_object();
        json_object_set_new(cu, "available", json_boolean(ci.n_devices > 0));
        json_object_set_new(cu, "reason", json_string(ci.reason));
        json_object_set_new(cu, "runtime_version", json_integer(ci.runtime_version));
        json_object_set_new(cu, "driver_version", json_integer(ci.driver_version));
        json_t *devs = json_array();
        for (int i = 0; i < ci.n_devices; i++) {
            json_t *d = json_object();
            json_object_set_new(d, "index", json_integer(i));
            json_object_set_new(d, "name", json_string(ci.devices[i].name));
            json_object_set_new(d, "memory_bytes", json_integer((json_int_t)ci.devices[i].memory_bytes));
            json_object_set_new(d, "compute_capability", json_sprintf("%d.%d", ci.devices[i].cc_major, ci.devices[i].cc_minor));
            json_object_set_new(d, "sm_count", json_integer(ci.devices[i].sm_count));
            json_object_set_new(d, "bf16", json_boolean(ci.devices[i].bf16));
            json_array_append_new(devs, d);
        }
        json_object_set_new(cu, "devices", devs);
        json_object_set_new(o, "cuda", cu);
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("fathom %s (%s build%s)\n", bi.version, bi.build_type, bi.sanitized ? ", sanitizers" : "");
        printf("cpu:   %s%s%s%s%s%s -> %s kernels, %d threads (FATHOM_NUM_THREADS)\n", f->avx ? "avx " : "",
               f->avx2 ? "avx2 " : "", f->fma ? "fma " : "", f->f16c ? "f16c " : "", f->avx512f ? "avx512f " : "",
               f->avx_vnni ? "avx-vnni " : "", fm_cpu_use_avx2() ? "avx2" : "scalar", fm_num_threads());
        printf("blas:  %s, %d threads\n", blas ? blas : "unknown", blas_threads);
        printf("cuda:  %s\n", bi.cuda_built ? "built in" : "not built (no CUDA toolkit at build time)");
        if (ci.n_devices == 0) printf("       no usable device: %s\n", ci.reason);
        if (ci.runtime_version) printf("       runtime %d, driver %d\n", ci.runtime_version, ci.driver_version);
        for (int i = 0; i < ci.n_devices; i++)
            printf("       cuda:%d %s, %.1f GiB, sm_%d%d, %d SMs, bf16 %s\n", i, ci.devices[i].name,
                   (double)ci.devices[i].memory_bytes / (1 << 30), ci.devices[i].cc_major, ci.devices[i].cc_minor,
                   ci.devices[i].sm_count, ci.devices[i].bf16 ? "yes" : "no");
    }
    fm_parallel_shutdown();
    return 0;
}
