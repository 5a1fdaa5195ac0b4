/* Flash-style scaled-dot-product attention for f32, written once for any
 * vector width and included by attention_avx2.c (VW = 8, __m256) and
 * attention_avx512.c (VW = 16, __m512), which define, before including it:
 *   VEC, VW                 the vector type and its number of floats;
 *   V_LOADU V_STOREU V_FMADD V_BCAST (broadcast one float from memory) V_SET1
 *   V_ZERO V_MAX V_SUB V_MUL V_ADD, and V_EXP2_NEG(x) (2^x for x <= 0);
 *   SDPA_FORWARD, SDPA_BACKWARD the names of the two entry points.
 * Each element of a tile product is one FMA chain over k in the same order at
 * both widths, and the softmax statistics are per query lane, so the widths
 * differ only in how many lanes run at once (tests/test_isa_kernels.c).
 *
 * Forward: one task per (batch, head, query block). The query block is packed
 * transposed ([D][BQ], pre-multiplied by scale*log2(e)) so the score tile is
 * computed as S^T = K_blk * Q^T: rows are keys, columns queries. Softmax
 * statistics then run down the columns, VW queries per vector, with no
 * horizontal reductions, and exp becomes exp2. The T x T score matrix is never
 * stored: only one BK x BQ tile per task plus the running max/sum (online softmax).
 *
 * Backward (flash-attention-2 recomputation from q, k and the saved logsumexp):
 * every gradient row has exactly one owning task, so no two threads ever add into
 * the same row and the sum order is fixed; results do not depend on the thread
 * count. With many (batch, kv head) pairs one task owns a pair's dK/dV and the dQ
 * of its query heads; with few, dK/dV and dQ are split over key and query blocks
 * in two passes (see SDPA_BACKWARD). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/attention_cpu.h" /* fm_sdpa_io */
#include "core/parallel.h"            /* fm_parallel_for */

/* 64x64 f32 tiles are 16 KiB: the score tile, the packed queries and one K or V
 * block together stay in L1/L2. */
#define BQ 64 /* queries per tile (a multiple of 2 * VW: the micro-kernel width) */
#define BK 64 /* keys per tile */

/* ---- micro-kernels: C[m][n] (+)= sum_k A[m*ams + k*aks] * B[k*ldb + n] ----
 * A is read by broadcast, so any A layout (transposed or not) costs the same;
 * B rows are read as vectors. Own kernels rather than cblas_sgemm per tile: on
 * 64x64x64 tiles, one thread, they measured 63-73 GFLOP/s against OpenBLAS's
 * 52-62 (NN) and 41-45 (the NT form Q*K^T would need), and they never start
 * OpenBLAS threads inside our pool. */
static inline void kern_4x2v(int K, const float *A, int64_t ams, int64_t aks, const float *B, int64_t ldb,
                             float *C, int64_t ldc, int acc) {
    VEC c00, c01, c10, c11, c20, c21, c30, c31;
    if (acc) {
        c00 = V_LOADU(C); c01 = V_LOADU(C + VW);
        c10 = V_LOADU(C + ldc); c11 = V_LOADU(C + ldc + VW);
        c20 = V_LOADU(C + 2 * ldc); c21 = V_LOADU(C + 2 * ldc + VW);
        c30 = V_LOADU(C + 3 * ldc); c31 = V_LOADU(C + 3 * ldc + VW);
    } else {
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = V_ZERO();
    }
    const float *a0 = A, *a1 = A + ams, *a2 = A + 2 * ams, *a3 = A + 3 * ams;
    for (int k = 0; k < K; k++) {
        VEC b0 = V_LOADU(B + k * ldb), b1 = V_LOADU(B + k * ldb + VW);
        int64_t ak = k * aks;
        VEC a = V_BCAST(a0 + ak);
        c00 = V_FMADD(a, b0, c00); c01 = V_FMADD(a, b1, c01);
        a = V_BCAST(a1 + ak);
        c10 = V_FMADD(a, b0, c10); c11 = V_FMADD(a, b1, c11);
        a = V_BCAST(a2 + ak);
        c20 = V_FMADD(a, b0, c20); c21 = V_FMADD(a, b1, c21);
        a = V_BCAST(a3 + ak);
        c30 = V_FMADD(a, b0, c30); c31 = V_FMADD(a, b1, c31);
    }
    V_STOREU(C, c00); V_STOREU(C + VW, c01);
    V_STOREU(C + ldc, c10); V_STOREU(C + ldc + VW, c11);
    V_STOREU(C + 2 * ldc, c20); V_STOREU(C + 2 * ldc + VW, c21);
    V_STOREU(C + 3 * ldc, c30); V_STOREU(C + 3 * ldc + VW, c31);
}

