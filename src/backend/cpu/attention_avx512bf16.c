/* Scaled-dot-product attention with its products in bf16 (AVX512-BF16's
 * vdpbf16ps: two bf16 products per f32 lane, f32 accumulation), for f32
 * operands under bf16 autocast (fm_sdpa_io.lowp; the GPT's mixed path). The
 * algorithm is attention_simd.h's: flash-style tiles of BQ queries x BK keys,
 * online softmax in base 2, and the flash-attention-2 backward recomputing the
 * probabilities from the saved logsumexp, with one owning task per (batch, kv
 * head) so that no two threads add into one row. What differs is the operands of
 * the products: q, k, v, dO and the probabilities P and dS are rounded to bf16
 * (round to nearest even) as they are packed, as a bf16 flash attention does;
 * the scores, the softmax statistics, the exponentials and every sum stay f32.
 *
 * Why a kernel of our own: the tiles (64 x 64 x D) are far too small for a
 * library GEMM call each, and oneDNN has no fused attention in the version
 * Debian ships. The micro-kernel computes C[M x N] (+)= A[M x K] B[K x N] with
 * K taken in pairs: A is read as one 32-bit pair (a[m][2p], a[m][2p+1]) per
 * row, broadcast; B as pair-interleaved rows ([K/2][N][2] bf16), 16 columns a
 * vector. Every operand is packed into one of those two forms by converting
 * rows (pairs along a row) or interleaving two rows (pairs across rows), so no
 * pack transposes element by element, except the per-block transposes of Q and
 * dO into [D/2][BQ] pairs, done once per query block. Compiled with AVX512-BF16
 * (the *_avx512bf16.c flags) and entered only when the CPU runs it faster than
 * f32 FMAs (fm_cpu_bf16_dot_fast). */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/attention_cpu.h"
#include "backend/cpu/simd_avx512.h" /* fm_exp2_neg512 */
#include "core/parallel.h"

#define BQ 64
#define BK 64
#define VW 16

typedef uint16_t bf16;

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t zigzag(int64_t i, int64_t n) { return (i & 1) ? n - 1 - i / 2 : i / 2; }

/* ---------------------------------------------------------------- packing ---- */

/* 16 floats (n of them; the rest 0) times s, to 16 bf16 (round to nearest even) */
static inline __m256i cvt16(const float *src, int n, float s) {
    __mmask16 m = n >= VW ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src), _mm512_set1_ps(s));
    return (__m256i)_mm512_cvtneps_pbh(v);
}

/* one row of n floats (times s) as n/2 rounded-up pairs: dst[p] = (x[2p], x[2p+1]) */
static void pack_row(const float *x, int64_t n, float s, uint32_t *dst) {
    int64_t i = 0;
    for (; i < n; i += VW) {
        int c = (int)min64(VW, n - i);
        _mm256_mask_storeu_epi16((bf16 *)dst + i, c >= VW ? (__mmask16)0xFFFF : (__mmask16)((1u << c) - 1), cvt16(x + i, c, s));
    }
    if (n & 1) ((bf16 *)dst)[n] = 0; /* the odd element's partner */
}

/* two rows of n floats interleaved: dst[i] = (r0[i], r1[i]); r1 NULL: zeros */
static void pack_two(const float *r0, const float *r1, int64_t n, float s, uint32_t *dst) {
    for (int64_t i = 0; i < n; i += VW) {
        int c = (int)min64(VW, n - i);
        __m512i a = _mm512_cvtepu16_epi32(cvt16(r0 + i, c, s));
        __m512i b = r1 ? _mm512_slli_epi32(_mm512_cvtepu16_epi32(cvt16(r1 + i, c, s)), 16) : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(dst + i, c >= VW ? (__mmask16)0xFFFF : (__mmask16)((1u << c) - 1), _mm512_or_si512(a, b));
    }
}

/* rows 0..n-1 of x (row stride st, d floats each) as pairs across rows: [ceil(n/2)][d] */
static void pack_across(const float *x, int64_t st, int64_t n, int64_t d, float s, uint32_t *dst) {
    for (int64_t p = 0; 2 * p < n; p++)
        pack_two(x + 2 * p * st, 2 * p + 1 < n ? x + (2 * p + 1) * st : NULL, d, s, dst + p * d);
}

