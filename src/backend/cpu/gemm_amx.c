/* bf16 GEMM on AMX tiles, with f32 accumulation: fathom's own kernel.
 *
 * Why not oneDNN here: Debian's oneDNN 2.6.3 does run AMX (brg:avx512_core_amx_bf16),
 * but on one core of an Intel Xeon with AMX (2 December 2026, family 6 model 167) it
 * reached 734-973 GFLOP/s on 1024^3-2048^3 where PyTorch 2.15's torch.mm in bf16
 * (oneDNN 3.x inside) reached 1400-1650 in the same shell, and its 2048^3 product at
 * 2 threads ran at 0.55x torch.mm. The tile unit itself does 3.8 TFLOP/s per core
 * here when its operands come from L1, so the difference is the data movement
 * around it, which this file arranges for the products fathom makes.
 *
 * The tile product C[16x16 f32] += A[16x32 bf16] B[32x16 bf16] wants A's rows
 * K-contiguous and B in pairs of K ("VNNI": each 32-bit element holds B[k][n] and
 * B[k+1][n]). Both operands are packed into those tiles first (any of the four
 * transpose cases, zero-padded to whole tiles, so edges need no special kernel):
 * B per column chunk (<= 1 MiB, so that it stays in L2) by each thread that uses
 * the chunk; A per 64-row group, except where A is stored [M,K] with K a multiple
 * of 32: its rows are tile rows already and load in place, lda apart (2048^3 on
 * one thread: 1.10-1.13 TFLOP/s packed, 1.29-1.33 in place). The micro-kernel
 * keeps a 32x32 block of C in four tiles over the whole of K, with two A and two
 * B tiles per 32-step of K: C is written once, the operands stream from L2.
 * Chunks of 256 KiB, 512 KiB and 1.5 MiB ran 2048^3 at 0.96-0.98, 1.19-1.20 and
 * 1.14-1.18 TFLOP/s on one thread against 1.31 at 1 MiB.
 *
 * Entered only when the CPU has AMX-BF16, Linux granted the tile data (cpu_features.c)
 * and the kernel level in use is amx (FATHOM_ISA=avx512 or lower keeps oneDNN). */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/simd_avx512.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

#define TK 32   /* K per tile step (bf16 elements in a 64-byte tile row) */
#define BLK 32  /* rows and columns of C per micro-kernel block (2 x 2 tiles) */
#define MGRP 64 /* rows of A packed at once by a task */
#define TILE_ELEMS 512 /* bf16 elements in one 16 x 32 tile */

/* Up to 32 bf16 of a row (n valid, the rest zero). */
static inline __m512i load32(const uint16_t *p, int64_t n) {
    if (n >= 32) return _mm512_loadu_si512(p);
    if (n <= 0) return _mm512_setzero_si512();
    return _mm512_maskz_loadu_epi16((__mmask32)((1ull << n) - 1), p);
}

/* Rows k and k+1 (32 elements each) interleaved into pairs: lo holds elements
 * 0..15 as (x[n], y[n]) 32-bit pairs, hi elements 16..31. */
static inline void pairs(__m512i x, __m512i y, __m512i *lo, __m512i *hi) {
    const __m512i ilo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37,
                                         5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i ihi = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54, 22,
                                         53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    *lo = _mm512_permutex2var_epi16(x, ilo, y);
    *hi = _mm512_permutex2var_epi16(x, ihi, y);
}

/* One K-major operand (element (k, j) at p[k * ld + j], kn rows and jn columns
 * valid from (k0, j0)) as two 32-step tiles in pair layout: dst[t][r][2c+e] =
 * element (k0 + 2r + e, j0 + 16t + c). This is B's layout as stored ([K,N]) and
 * A's when transposed ([K,M]); A's tiles are then transposed on top (kmaj_a). */