static inline void kern_6x2v(int K, const float *A, int64_t ams, int64_t aks, const float *B, int64_t ldb,
                             float *C, int64_t ldc, int acc) {
    VEC c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
#define LD(r) c##r##0 = acc ? V_LOADU(C + r * ldc) : V_ZERO(); \
              c##r##1 = acc ? V_LOADU(C + r * ldc + VW) : V_ZERO();
    LD(0) LD(1) LD(2) LD(3) LD(4) LD(5)
#undef LD
    for (int k = 0; k < K; k++) {
        VEC b0 = V_LOADU(B + k * ldb), b1 = V_LOADU(B + k * ldb + VW), a;
        const float *ak = A + k * aks;
#define FM(r) a = V_BCAST(ak + r * ams); \
              c##r##0 = V_FMADD(a, b0, c##r##0); c##r##1 = V_FMADD(a, b1, c##r##1);
        FM(0) FM(1) FM(2) FM(3) FM(4) FM(5)
#undef FM
    }
#define ST(r) V_STOREU(C + r * ldc, c##r##0); V_STOREU(C + r * ldc + VW, c##r##1);
    ST(0) ST(1) ST(2) ST(3) ST(4) ST(5)
#undef ST
}

static inline void kern_1x2v(int K, const float *A, int64_t aks, const float *B, int64_t ldb, float *C, int acc) {
    VEC c0 = acc ? V_LOADU(C) : V_ZERO();
    VEC c1 = acc ? V_LOADU(C + VW) : V_ZERO();
    for (int k = 0; k < K; k++) {
        VEC a = V_BCAST(A + k * aks);
        c0 = V_FMADD(a, V_LOADU(B + k * ldb), c0);
        c1 = V_FMADD(a, V_LOADU(B + k * ldb + VW), c1);
    }
    V_STOREU(C, c0);
    V_STOREU(C + VW, c1);
}

static inline void kern_1x1v(int K, const float *A, int64_t aks, const float *B, int64_t ldb, float *C, int acc) {
    VEC c0 = acc ? V_LOADU(C) : V_ZERO();
    for (int k = 0; k < K; k++)
        c0 = V_FMADD(V_BCAST(A + k * aks), V_LOADU(B + k * ldb), c0);
    V_STOREU(C, c0);
}

/* Causal tiles on the diagonal (key block == query block) are half zero: a key
 * after the query is masked in S and exactly 0 in P and dS. The products skip
 * those parts instead of multiplying zeros (a third of the work at T = 128):
 *   TRI_COLS  C = keys x queries (S^T, P^T, dP^T): each block of query columns
 *             computes only the key rows up to its last query (the rest is masked
 *             or zeroed by the caller afterwards, never read as computed);
 *   TRI_KHI   C rows are queries, K runs over keys: query row m needs keys <= m;
 *   TRI_KLO   C rows are keys, K runs over queries: key row m needs queries >= m.
 * The terms skipped by TRI_KHI/TRI_KLO are exact zeros, so the sums are the same
 * bits as the full products. */
enum { TRI_NONE, TRI_COLS, TRI_KHI, TRI_KLO };

static inline void k_range(int tri, int m, int rows, int K, int *k0, int *k1) {
    *k0 = tri == TRI_KLO ? (m < K ? m : K) : 0;
    *k1 = tri == TRI_KHI ? (m + rows < K ? m + rows : K) : K;
}

