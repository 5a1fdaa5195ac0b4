/* `fathom info`: version, build options, the CPU (model, features, the ISA each
 * kernel family uses), the GEMM provider with its kernels and threads, CUDA
 * toolkit/driver/devices (or exactly why there are none). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/kernel_isa.h"
#include "backend/cpu/openblas_load.h"
#include "commands.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "fathom/dist.h"
#include "fathom/fathom.h"

/* the features worth naming, in order */
#define FEATURES(X)                                                                                        \
    X(avx) X(avx2) X(fma) X(f16c) X(avx512f) X(avx512dq) X(avx512cd) X(avx512bw) X(avx512vl) X(avx512vbmi) \
    X(avx512ifma) X(avx512_vnni) X(avx512_bf16) X(avx512_fp16) X(avx_vnni) X(amx_tile) X(amx_bf16) X(amx_int8)

/* Which products fathom's own attention kernel takes under bf16 training
 * (attention_avx512bf16.c needs a vdpbf16ps faster than the f32 FMA). */
static const char *bf16_attention_note(void) {
    if (!fm_cpu_bf16_dot_fast()) return "f32 products (no AVX512-BF16, or its dot product is not faster than f32 FMAs here)";
    if (!fm_cpu_use_avx512()) return "f32 products (FATHOM_ISA is below avx512)";
    return "bf16 products (vdpbf16ps; head sizes that are multiples of 16)";
}

static void print_text(const fm_cpu_features *f, const fm_gemm_provider_info *gp) {
    printf("cpu:   %s\n       ", f->model[0] ? f->model : "(no model name)");
#define PRINT_FEATURE(x) if (f->x) printf("%s ", #x);
    FEATURES(PRINT_FEATURE)
#undef PRINT_FEATURE
    if (f->amx_tile) printf("(amx tile data %s)", f->amx_usable ? "granted by the OS" : "NOT granted by the OS");
    printf("\n       kernels at %s (highest here: %s; FATHOM_ISA), %d threads (FATHOM_NUM_THREADS)\n",
           fm_isa_name(fm_cpu_isa()), fm_isa_name(fm_isa_max_for(f)), fm_num_threads());
    int nfam;
    const fm_kernel_family *fam = fm_kernel_families(&nfam);
    for (int i = 0; i < nfam; i++) printf("       %-36s %s\n", fam[i].name, fm_isa_name(fm_kernel_family_isa(&fam[i])));
    if (gp->loaded)
        printf("gemm:  OpenBLAS (%s), %s kernels, %d OpenBLAS thread%s (%s; FATHOM_GEMM_THREADS)\n       %s\n",
               gp->library, gp->core, gp->threads, gp->threads == 1 ? "" : "s",
               gp->threads == 1 ? "fathom's pool splits each GEMM" : "OpenBLAS's own threads", gp->config);
    else
        printf("gemm:  fathom's portable loops (no OpenBLAS)\n");
    if (gp->note[0]) printf("       note: %s\n", gp->note);
    fm_f32_gemm_info fi;
    fm_f32_gemm_info_get(&fi);
    if (fi.onednn)
        printf("f32:   oneDNN %s kernels for products of >= 2M multiply-adds%s (FATHOM_GEMM_F32=openblas keeps OpenBLAS)\n",
               fi.kernel, fm_cpu_use_avx512() ? "" : "; not used while FATHOM_ISA is below avx512");
    else
        printf("f32:   OpenBLAS (%s)\n", fi.note);
    const char *own = fm_cpu_gemm_f32_avx512_note();
    if (own)
        printf("       %s: fathom's own AVX-512 kernel (gemm_f32_avx512.c)%s\n", own,
               fm_cpu_use_avx512() ? "" : "; not used while FATHOM_ISA is below avx512");
    fm_bf16_gemm_info bi;
    fm_bf16_gemm_info_get(&bi);
    if (bi.loaded) {
        printf("bf16:  oneDNN %s (%s), %s kernels%s (FATHOM_DNNL=off widens to f32 instead)\n", bi.version, bi.library, bi.kernel,
               fm_cpu_use_avx512() ? "" : "; not used while FATHOM_ISA is below avx512");
        if (bi.dp_rate > 0) printf("       vdpbf16ps multiplies at %.2fx the f32 FMA's rate here (measured)\n", bi.dp_rate);
    } else {
        printf("bf16:  %s\n", bi.note);
    }
    if (fm_cpu_use_amx())
        printf("       products of >= 256K multiply-adds: fathom's own AMX tile kernel (gemm_amx.c; FATHOM_ISA=avx512 "
               "leaves them to the path above)\n");
    printf("       attention in bf16 training: %s\n", bf16_attention_note());
}

