/* f32 GEMM on AVX-512: fathom's own kernel, for the large products.
 *
 * Why not only oneDNN: on an Intel Xeon with AVX-512 (5 December 2026, family 6
 * model 167, 2 cores) every f32 provider fathom can load stayed behind PyTorch's
 * torch.mm (MKL) on the squares: oneDNN 2.6.3's brg:avx512_core at 0.89-0.98x,
 * OpenBLAS 0.3.21 (SkylakeX) with its own threads 0.90-0.92x, BLIS 0.58x
 * (docs/PERFORMANCE.md). The products are bound by how their operands reach the
 * FMA units, which this file arranges as the Goto/BLIS scheme does:
 *
 * - C is computed in blocks of MR x NR = 14 x 32 (28 zmm accumulators; per step of
 *   K two vectors of B and 14 broadcasts of A feed 28 FMAs).
 * - K is cut into blocks of at most KC; for each, a chunk of B (KC x NC, ~1 MiB)
 *   is packed into column panels of 32 that stay in L2 and stream from it, and A
 *   is packed 14 rows at a time, k-major, into a panel that stays in L1 while it
 *   meets every B panel of the chunk.
 * - The first K block writes C (beta * C + bias + the block's sum), the others add.
 *   C's rows are prefetched when a block starts.
 * - Threads split C by columns (each packs its own B and all of A) or, when C is
 *   too narrow for that, by rows (each packs all of B).
 *
 * Edges need no second kernel: packing pads A's rows and B's columns with zeros,
 * and the block's stores are masked to the rows and columns that exist. Every
 * transpose case packs into the same layout.
 *
 * Measured there (one core): the block alone runs at 205-218 GFLOP/s of the core's
 * 240 (a register-only FMA loop), with B in L1 or streaming from L2 alike; 28 x 16
 * blocks with the broadcasts folded into the FMAs ran 190-200. KC 384 / NC 768
 * ran 2048^3 3% faster than 512 / 512 on two threads; on one thread, paired with
 * oneDNN's f32 matmul in one process (bench/bench_gemm_pair.c), 1024^3-2048^3 ran
 * 1.06-1.14x oneDNN 2.6.3, but on two threads (one part each) 0.95-1.01x (its
 * blocks ran ~10% slower there, an effect of alternating with oneDNN's calls that
 * was not pinned down), and timed alone against torch.mm no better than oneDNN at
 * two threads (0.93-0.99x against 0.96-0.99x). So by default it runs only where the
 * product runs on one thread (gemm_cpu.c). Tried and not kept: packing
 * all of A's rows per K block once (instead of 14 rows per chunk; 2048^3 8-15%
 * slower on two threads: each thread's packed A no longer stays in its L2),
 * prefetching the next A panel's rows during the blocks (1024^3 6% slower) and
 * prefetching B ahead in the block (no change). */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/simd_avx512.h"
#include "core/parallel.h"

#define MR 14  /* rows of C per block */
#define NR 32  /* columns of C per block: two vectors */
#define KC 384 /* largest K block */
#define NC 768 /* largest column chunk of packed B (KC x NC floats = 1.1 MiB, in L2) */

/* the packed A panel and each part's buffer keep B's panels 64-byte aligned */
_Static_assert((KC * MR) % 16 == 0 && (KC * (NC + NR)) % 16 == 0, "packed panels must stay 64-byte aligned");

typedef struct own_ctx {
    const fm_cpu_gemm_args *g;
    const float *bias;
    bool by_cols;
    int parts;
    int64_t kblocks;
    float *buf; /* per part: packed A panel, then packed B chunk */
    size_t part_floats;
} own_ctx;

/* the first n lanes, any n */
static inline __mmask16 lanes(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : fm_tail16(n); }

/* Up to 16 rows of a row-major matrix (row r at src + r * ld, r < nrows; the rest
 * zero), k in [0, kc), transposed: dst[k * dst_ld + r], the lanes in `store` written. */
static void transpose_rows(const float *src, int64_t ld, int64_t nrows, int64_t kc, float *dst, int64_t dst_ld,
                           __mmask16 store) {
    for (int64_t k = 0; k < kc; k += 16) {
        __mmask16 km = lanes(kc - k);
        __m512i r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < nrows ? _mm512_castps_si512(_mm512_maskz_loadu_ps(km, src + i * ld + k)) : _mm512_setzero_si512();
        fm_transpose16_epi32(r);
        int64_t kn = kc - k < 16 ? kc - k : 16;
        for (int64_t t = 0; t < kn; t++) _mm512_mask_storeu_ps(dst + (k + t) * dst_ld, store, _mm512_castsi512_ps(r[t]));
    }
}