static inline void tile_gemm_tri(int tri, int M, int N, int K, const float *A, int64_t ams, int64_t aks,
                                 const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
    int n0 = 0, k0, k1;
    for (; n0 + 2 * VW <= N; n0 += 2 * VW) {
        int Mn = tri == TRI_COLS && n0 + 2 * VW < M ? n0 + 2 * VW : M;
        int m = 0;
        for (; m + 6 <= Mn; m += 6) {
            k_range(tri, m, 6, K, &k0, &k1);
            kern_6x2v(k1 - k0, A + m * ams + k0 * aks, ams, aks, B + k0 * ldb + n0, ldb, C + m * ldc + n0, ldc, acc);
        }
        for (; m + 4 <= Mn; m += 4) {
            k_range(tri, m, 4, K, &k0, &k1);
            kern_4x2v(k1 - k0, A + m * ams + k0 * aks, ams, aks, B + k0 * ldb + n0, ldb, C + m * ldc + n0, ldc, acc);
        }
        for (; m < Mn; m++) {
            k_range(tri, m, 1, K, &k0, &k1);
            kern_1x2v(k1 - k0, A + m * ams + k0 * aks, aks, B + k0 * ldb + n0, ldb, C + m * ldc + n0, acc);
        }
    }
    for (; n0 + VW <= N; n0 += VW) {
        int Mn = tri == TRI_COLS && n0 + VW < M ? n0 + VW : M;
        for (int m = 0; m < Mn; m++) {
            k_range(tri, m, 1, K, &k0, &k1);
            kern_1x1v(k1 - k0, A + m * ams + k0 * aks, aks, B + k0 * ldb + n0, ldb, C + m * ldc + n0, acc);
        }
    }
    for (; n0 < N; n0++) {
        int Mn = tri == TRI_COLS && n0 + 1 < M ? n0 + 1 : M;
        for (int m = 0; m < Mn; m++) {
            k_range(tri, m, 1, K, &k0, &k1);
            float s = acc ? C[m * ldc + n0] : 0.0f;
            for (int k = k0; k < k1; k++) s += A[m * ams + k * aks] * B[k * ldb + n0];
            C[m * ldc + n0] = s;
        }
    }
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Block visiting order 0, n-1, 1, n-2, ...: with a causal mask a block's cost grows
 * (queries) or shrinks (keys) with its index, and fm_parallel_for hands each thread
 * one contiguous range of tasks, so this keeps the ranges' costs even. Each task
 * writes only its own rows, so the order never changes the results. */
static inline int64_t zigzag(int64_t i, int64_t n) { return (i & 1) ? n - 1 - i / 2 : i / 2; }

/* ---------------------------------------------------------------- forward ---- */
typedef struct fwd_ctx {
    const fm_sdpa_io *io;
    int64_t nqb;
    int oom;
} fwd_ctx;

/* One query row (a decode step's query, or a prompt's last block of one row):
 * the tile path would pack a [D][BQ] query block and zero a BQ x D output for
 * it, and compute VW query columns to use one. Here each score is 8 FMA
 * chains over d (d mod 8) in __m256 registers and one fixed reduction of
 * them, the same instructions at both widths (attention_avx2.c and
 * attention_avx512.c give the same bits); exp2, the running max and sum and
 * the output's FMA chains over keys are the tile path's, per element. */
static inline float row_score(const float *q, const float *k, int64_t D) {
    __m256 a = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float s = _mm_cvtss_f32(h);
    for (; d < D; d++) s = fmaf(q[d], k[d], s);
    return s;
}

/* sdpa_mask: mask value m added to score x in the scores' log2 units. A finite m keeps the
 * sum finite (no less than -FLT_MAX): exports mask with float's lowest value, and a query
 * whose keys all carry it attends to them evenly, as the unfused softmax does; -inf stays
 * -inf (a query with every key so masked gets 0). */
static inline float clamp_lo(float x) { return x > -FLT_MAX ? x : -FLT_MAX; } /* one maxss; fmaxf's NaN rules cost a call */
static inline float mask_term(float m) { return clamp_lo(m * 1.4426950408889634f); }
static inline float add_mask(float x, float m) { return m == -INFINITY ? m : clamp_lo(x + mask_term(m)); }

/* the mask's tile for the block's bq queries (from mb, the block's first query's row) and keys
 * j0 .. j0 + bk, added to S [key][query] (row stride BQ) */
static void add_mask_tile(const fm_sdpa_io *g, const float *mb, int64_t j0, int bk, int64_t bq, float *S) {
    for (int r = 0; r < bk; r++) {
        const float *mr = mb + (j0 + r) * g->msj;
        float *row = S + r * BQ;
        if (g->msi) { /* a value per query */
            for (int64_t i = 0; i < bq; i++) row[i] = add_mask(row[i], mr[i * g->msi]);
            continue;
        }
        const float m = mr[0]; /* one value for every query (a padding mask) */
        if (m == 0) continue;  /* x + 0 is x */
        if (m == -INFINITY) {
            for (int64_t i = 0; i < bq; i++) row[i] = -INFINITY;
            continue;
        }
        const VEC mv = V_SET1(mask_term(m)), lo = V_SET1(-FLT_MAX);
        int64_t i = 0;
        for (; i + VW <= bq; i += VW) V_STOREU(row + i, V_MAX(V_ADD(V_LOADU(row + i), mv), lo));
        for (; i < bq; i++) row[i] = add_mask(row[i], m);
    }
}

static void fwd_row(const fm_sdpa_io *g, const float *Q, const float *K, const float *V, int64_t kend, float sc2, float *qs, float *S,
                    float *O, float *out, float *lse, const float *mrow) {
    const int64_t D = g->D, kst = g->lk.st, vst = g->lv.st, dv = D / VW * VW;
    for (int64_t d = 0; d < D; d++) {
        qs[d] = Q[d] * sc2;
        O[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        const int bk = (int)min64(BK, kend - j0), bkv = (bk + VW - 1) / VW * VW;
        float mx = -INFINITY;
        for (int r = 0; r < bk; r++) S[r] = row_score(qs, K + (j0 + r) * kst, D);
        for (int r = 0; mrow && r < bk; r++) S[r] = add_mask(S[r], mrow[(j0 + r) * g->msj]);
        for (int r = 0; r < bk; r++) mx = S[r] > mx ? S[r] : mx;
        for (int r = bk; r < bkv; r++) S[r] = -INFINITY;
        /* at least -FLT_MAX: keys all masked so far give exp2(-inf) = 0 and a zero sum, not NaN */
        const float mnew = clamp_lo(m > mx ? m : mx);
        float al[VW];
        V_STOREU(al, V_EXP2_NEG(V_SET1(m - mnew)));
        float sum = 0.0f;
        for (int c = 0; c < bkv; c += VW) V_STOREU(S + c, V_EXP2_NEG(V_SUB(V_LOADU(S + c), V_SET1(mnew))));
        for (int r = 0; r < bk; r++) sum += S[r];
        l = fmaf(l, al[0], sum);
        m = mnew;
        if (j0 > 0) {
            const VEC a = V_SET1(al[0]);
            for (int64_t d = 0; d < dv; d += VW) V_STOREU(O + d, V_MUL(a, V_LOADU(O + d)));
            for (int64_t d = dv; d < D; d++) O[d] *= al[0];
        }
        int64_t d = 0;
        /* four vectors of the row at once, key after key: four independent FMA chains
         * and one pass down V's rows (one chain per vector walked the rows D / VW
         * times, its FMAs each waiting for the last); each element's sum is the same
         * FMAs in the same key order as below */
        for (; d + 4 * VW <= dv; d += 4 * VW) {
            VEC o0 = V_LOADU(O + d), o1 = V_LOADU(O + d + VW), o2 = V_LOADU(O + d + 2 * VW), o3 = V_LOADU(O + d + 3 * VW);
            for (int r = 0; r < bk; r++) {
                const float *vr = V + (j0 + r) * vst + d;
                const VEC p = V_SET1(S[r]);
                o0 = V_FMADD(p, V_LOADU(vr), o0);
                o1 = V_FMADD(p, V_LOADU(vr + VW), o1);
                o2 = V_FMADD(p, V_LOADU(vr + 2 * VW), o2);
                o3 = V_FMADD(p, V_LOADU(vr + 3 * VW), o3);
            }
            V_STOREU(O + d, o0);
            V_STOREU(O + d + VW, o1);
            V_STOREU(O + d + 2 * VW, o2);
            V_STOREU(O + d + 3 * VW, o3);
        }
        for (; d < dv; d += VW) {
            VEC o = V_LOADU(O + d);
            for (int r = 0; r < bk; r++) o = V_FMADD(V_SET1(S[r]), V_LOADU(V + (j0 + r) * vst + d), o);
            V_STOREU(O + d, o);
        }
        for (d = dv; d < D; d++) {
            float o = O[d];
            for (int r = 0; r < bk; r++) o = fmaf(S[r], V[(j0 + r) * vst + d], o);
            O[d] = o;
        }
    }
    const float inv = l > 0 ? 1.0f / l : 0.0f; /* every key masked: 0, as transformers' exports make it */
    for (int64_t d = 0; d < D; d++) out[d] = O[d] * inv;
    if (lse) *lse = (m + log2f(l)) * 0.6931471805599453f;
}

/* QT[d][i] = Q[i][d] * sc2 for the block's bq queries, zero for i in [bq, BQ).
 * attention_avx512.c sets V_PACK_QT to a 16x16-transposing version (the same
 * products, stored in the same places): this loop's strided reads ran at ~8% of
 * the prefill's attention there. */
#ifndef V_PACK_QT
static void pack_qt(const float *Q, int64_t qst, int64_t bq, int64_t D, float sc2, float *QT) {
    for (int64_t d = 0; d < D; d++) {
        for (int64_t i = 0; i < bq; i++) QT[d * BQ + i] = Q[i * qst + d] * sc2;
        for (int64_t i = bq; i < BQ; i++) QT[d * BQ + i] = 0.0f;
    }
}
#define V_PACK_QT pack_qt
#endif

static void fwd_range(void *vctx, int64_t t0, int64_t t1, int tid) {
    fwd_ctx *c = vctx;
    const fm_sdpa_io *g = c->io;
    const int64_t D = g->D, Dp = (D + VW - 1) & ~(int64_t)(VW - 1);
    const int64_t qst = g->lq.st, kst = g->lk.st, vst = g->lv.st, ost = g->lo.st;
    float *buf = NULL;
    size_t nflt = (size_t)(D * BQ + BK * BQ + BQ * Dp + 2 * BQ);
    if (posix_memalign((void **)&buf, 64, nflt * sizeof(float)) != 0) { c->oom = 1; return; }
    float *QT = buf, *S = QT + D * BQ, *O = S + BK * BQ, *mrow = O + BQ * Dp, *lrow = mrow + BQ;
    const float sc2 = (float)g->scale * 1.4426950408889634f; /* scale * log2(e) */
    const int64_t group = g->H / g->Hkv;
    for (int64_t t = t0; t < t1; t++) {
        int64_t qb = zigzag(t % c->nqb, c->nqb), bh = t / c->nqb, b = bh / g->H, h = bh % g->H, hk = h / group;
        int64_t i0 = qb * BQ, bq = min64(BQ, g->Tq - i0);
        /* query columns computed: bq rounded up to a vector, not all BQ (a decode step's
         * one query ran 64 columns; each column's sums are the same FMAs either way) */
        const int nq = (int)min64(BQ, (bq + VW - 1) / VW * VW);
        const float *Q = (const float *)g->q + fm_sdpa_row(g->lq, b, h, i0);
        const float *K = (const float *)g->k + fm_sdpa_row(g->lk, b, hk, 0);
        const float *V = (const float *)g->v + fm_sdpa_row(g->lv, b, hk, 0);
        const float *mb = g->mask ? (const float *)g->mask + b * g->msb + h * g->msh + i0 * g->msi : NULL;
        if (bq == 1) {
            fwd_row(g, Q, K, V, g->causal ? min64(g->Tk, i0 + 1) : g->Tk, sc2, QT, S, O, (float *)g->o + fm_sdpa_row(g->lo, b, h, i0),
                    g->lse ? g->lse + bh * g->Tq + i0 : NULL, mb);
            continue;
        }
        V_PACK_QT(Q, qst, bq, D, sc2, QT);
        for (int i = 0; i < BQ; i++) { mrow[i] = -INFINITY; lrow[i] = 0.0f; }
        memset(O, 0, sizeof(float) * BQ * Dp);
        /* causal (top-left aligned, as PyTorch's is_causal): key j is visible to query i iff j <= i */
        int64_t kend = g->causal ? min64(g->Tk, i0 + bq) : g->Tk;
        for (int64_t j0 = 0; j0 < kend; j0 += BK) {
            int bk = (int)min64(BK, kend - j0);
            const int diag = g->causal && j0 == i0;
            tile_gemm_tri(diag ? TRI_COLS : TRI_NONE, bk, nq, (int)D, K + j0 * kst, kst, 1, QT, BQ, S, BQ, 0);
            if (g->causal && j0 + bk - 1 > i0) {
                const VEC ninf = V_SET1(-INFINITY);
                for (int r = 0; r < bk; r++) {
                    int64_t first = min64(j0 + r - i0, BQ), i = 0; /* columns i < j are masked */
                    for (; i + VW <= first; i += VW) V_STOREU(S + r * BQ + i, ninf);
                    for (; i < first; i++) S[r * BQ + i] = -INFINITY;
                }
            }
            if (mb) add_mask_tile(g, mb, j0, bk, bq, S);
            for (int cb = 0; cb < nq; cb += VW) {
                /* on the diagonal, keys past the block's last query are masked for all
                 * its columns: P there is 0 without computing it, but the P V product
                 * (TRI_KHI) reads up to 5 keys past a query (its 6-row blocks), so the
                 * rows stop 8 past the block (exp2(-inf) = 0 exactly) */
                const int rows = diag ? (int)min64(bk, cb + VW + 8) : bk;
                /* four running maxima (one chain stalled on the max's latency); max is
                 * exact, so the order does not change the result */
                VEC mx = V_LOADU(S + cb), mx1 = mx, mx2 = mx, mx3 = mx;
                int rm = 1;
                for (; rm + 4 <= rows; rm += 4) {
                    mx = V_MAX(mx, V_LOADU(S + rm * BQ + cb));
                    mx1 = V_MAX(mx1, V_LOADU(S + (rm + 1) * BQ + cb));
                    mx2 = V_MAX(mx2, V_LOADU(S + (rm + 2) * BQ + cb));
                    mx3 = V_MAX(mx3, V_LOADU(S + (rm + 3) * BQ + cb));
                }
                for (; rm < rows; rm++) mx = V_MAX(mx, V_LOADU(S + rm * BQ + cb));
                mx = V_MAX(V_MAX(mx, mx1), V_MAX(mx2, mx3));
                VEC mold = V_LOADU(mrow + cb);
                VEC mnew = V_MAX(V_MAX(mold, mx), V_SET1(-FLT_MAX)); /* as fwd_row: all masked so far gives 0s */
                VEC alpha = V_EXP2_NEG(V_SUB(mold, mnew));
                VEC sum = V_ZERO();
                for (int r = 0; r < rows; r++) {
                    VEC p = V_EXP2_NEG(V_SUB(V_LOADU(S + r * BQ + cb), mnew));
                    V_STOREU(S + r * BQ + cb, p);
                    sum = V_ADD(sum, p);
                }
                V_STOREU(lrow + cb, V_FMADD(V_LOADU(lrow + cb), alpha, sum));
                V_STOREU(mrow + cb, mnew);
                if (j0 > 0) {
                    float al[VW];
                    V_STOREU(al, alpha);
                    for (int ii = 0; ii < VW && cb + ii < bq; ii++) {
                        VEC a = V_SET1(al[ii]);
                        float *orow = O + (cb + ii) * Dp;
                        for (int64_t d = 0; d < Dp; d += VW)
                            V_STOREU(orow + d, V_MUL(a, V_LOADU(orow + d)));
                    }
                }
            }
            tile_gemm_tri(diag ? TRI_KHI : TRI_NONE, (int)bq, (int)D, bk, S, 1, BQ, V + j0 * vst, vst, O, Dp, 1);
        }
        float *out = (float *)g->o + fm_sdpa_row(g->lo, b, h, i0);
        float *lse = g->lse ? g->lse + bh * g->Tq + i0 : NULL;
        for (int64_t i = 0; i < bq; i++) {
            float inv = lrow[i] > 0 ? 1.0f / lrow[i] : 0.0f; /* every key masked: 0 */
            for (int64_t d = 0; d < D; d++) out[i * ost + d] = O[i * Dp + d] * inv;
            if (lse) lse[i] = (mrow[i] + log2f(lrow[i])) * 0.6931471805599453f;
        }
    }
    free(buf);
}

int SDPA_FORWARD(const fm_sdpa_io *io) {
    fwd_ctx c = {io, (io->Tq + BQ - 1) / BQ, 0};
    fm_parallel_for(io->B * io->H * c.nqb, 1, fwd_range, &c);
    return c.oom ? -1 : 0;
}

/* --------------------------------------------------------------- backward ---- */
typedef struct bwd_ctx {
    const fm_sdpa_io *io;
    int64_t nqb, nkb;
    int oom;
} bwd_ctx;

/* Per query block: Q^T (times scale*log2 e) and dO^T packed [D][BQ], delta =
 * rowsum(dO * O) and lse in base 2; padded columns get P = 0 (lse2 = +inf). */
static void pack_qblock(const bwd_ctx *c, int64_t b, int64_t h, int64_t i0, float *qt, float *dot, float *delta,
                        float *lse2) {
    const fm_sdpa_io *g = c->io;
    const int64_t D = g->D, bq = min64(BQ, g->Tq - i0), qst = g->lq.st, dst = g->ldo.st, ost = g->lo.st;
    const float sc2 = (float)g->scale * 1.4426950408889634f;
    const float *Q = (const float *)g->q + fm_sdpa_row(g->lq, b, h, i0);
    const float *dO = (const float *)g->dout + fm_sdpa_row(g->ldo, b, h, i0);
    const float *O = (const float *)g->o + fm_sdpa_row(g->lo, b, h, i0), *L = g->lse + (b * g->H + h) * g->Tq + i0;
    for (int64_t d = 0; d < D; d++) {
        for (int64_t i = 0; i < bq; i++) {
            qt[d * BQ + i] = Q[i * qst + d] * sc2;
            dot[d * BQ + i] = dO[i * dst + d];
        }
        for (int64_t i = bq; i < BQ; i++) qt[d * BQ + i] = dot[d * BQ + i] = 0.0f;
    }
    for (int64_t i = 0; i < BQ; i++) {
        if (i < bq) {
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++) s += dO[i * dst + d] * O[i * ost + d];
            delta[i] = s;
            lse2[i] = L[i] * 1.4426950408889634f;
        } else {
            delta[i] = 0.0f;
            lse2[i] = INFINITY;
        }
    }
}

/* One (key block, query block) tile: P^T = exp(S^T - lse) and dS^T = P^T * (dP^T - delta),
 * both [bk][BQ], recomputed from K, V and the packed query block. */
static void bwd_tile(const bwd_ctx *c, const float *K, const float *V, int bk, int64_t j0, int64_t i0,
                     const float *qt, const float *dot, const float *delta, const float *lse2, float *P, float *dS) {
    const fm_sdpa_io *g = c->io;
    const int D = (int)g->D, diag = g->causal && j0 == i0;
    tile_gemm_tri(diag ? TRI_COLS : TRI_NONE, bk, BQ, D, K, g->lk.st, 1, qt, BQ, P, BQ, 0);
    for (int r = 0; r < bk; r++) {
        float *pr = P + r * BQ;
        for (int cb = 0; cb < BQ; cb += VW)
            V_STOREU(pr + cb, V_EXP2_NEG(V_SUB(V_LOADU(pr + cb), V_LOADU(lse2 + cb))));
        if (g->causal) {
            int64_t first = j0 + r - i0; /* queries i < j do not see key j */
            for (int64_t i = 0; i < first && i < BQ; i++) pr[i] = 0.0f;
        }
    }
    tile_gemm_tri(diag ? TRI_COLS : TRI_NONE, bk, BQ, D, V, g->lv.st, 1, dot, BQ, dS, BQ, 0);
    for (int r = 0; r < bk; r++) {
        for (int cb = 0; cb < BQ; cb += VW) {
            VEC dp = V_SUB(V_LOADU(dS + r * BQ + cb), V_LOADU(delta + cb));
            V_STOREU(dS + r * BQ + cb, V_MUL(V_LOADU(P + r * BQ + cb), dp));
        }
        if (g->causal) { /* exact zeros where P is masked: dP was not computed there */
            int64_t first = j0 + r - i0;
            for (int64_t i = 0; i < first && i < BQ; i++) dS[r * BQ + i] = 0.0f;
        }
    }
}

/* Owner mode: one task per (batch, kv head) computes dK, dV of that kv head and dQ
 * of its query heads in one sweep (five tile GEMMs per tile, nothing recomputed). */
static void bwd_owner_range(void *vctx, int64_t t0, int64_t t1, int tid) {
    bwd_ctx *c = vctx;
    const fm_sdpa_io *g = c->io;
    const int64_t D = g->D, Tq = g->Tq, Tk = g->Tk, nqb = c->nqb, Tqp = nqb * BQ;
    const int64_t kst = g->lk.st, vst = g->lv.st, qst = g->lq.st, dost = g->ldo.st;
    const int64_t dqst = g->ldq.st, dkst = g->ldk.st, dvst = g->ldv.st;
    float *buf = NULL;
    size_t nflt = (size_t)(2 * Tqp * D + 2 * Tqp + 2 * BK * BQ);
    if (posix_memalign((void **)&buf, 64, nflt * sizeof(float)) != 0) { c->oom = 1; return; }
    float *QT = buf, *dOT = QT + Tqp * D, *delta = dOT + Tqp * D, *lse2 = delta + Tqp;
    float *P = lse2 + Tqp, *dS = P + BK * BQ;
    const int64_t group = g->H / g->Hkv;
    for (int64_t t = t0; t < t1; t++) {
        int64_t b = t / g->Hkv, hk = t % g->Hkv;
        const float *K = (const float *)g->k + fm_sdpa_row(g->lk, b, hk, 0);
        const float *V = (const float *)g->v + fm_sdpa_row(g->lv, b, hk, 0);
        float *dK = (float *)g->dk + fm_sdpa_row(g->ldk, b, hk, 0), *dV = (float *)g->dv + fm_sdpa_row(g->ldv, b, hk, 0);
        fm_sdpa_zero_rows(dK, Tk, D, dkst);
        fm_sdpa_zero_rows(dV, Tk, D, dvst);
        for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
            const float *Q = (const float *)g->q + fm_sdpa_row(g->lq, b, h, 0);
            const float *dO = (const float *)g->dout + fm_sdpa_row(g->ldo, b, h, 0);
            float *dQ = (float *)g->dq + fm_sdpa_row(g->ldq, b, h, 0);
            fm_sdpa_zero_rows(dQ, Tq, D, dqst);
            for (int64_t qb = 0; qb < nqb; qb++)
                pack_qblock(c, b, h, qb * BQ, QT + qb * D * BQ, dOT + qb * D * BQ, delta + qb * BQ, lse2 + qb * BQ);
            for (int64_t j0 = 0; j0 < Tk; j0 += BK) {
                int bk = (int)min64(BK, Tk - j0);
                for (int64_t qb = g->causal ? j0 / BQ : 0; qb < nqb; qb++) {
                    int64_t i0 = qb * BQ;
                    int bq = (int)min64(BQ, Tq - i0);
                    bwd_tile(c, K + j0 * kst, V + j0 * vst, bk, j0, i0, QT + qb * D * BQ, dOT + qb * D * BQ,
                             delta + i0, lse2 + i0, P, dS);
                    const int lo = g->causal && j0 == i0 ? TRI_KLO : TRI_NONE, hi = lo ? TRI_KHI : TRI_NONE;
                    tile_gemm_tri(lo, bk, (int)D, bq, P, BQ, 1, dO + i0 * dost, dost, dV + j0 * dvst, dvst, 1); /* dV += P^T dO */
                    tile_gemm_tri(lo, bk, (int)D, bq, dS, BQ, 1, Q + i0 * qst, qst, dK + j0 * dkst, dkst, 1);  /* dK += dS^T Q */
                    tile_gemm_tri(hi, bq, (int)D, bk, dS, 1, BQ, K + j0 * kst, kst, dQ + i0 * dqst, dqst, 1);  /* dQ += dS K */
                }
            }
            fm_sdpa_scale_rows(dQ, Tq, D, dqst, (float)g->scale);
        }
        fm_sdpa_scale_rows(dK, Tk, D, dkst, (float)g->scale);
    }
    free(buf);
}