static json_t *cpu_json(const fm_cpu_features *f) {
    json_t *cpu = json_object();
    json_object_set_new(cpu, "model", json_string(f->model));
#define JSON_FEATURE(x) json_object_set_new(cpu, #x, json_boolean(f->x));
    FEATURES(JSON_FEATURE)
#undef JSON_FEATURE
    json_object_set_new(cpu, "amx_usable", json_boolean(f->amx_usable));
    json_object_set_new(cpu, "isa", json_string(fm_isa_name(fm_cpu_isa())));
    json_object_set_new(cpu, "isa_max", json_string(fm_isa_name(fm_isa_max_for(f))));
    json_object_set_new(cpu, "simd_kernels", json_string(fm_isa_name(fm_cpu_isa())));
    json_t *kern = json_object();
    int nfam;
    const fm_kernel_family *fam = fm_kernel_families(&nfam);
    for (int i = 0; i < nfam; i++) json_object_set_new(kern, fam[i].name, json_string(fm_isa_name(fm_kernel_family_isa(&fam[i]))));
    json_object_set_new(cpu, "kernels", kern);
    json_object_set_new(cpu, "threads", json_integer(fm_num_threads()));
    return cpu;
}

static json_t *gemm_json(const fm_gemm_provider_info *gp) {
    json_t *b = json_object();
    json_object_set_new(b, "provider", json_string(gp->loaded ? "openblas" : "portable"));
    json_object_set_new(b, "library", json_string(gp->library));
    json_object_set_new(b, "core", json_string(gp->core));
    json_object_set_new(b, "config", json_string(gp->config));
    json_object_set_new(b, "threads", json_integer(gp->threads));
    json_object_set_new(b, "note", json_string(gp->note));
    fm_bf16_gemm_info bi;
    fm_bf16_gemm_info_get(&bi);
    json_t *bf = json_object();
    json_object_set_new(bf, "provider", json_string(bi.loaded ? "onednn" : "widen-f32"));
    json_object_set_new(bf, "amx_tiles", json_boolean(fm_cpu_use_amx())); /* gemm_amx.c takes the products it can */
    json_object_set_new(bf, "library", json_string(bi.library));
    json_object_set_new(bf, "version", json_string(bi.version));
    json_object_set_new(bf, "kernel", json_string(bi.kernel));
    json_object_set_new(bf, "used", json_boolean(bi.loaded && fm_cpu_use_avx512()));
    json_object_set_new(bf, "note", json_string(bi.note));
    json_object_set_new(bf, "dot_rate_vs_f32_fma", json_real(bi.dp_rate));
    json_object_set_new(bf, "attention", json_string(bf16_attention_note()));
    json_object_set_new(b, "bf16", bf);
    fm_f32_gemm_info fi;
    fm_f32_gemm_info_get(&fi);
    json_t *f32 = json_object();
    json_object_set_new(f32, "provider", json_string(fi.onednn ? "onednn" : "openblas"));
    json_object_set_new(f32, "kernel", json_string(fi.kernel));
    json_object_set_new(f32, "used", json_boolean(fi.onednn && fm_cpu_use_avx512()));
    json_object_set_new(f32, "note", json_string(fi.note));
    const char *own = fm_cpu_gemm_f32_avx512_note(); /* the products fathom's own kernel takes, or null */
    json_object_set_new(f32, "fathom_kernel", own ? json_string(own) : json_null());
    json_object_set_new(b, "f32", f32);
    return b;
}

/* The checked test device (--device check): the CPU's kernels on memory the host may
 * not touch; listed so a user knows the name exists and what it is for. */
static json_t *check_json(void) {
    const char *why = "";
    int n = fm_device_count(FM_DEV_CHECK, &why);
    json_t *c = json_object(), *devs = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(devs, json_sprintf("check:%d", i));
    json_object_set_new(c, "devices", devs);
    json_object_set_new(c, "note", json_string("the checked test device: CPU kernels on memory the host may not touch "
                                               "outside the backend's copies (docs/DEVICES.md)"));
    return c;
}