/* A's rows i0..i0+mr-1, K range [p0, p0+kc): ap[k * MR + i], rows past mr zero. */
static void pack_a(const fm_cpu_gemm_args *g, int64_t i0, int64_t mr, int64_t p0, int64_t kc, float *ap) {
    const float *A = g->A;
    if (g->ta) { /* A stored [K, M]: row k of the panel is contiguous */
        __mmask16 im = lanes(mr);
        for (int64_t k = 0; k < kc; k++)
            _mm512_mask_storeu_ps(ap + k * MR, 0x3FFF, _mm512_maskz_loadu_ps(im, A + (p0 + k) * g->lda + i0));
        return;
    }
    transpose_rows(A + i0 * g->lda + p0, g->lda, mr, kc, ap, MR, 0x3FFF); /* stored [M, K] */
}

/* B's columns [j0, j0+nc) and K range [p0, p0+kc) as panels of NR columns:
 * bp[(panel * kc + k) * NR + c], columns past nc zero. */
static void pack_b(const fm_cpu_gemm_args *g, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float *bp) {
    const float *B = g->B;
    for (int64_t jp = 0; jp * NR < nc; jp++) {
        float *dst = bp + jp * kc * NR;
        int64_t jb = j0 + jp * NR, jn = nc - jp * NR;
        if (!g->tb) { /* B stored [K, N]: a panel row is 32 contiguous floats */
            __mmask16 m0 = lanes(jn), m1 = lanes(jn - 16);
            for (int64_t k = 0; k < kc; k++) {
                const float *s = B + (p0 + k) * g->ldb + jb;
                _mm512_store_ps(dst + k * NR, _mm512_maskz_loadu_ps(m0, s));
                _mm512_store_ps(dst + k * NR + 16, _mm512_maskz_loadu_ps(m1, s + 16));
            }
            continue;
        }
        for (int h = 0; h < 2; h++) /* B stored [N, K]: each half of the panel's columns transposed */
            transpose_rows(B + (jb + 16 * h) * g->ldb + p0, g->ldb, jn - 16 * h, kc, dst + 16 * h, NR, 0xFFFF);
    }
}

typedef struct block_out {
    float *c; /* C at the block's first row and column */
    int64_t ldc, mr;
    __mmask16 m0, m1; /* the block's columns that exist */
    bool first;       /* first K block: C = beta * C + bias + sum; else C += sum */
    float beta;
    const float *bias; /* at the block's first column, or NULL */
} block_out;

/* One R x 32 block of C (R <= MR) over a K block: ap [kc][MR] (its first R rows), bp [kc][NR].
 * Inlined with R constant: block() for whole panels, smaller R for the last rows. */
static inline __attribute__((always_inline)) void block_rows(int64_t kc, const float *restrict ap, const float *restrict bp,
                                                              const block_out *o, const int R) {
    __m512 acc[MR][2];
    for (int i = 0; i < R; i++) {
        _mm_prefetch((const char *)(o->c + i * o->ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(o->c + i * o->ldc + 16), _MM_HINT_T0);
    }
#pragma GCC unroll 14
    for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(bp + k * NR), b1 = _mm512_load_ps(bp + k * NR + 16);
        const float *a = ap + k * MR;
#pragma GCC unroll 14
        for (int i = 0; i < R; i++) {
            __m512 av = _mm512_set1_ps(a[i]);
            acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
        }
    }
    const float *bias = o->first ? o->bias : NULL;
    __m512 bias0 = bias ? _mm512_maskz_loadu_ps(o->m0, bias) : _mm512_setzero_ps();
    __m512 bias1 = bias ? _mm512_maskz_loadu_ps(o->m1, bias + 16) : _mm512_setzero_ps();
    __m512 beta = _mm512_set1_ps(o->first ? o->beta : 1.0f);
    bool load = !o->first || o->beta != 0.0f;
    for (int i = 0; i < R; i++) {
        if (i >= o->mr) break;
        float *c = o->c + i * o->ldc;
        __m512 v0 = _mm512_add_ps(acc[i][0], bias0), v1 = _mm512_add_ps(acc[i][1], bias1);
        if (load) {
            v0 = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(o->m0, c), v0);
            v1 = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(o->m1, c + 16), v1);
        }
        _mm512_mask_storeu_ps(c, o->m0, v0);
        _mm512_mask_storeu_ps(c + 16, o->m1, v1);
    }
}

