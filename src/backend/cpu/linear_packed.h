/* The packed f32 linear of linear_fused (linear_fused_cpu.c): y = act(x w^T + b)
 * with the weight w [N, K] packed once (a graph does it at load) into panels of
 * 16 output columns, each [K][16] (w[j][k] at panel j / 16, offset k * 16 + j % 16;
 * zeros past N), so the AVX2 micro-kernel reads one 64-byte line of weights per
 * step of k and never repacks them, as OpenBLAS does on every call.
 *
 * The tile is MR rows (1-6) x one panel: 2 vectors of 8 columns, 2*MR
 * accumulators (12 for 6 rows, and 2 weight vectors and 1 broadcast: 15 of the 16
 * registers; measured on Zen 3 at about 80 GFLOP/s on one core). K runs in blocks of FM_LINEAR_KC (a block of a panel is 16 KB and
 * stays in L1 while every row block of the call's rows passes over it); the
 * partial sums go through y between blocks, and the last block adds the bias and
 * applies the ReLU on the accumulators before the one store. Rows are taken in
 * blocks of FM_LINEAR_MC (their K block, 120 KB at most, stays in L2 across the
 * panels). A block of 1-2 rows runs 4 (one row) or 2 panels per tile instead, so
 * that 8 accumulators hide the FMA latency, and one row takes all of K at once
 * (each weight is read once: the panels are long streams). Each output is one sum
 * over k in order, in one accumulator lane, whatever M, the tile's shape or the
 * thread split, so a row's result does not depend on the batch it is in. */
#ifndef FATHOM_LINEAR_PACKED_H
#define FATHOM_LINEAR_PACKED_H
#include <stdint.h>

#define FM_LINEAR_NR 16  /* output columns per panel */
#define FM_LINEAR_MR 6   /* rows per tile */
#define FM_LINEAR_KC 256 /* k per block */
#define FM_LINEAR_MC 120 /* rows per block (a multiple of FM_LINEAR_MR) */

static inline int64_t fm_linear_panels(int64_t N) { return (N + FM_LINEAR_NR - 1) / FM_LINEAR_NR; }
/* floats of the packed form of an [N, K] weight */
static inline int64_t fm_linear_packed_numel(int64_t N, int64_t K) { return fm_linear_panels(N) * FM_LINEAR_NR * K; }

/* w [N, K] row-major -> wp (fm_linear_packed_numel floats) */
static inline void fm_linear_pack_f32(const float *w, float *wp, int64_t N, int64_t K) {
    for (int64_t p = 0; p < fm_linear_panels(N); p++) {
        float *dst = wp + p * FM_LINEAR_NR * K;
        for (int64_t j = 0; j < FM_LINEAR_NR; j++) {
            const int64_t n = p * FM_LINEAR_NR + j;
            for (int64_t k = 0; k < K; k++) dst[k * FM_LINEAR_NR + j] = n < N ? w[n * K + k] : 0.0f;
        }
    }
}

typedef struct fm_linear_packed {
    const float *x;    /* [M, K], rows ldx apart */
    const float *wp;   /* fm_linear_pack_f32's form */
    const float *bias; /* [N] or NULL */
    float *y;          /* [M, N], rows ldy apart */
    int64_t M, N, K, ldx, ldy;
    int relu;
} fm_linear_packed;

/* y[i0:i1, the columns of panels p0:p1] of d */
void fm_linear_packed_f32_avx2(const fm_linear_packed *d, int64_t i0, int64_t i1, int64_t p0, int64_t p1);
/* the same on AVX-512 (linear_packed_avx512.c), bitwise the AVX2 result; call only when fm_cpu_use_avx512() */
void fm_linear_packed_f32_avx512(const fm_linear_packed *d, int64_t i0, int64_t i1, int64_t p0, int64_t p1);
#endif