/* Split mode, for few (batch, kv head) pairs: pass 1 gives each (b, kv head, key
 * block) task its dK/dV rows; pass 2 gives each (b, head, query block) task its dQ
 * rows. P and dS are recomputed in pass 2, the price of using every thread. */
static void bwd_kv_range(void *vctx, int64_t t0, int64_t t1, int tid) {
    bwd_ctx *c = vctx;
    const fm_sdpa_io *g = c->io;
    const int64_t D = g->D, Tq = g->Tq, Tk = g->Tk, group = g->H / g->Hkv;
    const int64_t dkst = g->ldk.st, dvst = g->ldv.st;
    float *buf = NULL;
    size_t nflt = (size_t)(2 * BQ * D + 2 * BQ + 2 * BK * BQ);
    if (posix_memalign((void **)&buf, 64, nflt * sizeof(float)) != 0) { c->oom = 1; return; }
    float *qt = buf, *dot = qt + BQ * D, *delta = dot + BQ * D, *lse2 = delta + BQ, *P = lse2 + BQ, *dS = P + BK * BQ;
    for (int64_t t = t0; t < t1; t++) {
        int64_t kb = zigzag(t % c->nkb, c->nkb), bhk = t / c->nkb, b = bhk / g->Hkv, hk = bhk % g->Hkv;
        int64_t j0 = kb * BK;
        int bk = (int)min64(BK, Tk - j0);
        const float *K = (const float *)g->k + fm_sdpa_row(g->lk, b, hk, j0);
        const float *V = (const float *)g->v + fm_sdpa_row(g->lv, b, hk, j0);
        float *dK = (float *)g->dk + fm_sdpa_row(g->ldk, b, hk, j0), *dV = (float *)g->dv + fm_sdpa_row(g->ldv, b, hk, j0);
        fm_sdpa_zero_rows(dK, bk, D, dkst);
        fm_sdpa_zero_rows(dV, bk, D, dvst);
        for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
            for (int64_t qb = g->causal ? j0 / BQ : 0; qb < c->nqb; qb++) {
                int64_t i0 = qb * BQ;
                int bq = (int)min64(BQ, Tq - i0);
                pack_qblock(c, b, h, i0, qt, dot, delta, lse2);
                bwd_tile(c, K, V, bk, j0, i0, qt, dot, delta, lse2, P, dS);
                const int lo = g->causal && j0 == i0 ? TRI_KLO : TRI_NONE;
                tile_gemm_tri(lo, bk, (int)D, bq, P, BQ, 1, (const float *)g->dout + fm_sdpa_row(g->ldo, b, h, i0),
                              g->ldo.st, dV, dvst, 1);
                tile_gemm_tri(lo, bk, (int)D, bq, dS, BQ, 1, (const float *)g->q + fm_sdpa_row(g->lq, b, h, i0), g->lq.st,
                              dK, dkst, 1);
            }
        }
        fm_sdpa_scale_rows(dK, bk, D, dkst, (float)g->scale);
    }
    free(buf);
}

