/* Multiply-add rates of the CPU's 512-bit dot-product and FMA instructions, one
 * core: vfmadd231ps (16 f32 multiply-adds), vdpbf16ps (32 bf16 products into 16
 * f32 lanes), vfmadd231ph (32 fp16) and vpdpbusd (64 u8 x s8 into 16 i32), each
 * as 24 independent accumulators (more than any of their latencies needs), so
 * the loop measures issue throughput. Whether bf16 can beat f32 on a CPU without
 * AMX comes down to the second row against the first (docs/PERFORMANCE.md).
 *
 *   build/bench_dot_rates [rounds]        (x86-64 with AVX-512 F/BF16/FP16/VNNI)
 *
 * Prints one JSON line per instruction: the fastest round's ns per instruction
 * and multiply-adds per ns; an instruction the CPU lacks is reported as such. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "core/cpu_features.h"

#define ITERS 200000 /* of 24 instructions */

#define FM_RATE_RUN(ins)                                                                                           \
    __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n\t"                                                          \
                     "vpxord %%zmm1, %%zmm1, %%zmm1\n\tvpxord %%zmm2, %%zmm2, %%zmm2\n\t"                          \
                     "vpxord %%zmm3, %%zmm3, %%zmm3\n\tvpxord %%zmm4, %%zmm4, %%zmm4\n\t"                          \
                     "vpxord %%zmm5, %%zmm5, %%zmm5\n\tvpxord %%zmm6, %%zmm6, %%zmm6\n\t"                          \
                     "vpxord %%zmm7, %%zmm7, %%zmm7\n\tvpxord %%zmm8, %%zmm8, %%zmm8\n\t"                          \
                     "vpxord %%zmm9, %%zmm9, %%zmm9\n\tvpxord %%zmm10, %%zmm10, %%zmm10\n\t"                       \
                     "vpxord %%zmm11, %%zmm11, %%zmm11\n\tvpxord %%zmm12, %%zmm12, %%zmm12\n\t"                    \
                     "vpxord %%zmm13, %%zmm13, %%zmm13\n\t"                                                       \
                     "mov %0, %%ecx\n"                                                                            \
                     "1:\n\t" ins " %%zmm12, %%zmm13, %%zmm0\n\t" ins " %%zmm12, %%zmm13, %%zmm1\n\t"             \
                     ins " %%zmm12, %%zmm13, %%zmm2\n\t" ins " %%zmm12, %%zmm13, %%zmm3\n\t"                      \
                     ins " %%zmm12, %%zmm13, %%zmm4\n\t" ins " %%zmm12, %%zmm13, %%zmm5\n\t"                      \
                     ins " %%zmm12, %%zmm13, %%zmm6\n\t" ins " %%zmm12, %%zmm13, %%zmm7\n\t"                      \
                     ins " %%zmm12, %%zmm13, %%zmm8\n\t" ins " %%zmm12, %%zmm13, %%zmm9\n\t"                      \
                     ins " %%zmm12, %%zmm13, %%zmm10\n\t" ins " %%zmm12, %%zmm13, %%zmm11\n\t"                    \
                     ins " %%zmm12, %%zmm13, %%zmm0\n\t" ins " %%zmm12, %%zmm13, %%zmm1\n\t"                      \
                     ins " %%zmm12, %%zmm13, %%zmm2\n\t" ins " %%zmm12, %%zmm13, %%zmm3\n\t"                      \
                     ins " %%zmm12, %%zmm13, %%zmm4\n\t" ins " %%zmm12, %%zmm13, %%zmm5\n\t"                      \
                     ins " %%zmm12, %%zmm13, %%zmm6\n\t" ins " %%zmm12, %%zmm13, %%zmm7\n\t"                      \
                     ins " %%zmm12, %%zmm13, %%zmm8\n\t" ins " %%zmm12, %%zmm13, %%zmm9\n\t"                      \
                     ins " %%zmm12, %%zmm13, %%zmm10\n\t" ins " %%zmm12, %%zmm13, %%zmm11\n\t"                    \
                     "dec %%ecx\n\tjnz 1b\n\tvzeroupper"                                                          \
                     :                                                                                            \
                     : "r"(ITERS)                                                                                 \
                     : "ecx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",     \
                       "xmm10", "xmm11", "xmm12", "xmm13", "cc")

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    if (rounds < 1 || rounds > 1000) {
        fprintf(stderr, "usage: %s [rounds 1-1000]\n", argv[0]);
        return 2;
    }
    const fm_cpu_features *f = fm_cpu_get_features();
    if (!f->avx512f) {
        fprintf(stderr, "bench_dot_rates: this CPU has no AVX-512 (%s)\n", f->model);
        return 77;
    }
    enum { FMA_PS, DPBF16, FMA_PH, DPBUSD, NI };
    static const char *name[NI] = {"vfmadd231ps", "vdpbf16ps", "vfmadd231ph", "vpdpbusd"};
    static const int macs[NI] = {16, 32, 32, 64};
    const bool have[NI] = {true, f->avx512_bf16, f->avx512_fp16, f->avx512_vnni};
    double best[NI];
    for (int i = 0; i < NI; i++) best[i] = 1e30;
    for (int r = 0; r <= rounds; r++) /* round 0 warms the vector units up and is not kept */
        for (int i = 0; i < NI; i++) {
            if (!have[i]) continue;
            double t0 = bench_now_s();
            switch (i) {
            case FMA_PS: FM_RATE_RUN("vfmadd231ps"); break;
            case DPBF16: FM_RATE_RUN("vdpbf16ps"); break;
            case FMA_PH: FM_RATE_RUN("vfmadd231ph"); break;
            default: FM_RATE_RUN("vpdpbusd"); break;
            }
            double dt = bench_now_s() - t0;
            if (r && dt < best[i]) best[i] = dt;
        }
    const double n = 24.0 * ITERS;
    for (int i = 0; i < NI; i++) {
        if (!have[i]) {
            printf("{\"bench\":\"dot_rate\",\"instruction\":\"%s\",\"available\":false}\n", name[i]);
            continue;
        }
        double ns = best[i] / n * 1e9;
        printf("{\"bench\":\"dot_rate\",\"instruction\":\"%s\",\"ns_per_instruction\":%.3f,\"macs_per_ns\":%.1f,"
               "\"vs_f32_fma\":%.2f,\"cpu\":\"%s\"}\n",
               name[i], ns, macs[i] / ns, (macs[i] / ns) / (16.0 / (best[FMA_PS] / n * 1e9)), f->model);
    }
    return 0;
}