/* n query rows of d floats (row stride st; d even) as [d/2][BQ] pairs (query columns past n:
 * 0): each pair (x[q][2p], x[q][2p+1]) of 8 queries is one 64-bit gather, then one
 * conversion gives those 8 queries' pairs in order (a row-by-row pack and a scatter of
 * single pairs into the columns cost 2.3% of a kjv-gpt bf16 step) */
static void pack_qt(const float *x, int64_t st, int64_t n, int64_t d, float s, uint32_t *dst) {
    const __m512 sv = _mm512_set1_ps(s);
    for (int64_t q0 = 0; q0 < BQ; q0 += 8) {
        const int64_t c = min64(8, n - q0);
        if (c <= 0) {
            for (int64_t p = 0; 2 * p < d; p++) _mm256_storeu_si256((__m256i *)(dst + p * BQ + q0), _mm256_setzero_si256());
            continue;
        }
        const __mmask8 m = c >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << c) - 1);
        const __m512i rows = _mm512_mullo_epi64(_mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi64(st));
        const float *base = x + q0 * st;
        for (int64_t p = 0; 2 * p < d; p++) {
            __m512i idx = _mm512_add_epi64(rows, _mm512_set1_epi64(2 * p));
            __m512d pr = _mm512_mask_i64gather_pd(_mm512_setzero_pd(), m, idx, (const double *)(const void *)base, 4);
            __m512 v = _mm512_mul_ps(_mm512_castpd_ps(pr), sv);
            _mm256_storeu_si256((__m256i *)(dst + p * BQ + q0), (__m256i)_mm512_cvtneps_pbh(v));
        }
    }
}

/* ------------------------------------------------------------ the product ---- */