static void kmaj_pairs(const uint16_t *p, int64_t ld, int64_t kn, int64_t jn, __m512i lo[16], __m512i hi[16]) {
    for (int r = 0; r < 16; r++) {
        __m512i x = 2 * r < kn ? load32(p + 2 * r * ld, jn) : _mm512_setzero_si512();
        __m512i y = 2 * r + 1 < kn ? load32(p + (2 * r + 1) * ld, jn) : _mm512_setzero_si512();
        pairs(x, y, &lo[r], &hi[r]);
    }
}

/* One N-major operand (element (k, j) at p[j * ld + k]: B stored [N,K], or A as
 * stored [M,K]) for 16 values of j: row c of the result holds element (k0.., j0 + c)
 * for 32 k, i.e. 16 pairs of k. */
static void nmaj_rows(const uint16_t *p, int64_t ld, int64_t kn, int64_t jn, __m512i rows[16]) {
    for (int c = 0; c < 16; c++) rows[c] = c < jn ? load32(p + c * ld, kn) : _mm512_setzero_si512();
}

/* B's 32-column panels jb in [p0, p1): panel jb, step kb at bp + ((jb - p0) * nkb + kb) * 2 tiles. */
static void pack_b(const fm_cpu_gemm_args *g, int64_t p0, int64_t p1, int64_t nkb, uint16_t *bp) {
    const uint16_t *B = g->B;
    for (int64_t jb = p0; jb < p1; jb++)
        for (int64_t kb = 0; kb < nkb; kb++) {
            __m512i *dst = (__m512i *)(bp + ((jb - p0) * nkb + kb) * 2 * TILE_ELEMS);
            int64_t j0 = jb * BLK, k0 = kb * TK, jn = g->N - j0, kn = g->K - k0;
            if (!g->tb) { /* stored [K,N]: interleave row pairs */
                __m512i lo[16], hi[16];
                kmaj_pairs(B + k0 * g->ldb + j0, g->ldb, kn, jn, lo, hi);
                for (int r = 0; r < 16; r++) {
                    _mm512_store_si512(dst + r, lo[r]);
                    _mm512_store_si512(dst + 16 + r, hi[r]);
                }
            } else { /* stored [N,K]: each column's 32 k are contiguous; transpose 32-bit pairs */
                for (int t = 0; t < 2; t++) {
                    __m512i rows[16];
                    nmaj_rows(B + (j0 + 16 * t) * g->ldb + k0, g->ldb, kn, jn - 16 * t, rows);
                    fm_transpose16_epi32(rows);
                    for (int r = 0; r < 16; r++) _mm512_store_si512(dst + 16 * t + r, rows[r]);
                }
            }
        }
}

/* A's rows [i0, i0 + 64) as 32-row blocks: block q, step kb at ap + (q * nkb + kb) * 2 tiles,
 * tile t holding rows 16t..16t+15 of the block, 32 k each. */
static void pack_a(const fm_cpu_gemm_args *g, int64_t i0, int64_t nkb, uint16_t *ap) {
    const uint16_t *A = g->A;
    for (int q = 0; q < MGRP / BLK; q++) {
        int64_t ib = i0 + q * BLK;
        for (int64_t kb = 0; kb < nkb; kb++) {
            __m512i *dst = (__m512i *)(ap + (q * nkb + kb) * 2 * TILE_ELEMS);
            int64_t k0 = kb * TK, kn = g->K - k0, in = g->M - ib;
            if (in <= 0) break; /* a block past M: never multiplied */
            if (!g->ta) { /* stored [M,K]: rows are K-contiguous already */
                for (int r = 0; r < 32; r++)
                    _mm512_store_si512(dst + r, r < in ? load32(A + (ib + r) * g->lda + k0, kn) : _mm512_setzero_si512());
            } else { /* stored [K,M]: pairs of k, then a 32-bit transpose per 16 rows */
                __m512i lo[16], hi[16];
                kmaj_pairs(A + k0 * g->lda + ib, g->lda, kn, in, lo, hi);
                fm_transpose16_epi32(lo);
                fm_transpose16_epi32(hi);
                for (int r = 0; r < 16; r++) {
                    _mm512_store_si512(dst + r, lo[r]);
                    _mm512_store_si512(dst + 16 + r, hi[r]);
                }
            }
        }
    }
}