static void bwd_q_range(void *vctx, int64_t t0, int64_t t1, int tid) {
    bwd_ctx *c = vctx;
    const fm_sdpa_io *g = c->io;
    const int64_t D = g->D, Tq = g->Tq, Tk = g->Tk, group = g->H / g->Hkv;
    const int64_t kst = g->lk.st, vst = g->lv.st, dqst = g->ldq.st;
    float *buf = NULL;
    size_t nflt = (size_t)(2 * BQ * D + 2 * BQ + 2 * BK * BQ);
    if (posix_memalign((void **)&buf, 64, nflt * sizeof(float)) != 0) { c->oom = 1; return; }
    float *qt = buf, *dot = qt + BQ * D, *delta = dot + BQ * D, *lse2 = delta + BQ, *P = lse2 + BQ, *dS = P + BK * BQ;
    for (int64_t t = t0; t < t1; t++) {
        int64_t qb = zigzag(t % c->nqb, c->nqb), bh = t / c->nqb, b = bh / g->H, h = bh % g->H, hk = h / group;
        int64_t i0 = qb * BQ;
        int bq = (int)min64(BQ, Tq - i0);
        const float *K = (const float *)g->k + fm_sdpa_row(g->lk, b, hk, 0);
        const float *V = (const float *)g->v + fm_sdpa_row(g->lv, b, hk, 0);
        float *dQ = (float *)g->dq + fm_sdpa_row(g->ldq, b, h, i0);
        fm_sdpa_zero_rows(dQ, bq, D, dqst);
        pack_qblock(c, b, h, i0, qt, dot, delta, lse2);
        int64_t kend = g->causal ? min64(Tk, i0 + bq) : Tk;
        for (int64_t j0 = 0; j0 < kend; j0 += BK) {
            int bk = (int)min64(BK, kend - j0);
            bwd_tile(c, K + j0 * kst, V + j0 * vst, bk, j0, i0, qt, dot, delta, lse2, P, dS);
            tile_gemm_tri(g->causal && j0 == i0 ? TRI_KHI : TRI_NONE, bq, (int)D, bk, dS, 1, BQ, K + j0 * kst, kst, dQ,
                          dqst, 1);
        }
        fm_sdpa_scale_rows(dQ, bq, D, dqst, (float)g->scale);
    }
    free(buf);
}

/* Owner mode needs enough (batch, kv head) pairs to keep the threads busy. The
 * choice depends on the shape only, never on the thread count, so results are
 * the same bits for any FATHOM_NUM_THREADS. */
#define SDPA_OWNER_MIN_TASKS 16

int SDPA_BACKWARD(const fm_sdpa_io *io) {
    bwd_ctx c = {io, (io->Tq + BQ - 1) / BQ, (io->Tk + BK - 1) / BK, 0};
    if (io->B * io->Hkv >= SDPA_OWNER_MIN_TASKS) {
        fm_parallel_for(io->B * io->Hkv, 1, bwd_owner_range, &c);
    } else {
        fm_parallel_for(io->B * io->Hkv * c.nkb, 1, bwd_kv_range, &c);
        fm_parallel_for(io->B * io->H * c.nqb, 1, bwd_q_range, &c);
    }
    return c.oom ? -1 : 0;
}