static void print_check(void) {
    const char *why = "";
    int n = fm_device_count(FM_DEV_CHECK, &why);
    printf("check: ");
    if (n <= 0) printf("none: %s\n", why);
    for (int i = 0; i < n; i++) printf("%scheck:%d", i ? ", " : "", i);
    if (n > 0)
        printf(" (the checked test device: CPU kernels on memory the host may not touch outside the\n"
               "       backend's copies; for tests of the device path, docs/DEVICES.md)\n");
}

/* The meta (shape-only) device: the planner's; named here so that `fathom info`
 * lists every device type this build has. */
#define META_NOTE "the shape-only device: shapes and dtypes, no data; `fathom plan --model RECIPE` runs the trainer " \
                  "on it (docs/DEVICES.md); train, eval, predict and generate refuse it"

static json_t *meta_json(void) {
    const char *why = "";
    int n = fm_device_count(FM_DEV_META, &why);
    json_t *c = json_object(), *devs = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(devs, json_sprintf("meta:%d", i));
    json_object_set_new(c, "devices", devs);
    json_object_set_new(c, "note", json_string(n > 0 ? META_NOTE : why));
    return c;
}

static void print_meta(void) {
    const char *why = "";
    int n = fm_device_count(FM_DEV_META, &why);
    printf("meta:  ");
    if (n <= 0) printf("none: %s\n", why);
    for (int i = 0; i < n; i++) printf("%smeta:%d", i ? ", " : "", i);
    if (n > 0)
        printf(" (the shape-only device: shapes and dtypes, no data; `fathom plan --model RECIPE`\n"
               "       runs the trainer on it, docs/DEVICES.md; train, eval, predict and generate refuse it)\n");
}

int fm_cmd_info(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: fathom info [--json]\n\nPrints the version, build options, the CPU model and features, the\n"
                   "instruction set each kernel family uses, the GEMM provider with its kernels and threads, and\n"
                   "the CUDA toolkit, driver and devices (or why none), the checked test devices and the meta\n"
                   "(shape-only) device.\n");
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
    fm_cpu_gemm_init(); /* the thread setting GEMMs run with */
    fm_gemm_provider_info gp;
    fm_gemm_provider_info_get(&gp);
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "version", json_string(bi.version));
        json_object_set_new(o, "build_type", json_string(bi.build_type));
        json_object_set_new(o, "sanitized", json_boolean(bi.sanitized));
        json_object_set_new(o, "cuda_built", json_boolean(bi.cuda_built));
        json_object_set_new(o, "mpi_built", json_boolean(fm_dist_mpi_built()));
        json_object_set_new(o, "cuda_switched_off", json_boolean(bi.cuda_switched_off));
        json_object_set_new(o, "cpu", cpu_json(f));
        json_object_set_new(o, "gemm", gemm_json(&gp));
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
        json_object_set_new(o, "check", check_json());
        json_object_set_new(o, "meta", meta_json());
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("fathom %s (%s build%s)\n", bi.version, bi.build_type, bi.sanitized ? ", sanitizers" : "");
        print_text(f, &gp);
        printf("mpi:   %s\n", fm_dist_mpi_built() ? "built in (mpirun -np N fathom train RECIPE: data parallel; docs/DISTRIBUTED.md)"
                                                 : "not built (no MPI at build time)");
        printf("cuda:  %s\n", bi.cuda_built ? "built in"
                              : bi.cuda_switched_off ? "not built (switched off at build time: -DFATHOM_CUDA=OFF)"
                                                     : "not built (no CUDA toolkit at build time)");
        if (ci.n_devices == 0) printf("       no usable device: %s\n", ci.reason);
        if (ci.runtime_version) printf("       runtime %d, driver %d\n", ci.runtime_version, ci.driver_version);
        for (int i = 0; i < ci.n_devices; i++)
            printf("       cuda:%d %s, %.1f GiB, sm_%d%d, %d SMs, bf16 %s\n", i, ci.devices[i].name,
                   (double)ci.devices[i].memory_bytes / (1 << 30), ci.devices[i].cc_major, ci.devices[i].cc_minor,
                   ci.devices[i].sm_count, ci.devices[i].bf16 ? "yes" : "no");
        print_check();
        print_meta();
    }
    fm_parallel_shutdown();
    return 0;
}