typedef struct amx_ctx {
    const fm_cpu_gemm_args *g;
    const float *bias_pad; /* Np floats (bias, zero-padded) or NULL */
    bool c_bf16;
    int64_t nkb, nmg, chunk_panels, npanels;
    size_t ap_bytes, bp_bytes; /* 64 rows of packed A, one chunk of packed B: each task call packs into its own */
    _Atomic int failed;
} amx_ctx;

/* The 32x32 block of C at (i, j): tiles to a local buffer unless the block is whole
 * and f32, then bias already added by the tiles' start, written as f32 or bf16. */
static void store_block(const amx_ctx *c, int64_t i, int64_t j) {
    const fm_cpu_gemm_args *g = c->g;
    int64_t in = g->M - i < BLK ? g->M - i : BLK, jn = g->N - j < BLK ? g->N - j : BLK;
    if (!c->c_bf16 && in == BLK && jn == BLK) {
        float *C = (float *)g->C + i * g->ldc + j;
        size_t ld = (size_t)g->ldc * sizeof(float);
        _tile_stored(0, C, ld);
        _tile_stored(1, C + 16, ld);
        _tile_stored(2, C + 16 * g->ldc, ld);
        _tile_stored(3, C + 16 * g->ldc + 16, ld);
        return;
    }
    float buf[BLK * BLK] __attribute__((aligned(64)));
    _tile_stored(0, buf, BLK * sizeof(float));
    _tile_stored(1, buf + 16, BLK * sizeof(float));
    _tile_stored(2, buf + 16 * BLK, BLK * sizeof(float));
    _tile_stored(3, buf + 16 * BLK + 16, BLK * sizeof(float));
    for (int64_t r = 0; r < in; r++)
        for (int h = 0; h < 2; h++) {
            int64_t n = jn - 16 * h;
            if (n <= 0) break;
            __mmask16 m = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
            __m512 v = _mm512_load_ps(buf + r * BLK + 16 * h);
            if (c->c_bf16)
                _mm256_mask_storeu_epi16((uint16_t *)g->C + (i + r) * g->ldc + j + 16 * h, m, (__m256i)_mm512_cvtneps_pbh(v));
            else
                _mm512_mask_storeu_ps((float *)g->C + (i + r) * g->ldc + j + 16 * h, m, v);
        }
}

/* Task u: 64-row group u % nmg of A, column chunk u / nmg of B. Consecutive tasks
 * on a thread share the chunk, which stays in L2; each thread packs the chunks and
 * row groups it uses itself (a chunk two threads share is packed twice: K x 32
 * columns per panel against the 64 x 32 x K products per row group it serves, and
 * no second pass over the pool, which at K = 128 cost more than the packing). */