/* C[R rows][NV vectors] (+)= sum over pairs p < KP of A[r*ars + p*aks] . B[p][16 NV columns] */
static inline __attribute__((always_inline)) void kern(const int R, const int NV, int64_t KP, const uint32_t *A, int64_t ars,
                                                       int64_t aks, const bf16 *B, int64_t ldb, float *C, int64_t ldc, int acc) {
    __m512 c[6][2];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) c[r][v] = acc ? _mm512_loadu_ps(C + r * ldc + v * VW) : _mm512_setzero_ps();
    for (int64_t p = 0; p < KP; p++) {
        __m512bh b[2];
        for (int v = 0; v < NV; v++) b[v] = (__m512bh)_mm512_loadu_si512(B + (p * ldb + v * VW) * 2);
        for (int r = 0; r < R; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[r * ars + p * aks]);
            for (int v = 0; v < NV; v++) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, b[v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(C + r * ldc + v * VW, c[r][v]);
}

/* Causal tiles on the diagonal skip what is masked, as attention_simd.h's
 * tile_gemm_tri does (the skipped terms are exact zeros, or results the caller
 * masks): TRI_COLS rows = keys, columns = queries: a column block needs only
 * the keys up to its last query; TRI_KHI rows = queries, K = keys: row m needs
 * keys <= m; TRI_KLO rows = keys, K = queries: row m needs queries >= m;
 * TRI_KCOL columns = queries, K = keys: a column block needs keys up to its
 * last query. K is counted in elements; a pair that straddles the limit is taken
 * whole (its other element is a masked zero). */
enum { TRI_NONE, TRI_COLS, TRI_KHI, TRI_KLO, TRI_KCOL };

static void bgemm(int tri, int64_t M, int64_t N, int64_t K, const uint32_t *A, int64_t ars, int64_t aks, const bf16 *B,
                  int64_t ldb, float *C, int64_t ldc, int acc) {
    for (int64_t n0 = 0; n0 < N; n0 += 2 * VW) {
        const int nv = N - n0 >= 2 * VW ? 2 : 1;
        const int64_t ncol = n0 + nv * VW;
        const int64_t Mn = tri == TRI_COLS && ncol < M ? ncol : M;
        const int64_t kc = tri == TRI_KCOL && ncol < K ? ncol : K;
        for (int64_t m = 0; m < Mn;) {
            const int R = Mn - m >= 6 ? 6 : Mn - m >= 4 ? 4 : 1;
            int64_t k0 = tri == TRI_KLO ? min64(m, kc) : 0, k1 = tri == TRI_KHI ? min64(m + R, kc) : kc;
            int64_t p0 = k0 / 2, p1 = (k1 + 1) / 2, KP = p1 > p0 ? p1 - p0 : 0;
            const uint32_t *a = A + m * ars + p0 * aks;
            const bf16 *b = B + (p0 * ldb + n0) * 2;
            float *c = C + m * ldc + n0;
            if (R == 6 && nv == 2) kern(6, 2, KP, a, ars, aks, b, ldb, c, ldc, acc);
            else if (R == 6) kern(6, 1, KP, a, ars, aks, b, ldb, c, ldc, acc);
            else if (R == 4 && nv == 2) kern(4, 2, KP, a, ars, aks, b, ldb, c, ldc, acc);
            else if (R == 4) kern(4, 1, KP, a, ars, aks, b, ldb, c, ldc, acc);
            else if (nv == 2) kern(1, 2, KP, a, ars, aks, b, ldb, c, ldc, acc);
            else kern(1, 1, KP, a, ars, aks, b, ldb, c, ldc, acc);
            m += R;
        }
    }
}

/* ---------------------------------------------------------------- forward ---- */

/* A task's scratch: n32 packed pairs and nf floats, 64-byte aligned; false (nothing held)
 * when out of memory */
static bool tile_scratch(size_t n32, size_t nf, uint32_t **u, float **f) {
    *u = NULL;
    *f = NULL;
    if (!posix_memalign((void **)u, 64, n32 * sizeof(uint32_t)) && !posix_memalign((void **)f, 64, nf * sizeof(float))) return true;
    free(*u);
    *u = NULL;
    return false;
}

typedef struct fwd_ctx {
    const fm_sdpa_io *io;
    int64_t nqb;
    _Atomic int oom;
} fwd_ctx;

/* One task per (batch, head, query block): S^T = K Q^T (keys x queries, so the
 * softmax statistics run down the columns, a query per lane), P^T = 2^(S^T - m),
 * and O^T += V^T P^T ([D x queries]), transposed into the output at the end. */
static void fwd_range(void *vctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    fwd_ctx *c = vctx;
    const fm_sdpa_io *g = c->io;
    const int64_t D = g->D, D2 = (D + 1) / 2, kst = g->lk.st, vst = g->lv.st, group = g->H / g->Hkv;
    const size_t n32 = (size_t)(D2 * BQ + BK * D2 + (BK / 2) * D + (BK / 2) * BQ);
    uint32_t *u;
    float *f;
    if (!tile_scratch(n32, (size_t)(BK * BQ + D * BQ + 2 * BQ), &u, &f)) { c->oom = 1; return; }
    uint32_t *QT = u, *Kr = QT + D2 * BQ, *Vi = Kr + BK * D2, *Pi = Vi + (BK / 2) * D;
    float *S = f, *OT = S + BK * BQ, *mrow = OT + D * BQ, *lrow = mrow + BQ;
    const float sc2 = (float)g->scale * 1.4426950408889634f;
    for (int64_t t = t0; t < t1; t++) {
        int64_t qb = zigzag(t % c->nqb, c->nqb), bh = t / c->nqb, b = bh / g->H, h = bh % g->H, hk = h / group;
        int64_t i0 = qb * BQ, bq = min64(BQ, g->Tq - i0);
        const int64_t nq = min64(BQ, (bq + VW - 1) / VW * VW);
        const float *Q = (const float *)g->q + fm_sdpa_row(g->lq, b, h, i0);
        const float *K = (const float *)g->k + fm_sdpa_row(g->lk, b, hk, 0);
        const float *V = (const float *)g->v + fm_sdpa_row(g->lv, b, hk, 0);
        pack_qt(Q, g->lq.st, bq, D, sc2, QT);
        for (int i = 0; i < BQ; i++) { mrow[i] = -INFINITY; lrow[i] = 0.0f; }
        memset(OT, 0, sizeof(float) * (size_t)(D * BQ));
        const int64_t kend = g->causal ? min64(g->Tk, i0 + bq) : g->Tk;
        for (int64_t j0 = 0; j0 < kend; j0 += BK) {
            const int64_t bk = min64(BK, kend - j0);
            const int diag = g->causal && j0 == i0;
            for (int64_t r = 0; r < bk; r++) pack_row(K + (j0 + r) * kst, D, 1.0f, Kr + r * D2);
            bgemm(diag ? TRI_COLS : TRI_NONE, bk, nq, D, Kr, D2, 1, (const bf16 *)QT, BQ, S, BQ, 0);
            if (g->causal && j0 + bk - 1 > i0)
                for (int64_t r = 0; r < bk; r++)
                    for (int64_t i = 0; i < j0 + r - i0 && i < BQ; i++) S[r * BQ + i] = -INFINITY;
            for (int64_t cb = 0; cb < nq; cb += VW) {
                __m512 mx = _mm512_loadu_ps(S + cb);
                for (int64_t r = 1; r < bk; r++) mx = _mm512_max_ps(mx, _mm512_loadu_ps(S + r * BQ + cb));
                __m512 mold = _mm512_loadu_ps(mrow + cb), mnew = _mm512_max_ps(mold, mx);
                __m512 alpha = fm_exp2_neg512(_mm512_sub_ps(mold, mnew)), sum = _mm512_setzero_ps();
                for (int64_t r = 0; r < bk; r++) {
                    __m512 p = fm_exp2_neg512(_mm512_sub_ps(_mm512_loadu_ps(S + r * BQ + cb), mnew));
                    _mm512_storeu_ps(S + r * BQ + cb, p);
                    sum = _mm512_add_ps(sum, p);
                }
                _mm512_storeu_ps(lrow + cb, _mm512_fmadd_ps(_mm512_loadu_ps(lrow + cb), alpha, sum));
                _mm512_storeu_ps(mrow + cb, mnew);
                if (j0 > 0)
                    for (int64_t d = 0; d < D; d++)
                        _mm512_storeu_ps(OT + d * BQ + cb, _mm512_mul_ps(alpha, _mm512_loadu_ps(OT + d * BQ + cb)));
            }
            pack_across(V + j0 * vst, vst, bk, D, 1.0f, Vi);
            pack_across(S, BQ, bk, nq, 1.0f, Pi);
            /* O^T [D x nq] += V^T [D x bk] P^T [bk x nq]; A = V pairs across keys: element (d, pair p) at Vi[p*D + d] */
            bgemm(diag ? TRI_KCOL : TRI_NONE, D, nq, bk, Vi, 1, D, (const bf16 *)Pi, nq, OT, BQ, 1);
        }
        float *out = (float *)g->o + fm_sdpa_row(g->lo, b, h, i0);
        float *lse = g->lse + bh * g->Tq + i0;
        for (int64_t i = 0; i < bq; i++) {
            const float inv = 1.0f / lrow[i];
            for (int64_t d = 0; d < D; d++) out[i * g->lo.st + d] = OT[d * BQ + i] * inv;
            lse[i] = (mrow[i] + log2f(lrow[i])) * 0.6931471805599453f;
        }
    }
    free(u);
    free(f);
}

int fm_sdpa_bf16_forward(const fm_sdpa_io *io) {
    fwd_ctx c = {io, (io->Tq + BQ - 1) / BQ, 0};
    fm_parallel_for(io->B * io->H * c.nqb, 1, fwd_range, &c);
    return c.oom ? -1 : 0;
}

/* --------------------------------------------------------------- backward ---- */

typedef struct bwd_ctx {
    const fm_sdpa_io *io;
    int64_t nqb, nkb;
    _Atomic int oom;
} bwd_ctx;

/* A query block's operands, packed once per (head, query block): Q^T and dO^T as
 * [D/2][BQ] pairs (the B of S^T = K Q^T and dP^T = V dO^T), Q and dO as pairs across
 * queries (the B of dK += dS^T Q and dV += P^T dO; qi NULL: not needed), and per
 * query delta = rowsum(dO * O) and the logsumexp in base 2 (past the block: +inf). */
static void pack_qblock(const fm_sdpa_io *g, int64_t b, int64_t h, int64_t i0, uint32_t *qt, uint32_t *dot, uint32_t *qi,
                        uint32_t *doi, float *delta, float *lse2) {
    const int64_t D = g->D, qst = g->lq.st, dost = g->ldo.st, ost = g->lo.st, bq = min64(BQ, g->Tq - i0);
    const float *Q = (const float *)g->q + fm_sdpa_row(g->lq, b, h, i0);
    const float *dO = (const float *)g->dout + fm_sdpa_row(g->ldo, b, h, i0);
    const float *O = (const float *)g->o + fm_sdpa_row(g->lo, b, h, i0), *L = g->lse + (b * g->H + h) * g->Tq + i0;
    pack_qt(Q, qst, bq, D, (float)g->scale * 1.4426950408889634f, qt);
    pack_qt(dO, dost, bq, D, 1.0f, dot);
    if (qi) {
        memset(qi, 0, sizeof(uint32_t) * (size_t)((BQ / 2) * D));
        memset(doi, 0, sizeof(uint32_t) * (size_t)((BQ / 2) * D));
        pack_across(Q, qst, bq, D, 1.0f, qi);
        pack_across(dO, dost, bq, D, 1.0f, doi);
    }
    for (int64_t i = 0; i < BQ; i++) {
        float s = 0.0f;
        if (i < bq)
            for (int64_t d = 0; d < D; d++) s += dO[i * dost + d] * O[i * ost + d];
        delta[i] = s;
        lse2[i] = i < bq ? L[i] * 1.4426950408889634f : INFINITY;
    }
}

/* One tile of keys j0.. (bk of them; kr, vr: their rows as pairs) against the query block
 * i0..: P^T = 2^(S^T - lse2) and dS^T = P^T * (dP^T - delta) into P and dS ([bk][BQ]),
 * with P^T and dS^T also as rows of pairs (pr, dsr: the A of dV and dK; NULL: not needed)
 * and dS^T as pairs across keys (dsi: the A of dQ; NULL: not needed). */
static void bwd_tile(const fm_sdpa_io *g, int64_t j0, int64_t bk, int64_t i0, const uint32_t *kr, const uint32_t *vr,
                     const uint32_t *qt, const uint32_t *dot, const float *delta, const float *lse2, float *P, float *dS,
                     uint32_t *pr, uint32_t *dsr, uint32_t *dsi) {
    const int64_t D = g->D, D2 = (D + 1) / 2;
    const int diag = g->causal && j0 == i0;
    bgemm(diag ? TRI_COLS : TRI_NONE, bk, BQ, D, kr, D2, 1, (const bf16 *)qt, BQ, P, BQ, 0);
    bgemm(diag ? TRI_COLS : TRI_NONE, bk, BQ, D, vr, D2, 1, (const bf16 *)dot, BQ, dS, BQ, 0);
    for (int64_t r = 0; r < bk; r++) {
        float *prow = P + r * BQ, *drow = dS + r * BQ;
        for (int64_t cb = 0; cb < BQ; cb += VW) {
            __m512 p = fm_exp2_neg512(_mm512_sub_ps(_mm512_loadu_ps(prow + cb), _mm512_loadu_ps(lse2 + cb)));
            __m512 dp = _mm512_sub_ps(_mm512_loadu_ps(drow + cb), _mm512_loadu_ps(delta + cb));
            _mm512_storeu_ps(prow + cb, p);
            _mm512_storeu_ps(drow + cb, _mm512_mul_ps(p, dp));
        }
        if (g->causal) /* queries i < key j do not see it: exact zeros (P and dP were not computed there) */
            for (int64_t i = 0; i < j0 + r - i0 && i < BQ; i++) prow[i] = drow[i] = 0.0f;
        if (pr) pack_row(prow, BQ, 1.0f, pr + r * (BQ / 2));
        if (dsr) pack_row(drow, BQ, 1.0f, dsr + r * (BQ / 2));
    }
    if (dsi) pack_across(dS, BQ, bk, BQ, 1.0f, dsi);
}

/* dV += P^T dO and dK += dS^T Q for one tile: rows keys, K = queries (pairs across queries in B) */
static void bwd_dkdv(const fm_sdpa_io *g, int64_t j0, int64_t bk, int64_t i0, const uint32_t *pr, const uint32_t *dsr,
                     const uint32_t *qi, const uint32_t *doi, float *dK, float *dV) {
    const int64_t D = g->D, bq = min64(BQ, g->Tq - i0);
    const int lo = g->causal && j0 == i0 ? TRI_KLO : TRI_NONE;
    bgemm(lo, bk, D, bq, pr, BQ / 2, 1, (const bf16 *)doi, D, dV, g->ldv.st, 1);
    bgemm(lo, bk, D, bq, dsr, BQ / 2, 1, (const bf16 *)qi, D, dK, g->ldk.st, 1);
}

/* dQ += dS K for one tile: rows queries, K = keys; A = dS^T pairs across keys: (query m, pair p) at dsi[p*BQ + m] */
static void bwd_dq(const fm_sdpa_io *g, int64_t j0, int64_t bk, int64_t i0, const uint32_t *dsi, const uint32_t *ki, float *dQ) {
    const int64_t bq = min64(BQ, g->Tq - i0);
    bgemm(g->causal && j0 == i0 ? TRI_KHI : TRI_NONE, bq, g->D, bk, dsi, 1, BQ, (const bf16 *)ki, g->D, dQ, g->ldq.st, 1);
}

static void pack_keys(const fm_sdpa_io *g, const float *K, const float *V, int64_t n, uint32_t *kr, uint32_t *vr) {
    const int64_t D2 = (g->D + 1) / 2;
    for (int64_t r = 0; r < n; r++) {
        pack_row(K + r * g->lk.st, g->D, 1.0f, kr + r * D2);
        pack_row(V + r * g->lv.st, g->D, 1.0f, vr + r * D2);
    }
}

/* Owner mode: one task per (batch, kv head): dK, dV of the kv head and dQ of its query
 * heads. Per key block, packed once: K and V as rows of pairs and K as pairs across
 * keys (the B of dQ += dS K); per query block of each head, pack_qblock's operands. */
static void bwd_owner_range(void *vctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    bwd_ctx *c = vctx;
    const fm_sdpa_io *g = c->io;
    const int64_t D = g->D, D2 = (D + 1) / 2, Tq = g->Tq, Tk = g->Tk, nqb = c->nqb, nkb = c->nkb, Tkp = nkb * BK;
    const int64_t kst = g->lk.st, dqst = g->ldq.st, dkst = g->ldk.st, dvst = g->ldv.st, group = g->H / g->Hkv;
    const size_t n32 = (size_t)(2 * Tkp * D2 + (Tkp / 2) * D + nqb * (2 * D2 * BQ + 2 * (BQ / 2) * D) + 2 * BK * (BQ / 2) +
                                (BK / 2) * BQ);
    uint32_t *u;
    float *f;
    if (!tile_scratch(n32, (size_t)(2 * BK * BQ + 2 * nqb * BQ), &u, &f)) { c->oom = 1; return; }
    uint32_t *Kr = u, *Vr = Kr + Tkp * D2, *Ki = Vr + Tkp * D2, *QT = Ki + (Tkp / 2) * D, *dOT = QT + nqb * D2 * BQ;
    uint32_t *Qi = dOT + nqb * D2 * BQ, *dOi = Qi + nqb * (BQ / 2) * D;
    uint32_t *Pr = dOi + nqb * (BQ / 2) * D, *dSr = Pr + BK * (BQ / 2), *dSi = dSr + BK * (BQ / 2);
    float *P = f, *dS = P + BK * BQ, *delta = dS + BK * BQ, *lse2 = delta + nqb * BQ;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t b = t / g->Hkv, hk = t % g->Hkv;
        const float *K = (const float *)g->k + fm_sdpa_row(g->lk, b, hk, 0);
        const float *V = (const float *)g->v + fm_sdpa_row(g->lv, b, hk, 0);
        float *dK = (float *)g->dk + fm_sdpa_row(g->ldk, b, hk, 0), *dV = (float *)g->dv + fm_sdpa_row(g->ldv, b, hk, 0);
        fm_sdpa_zero_rows(dK, Tk, D, dkst);
        fm_sdpa_zero_rows(dV, Tk, D, dvst);
        pack_keys(g, K, V, Tk, Kr, Vr);
        for (int64_t j0 = 0; j0 < Tk; j0 += BK) pack_across(K + j0 * kst, kst, min64(BK, Tk - j0), D, 1.0f, Ki + (j0 / 2) * D);
        for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
            float *dQ = (float *)g->dq + fm_sdpa_row(g->ldq, b, h, 0);
            fm_sdpa_zero_rows(dQ, Tq, D, dqst);
            for (int64_t qb = 0; qb < nqb; qb++)
                pack_qblock(g, b, h, qb * BQ, QT + qb * D2 * BQ, dOT + qb * D2 * BQ, Qi + qb * (BQ / 2) * D,
                            dOi + qb * (BQ / 2) * D, delta + qb * BQ, lse2 + qb * BQ);
            for (int64_t j0 = 0; j0 < Tk; j0 += BK) {
                const int64_t bk = min64(BK, Tk - j0);
                for (int64_t qb = g->causal ? j0 / BQ : 0; qb < nqb; qb++) {
                    const int64_t i0 = qb * BQ;
                    bwd_tile(g, j0, bk, i0, Kr + j0 * D2, Vr + j0 * D2, QT + qb * D2 * BQ, dOT + qb * D2 * BQ, delta + i0,
                             lse2 + i0, P, dS, Pr, dSr, dSi);
                    bwd_dkdv(g, j0, bk, i0, Pr, dSr, Qi + qb * (BQ / 2) * D, dOi + qb * (BQ / 2) * D, dK + j0 * dkst,
                             dV + j0 * dvst);
                    bwd_dq(g, j0, bk, i0, dSi, Ki + (j0 / 2) * D, dQ + i0 * dqst);
                }
            }
            fm_sdpa_scale_rows(dQ, Tq, D, dqst, (float)g->scale);
        }
        fm_sdpa_scale_rows(dK, Tk, D, dkst, (float)g->scale);
    }
    free(u);
    free(f);
}