static void block(int64_t kc, const float *ap, const float *bp, const block_out *o) { block_rows(kc, ap, bp, o, MR); }
static void block8(int64_t kc, const float *ap, const float *bp, const block_out *o) { block_rows(kc, ap, bp, o, 8); }
static void block4(int64_t kc, const float *ap, const float *bp, const block_out *o) { block_rows(kc, ap, bp, o, 4); }
static void block2(int64_t kc, const float *ap, const float *bp, const block_out *o) { block_rows(kc, ap, bp, o, 2); }

/* C[i0:i1, j0:j1] over all of K. */
static void own_range(const own_ctx *x, int64_t i0, int64_t i1, int64_t j0, int64_t j1, float *ap, float *bp) {
    const fm_cpu_gemm_args *g = x->g;
    int64_t npan = (j1 - j0 + NR - 1) / NR, nchunks = (npan * NR + NC - 1) / NC;
    int64_t chunk = (npan + nchunks - 1) / nchunks * NR; /* balanced chunks of whole panels */
    for (int64_t jc = j0; jc < j1; jc += chunk) {
        int64_t nc = j1 - jc < chunk ? j1 - jc : chunk;
        for (int64_t kb = 0; kb < x->kblocks; kb++) {
            int64_t p0 = g->K * kb / x->kblocks, kc = g->K * (kb + 1) / x->kblocks - p0;
            pack_b(g, jc, nc, p0, kc, bp);
            for (int64_t ir = i0; ir < i1; ir += MR) {
                int64_t mr = i1 - ir < MR ? i1 - ir : MR;
                pack_a(g, ir, mr, p0, kc, ap);
                /* the last rows (M not a multiple of 14): the smallest block that covers them */
                void (*run)(int64_t, const float *, const float *, const block_out *) =
                    mr > 8 ? block : mr > 4 ? block8 : mr > 2 ? block4 : block2;
                for (int64_t jp = 0; jp * NR < nc; jp++) {
                    int64_t j = jc + jp * NR;
                    block_out o = {(float *)g->C + ir * g->ldc + j, g->ldc, mr, lanes(nc - jp * NR), lanes(nc - jp * NR - 16),
                                   kb == 0, (float)g->beta, x->bias ? x->bias + j : NULL};
                    run(kc, ap, bp + jp * kc * NR, &o);
                }
            }
        }
    }
}

static void own_task(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const own_ctx *x = vctx;
    const fm_cpu_gemm_args *g = x->g;
    for (int64_t p = b; p < e; p++) {
        float *ap = x->buf + (size_t)p * x->part_floats, *bp = ap + (size_t)KC * MR;
        if (x->by_cols) {
            int64_t npan = (g->N + NR - 1) / NR;
            int64_t j0 = npan * p / x->parts * NR, j1 = npan * (p + 1) / x->parts * NR;
            own_range(x, 0, g->M, j0, j1 < g->N ? j1 : g->N, ap, bp);
        } else {
            int64_t nrb = (g->M + MR - 1) / MR;
            int64_t i0 = nrb * p / x->parts * MR, i1 = nrb * (p + 1) / x->parts * MR;
            own_range(x, i0, i1 < g->M ? i1 : g->M, 0, g->N, ap, bp);
        }
    }
}

bool fm_cpu_gemm_f32_avx512(const fm_cpu_gemm_args *g, const float *bias) {
    if (g->dt != FM_F32 || g->M < 1 || g->N < 1 || g->K < 1) return false;
    int nt = fm_num_threads();
    int64_t npan = (g->N + NR - 1) / NR, nrb = (g->M + MR - 1) / MR;
    own_ctx x = {g, bias, false, 1, (g->K + KC - 1) / KC, NULL, 0};
    if (nt > 1) {
        /* columns when every thread gets a few panels; else rows */
        x.by_cols = npan >= 4 * nt || npan >= nrb;
        int64_t units = x.by_cols ? npan : nrb;
        x.parts = (int)(units < nt ? units : nt);
    }
    x.part_floats = (size_t)KC * MR + (size_t)KC * (NC + NR);
    x.buf = aligned_alloc(64, (size_t)x.parts * x.part_floats * sizeof(float));
    if (!x.buf) return false;
    if (x.parts > 1) fm_parallel_for(x.parts, 1, own_task, &x);
    else own_task(&x, 0, 1, 0);
    free(x.buf);
    return true;
}