static void amx_task(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    amx_ctx *c = vctx;
    uint16_t *ap = aligned_alloc(64, c->ap_bytes), *bp = aligned_alloc(64, c->bp_bytes);
    if (!ap || !bp) {
        c->failed = 1;
        free(ap);
        free(bp);
        return;
    }
    int64_t nkb = c->nkb, packed_group = -1, packed_chunk = -1;
    fm_amx_tiles_on();
    for (int64_t u = b; u < e; u++) {
        int64_t grp = u % c->nmg, chunk = u / c->nmg;
        int64_t p0 = chunk * c->chunk_panels, p1 = p0 + c->chunk_panels < c->npanels ? p0 + c->chunk_panels : c->npanels;
        /* A stored [M,K] with whole 32-k steps and a whole group: its rows are
         * tile rows already, loaded in place (lda apart) instead of packed */
        bool direct = !c->g->ta && c->g->K % TK == 0 && (grp + 1) * MGRP <= c->g->M;
        if (!direct && grp != packed_group) {
            pack_a(c->g, grp * MGRP, nkb, ap);
            packed_group = grp;
        }
        if (chunk != packed_chunk) {
            pack_b(c->g, p0, p1, nkb, bp);
            packed_chunk = chunk;
        }
        for (int q = 0; q < MGRP / BLK; q++) {
            int64_t i = grp * MGRP + q * BLK;
            if (i >= c->g->M) break;
            const uint16_t *a = direct ? (const uint16_t *)c->g->A + i * c->g->lda : ap + q * nkb * 2 * TILE_ELEMS;
            int64_t a_step = direct ? TK : 2 * TILE_ELEMS, a_next = direct ? 16 * c->g->lda : TILE_ELEMS;
            size_t a_stride = direct ? (size_t)c->g->lda * sizeof(uint16_t) : 64;
            for (int64_t jb = p0; jb < p1; jb++) {
                const uint16_t *bb = bp + (jb - p0) * nkb * 2 * TILE_ELEMS;
                if (c->bias_pad) { /* every row of C starts from the bias: a stride-0 tile load */
                    _tile_loadd(0, c->bias_pad + jb * BLK, 0);
                    _tile_loadd(1, c->bias_pad + jb * BLK + 16, 0);
                    _tile_loadd(2, c->bias_pad + jb * BLK, 0);
                    _tile_loadd(3, c->bias_pad + jb * BLK + 16, 0);
                } else {
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_zero(2);
                    _tile_zero(3);
                }
                for (int64_t kb = 0; kb < nkb; kb++) {
                    const uint16_t *ak = a + kb * a_step, *bk = bb + kb * 2 * TILE_ELEMS;
                    _tile_loadd(4, ak, a_stride);
                    _tile_loadd(5, ak + a_next, a_stride);
                    _tile_loadd(6, bk, 64);
                    _tile_loadd(7, bk + TILE_ELEMS, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
                store_block(c, i, jb * BLK);
            }
        }
    }
    _tile_release();
    free(ap);
    free(bp);
}

/* Bytes of packed B a column chunk may hold so that it and a thread's packed A stay
 * in a core's L2 (2 MiB on the Xeons with AMX; the chunk is the part re-read). */
#define CHUNK_BYTES (1 << 20)

bool fm_cpu_gemm_bf16_amx(const fm_cpu_gemm_args *g, const float *bias, bool c_bf16) {
    if (g->dt != FM_BF16 || g->beta != 0 || g->M < 2 || g->M * g->N * g->K < ((int64_t)1 << 18) || !fm_cpu_use_amx())
        return false;
    int64_t nkb = (g->K + TK - 1) / TK, npanels = (g->N + BLK - 1) / BLK, nmg = (g->M + MGRP - 1) / MGRP;
    int nt = fm_num_threads();
    float *bias_pad = bias ? aligned_alloc(64, (size_t)npanels * BLK * sizeof(float)) : NULL;
    bool ok = !bias || bias_pad;
    if (ok) {
        if (bias_pad) {
            memset(bias_pad, 0, (size_t)npanels * BLK * sizeof(float));
            memcpy(bias_pad, bias, (size_t)g->N * sizeof(float));
        }
        int64_t chunk = CHUNK_BYTES / (nkb * 2 * TILE_ELEMS * (int64_t)sizeof(uint16_t));
        if (chunk < 1) chunk = 1;
        if (chunk > npanels) chunk = npanels;
        int64_t nchunks = (npanels + chunk - 1) / chunk;
        /* few row groups: narrow the chunks so that every thread has two tasks */
        if (nmg * nchunks < 2 * nt) {
            int64_t want = (2 * nt + nmg - 1) / nmg;
            chunk = (npanels + want - 1) / want;
            nchunks = (npanels + chunk - 1) / chunk;
        }
        size_t step_bytes = 2 * TILE_ELEMS * sizeof(uint16_t);
        amx_ctx c = {g, bias_pad, c_bf16, nkb, nmg, chunk, npanels, (size_t)(MGRP / BLK) * nkb * step_bytes,
                     (size_t)chunk * nkb * step_bytes, 0};
        fm_parallel_for(nmg * nchunks, 1, amx_task, &c);
        ok = !c.failed;
    }
    free(bias_pad);
    return ok;
}