/* Split mode, first pass: one task per (batch, kv head, key block) owns that block's dK
 * and dV rows, over the kv head's query heads and query blocks in owner mode's order
 * (so the same sums in the same order: owner mode's bits). */
static void bwd_kv_range(void *vctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    bwd_ctx *c = vctx;
    const fm_sdpa_io *g = c->io;
    const int64_t D = g->D, D2 = (D + 1) / 2, group = g->H / g->Hkv;
    const size_t n32 = (size_t)(2 * BK * D2 + 2 * D2 * BQ + 2 * (BQ / 2) * D + 2 * BK * (BQ / 2));
    uint32_t *u;
    float *f;
    if (!tile_scratch(n32, (size_t)(2 * BK * BQ + 2 * BQ), &u, &f)) { c->oom = 1; return; }
    uint32_t *Kr = u, *Vr = Kr + BK * D2, *QT = Vr + BK * D2, *dOT = QT + D2 * BQ, *Qi = dOT + D2 * BQ;
    uint32_t *dOi = Qi + (BQ / 2) * D, *Pr = dOi + (BQ / 2) * D, *dSr = Pr + BK * (BQ / 2);
    float *P = f, *dS = P + BK * BQ, *delta = dS + BK * BQ, *lse2 = delta + BQ;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t kb = t % c->nkb, bh = t / c->nkb, b = bh / g->Hkv, hk = bh % g->Hkv;
        const int64_t j0 = kb * BK, bk = min64(BK, g->Tk - j0);
        const float *K = (const float *)g->k + fm_sdpa_row(g->lk, b, hk, j0);
        const float *V = (const float *)g->v + fm_sdpa_row(g->lv, b, hk, j0);
        float *dK = (float *)g->dk + fm_sdpa_row(g->ldk, b, hk, j0), *dV = (float *)g->dv + fm_sdpa_row(g->ldv, b, hk, j0);
        fm_sdpa_zero_rows(dK, bk, D, g->ldk.st);
        fm_sdpa_zero_rows(dV, bk, D, g->ldv.st);
        pack_keys(g, K, V, bk, Kr, Vr);
        for (int64_t h = hk * group; h < (hk + 1) * group; h++)
            for (int64_t qb = g->causal ? j0 / BQ : 0; qb < c->nqb; qb++) {
                const int64_t i0 = qb * BQ;
                pack_qblock(g, b, h, i0, QT, dOT, Qi, dOi, delta, lse2);
                bwd_tile(g, j0, bk, i0, Kr, Vr, QT, dOT, delta, lse2, P, dS, Pr, dSr, NULL);
                bwd_dkdv(g, j0, bk, i0, Pr, dSr, Qi, dOi, dK, dV);
            }
        fm_sdpa_scale_rows(dK, bk, D, g->ldk.st, (float)g->scale);
    }
    free(u);
    free(f);
}

