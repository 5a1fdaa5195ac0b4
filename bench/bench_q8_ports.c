/* Which AVX2 instructions of the int8 kernels compete for the same execution
 * pipes (docs/QUANTIZE.md, "Why the int8 prefill is not 2x"). Each test runs
 * ten independent dependency chains (enough to hide every latency here), so its
 * time per instruction is the reciprocal throughput; a test of two instructions
 * alternates them. If A and B each run at t ns and the A+B mix also at t, they
 * share pipes; if the mix runs at about t / 2, they use different ones.
 *   build/bench_q8_ports [ROUNDS]
 * One JSON line per test: ns per instruction, median and best of ROUNDS, in
 * process CPU time (one thread). Needs AVX2 and FMA (says so and exits 0 without). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_util.h"

#define ITERS 20000000L /* x 10 instructions per test round */

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Ten chains; I0 on the even ones, I1 on the odd ones. "x" operands: ymm registers. */
#define CHAINS(I0, I1)                                                                                             \
    __asm__ volatile(I0 : "+x"(r0) : "x"(k)); __asm__ volatile(I1 : "+x"(r1) : "x"(k));                          \
    __asm__ volatile(I0 : "+x"(r2) : "x"(k)); __asm__ volatile(I1 : "+x"(r3) : "x"(k));                          \
    __asm__ volatile(I0 : "+x"(r4) : "x"(k)); __asm__ volatile(I1 : "+x"(r5) : "x"(k));                          \
    __asm__ volatile(I0 : "+x"(r6) : "x"(k)); __asm__ volatile(I1 : "+x"(r7) : "x"(k));                          \
    __asm__ volatile(I0 : "+x"(r8) : "x"(k)); __asm__ volatile(I1 : "+x"(r9) : "x"(k));

#define TEST(name, I0, I1)                                                                                         \
    __attribute__((target("avx2,fma"), noinline)) static void name(void) {                                       \
        typedef long long v4 __attribute__((vector_size(32)));                                                   \
        v4 r0 = {1, 1, 1, 1}, r1 = r0, r2 = r0, r3 = r0, r4 = r0, r5 = r0, r6 = r0, r7 = r0, r8 = r0, r9 = r0;   \
        v4 k = {0x0101010101010101LL, 0x0101010101010101LL, 0x0101010101010101LL, 0x0101010101010101LL};         \
        for (long i = 0; i < ITERS; i++) { CHAINS(I0, I1) }                                                       \
        __asm__ volatile("" ::"x"(r0), "x"(r1), "x"(r2), "x"(r3), "x"(r4), "x"(r5), "x"(r6), "x"(r7), "x"(r8),    \
                         "x"(r9));                                                                               \
    }

TEST(t_fma, "vfmadd231ps %1, %1, %0", "vfmadd231ps %1, %1, %0")
TEST(t_maddubsw, "vpmaddubsw %1, %0, %0", "vpmaddubsw %1, %0, %0")
TEST(t_maddwd, "vpmaddwd %1, %0, %0", "vpmaddwd %1, %0, %0")
TEST(t_signb, "vpsignb %1, %0, %0", "vpsignb %1, %0, %0")
TEST(t_absb, "vpabsb %0, %0", "vpabsb %0, %0")
TEST(t_addd, "vpaddd %1, %0, %0", "vpaddd %1, %0, %0")
TEST(t_maddubsw_maddwd, "vpmaddubsw %1, %0, %0", "vpmaddwd %1, %0, %0")
TEST(t_maddubsw_signb, "vpmaddubsw %1, %0, %0", "vpsignb %1, %0, %0")
TEST(t_maddubsw_absb, "vpmaddubsw %1, %0, %0", "vpabsb %0, %0")
TEST(t_maddubsw_addd, "vpmaddubsw %1, %0, %0", "vpaddd %1, %0, %0")
TEST(t_maddubsw_fma, "vpmaddubsw %1, %0, %0", "vfmadd231ps %1, %1, %0")

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    if (rounds < 1 || rounds > 64) rounds = 5;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("{\"skipped\": \"this CPU lacks AVX2 or FMA\"}\n");
        return 0;
    }
    static const struct { const char *name; void (*fn)(void); } tests[] = {
        {"vfmadd231ps", t_fma}, {"vpmaddubsw", t_maddubsw}, {"vpmaddwd", t_maddwd}, {"vpsignb", t_signb},
        {"vpabsb", t_absb}, {"vpaddd", t_addd}, {"vpmaddubsw+vpmaddwd", t_maddubsw_maddwd},
        {"vpmaddubsw+vpsignb", t_maddubsw_signb}, {"vpmaddubsw+vpabsb", t_maddubsw_absb},
        {"vpmaddubsw+vpaddd", t_maddubsw_addd}, {"vpmaddubsw+vfmadd231ps", t_maddubsw_fma}};
    const int n = (int)(sizeof tests / sizeof tests[0]);
    double t[64];
    for (int i = 0; i < n; i++) {
        for (int r = 0; r < rounds; r++) {
            double t0 = cpu_s();
            tests[i].fn();
            t[r] = (cpu_s() - t0) / (10.0 * (double)ITERS) * 1e9;
        }
        double best = t[0];
        for (int r = 1; r < rounds; r++) best = t[r] < best ? t[r] : best;
        printf("{\"test\": \"%s\", \"ns_per_instruction\": %.4f, \"best_ns\": %.4f, \"rounds\": %d}\n", tests[i].name,
               bench_median(t, rounds), best, rounds);
        fflush(stdout);
    }
    return 0;
}