/* Split mode, second pass: one task per (batch, head, query block) owns that block's dQ
 * rows, over the key blocks in owner mode's order. */
static void bwd_q_range(void *vctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    bwd_ctx *c = vctx;
    const fm_sdpa_io *g = c->io;
    const int64_t D = g->D, D2 = (D + 1) / 2, group = g->H / g->Hkv;
    const size_t n32 = (size_t)(2 * BK * D2 + (BK / 2) * D + 2 * D2 * BQ + (BK / 2) * BQ);
    uint32_t *u;
    float *f;
    if (!tile_scratch(n32, (size_t)(2 * BK * BQ + 2 * BQ), &u, &f)) { c->oom = 1; return; }
    uint32_t *Kr = u, *Vr = Kr + BK * D2, *Ki = Vr + BK * D2, *QT = Ki + (BK / 2) * D, *dOT = QT + D2 * BQ, *dSi = dOT + D2 * BQ;
    float *P = f, *dS = P + BK * BQ, *delta = dS + BK * BQ, *lse2 = delta + BQ;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t qb = zigzag(t % c->nqb, c->nqb), bh = t / c->nqb, b = bh / g->H, h = bh % g->H, hk = h / group;
        const int64_t i0 = qb * BQ, bq = min64(BQ, g->Tq - i0);
        const float *K = (const float *)g->k + fm_sdpa_row(g->lk, b, hk, 0);
        const float *V = (const float *)g->v + fm_sdpa_row(g->lv, b, hk, 0);
        float *dQ = (float *)g->dq + fm_sdpa_row(g->ldq, b, h, i0);
        fm_sdpa_zero_rows(dQ, bq, D, g->ldq.st);
        pack_qblock(g, b, h, i0, QT, dOT, NULL, NULL, delta, lse2);
        const int64_t kend = g->causal ? min64(g->Tk, i0 + bq) : g->Tk;
        for (int64_t j0 = 0; j0 < kend; j0 += BK) {
            const int64_t bk = min64(BK, g->Tk - j0);
            pack_keys(g, K + j0 * g->lk.st, V + j0 * g->lv.st, bk, Kr, Vr);
            pack_across(K + j0 * g->lk.st, g->lk.st, bk, D, 1.0f, Ki);
            bwd_tile(g, j0, bk, i0, Kr, Vr, QT, dOT, delta, lse2, P, dS, NULL, NULL, dSi);
            bwd_dq(g, j0, bk, i0, dSi, Ki, dQ);
        }
        fm_sdpa_scale_rows(dQ, bq, D, g->ldq.st, (float)g->scale);
    }
    free(u);
    free(f);
}

/* Owner mode needs enough (batch, kv head) pairs to keep the threads busy; with fewer,
 * two passes split the work over key blocks (dK, dV) and query blocks (dQ), computing
 * the probabilities twice. Chosen by the shape only (as attention_simd.h), and both
 * give the same bits, so results do not depend on the thread count. */
#define SDPA_BF16_OWNER_MIN_TASKS 16

int fm_sdpa_bf16_backward(const fm_sdpa_io *io) {
    bwd_ctx c = {io, (io->Tq + BQ - 1) / BQ, (io->Tk + BK - 1) / BK, 0};
    if (io->B * io->Hkv < SDPA_BF16_OWNER_MIN_TASKS) {
        fm_parallel_for(io->B * io->Hkv * c.nkb, 1, bwd_kv_range, &c);
        if (!c.oom) fm_parallel_for(io->B * io->H * c.nqb, 1, bwd_q_range, &c);
    } else {
        fm_parallel_for(io->B * io->Hkv, 1, bwd_owner_range, &c);
    }
    return c.oom ? -1 : 0;
}
