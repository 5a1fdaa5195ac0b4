/* The AVX-512 kernels against the AVX2 ones and the scalar reference, called
 * directly (not through FATHOM_ISA), on inputs that hit every tail length and
 * the special values (NaN, +-inf, -0, denormals, the exp/GELU cut-offs):
 * - elementwise (forward, backward, binary, where): AVX-512 is bitwise the
 *   AVX2 result (same arithmetic per element), and both are within tolerance
 *   of the double scalar reference;
 * - dtype conversions: bitwise the scalar conversion at every level (NaN:
 *   still NaN);
 * - AdamW (f32): bitwise the scalar update;
 * - softmax/log-softmax/cross-entropy rows: 16-lane sums, so within
 *   tolerance of a double reference (as the AVX2 rows); the AVX2 level's fused
 *   cross-entropy backward row bitwise its stats + backward row calls;
 * - fused bias + GELU(tanh) rows: bitwise the AVX2 rows;
 * - the residual add + layer norm row: bitwise, at its level, the sum stored by a
 *   plain loop followed by that level's layer norm row (sum, output, mean, rstd),
 *   with and without h, weight and bias;
 * - the one-row GEMV and the packed linear (bias, ReLU): bitwise the AVX2
 *   kernels (same sums in the same order), and within the f32 summation bound
 *   of a double reference, over tails of K, N and the rows;
 * - conv2d_fused's lanes kernel (conv_lanes.h): bitwise the AVX2 kernel over
 *   channel blocks of 1-4 vectors, input-channel passes, pools, column chunks
 *   and task splits (the op test holds both to a double reference);
 * - f32 attention (attention_simd.h at 8 and 16 lanes), forward and backward in
 *   both backward modes: bitwise the AVX2 kernels where the head size is a
 *   multiple of 16 (each element is the same FMA chain), within 1e-5 of them
 *   on head-size tails (the 16-lane code leaves a tail of < 16 columns to
 *   scalar code); test_ops checks every level against a double reference;
 * - column sums (the bias gradient's reduction): bitwise the scalar loop (each
 *   column summed in double over the rows in order), over column tails, row
 *   counts and row strides, with the special values among the inputs.
 * On a CPU with AVX2 but not the AVX-512 level, L512() names the AVX2 kernel
 * instead: the cross-level comparisons then compare AVX2 with itself, and the
 * checks against the scalar and double references test the AVX2 kernels (the
 * ones that CPU runs); AdamW is checked at every level the CPU has.
 * Skipped (exit 77) on a CPU without the AVX2 level. */
#include <stdlib.h>

#include "backend/cpu/elementwise_math.h"
#include "core/cpu_features.h"
#include "backend/cpu/adamw_simd.h"
#include "backend/cpu/conv_lanes.h"
#include "backend/cpu/conv_wino.h"
#include "backend/cpu/gemv_avx2.h"
#include "backend/cpu/linear_packed.h"
#include "backend/cpu/attention_cpu.h"
#include "fathom/tensor.h"
#include "test_util.h"

void fm_convert_f32_to_f16_avx2(const float *src, uint16_t *dst, size_t n);
void fm_convert_f16_to_f32_avx2(const uint16_t *src, float *dst, size_t n);
void fm_convert_f32_to_bf16_avx2(const float *src, uint16_t *dst, size_t n);
void fm_convert_bf16_to_f32_avx2(const uint16_t *src, float *dst, size_t n);
void fm_convert_f32_to_f16_avx512(const float *src, uint16_t *dst, size_t n);
void fm_convert_f16_to_f32_avx512(const uint16_t *src, float *dst, size_t n);
void fm_convert_f32_to_bf16_avx512(const float *src, uint16_t *dst, size_t n);
void fm_convert_bf16_to_f32_avx512(const uint16_t *src, float *dst, size_t n);
void fm_convert_f32_to_bf16_avx512bf16(const float *src, uint16_t *dst, size_t n);

void fm_softmax_row_f32_avx2(const float *x, float *y, int64_t n, int log_mode, int stream);
void fm_softmax_row_f32_avx512(const float *x, float *y, int64_t n, int log_mode, int stream);
void fm_softmax_bwd_row_f32_avx2(const float *dy, const float *y, float *dx, int64_t n, int log_mode, int stream);
void fm_softmax_bwd_row_f32_avx512(const float *dy, const float *y, float *dx, int64_t n, int log_mode, int stream);
void fm_ce_row_stats_f32_avx2(const float *x, int64_t n, float *max_out, float *sumexp_out, float *sumx_out);
void fm_ce_bwd_row_f32_avx2(const float *x, float *dx, int64_t n, float m, float scale, float shift, int stream);
void fm_ce_bwd_fused_row_f32_avx2(const float *x, float *dx, int64_t n, double g, float shift, int stream);
void fm_ce_row_stats_f32_avx512(const float *x, int64_t n, float *max_out, float *sumexp_out, float *sumx_out);
void fm_ce_bwd_row_f32_avx512(const float *x, float *dx, int64_t n, float m, float scale, float shift, int stream);
void fm_ce_bwd_fused_row_f32_avx512(const float *x, float *dx, int64_t n, double g, float shift, int stream);

void fm_bias_gelu_row_f32_avx2(const float *x, const float *b, float *y, int64_t n);
void fm_bias_gelu_row_f32_avx512(const float *x, const float *b, float *y, int64_t n);
void fm_bias_gelu_bwd_row_f32_avx2(const float *dy, const float *x, const float *b, float *dx, float *db_acc, int64_t n);
void fm_bias_gelu_bwd_row_f32_avx512(const float *dy, const float *x, const float *b, float *dx, float *db_acc,
                                     int64_t n);

void fm_colsum_f32_avx2(const float *x, int64_t R, int64_t ld, int64_t nc, double *acc);
void fm_colsum_f32_avx512(const float *x, int64_t R, int64_t ld, int64_t nc, double *acc);
double fm_rowsum_f32_avx2(const float *p, int64_t n);
double fm_rowsum_f32_avx512(const float *p, int64_t n);

static bool w512; /* the CPU has the AVX-512 level */
/* the AVX-512 kernel f, or its AVX2 twin where the CPU has no AVX-512 */
#define L512(f) (w512 ? f##_avx512 : f##_avx2)

#define N 1037 /* 64 * 16 + 13: full vectors of both widths and a tail */

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24) - 0.5);
}

static void fill(float *x, uint64_t seed, float scale) {
    static const float special[] = {0.0f, -0.0f, 1e-40f, -1e-40f, INFINITY, -INFINITY, NAN, 88.7f, -87.4f,
                                    -100.0f, 100.0f, 13.0f, -13.0f, 0.3f, -0.3f, 20.0f, -20.0f, 3e38f, -3e38f};
    for (int i = 0; i < N; i++) x[i] = frand(&seed) * scale;
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[i * 37 % N] = special[i];
}

static bool same_bits(const float *a, const float *b, int n, int *where) {
    for (int i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) { *where = i; return false; }
    return true;
}

/* |got - ref| within tol relative (NaN where the reference is NaN) */
static bool near_ref(float got, double ref, double tol) {
    if (ref != ref) return got != got;
    ref = (float)ref; /* beyond FLT_MAX: inf */
    if (isinf(ref)) return got == ref;
    return fabs(got - ref) <= tol * (1.0 + fabs(ref));
}

static void test_unary(void) {
    static const fm_op_id ops[] = {FM_OP_NEG, FM_OP_ABS, FM_OP_EXP, FM_OP_SQRT, FM_OP_RSQRT, FM_OP_TANH, FM_OP_SIGMOID,
                                   FM_OP_RELU, FM_OP_LEAKY_RELU, FM_OP_GELU, FM_OP_GELU_TANH, FM_OP_SILU, FM_OP_CLAMP,
                                   FM_OP_COPY};
    static float x[N], dy[N], y2[N], y5[N], d2[N], d5[N];
    fm_unary_attrs at = {.a = -0.25, .b = 0.5};
    for (int s = 0; s < 2; s++) {
        fill(x, 11 + (uint64_t)s, s ? 30.0f : 6.0f);
        fill(dy, 99, 2.0f);
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            fm_op_id op = ops[o];
            if (op == FM_OP_LEAKY_RELU) at.a = 0.01;
            else at.a = -0.25;
            for (int n = 1; n <= N; n += n < 40 ? 1 : 331) { /* every tail of both widths, then long runs */
                memset(y2, 0x55, sizeof y2);
                memset(y5, 0x55, sizeof y5);
                CHECK(fm_ew_unary_f32_avx2(op, &at, x, y2, n, false) && L512(fm_ew_unary_f32)(op, &at, x, y5, n, false));
                int w = -1;
                CHECK_MSG(same_bits(y2, y5, N, &w), "unary op %d n %d: x %g avx2 %g avx512 %g at %d", (int)op, n,
                          w >= 0 ? x[w] : 0, w >= 0 ? y2[w] : 0, w >= 0 ? y5[w] : 0, w);
            }
            L512(fm_ew_unary_f32)(op, &at, x, y5, N, false);
            fm_ew_unary_f32_avx2(op, &at, x, y2, N, false);
            int bad = -1;
            for (int i = 0; i < N && bad < 0; i++) /* large inputs: only the ops defined for them */
                if (!near_ref(y5[i], fm_ew_unary_scalar(op, &at, x[i]), 2e-6) && fabsf(x[i]) < 1e30f) bad = i;
            CHECK_MSG(bad < 0, "unary op %d vs scalar: x %g got %g ref %g", (int)op, bad >= 0 ? x[bad] : 0,
                      bad >= 0 ? y5[bad] : 0, bad >= 0 ? fm_ew_unary_scalar(op, &at, x[bad]) : 0);
            if (op == FM_OP_ABS || op == FM_OP_SQRT || op == FM_OP_RSQRT || op == FM_OP_CLAMP || op == FM_OP_COPY) continue;
            bool b2 = fm_ew_unary_bwd_f32_avx2(op, &at, dy, x, y2, d2, N, false);
            bool b5 = L512(fm_ew_unary_bwd_f32)(op, &at, dy, x, y5, d5, N, false);
            CHECK(b2 == b5);
            int w = -1;
            if (b2) CHECK_MSG(same_bits(d2, d5, N, &w), "backward op %d: x %g at %d", (int)op, w >= 0 ? x[w] : 0, w);
        }
    }
}

static void test_binary(void) {
    static const fm_op_id ops[] = {FM_OP_ADD, FM_OP_SUB, FM_OP_MUL, FM_OP_DIV, FM_OP_MAXIMUM, FM_OP_MINIMUM};
    static float a[N], b[N], y2[N], y5[N];
    fill(a, 5, 10.0f);
    fill(b, 6, 10.0f);
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (int n = 1; n <= N; n += n < 40 ? 1 : 331) {
            memset(y2, 0, sizeof y2);
            memset(y5, 0, sizeof y5);
            CHECK(fm_ew_binary_f32_avx2(ops[o], a, b, y2, n, false) && L512(fm_ew_binary_f32)(ops[o], a, b, y5, n, false));
            int w = -1;
            CHECK_MSG(same_bits(y2, y5, N, &w), "binary op %d n %d at %d", (int)ops[o], n, w);
            if (ops[o] == FM_OP_MAXIMUM || ops[o] == FM_OP_MINIMUM) continue;
            int bad = -1; /* the four IEEE operations: exactly the scalar result (any NaN for NaN) */
            for (int i = 0; i < n && bad < 0; i++) {
                float r = ops[o] == FM_OP_ADD ? a[i] + b[i] : ops[o] == FM_OP_SUB ? a[i] - b[i]
                        : ops[o] == FM_OP_MUL ? a[i] * b[i] : a[i] / b[i];
                if (r != r ? y2[i] == y2[i] : memcmp(&r, &y2[i], sizeof r) != 0) bad = i;
            }
            CHECK_MSG(bad < 0, "binary op %d n %d vs scalar at %d", (int)ops[o], n, bad);
        }
    for (int i = 0; i < N; i++) /* where: the scalar choice, bit for bit */
        a[i] = (float)(i % 3 == 0) * (i % 7 == 0 ? NAN : 1.0f);
    fm_ew_where_f32_avx2(a, b, b + 1, y2, N - 1);
    L512(fm_ew_where_f32)(a, b, b + 1, y5, N - 1);
    int w = -1;
    CHECK_MSG(same_bits(y2, y5, N - 1, &w), "where at %d", w);
    for (int i = 0; i < N - 1 && w < 0; i++) /* a NaN condition counts as true (!= 0) */
        if (memcmp(&y2[i], a[i] != 0 ? &b[i] : &b[i + 1], sizeof(float))) w = i;
    CHECK_MSG(w < 0, "where vs scalar at %d", w);
}

/* f32 -> bf16 on vcvtneps2bf16 (AVX512-BF16): bitwise the scalar conversion on every
 * class of value, a subnormal among normals in a vector included (the instruction
 * alone would give zero for it), and at every length (the masked tail) */
static void test_convert_bf16_hw(void) {
    static float x[N];
    static uint16_t h[N], hw[N];
    fill(x, 11, 1000.0f);
    const uint32_t special[] = {0x00000001u, 0x80000001u, 0x007fffffu, 0x00408000u, 0x00018000u, /* subnormals, ties */
                                0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, /* inf, NaNs (a signalling one) */
                                0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x00000000u, 0x80000000u};
    for (int i = 0; i < N; i += 7) memcpy(&x[i], &special[(i / 7) % 16], 4);
    for (int n = 1; n <= N; n += n < 40 ? 1 : 331) {
        for (int i = 0; i < n; i++) h[i] = fm_f32_to_bf16(x[i]);
        memset(hw, 0, sizeof hw);
        fm_convert_f32_to_bf16_avx512bf16(x, hw, (size_t)n);
        int bad = -1;
        for (int i = 0; i < n && bad < 0; i++)
            if (h[i] != hw[i]) bad = i;
        CHECK_MSG(bad < 0, "f32->bf16 (avx512bf16) n %d at %d: %04x, scalar %04x", n, bad, bad < 0 ? 0 : hw[bad],
                  bad < 0 ? 0 : h[bad]);
        CHECK(n == N || hw[n] == 0); /* nothing past n written */
    }
    /* vectors of normals only take the instruction's path: the same values there too */
    uint64_t seed = 12;
    for (int i = 0; i < N; i++) x[i] = frand(&seed) * 3.0f;
    fm_convert_f32_to_bf16_avx512bf16(x, hw, N);
    int bad = -1;
    for (int i = 0; i < N && bad < 0; i++)
        if (hw[i] != fm_f32_to_bf16(x[i])) bad = i;
    CHECK_MSG(bad < 0, "f32->bf16 (avx512bf16), normals at %d", bad);
}

static void test_convert(void) {
    static float x[N], r[N], r2[N], r5[N];
    static uint16_t h[N], h2[N], h5[N];
    fill(x, 7, 1000.0f);
    for (int i = 0; i < N; i += 5) x[i] *= 1e-5f; /* f16 subnormals */
    for (int n = 1; n <= N; n += n < 40 ? 1 : 331) {
        for (int i = 0; i < n; i++) h[i] = fm_f32_to_bf16(x[i]);
        fm_convert_f32_to_bf16_avx2(x, h2, (size_t)n);
        L512(fm_convert_f32_to_bf16)(x, h5, (size_t)n);
        CHECK_MSG(!memcmp(h, h2, (size_t)n * 2) && !memcmp(h, h5, (size_t)n * 2), "f32->bf16 n %d", n);
        for (int i = 0; i < n; i++) r[i] = fm_bf16_to_f32(h[i]);
        fm_convert_bf16_to_f32_avx2(h, r2, (size_t)n);
        L512(fm_convert_bf16_to_f32)(h, r5, (size_t)n);
        CHECK_MSG(!memcmp(r, r2, (size_t)n * 4) && !memcmp(r, r5, (size_t)n * 4), "bf16->f32 n %d", n);
        fm_convert_f32_to_f16_avx2(x, h2, (size_t)n);
        L512(fm_convert_f32_to_f16)(x, h5, (size_t)n);
        int bad = -1;
        for (int i = 0; i < n && bad < 0; i++) {
            uint16_t ref = fm_f32_to_f16(x[i]);
            bool nan = x[i] != x[i];
            if (nan ? !((h2[i] & 0x7c00) == 0x7c00 && (h2[i] & 0x3ff) && h2[i] == h5[i]) : (h2[i] != ref || h5[i] != ref))
                bad = i;
        }
        CHECK_MSG(bad < 0, "f32->f16 n %d: x %g ref %04x avx2 %04x avx512 %04x", n, bad >= 0 ? x[bad] : 0,
                  bad >= 0 ? fm_f32_to_f16(x[bad]) : 0, bad >= 0 ? h2[bad] : 0, bad >= 0 ? h5[bad] : 0);
        for (int i = 0; i < n; i++) h[i] = fm_f32_to_f16(x[i]);
        fm_convert_f16_to_f32_avx2(h, r2, (size_t)n);
        L512(fm_convert_f16_to_f32)(h, r5, (size_t)n);
        bad = -1;
        for (int i = 0; i < n && bad < 0; i++) {
            float ref = fm_f16_to_f32(h[i]);
            if (ref != ref ? !(r2[i] != r2[i] && r5[i] != r5[i]) : (memcmp(&ref, &r2[i], 4) || memcmp(&ref, &r5[i], 4)))
                bad = i;
        }
        CHECK_MSG(bad < 0, "f16->f32 n %d at %d", n, bad);
    }
}

/* softmax rows (sums in 16 lanes: tolerance against a double reference),
 * every row length up to 40 and long ones, streamed and not */
static void test_softmax(void) {
    static _Alignas(64) float x[N], dy[N], y5[N + 16], d5[N + 16], y2[N], d2[N];
    static double ref[N];
    uint64_t s = 3;
    for (int i = 0; i < N; i++) { x[i] = frand(&s) * 20.0f; dy[i] = frand(&s); }
    for (int n = 1; n <= N; n += n < 40 ? 1 : 333) {
        for (int lm = 0; lm < 2; lm++)
            for (int stream = 0; stream < 2; stream++) {
                float *out = stream ? y5 + 8 : y5; /* streamed rows only 32-byte aligned: stored normally */
                double m = -INFINITY, sum = 0;
                for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
                for (int i = 0; i < n; i++) sum += exp((double)x[i] - m);
                for (int i = 0; i < n; i++) ref[i] = lm ? (double)x[i] - m - log(sum) : exp((double)x[i] - m) / sum;
                L512(fm_softmax_row_f32)(x, out, n, lm, stream && n % 8 == 0);
                fm_softmax_row_f32_avx2(x, y2, n, lm, 0);
                int bad = -1;
                for (int i = 0; i < n && bad < 0; i++)
                    if (!near_ref(out[i], ref[i], 2e-6) || !near_ref(y2[i], ref[i], 2e-6)) bad = i;
                CHECK_MSG(bad < 0, "softmax n %d log %d stream %d at %d: %g vs %g", n, lm, stream, bad,
                          bad >= 0 ? out[bad] : 0, bad >= 0 ? ref[bad] : 0);
                /* backward: dx = y (dy - sum dy y) or dy - exp(y) sum dy */
                double sd = 0;
                for (int i = 0; i < n; i++) sd += lm ? dy[i] : (double)dy[i] * out[i];
                L512(fm_softmax_bwd_row_f32)(dy, out, d5, n, lm, 0);
                fm_softmax_bwd_row_f32_avx2(dy, out, d2, n, lm, 0);
                bad = -1;
                for (int i = 0; i < n && bad < 0; i++) {
                    double r = lm ? dy[i] - exp((double)out[i]) * sd : out[i] * (dy[i] - sd);
                    if (fabs(d5[i] - r) > 1e-5 * (1 + fabs(sd)) || fabs(d2[i] - r) > 1e-5 * (1 + fabs(sd))) bad = i;
                }
                CHECK_MSG(bad < 0, "softmax backward n %d log %d at %d", n, lm, bad);
            }
        float m, se, sx;
        L512(fm_ce_row_stats_f32)(x, n, &m, &se, &sx);
        double rm = -INFINITY, rse = 0, rsx = 0;
        for (int i = 0; i < n; i++) rm = x[i] > rm ? x[i] : rm;
        for (int i = 0; i < n; i++) { rse += exp((double)x[i] - rm); rsx += x[i]; }
        CHECK_MSG(m == (float)rm && near_ref(se, rse, 1e-6) && fabs(sx - rsx) < 1e-5 * n * 10, "ce stats n %d", n);
        L512(fm_ce_bwd_row_f32)(x, d5, n, m, 0.5f, 0.25f, 0);
        int bad = -1;
        for (int i = 0; i < n && bad < 0; i++)
            if (!near_ref(d5[i], exp((double)x[i] - m) * 0.5 - 0.25, 2e-6)) bad = i;
        CHECK_MSG(bad < 0, "ce backward n %d at %d", n, bad);
        /* the AVX2 level's whole backward row: bitwise its stats + backward row, streamed and not */
        for (int st = 0; st < 2; st++) {
            if (st && n % 8) continue;
            fm_ce_row_stats_f32_avx2(x, n, &m, &se, &sx);
            fm_ce_bwd_row_f32_avx2(x, d2, n, m, (float)(0.75 / se), 0.25f, 0);
            fm_ce_bwd_fused_row_f32_avx2(x, d5, n, 0.75, 0.25f, st);
            CHECK_MSG(!memcmp(d2, d5, sizeof(float) * (size_t)n), "ce fused backward n %d stream %d", n, st);
        }
    }
}

/* The fused cross-entropy backward row on rows wider than its stack stage (4096
 * floats: streamed rows then take the two-call path) and with -inf and NaN logits:
 * bitwise the stats + backward row calls. */
static void test_ce_fused_long(void) {
    enum { W = 8192 + 16 };
    static _Alignas(64) float x[W], a[W], b[W];
    const int ns[] = {4096, 4104, 8192 + 13, 8192 + 16};
    uint64_t s = 11;
    for (int i = 0; i < W; i++) x[i] = frand(&s) * 30.0f;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int special = 0; special < 3; special++)
            for (int st = 0; st < 2; st++) {
                int n = ns[k];
                if (st && n % 8) continue;
                float keep = x[n / 3];
                if (special) x[n / 3] = special == 1 ? -INFINITY : NAN;
                float m, se, sx;
                fm_ce_row_stats_f32_avx2(x, n, &m, &se, &sx);
                fm_ce_bwd_row_f32_avx2(x, a, n, m, (float)(1.0 / 3.0 / se), 1e-3f, 0);
                fm_ce_bwd_fused_row_f32_avx2(x, b, n, 1.0 / 3.0, 1e-3f, st);
                CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)n), "ce fused backward n %d special %d stream %d", n,
                          special, st);
                if (w512) { /* the 16-lane twin against its own two calls */
                    fm_ce_row_stats_f32_avx512(x, n, &m, &se, &sx);
                    fm_ce_bwd_row_f32_avx512(x, a, n, m, (float)(1.0 / 3.0 / se), 1e-3f, 0);
                    fm_ce_bwd_fused_row_f32_avx512(x, b, n, 1.0 / 3.0, 1e-3f, st);
                    CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)n), "ce fused backward (avx512) n %d special %d stream %d",
                              n, special, st);
                }
                x[n / 3] = keep;
            }
    for (int n = 1; w512 && n <= 100; n++) /* short rows: the 16-lane tails */
        for (int st = 0; st < 2; st++) {
            float m, se, sx;
            fm_ce_row_stats_f32_avx512(x, n, &m, &se, &sx);
            fm_ce_bwd_row_f32_avx512(x, a, n, m, (float)(0.25 / se), 1e-3f, 0);
            fm_ce_bwd_fused_row_f32_avx512(x, b, n, 0.25, 1e-3f, st);
            CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)n), "ce fused backward (avx512) n %d stream %d", n, st);
        }
}

/* SGD f32 in every form (no buffer; the buffer's first step; momentum; Nesterov): bitwise
 * the scalar loops of optim_cpu.c (written out here the same way, no FMA) */
static void test_sgd(void (*kernel)(const fm_sgd_args *, int64_t, int64_t), const char *level) {
    static float p[N], g[N], m1[N], rp[N], rm1[N];
    for (int form = 0; form < 5; form++) { /* 0 no buffer, 1 first, 2 first + nesterov, 3 momentum, 4 nesterov */
        uint64_t s = 23 + (uint64_t)form;
        for (int i = 0; i < N; i++) {
            rp[i] = p[i] = frand(&s);
            g[i] = frand(&s) * (i % 5 ? 1.0f : 1e-6f);
            rm1[i] = m1[i] = frand(&s) * 0.1f;
        }
        fm_sgd_args a = {p, form ? m1 : NULL, g, 0.05f, 1e-4f, 0.9f, (float)(1.0 - 0.1), form == 1 || form == 2,
                         form == 2 || form == 4};
        for (int b = 0, e; b < N; b = e) { /* ranges of varied lengths (1 to 40), then the rest */
            e = b + (b < 820 ? b % 40 + 1 : N - b);
            if (e > N) e = N;
            kernel(&a, b, e);
            for (int i = b; i < e; i++) {
                float d = g[i] + a.wd * rp[i];
                if (!form) { rp[i] -= a.lr * d; continue; }
                float bb = a.first ? d : a.mom * rm1[i] + a.damp * d;
                rm1[i] = bb;
                rp[i] -= a.lr * (a.nesterov ? d + a.mom * bb : bb);
            }
        }
        int w = -1;
        CHECK_MSG(same_bits(p, rp, N, &w) && same_bits(m1, rm1, N, &w), "sgd form %d (%s) differs from the scalar loop at %d",
                  form, level, w);
    }
}

/* AdamW f32: bitwise the scalar loop of optim.c (same formula, no FMA), over every tail */
static void test_adamw(void (*kernel)(const fm_adamw_args *, int64_t, int64_t), const char *level) {
    for (int adam = 0; adam < 2; adam++) { /* AdamW, then Adam's L2 form */
        static float p[N], g[N], m1[N], m2[N], rp[N], rm1[N], rm2[N];
        uint64_t s = 17;
        for (int i = 0; i < N; i++) {
            rp[i] = p[i] = frand(&s);
            g[i] = frand(&s) * (i % 5 ? 1.0f : 1e-6f);
            rm1[i] = m1[i] = frand(&s) * 0.1f;
            rm2[i] = m2[i] = fabsf(frand(&s)) * 0.01f * (i % 7 != 0);
        }
        fm_adamw_args a = {p, m1, m2, g, 0.9f, 0.999f, (float)(1.0 - 0.9), (float)(1.0 - 0.999), 1e-8f,
                           (float)(3e-4 / (1.0 - pow(0.9, 3))), (float)(1.0 / sqrt(1.0 - pow(0.999, 3))),
                           (float)(1.0 - 3e-4 * 0.1), adam == 1, 0.01f};
        for (int b = 0, e; b < N; b = e) { /* ranges of varied lengths (1 to 40), then the rest */
            e = b + (b < 820 ? b % 40 + 1 : N - b);
            if (e > N) e = N;
            kernel(&a, b, e);
            for (int i = b; i < e; i++) {
                float gi = adam ? g[i] + a.wd * rp[i] : g[i];
                float m = a.b1 * rm1[i] + a.ob1 * gi;
                float v = a.b2 * rm2[i] + a.ob2 * gi * gi;
                rm1[i] = m;
                rm2[i] = v;
                if (adam) rp[i] -= a.step_size * m / (sqrtf(v) * a.rbc2 + a.eps);
                else rp[i] = rp[i] * a.decay - a.step_size * m / (sqrtf(v) * a.rbc2 + a.eps);
            }
        }
        int w = -1;
        CHECK_MSG(same_bits(p, rp, N, &w) && same_bits(m1, rm1, N, &w) && same_bits(m2, rm2, N, &w),
                  "%s (%s) differs from the scalar loop at %d", adam ? "adam" : "adamw", level, w);
    }
}

/* fused bias + GELU(tanh) rows (fused_avx512.c): bitwise the AVX2 rows, forward,
 * backward and the bias-gradient accumulation, at every tail length; and within
 * tolerance of the double formula x/(1+e^{-2u}) (the scalar reference) */
static void test_bias_gelu(void) {
    static float x[N], b[N], dy[N], y2[N], y5[N], d2[N], d5[N], a2[N], a5[N];
    fill(x, 21, 8.0f);
    fill(b, 22, 2.0f);
    fill(dy, 23, 2.0f);
    for (int n = 1; n <= N; n += n < 40 ? 1 : 331) {
        memset(y2, 0x55, sizeof y2);
        memset(y5, 0x55, sizeof y5);
        fm_bias_gelu_row_f32_avx2(x, b, y2, n);
        L512(fm_bias_gelu_row_f32)(x, b, y5, n);
        int w = -1;
        CHECK_MSG(same_bits(y2, y5, N, &w), "bias+gelu n %d at %d", n, w);
        for (int i = 0; i < N; i++) a2[i] = a5[i] = (float)i;
        fm_bias_gelu_bwd_row_f32_avx2(dy, x, b, d2, a2, n);
        L512(fm_bias_gelu_bwd_row_f32)(dy, x, b, d5, a5, n);
        CHECK_MSG(same_bits(d2, d5, n, &w) && same_bits(a2, a5, N, &w), "bias+gelu backward n %d at %d", n, w);
        L512(fm_bias_gelu_bwd_row_f32)(dy, x, b, d5, NULL, n);
        CHECK_MSG(same_bits(d2, d5, n, &w), "bias+gelu backward without db n %d at %d", n, w);
    }
    L512(fm_bias_gelu_row_f32)(x, b, y5, N);
    int bad = -1;
    for (int i = 0; i < N && bad < 0; i++) {
        double v = (double)x[i] + (double)b[i];
        if (!(fabs(v) < 30)) continue; /* finite, away from the clamps */
        double ref = v / (1.0 + exp(-2.0 * 0.7978845608028654 * (v + 0.044715 * v * v * v)));
        if (!near_ref(y5[i], ref, 1e-5)) bad = i;
    }
    CHECK_MSG(bad < 0, "bias+gelu vs double at %d: got %g", bad, bad >= 0 ? y5[bad] : 0);
}

void fm_add_ln_row_f32_avx2(const float *x, const float *h, const float *w, const float *b, float *s, float *y,
                            int64_t n, float eps, float *mean_out, float *rstd_out);
void fm_add_ln_row_f32_avx512(const float *x, const float *h, const float *w, const float *b, float *s, float *y,
                              int64_t n, float eps, float *mean_out, float *rstd_out);
void fm_layernorm_row_f32_avx2(const float *x, const float *w, const float *b, float *y, int64_t n, float eps,
                               float *mean_out, float *rstd_out, int stream);
void fm_layernorm_row_f32_avx512(const float *x, const float *w, const float *b, float *y, int64_t n, float eps,
                                 float *mean_out, float *rstd_out, int stream);

/* add + layer norm (fused_avx*.c) against the add, then the same level's layer norm row */
static void test_add_ln(void) {
    static float x[N], h[N], w[N], b[N], s1[N], s2[N], y1[N], y2[N];
    fill(x, 31, 3.0f);
    fill(h, 32, 2.0f);
    fill(w, 33, 1.5f);
    fill(b, 34, 0.5f);
    for (int n = 1; n <= N; n += n < 70 ? 1 : 193)
        for (int v = 0; v < 8; v++) { /* bit 0: h, bit 1: weight, bit 2: bias */
            const float *hp = v & 1 ? h : NULL, *wp = v & 2 ? w : NULL, *bp = v & 4 ? b : NULL;
            memset(s1, 0x55, sizeof s1);
            memset(y1, 0x55, sizeof y1);
            memset(y2, 0x55, sizeof y2);
            for (int i = 0; i < n; i++) s2[i] = hp ? x[i] + h[i] : x[i];
            float m1, r1, m2, r2;
            L512(fm_add_ln_row_f32)(x, hp, wp, bp, s1, y1, n, 1e-5f, &m1, &r1);
            L512(fm_layernorm_row_f32)(s2, wp, bp, y2, n, 1e-5f, &m2, &r2, 0);
            int at = -1;
            CHECK_MSG((!hp || same_bits(s1, s2, n, &at)) && same_bits(y1, y2, N, &at) && same_bits(&m1, &m2, 1, &at) &&
                          same_bits(&r1, &r2, 1, &at),
                      "add+layer norm n %d variant %d at %d", n, v, at);
        }
}

void fm_add_ln_bwd_row_f32_avx512(const float *dy, const float *dsum, const float *s, const float *w, float mean,
                                  float rstd, float *g, float *dw_acc, float *db_acc, int64_t n);
void fm_layernorm_bwd_row_f32_avx512(const float *dy, const float *x, const float *w, float mean, float rstd,
                                     float *dx, float *dw_acc, float *db_acc, int64_t n, int stream);

/* add + layer norm backward (AVX-512 level only; the AVX2 row has its own arithmetic):
 * bitwise the AVX-512 layer norm backward with the sum's gradient added to each
 * rounded element, the weight and bias gradient accumulators included */
static void test_add_ln_bwd(void) {
    static float dy[N], ds[N], sm[N], w[N], g1[N], g2[N], dw1[N], dw2[N], db1[N], db2[N];
    fill(dy, 41, 1.0f);
    fill(ds, 42, 0.7f);
    fill(sm, 43, 3.0f);
    fill(w, 44, 1.5f);
    const float mean = 0.125f, rstd = 0.61f;
    for (int n = 1; n <= N; n += n < 70 ? 1 : 193)
        for (int v = 0; v < 16; v++) { /* bit 0: dy, bit 1: dsum, bit 2: weight, bit 3: dw/db accumulators */
            const float *dyp = v & 1 ? dy : NULL, *dsp = v & 2 ? ds : NULL, *wp = v & 4 ? w : NULL;
            const bool acc = v & 8;
            for (int i = 0; i < n; i++) dw1[i] = dw2[i] = 0.25f * (float)(i % 5), db1[i] = db2[i] = -0.5f + (float)(i % 3);
            memset(g1, 0x55, sizeof g1);
            memset(g2, 0x55, sizeof g2);
            fm_add_ln_bwd_row_f32_avx512(dyp, dsp, sm, wp, mean, rstd, g1, acc ? dw1 : NULL, acc ? db1 : NULL, n);
            if (dyp) fm_layernorm_bwd_row_f32_avx512(dyp, sm, wp, mean, rstd, g2, acc ? dw2 : NULL, acc ? db2 : NULL, n, 0);
            for (int i = 0; i < n; i++) g2[i] = dyp ? (dsp ? g2[i] + dsp[i] : g2[i]) : dsp ? dsp[i] : 0.0f;
            int at = -1;
            CHECK_MSG(same_bits(g1, g2, N, &at) && same_bits(dw1, dw2, n, &at) && same_bits(db1, db2, n, &at),
                      "add+layer norm backward n %d variant %d at %d", n, v, at);
        }
    /* dx written over dsum (the in-place form the row allows) */
    fm_add_ln_bwd_row_f32_avx512(dy, ds, sm, w, mean, rstd, g1, NULL, NULL, N);
    memcpy(g2, ds, sizeof g2);
    fm_add_ln_bwd_row_f32_avx512(dy, g2, sm, w, mean, rstd, g2, NULL, NULL, N);
    int at = -1;
    CHECK_MSG(same_bits(g1, g2, N, &at), "add+layer norm backward in place at %d", at);
}

/* |got - sum| within 2 K eps of the sum of magnitudes (the f32 summation bound, with room) */
static bool within_sum_bound(float got, double sum, double mag, int64_t K) {
    return fabs((double)got - sum) <= 2.0 * (double)(K + 2) * 0x1p-24 * mag + 1e-30;
}

/* one-row GEMV y = W x + beta y0 (gemv_avx2.h), N rows x K with row stride K + 3 */
static void test_gemv(void) {
    const int64_t Ks[] = {1, 7, 8, 9, 15, 16, 17, 24, 31, 33, 128, 300, 517};
    const int64_t Ns[] = {1, 3, 4, 5, 7, 8, 9, 17, 33, 130};
    uint64_t seed = 5;
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (int bi = 0; bi < 2; bi++) {
                const int64_t K = Ks[ki], Nr = Ns[ni], ldw = K + 3;
                const float beta = bi ? 0.75f : 0.0f;
                float *W = malloc(sizeof(float) * (size_t)(Nr * ldw)), *x = malloc(sizeof(float) * (size_t)K);
                float *y0 = malloc(sizeof(float) * (size_t)Nr), *y2 = malloc(sizeof(float) * (size_t)Nr),
                      *y5 = malloc(sizeof(float) * (size_t)Nr);
                if (!W || !x || !y0 || !y2 || !y5) { CHECK(!"out of memory"); return; }
                for (int64_t i = 0; i < Nr * ldw; i++) W[i] = frand(&seed);
                for (int64_t i = 0; i < K; i++) x[i] = frand(&seed);
                for (int64_t i = 0; i < Nr; i++) y0[i] = frand(&seed);
                memcpy(y2, y0, sizeof(float) * (size_t)Nr), memcpy(y5, y0, sizeof(float) * (size_t)Nr);
                fm_gemv_rows_f32_avx2(Nr, K, W, ldw, x, beta, y2);
                L512(fm_gemv_rows_f32)(Nr, K, W, ldw, x, beta, y5);
                int w = -1;
                CHECK_MSG(same_bits(y2, y5, (int)Nr, &w), "gemv N %lld K %lld beta %g: avx512 %g avx2 %g at row %d",
                          (long long)Nr, (long long)K, beta, w >= 0 ? y5[w] : 0, w >= 0 ? y2[w] : 0, w);
                int bad = -1;
                for (int64_t n = 0; n < Nr; n++) {
                    double sum = (double)beta * y0[n], mag = fabs(sum);
                    for (int64_t k = 0; k < K; k++) sum += (double)W[n * ldw + k] * x[k], mag += fabs((double)W[n * ldw + k] * x[k]);
                    if (!within_sum_bound(y5[n], sum, mag, K)) bad = (int)n;
                }
                CHECK_MSG(bad < 0, "gemv N %lld K %lld beta %g vs double: row %d", (long long)Nr, (long long)K, beta, bad);
                free(W), free(x), free(y0), free(y2), free(y5);
            }
}

/* the packed linear y = relu?(x w^T + b) (linear_packed.h), whole and split
 * into row and panel ranges as the threads split it */
static void test_linear_packed(void) {
    const int64_t shapes[][3] = {{1, 16, 16},  {1, 130, 7},   {1, 200, 300}, {2, 64, 33},  {2, 37, 256},
                                 {3, 10, 128}, {5, 100, 257}, {6, 48, 512},  {7, 37, 300}, {13, 129, 65},
                                 {125, 20, 9}, {1, 1, 1},     {9, 17, 600}};
    uint64_t seed = 9;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int v = 0; v < 3; v++) { /* 0: bias + relu, 1: bias, 2: relu, no bias */
            const int64_t M = shapes[s][0], Nc = shapes[s][1], K = shapes[s][2], ldx = K + 1, ldy = Nc + 2;
            const int relu = v != 1;
            float *x = malloc(sizeof(float) * (size_t)(M * ldx)), *w = malloc(sizeof(float) * (size_t)(Nc * K));
            float *wp = malloc(sizeof(float) * (size_t)fm_linear_packed_numel(Nc, K)), *b = malloc(sizeof(float) * (size_t)Nc);
            float *y2 = malloc(sizeof(float) * (size_t)(M * ldy)), *y5 = malloc(sizeof(float) * (size_t)(M * ldy));
            if (!x || !w || !wp || !b || !y2 || !y5) { CHECK(!"out of memory"); return; }
            for (int64_t i = 0; i < M * ldx; i++) x[i] = frand(&seed);
            for (int64_t i = 0; i < Nc * K; i++) w[i] = frand(&seed);
            for (int64_t i = 0; i < Nc; i++) b[i] = frand(&seed);
            for (int64_t i = 0; i < M * ldy; i++) y2[i] = y5[i] = 1234.0f; /* the padding must stay */
            fm_linear_pack_f32(w, wp, Nc, K);
            const int64_t P = fm_linear_panels(Nc);
            fm_linear_packed d2 = {x, wp, v == 2 ? NULL : b, y2, M, Nc, K, ldx, ldy, relu}, d5 = d2;
            d5.y = y5;
            fm_linear_packed_f32_avx2(&d2, 0, M, 0, P);
            /* the AVX-512 one in pieces: rows [0, M/2) all panels, then rows [M/2, M) panel by panel ranges */
            const int64_t mh = M / 2;
            if (mh > 0) L512(fm_linear_packed_f32)(&d5, 0, mh, 0, P);
            for (int64_t p = 0; p < P; p += 3) L512(fm_linear_packed_f32)(&d5, mh, M, p, p + 3 < P ? p + 3 : P);
            int wh = -1;
            CHECK_MSG(same_bits(y2, y5, (int)(M * ldy), &wh), "linear packed M %lld N %lld K %lld v %d: avx512 %g avx2 %g at %d",
                      (long long)M, (long long)Nc, (long long)K, v, wh >= 0 ? y5[wh] : 0, wh >= 0 ? y2[wh] : 0, wh);
            int bad = -1;
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < ldy; j++) {
                    const float got = y5[i * ldy + j];
                    if (j >= Nc) { if (got != 1234.0f) bad = (int)(i * ldy + j); continue; }
                    double sum = v == 2 ? 0.0 : b[j], mag = fabs(sum);
                    for (int64_t k = 0; k < K; k++) sum += (double)x[i * ldx + k] * w[j * K + k], mag += fabs((double)x[i * ldx + k] * w[j * K + k]);
                    if (relu && sum < 0) sum = 0; /* the bound still holds around 0 */
                    if (!within_sum_bound(got, sum, mag, K)) bad = (int)(i * ldy + j);
                }
            CHECK_MSG(bad < 0, "linear packed M %lld N %lld K %lld v %d vs double: at %d got %g", (long long)M, (long long)Nc,
                      (long long)K, v, bad, bad >= 0 ? y5[bad] : 0);
            free(x), free(w), free(wp), free(b), free(y2), free(y5);
        }
}

/* conv2d_fused's lanes kernel, AVX-512 against AVX2, set up as conv_fused_cpu.c's run_lanes */
#pragma push_macro("N")
#undef N /* fm_conv_lanes's field */
static void test_conv_lanes(void) {
    typedef struct { int64_t N, C, O, H, W, k, pad; int pool, relu, cc; } shp; /* cc: input channels per pass (0: all) */
    const shp shapes[] = {
        {2, 1, 32, 28, 28, 3, 1, 2, 1, 0}, {2, 32, 64, 14, 14, 3, 1, 2, 1, 0}, {1, 40, 70, 9, 11, 3, 1, 2, 1, 14},
        {1, 20, 13, 6, 7, 5, 2, 0, 0, 6},  {1, 3, 41, 5, 101, 3, 1, 2, 1, 0}, {1, 2, 9, 3, 101, 3, 1, 0, 0, 0},
        {2, 5, 17, 7, 8, 4, 1, 2, 1, 0},   {2, 3, 10, 4, 4, 3, 1, 2, 1, 0},   {1, 6, 24, 14, 10, 3, 1, 2, 0, 4},
        {1, 4, 8, 9, 9, 1, 0, 0, 1, 0},    {3, 7, 48, 13, 15, 3, 0, 0, 1, 3},
    };
    uint64_t seed = 21;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shp *h = &shapes[s];
        fm_conv_lanes d;
        memset(&d, 0, sizeof d);
        d.N = h->N, d.C = h->C, d.O = h->O, d.KH = d.KW = h->k, d.Ho = h->H + 2 * h->pad - h->k + 1, d.Wo = h->W + 2 * h->pad - h->k + 1;
        d.pool = h->pool, d.relu = h->relu, d.Hy = h->pool ? d.Ho / 2 : d.Ho, d.Wy = h->pool ? d.Wo / 2 : d.Wo;
        d.Hp = h->H + 2 * h->pad, d.WS = h->W + 2 * h->pad, d.cc = h->cc ? h->cc : h->C;
        const int64_t per = h->C * h->k * h->k, ny = h->N * h->O * d.Hy * d.Wy;
        float *x = malloc(sizeof(float) * (size_t)(h->N * h->C * h->H * h->W)), *w = malloc(sizeof(float) * (size_t)(h->O * per));
        float *xp = malloc(sizeof(float) * (size_t)(h->N * h->C * d.Hp * d.WS)), *wp = malloc(sizeof(float) * (size_t)fm_conv_lanes_packed_numel(h->O, per));
        float *b = malloc(sizeof(float) * (size_t)h->O), *y2 = malloc(sizeof(float) * (size_t)ny), *y5 = malloc(sizeof(float) * (size_t)ny);
        if (!x || !w || !xp || !wp || !b || !y2 || !y5) { CHECK(!"out of memory"); return; }
        for (int64_t i = 0; i < h->N * h->C * h->H * h->W; i++) x[i] = frand(&seed);
        for (int64_t i = 0; i < h->O * per; i++) w[i] = frand(&seed);
        for (int64_t i = 0; i < h->O; i++) b[i] = frand(&seed);
        if (s == 2) x[7] = NAN; /* through the passes and the pool */
        for (int64_t p = 0; p < h->N * h->C; p++)
            fm_conv_lanes_pad_avx2(x + p * h->H * h->W, xp + p * d.Hp * d.WS, h->H, h->W, d.Hp, d.WS, h->pad, h->pad);
        fm_conv_lanes_pack(w, wp, h->O, per);
        d.xp = xp, d.wp = wp, d.bias = b;
        fm_conv_lanes_plan(&d);
        const int64_t tasks = fm_conv_lanes_tasks(&d);
        for (int64_t i = 0; i < ny; i++) y2[i] = y5[i] = -7.0f;
        d.y = y2;
        fm_conv_lanes_rows_avx2(&d, 0, tasks);
        d.y = y5;
        for (int64_t t0 = 0; t0 < tasks; t0 += 3) L512(fm_conv_lanes_rows)(&d, t0, t0 + 3 < tasks ? t0 + 3 : tasks); /* split */
        int wh = -1;
        CHECK_MSG(same_bits(y2, y5, (int)ny, &wh), "conv lanes N%lld C%lld O%lld %lldx%lld k%lld pool%d: avx512 %g avx2 %g at %d",
                  (long long)h->N, (long long)h->C, (long long)h->O, (long long)h->H, (long long)h->W, (long long)h->k, h->pool,
                  wh >= 0 ? y5[wh] : 0, wh >= 0 ? y2[wh] : 0, wh);
        /* one output against a double sum, so that a kernel equal to a broken AVX2 one still fails */
        const int64_t o = h->O - 1, oh = d.Ho - 1, ow = d.Wo / 2;
        if (!h->pool && s != 2) {
            double sum = b[o], mag = fabs(sum);
            for (int64_t c = 0; c < h->C; c++)
                for (int64_t i = 0; i < h->k; i++)
                    for (int64_t j = 0; j < h->k; j++) {
                        const int64_t ih = oh - h->pad + i, iw = ow - h->pad + j;
                        if (ih < 0 || ih >= h->H || iw < 0 || iw >= h->W) continue;
                        const double t = (double)x[(c * h->H + ih) * h->W + iw] * w[((o * h->C + c) * h->k + i) * h->k + j];
                        sum += t, mag += fabs(t);
                    }
            if (h->relu && sum < 0) sum = 0;
            const float got = y5[(o * d.Hy + oh) * d.Wy + ow]; /* sample 0 */
            CHECK_MSG(within_sum_bound(got, sum, mag, per), "conv lanes O%lld C%lld k%lld: output %g, double %g", (long long)h->O,
                      (long long)h->C, (long long)h->k, got, sum);
        }
        free(x), free(w), free(xp), free(wp), free(b), free(y2), free(y5);
    }
}
#pragma pop_macro("N")

/* conv2d_fused's Winograd F(2x2, 3x3) kernel with the 2x2 pool (conv_wino.h; the
 * AVX2 level, and the AVX-512 one bitwise against it where the CPU has it: wino_levels),
 * set up as conv_fused_cpu.c's run_wino, against a
 * double reference of every pooled output: the conv at the window's 4 pixels, the
 * max, bias, ReLU. The transforms round differently from a direct sum, so the
 * bound is 8x the direct sum's (K + 2) eps bound on the window's largest |terms|
 * sum (measured: errors within 0.001 of it; a sign flipped in the output
 * transform gives 1000x it). Shapes cover O in 16/32/48 tails, rows wider than 7
 * tiles (more than one 16-column load), odd conv sizes (the pool drops the last
 * row/column), no padding, a NaN in the input, and tasks run in pieces. */
#pragma push_macro("N")
#undef N /* fm_conv_wino's field */
/* The Winograd kernel's AVX2 level on d into y; with AVX-512 here, its AVX-512 level
 * into y5 too, which must be bitwise y (the same arithmetic in the same order): the
 * AVX-512 kernel reads the input unpadded when d->x is set, the AVX2 one always xp.
 * Tasks run two at a time (a task's pieces), the channel runs fm_conv_wino_split_channels made included. Returns false (and says why) on a difference. */
static bool wino_levels(fm_conv_wino *d, const float *wp, float *u, float *ws, float *y, float *y5, int64_t ny) {
    const int64_t tasks = fm_conv_wino_tasks(d);
    fm_conv_wino_weights_avx2(wp, u, d->O, d->C);
    const float *x = d->x;
    d->x = NULL, d->y = y;
    for (int64_t t0 = 0; t0 < tasks; t0 += 2) fm_conv_wino_rows_avx2(d, t0, t0 + 2 < tasks ? t0 + 2 : tasks, ws);
    d->x = x;
    if (!w512) return true;
    int wh = -1;
    fm_conv_wino d5 = *d; /* the AVX-512 kernel splits no channels */
    d5.y = y5, d5.nob = 1;
    const int64_t tasks5 = fm_conv_wino_tasks(&d5);
    for (int64_t t0 = 0; t0 < tasks5; t0 += 3) fm_conv_wino_rows_avx512(&d5, t0, t0 + 3 < tasks5 ? t0 + 3 : tasks5, ws);
    const bool same = same_bits(y, y5, (int)ny, &wh);
    CHECK_MSG(same, "conv wino N%lld C%lld O%lld pool %d: avx2 %g avx512 %g at %d", (long long)d->N, (long long)d->C, (long long)d->O, d->pool,
              wh >= 0 ? y[wh] : 0, wh >= 0 ? y5[wh] : 0, wh);
    return same;
}

static void test_conv_wino(void) {
    typedef struct { int64_t N, C, O, H, W, pad; int relu; } shp;
    const shp shapes[] = {
        {2, 32, 64, 14, 14, 1, 1}, {1, 8, 16, 5, 5, 1, 0},   {1, 16, 48, 9, 11, 1, 1}, {3, 12, 80, 30, 17, 1, 1},
        {1, 40, 32, 4, 30, 0, 0},  {2, 9, 112, 8, 8, 1, 1},  {1, 8, 16, 2, 2, 1, 1},
    };
    uint64_t seed = 33;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shp *h = &shapes[s];
        fm_conv_wino d;
        memset(&d, 0, sizeof d);
        const int64_t Ho = h->H + 2 * h->pad - 2, Wo = h->W + 2 * h->pad - 2, per = h->C * 9;
        d.N = h->N, d.C = h->C, d.O = h->O, d.Hy = Ho / 2, d.Wy = Wo / 2, d.relu = h->relu, d.pool = 2;
        fm_conv_wino_avx2_geometry(h->H, h->W, h->pad, h->pad, d.Hy, d.Wy, &d.Hp, &d.WS);
        CHECK_MSG(fm_conv_wino_fits(d.C, d.O, 3, 3, 2, d.Hy, d.Wy), "conv wino shape %zu should fit", s);
        fm_conv_wino_plan(&d);
        fm_conv_wino_split_channels(&d, 4); /* AVX2: channel runs where a shape has fewer than 4 row runs */
        const int64_t ny = h->N * h->O * d.Hy * d.Wy, nx = h->N * h->C * h->H * h->W, wsn = fm_conv_wino_ws_floats(&d);
        float *x = malloc(sizeof(float) * (size_t)nx), *w = malloc(sizeof(float) * (size_t)(h->O * per));
        float *xp = malloc(sizeof(float) * (size_t)(h->N * h->C * d.Hp * d.WS)), *wp = malloc(sizeof(float) * (size_t)fm_conv_lanes_packed_numel(h->O, per));
        float *u = malloc(sizeof(float) * (size_t)fm_conv_wino_u_floats(h->C, h->O)), *ws = malloc(sizeof(float) * (size_t)wsn);
        float *b = malloc(sizeof(float) * (size_t)h->O), *y = malloc(sizeof(float) * (size_t)ny), *y5 = malloc(sizeof(float) * (size_t)ny);
        if (!x || !w || !xp || !wp || !u || !ws || !b || !y || !y5) { CHECK(!"out of memory"); return; }
        for (int64_t i = 0; i < nx; i++) x[i] = 2 * frand(&seed);
        for (int64_t i = 0; i < h->O * per; i++) w[i] = frand(&seed);
        for (int64_t i = 0; i < h->O; i++) b[i] = frand(&seed);
        const int64_t nan_at = s == 2 ? 3 * h->W + 4 : -1; /* sample 0, channel 0, row 3, column 4 */
        if (nan_at >= 0) x[nan_at] = NAN;
        for (int64_t p = 0; p < h->N * h->C; p++)
            fm_conv_lanes_pad_avx2(x + p * h->H * h->W, xp + p * d.Hp * d.WS, h->H, h->W, d.Hp, d.WS, h->pad, h->pad);
        fm_conv_lanes_pack(w, wp, h->O, per);
        d.xp = xp, d.u = u, d.bias = b;
        for (int64_t i = 0; i < ny; i++) y[i] = y5[i] = -7.0f;
        wino_levels(&d, wp, u, ws, y, y5, ny);
        int64_t bad = -1, nans = 0;
        double worst = 0;
        for (int64_t n = 0; n < h->N; n++)
            for (int64_t o = 0; o < h->O; o++)
                for (int64_t py = 0; py < d.Hy; py++)
                    for (int64_t px = 0; px < d.Wy; px++) {
                        double best = -INFINITY, mag = 0;
                        int nan = 0;
                        for (int q = 0; q < 4; q++) {
                            const int64_t oh = 2 * py + q / 2, ow = 2 * px + q % 2;
                            double sum = 0, m = 0;
                            for (int64_t c = 0; c < h->C; c++)
                                for (int64_t i = 0; i < 3; i++)
                                    for (int64_t j = 0; j < 3; j++) {
                                        const int64_t ih = oh - h->pad + i, iw = ow - h->pad + j;
                                        if (ih < 0 || ih >= h->H || iw < 0 || iw >= h->W) continue;
                                        const int64_t xi = ((n * h->C + c) * h->H + ih) * h->W + iw;
                                        if (xi == nan_at) nan = 1;
                                        const double t = (double)x[xi] * w[((o * h->C + c) * 3 + i) * 3 + j];
                                        sum += t, m += fabs(t);
                                    }
                            if (sum > best) best = sum;
                            if (m > mag) mag = m;
                        }
                        best += b[o];
                        if (h->relu && best < 0) best = 0;
                        const float got = y[((n * h->O + o) * d.Hy + py) * d.Wy + px];
                        const int64_t at = ((n * h->O + o) * d.Hy + py) * d.Wy + px;
                        /* a tile's 4x4 input patch is its 4 outputs' 3x3 windows together: the NaN
                         * reaches exactly the pooled outputs whose reference saw it */
                        if (nan || got != got) {
                            if (nan && got != got) nans++;
                            else if (bad < 0) bad = at;
                            continue;
                        }
                        const double err = fabs((double)got - best), lim = 8.0 * 2.0 * (double)(per + 2) * 0x1p-24 * mag + 1e-30;
                        if (err / (lim > 0 ? lim : 1) > worst) worst = err / (lim > 0 ? lim : 1);
                        if (!(err <= lim) && bad < 0) bad = at;
                    }
        CHECK_MSG(bad < 0, "conv wino N%lld C%lld O%lld %lldx%lld pad %lld: output %lld is %g (worst error / bound %.3g)", (long long)h->N,
                  (long long)h->C, (long long)h->O, (long long)h->H, (long long)h->W, (long long)h->pad, (long long)bad,
                  bad >= 0 ? y[bad] : 0, worst);
        if (nan_at >= 0) CHECK_MSG(nans > 0, "conv wino: the NaN in the input reached no output");
        free(x), free(w), free(xp), free(wp), free(u), free(ws), free(b), free(y), free(y5);
    }
}

/* The same kernel without the pool, as conv_fused_cpu.c calls it (AVX-512 reading the
 * input unpadded, AVX2 the padded copy): every output of odd and even sizes (the last
 * tile row and column cut short) against a double sum, within the same bound; nothing
 * written past the output. */
static void test_conv_wino_unpooled(void) {
    typedef struct { int64_t N, C, O, H, W, pad; int relu; } shp;
    const shp shapes[] = {{1, 16, 32, 9, 13, 1, 1}, {2, 8, 16, 12, 12, 1, 0}, {1, 24, 48, 7, 5, 0, 1}, {1, 32, 64, 15, 30, 1, 0}};
    uint64_t seed = 77;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shp *h = &shapes[s];
        fm_conv_wino d;
        memset(&d, 0, sizeof d);
        const int64_t Ho = h->H + 2 * h->pad - 2, Wo = h->W + 2 * h->pad - 2, per = h->C * 9, ny = h->N * h->O * Ho * Wo;
        d.N = h->N, d.C = h->C, d.O = h->O, d.Ho = Ho, d.Wo = Wo, d.Hy = (Ho + 1) / 2, d.Wy = (Wo + 1) / 2, d.relu = h->relu, d.pool = 0;
        d.H = h->H, d.W = h->W, d.ph = d.pw = h->pad;
        CHECK_MSG(fm_conv_wino_fits(d.C, d.O, 3, 3, 0, Ho, Wo), "unpooled conv wino shape %zu should fit", s);
        fm_conv_wino_plan(&d);
        fm_conv_wino_split_channels(&d, 4);
        const int64_t nx = h->N * h->C * h->H * h->W, wsn = fm_conv_wino_ws_floats(&d);
        float *x = malloc(sizeof(float) * (size_t)nx), *w = malloc(sizeof(float) * (size_t)(h->O * per));
        float *wp = malloc(sizeof(float) * (size_t)fm_conv_lanes_packed_numel(h->O, per));
        float *u = malloc(sizeof(float) * (size_t)fm_conv_wino_u_floats(h->C, h->O)), *ws = malloc(sizeof(float) * (size_t)wsn);
        fm_conv_wino_avx2_geometry(h->H, h->W, h->pad, h->pad, d.Hy, d.Wy, &d.Hp, &d.WS);
        float *xp = malloc(sizeof(float) * (size_t)(h->N * h->C * d.Hp * d.WS));
        float *b = malloc(sizeof(float) * (size_t)h->O), *y = malloc(sizeof(float) * (size_t)(ny + 64)), *y5 = malloc(sizeof(float) * (size_t)(ny + 64));
        if (!x || !w || !wp || !u || !ws || !b || !y || !y5 || !xp) { CHECK(!"out of memory"); return; }
        for (int64_t i = 0; i < nx; i++) x[i] = 2 * frand(&seed);
        for (int64_t i = 0; i < h->O * per; i++) w[i] = frand(&seed);
        for (int64_t i = 0; i < h->O; i++) b[i] = frand(&seed);
        fm_conv_lanes_pack(w, wp, h->O, per);
        for (int64_t p = 0; p < h->N * h->C; p++)
            fm_conv_lanes_pad_avx2(x + p * h->H * h->W, xp + p * d.Hp * d.WS, h->H, h->W, d.Hp, d.WS, h->pad, h->pad);
        d.x = x, d.xp = xp, d.u = u, d.bias = b;
        for (int64_t i = 0; i < ny + 64; i++) y[i] = y5[i] = -7.0f;
        wino_levels(&d, wp, u, ws, y, y5, ny + 64);
        int64_t bad = -1;
        for (int64_t i = 0; i < h->N * h->O * Ho * Wo && bad < 0; i++) {
            const int64_t n = i / (h->O * Ho * Wo), o = i / (Ho * Wo) % h->O, oh = i / Wo % Ho, ow = i % Wo;
            double sum = b[o], mag = fabs(b[o]);
            for (int64_t c = 0; c < h->C; c++)
                for (int64_t ki = 0; ki < 3; ki++)
                    for (int64_t kj = 0; kj < 3; kj++) {
                        const int64_t ih = oh - h->pad + ki, iw = ow - h->pad + kj;
                        if (ih < 0 || ih >= h->H || iw < 0 || iw >= h->W) continue;
                        const double t = (double)x[((n * h->C + c) * h->H + ih) * h->W + iw] * w[((o * h->C + c) * 3 + ki) * 3 + kj];
                        sum += t, mag += fabs(t);
                    }
            if (h->relu && sum < 0) sum = 0;
            if (!(fabs((double)y[i] - sum) <= 8.0 * 2.0 * (double)(per + 2) * 0x1p-24 * mag + 1e-30)) bad = i;
        }
        for (int64_t i = ny; i < ny + 64 && bad < 0; i++)
            if (y[i] != -7.0f) bad = i;
        CHECK_MSG(bad < 0, "unpooled conv wino N%lld C%lld O%lld %lldx%lld pad %lld: output %lld is %g", (long long)h->N, (long long)h->C,
                  (long long)h->O, (long long)h->H, (long long)h->W, (long long)h->pad, (long long)bad, bad >= 0 ? y[bad] : 0);
        free(x), free(w), free(wp), free(u), free(ws), free(b), free(y), free(y5), free(xp);
    }
}
#pragma pop_macro("N")

/* attention at both widths on q [B, H, Tq, D] against k, v [B, Hkv, Tk, D]: every
 * output of the forward (o, lse) and of the backward (dq, dk, dv); and o against
 * a double-precision softmax(q k^T scale) v */
static void attention_case_q(int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t T, int64_t D, int causal) {
    const int64_t nq = B * H * Tq * D, nk = B * Hkv * T * D, nl = B * H * Tq;
    const int64_t len[5] = {nq, nl, nq, nk, nk};
    static const char *names[5] = {"o", "lse", "dq", "dk", "dv"};
    float *q = malloc(sizeof(float) * (size_t)nq), *dout = malloc(sizeof(float) * (size_t)nq);
    float *k = malloc(sizeof(float) * (size_t)nk), *v = malloc(sizeof(float) * (size_t)nk), *res[2][5];
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < 5; i++) res[w][i] = calloc((size_t)len[i], sizeof(float));
    uint64_t seed = (uint64_t)(B * 1000 + H * 100 + T * 10 + D + causal + 7 * Tq);
    for (int64_t i = 0; i < nq; i++) { q[i] = 2 * frand(&seed); dout[i] = frand(&seed); }
    for (int64_t i = 0; i < nk; i++) { k[i] = 2 * frand(&seed); v[i] = frand(&seed); }
    for (int w = 0; w < 2; w++) { /* w = 0: AVX2, 1: AVX-512 (AVX2 again without it) */
        fm_sdpa_io io = {.B = B, .H = H, .Hkv = Hkv, .Tq = Tq, .Tk = T, .D = D, .causal = causal,
                         .scale = 1.0 / sqrt((double)D), .q = q, .k = k, .v = v, .o = res[w][0], .dout = dout,
                         .dq = res[w][2], .dk = res[w][3], .dv = res[w][4], .lse = res[w][1]};
        io.lq = io.lo = io.ldo = io.ldq = fm_sdpa_lay_plain(H, Tq, D);
        io.lk = io.lv = io.ldk = io.ldv = fm_sdpa_lay_plain(Hkv, T, D);
        bool wide = w && w512;
        CHECK(!(wide ? fm_sdpa_f32_avx512_forward(&io) : fm_sdpa_f32_avx2_forward(&io)));
        if (Tq == T) CHECK(!(wide ? fm_sdpa_f32_avx512_backward(&io) : fm_sdpa_f32_avx2_backward(&io)));
    }
    double ref_worst = 0; /* o against double precision (causal: key j visible to query i iff j <= i) */
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, hk = (bh % H) / (H / Hkv);
        const float *kk = k + (b * Hkv + hk) * T * D, *vv = v + (b * Hkv + hk) * T * D;
        for (int64_t i = 0; i < Tq; i++) {
            const float *qi = q + (bh * Tq + i) * D;
            const int64_t kend = causal ? (i + 1 < T ? i + 1 : T) : T;
            double mx = -INFINITY, l = 0, *sc = malloc(sizeof(double) * (size_t)kend);
            for (int64_t j = 0; j < kend; j++) {
                double sj = 0;
                for (int64_t d = 0; d < D; d++) sj += (double)qi[d] * kk[j * D + d];
                sc[j] = sj / sqrt((double)D);
                mx = fmax(mx, sc[j]);
            }
            for (int64_t j = 0; j < kend; j++) l += exp(sc[j] - mx);
            for (int64_t d = 0; d < D; d++) {
                double o = 0;
                for (int64_t j = 0; j < kend; j++) o += exp(sc[j] - mx) / l * vv[j * D + d];
                ref_worst = fmax(ref_worst, fabs(o - res[1][0][(bh * Tq + i) * D + d]) / (1.0 + fabs(o)));
            }
            free(sc);
        }
    }
    CHECK_MSG(ref_worst <= 1e-5, "attention B%lld H%lld/%lld Tq%lld Tk%lld D%lld causal %d: o off the double reference by %g", (long long)B,
              (long long)H, (long long)Hkv, (long long)Tq, (long long)T, (long long)D, causal, ref_worst);
    for (int i = 0; i < (Tq == T ? 5 : 2); i++) {
        int where = -1;
        bool same = same_bits(res[0][i], res[1][i], (int)len[i], &where);
        double worst = 0;
        for (int64_t j = 0; j < len[i]; j++) {
            double e = fabs((double)res[0][i][j] - res[1][i][j]) / (1.0 + fabs((double)res[0][i][j]));
            if (!(e <= worst)) worst = e;
        }
        if (D % 16 == 0)
            CHECK_MSG(same, "attention B%lld H%lld/%lld T%lld D%lld causal %d: %s differs from AVX2 at %d", (long long)B,
                      (long long)H, (long long)Hkv, (long long)T, (long long)D, causal, names[i], where);
        CHECK_MSG(worst <= 1e-5, "attention B%lld H%lld/%lld T%lld D%lld causal %d: %s off AVX2 by %g", (long long)B,
                  (long long)H, (long long)Hkv, (long long)T, (long long)D, causal, names[i], worst);
    }
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < 5; i++) free(res[w][i]);
    free(q); free(dout); free(k); free(v);
}

static void attention_case(int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D, int causal) { attention_case_q(B, H, Hkv, T, T, D, causal); }

static void test_attention(void) {
    /* one query row (fwd_row): a decode step against 70 and 130 keys (one and three
     * key blocks, GQA), and a prompt whose last query block holds one row */
    attention_case_q(2, 4, 2, 1, 70, 32, 0);
    attention_case_q(1, 2, 2, 1, 130, 64, 0);
    attention_case_q(1, 3, 3, 1, 67, 24, 0);
    attention_case(1, 2, 2, 65, 64, 1);
    attention_case(16, 4, 4, 128, 32, 1); /* kjv-gpt's: owner-mode backward */
    attention_case(1, 2, 2, 130, 64, 1);  /* split-mode backward, a query-block tail */
    attention_case(2, 4, 2, 70, 32, 0);   /* GQA */
    attention_case(1, 3, 3, 67, 24, 1);   /* head-size tail of 8 */
    attention_case(2, 2, 1, 33, 5, 0);    /* head size below one vector */
    attention_case(2, 2, 2, 64, 40, 1);   /* one whole diagonal tile; a head-size tail past two vectors */
    attention_case_q(1, 2, 2, 20, 50, 32, 1); /* causal, fewer queries than keys (top-left aligned) */
}

/* column sums into a double accumulator that already holds a value (the
 * kernels add to acc), against the scalar loop in the same order */
static void test_colsum(void) {
    const int64_t ncs[] = {1, 3, 4, 5, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 130, 256};
    const int64_t Rs[] = {1, 2, 17, 128};
    const int64_t cap = 128 * 261;
    float *x = malloc(sizeof(float) * (size_t)cap);
    if (!x) { CHECK(!"out of memory"); return; }
    uint64_t seed = 21;
    for (int64_t i = 0; i < cap; i++) x[i] = 8.0f * frand(&seed);
    fill(x, 22, 8.0f); /* the special values among the first rows */
    for (size_t ci = 0; ci < sizeof ncs / sizeof ncs[0]; ci++)
        for (size_t ri = 0; ri < sizeof Rs / sizeof Rs[0]; ri++) {
            const int64_t nc = ncs[ci], R = Rs[ri], ld = nc + 5;
            double ref[256], a2[256], a5[256];
            for (int64_t c = 0; c < nc; c++) ref[c] = a2[c] = a5[c] = 0.25 * (double)c;
            for (int64_t c = 0; c < nc; c++)
                for (int64_t k = 0; k < R; k++) ref[c] += x[k * ld + c];
            fm_colsum_f32_avx2(x, R, ld, nc, a2);
            L512(fm_colsum_f32)(x, R, ld, nc, a5);
            int bad = -1;
            for (int64_t c = 0; c < nc; c++) {
                bool n2 = a2[c] != a2[c], n5 = a5[c] != a5[c], nr = ref[c] != ref[c];
                if (nr ? !(n2 && n5) : (n2 || n5 || memcmp(&a2[c], &ref[c], sizeof(double)) ||
                                        memcmp(&a5[c], &ref[c], sizeof(double))))
                    bad = (int)c;
            }
            CHECK_MSG(bad < 0, "colsum nc %lld R %lld ld %lld: column %d: avx2 %g avx512 %g scalar %g", (long long)nc,
                      (long long)R, (long long)ld, bad, bad >= 0 ? a2[bad] : 0, bad >= 0 ? a5[bad] : 0,
                      bad >= 0 ? ref[bad] : 0);
        }
    free(x);
}

/* row sums (reduce_cpu.c's rowsum_f32: element k to partial k mod 32, then a fixed tree)
 * at every length up to 100 and a few long ones, the special values among them, bitwise
 * the scalar definition at both vector levels (a NaN: NaN at all three) */
static void test_rowsum(void) {
    const int64_t cap = 5000;
    float *x = malloc(sizeof(float) * (size_t)cap);
    if (!x) { CHECK(!"out of memory"); return; }
    uint64_t seed = 23;
    for (int64_t i = 0; i < cap; i++) x[i] = 8.0f * frand(&seed) * (i % 7 == 3 ? 1e15f : i % 5 == 1 ? 1e-12f : 1.0f); /* wide exponents: the order shows */
    int bad = -1;
    fill(x, 22, 8.0f); /* the special values among the first N */
    for (int64_t n = 0; n <= 3900 && bad < 0; n += n < 100 ? 1 : 1031) {
        for (int sp = 0; sp < 2 && bad < 0; sp++) {
            const float *p = sp ? x : x + 1040; /* past fill's N: plain values */
            double s[32] = {0}, t[8];
            for (int64_t k = 0; k < n; k++) s[k & 31] += p[k];
            for (int j = 0; j < 8; j++) t[j] = (s[j] + s[j + 8]) + (s[j + 16] + s[j + 24]);
            const double ref = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
            const double a2 = fm_rowsum_f32_avx2(p, n), a5 = w512 ? fm_rowsum_f32_avx512(p, n) : a2;
            const bool nr = ref != ref;
            if (nr ? !(a2 != a2 && a5 != a5) : (memcmp(&a2, &ref, sizeof ref) || memcmp(&a5, &ref, sizeof ref))) bad = (int)n;
            if (bad >= 0) CHECK_MSG(0, "rowsum n %d (%s): avx2 %.17g avx512 %.17g scalar %.17g", bad, sp ? "special values" : "plain", a2, a5, ref);
        }
    }
    CHECK(bad < 0);
    free(x);
}

int main(void) {
    fm_isa max = fm_isa_max_for(fm_cpu_get_features());
    if (max < FM_ISA_AVX2) {
        fprintf(stderr, "skipped: this CPU has no AVX2 level (AVX2/FMA/F16C)\n");
        return 77;
    }
    w512 = max >= FM_ISA_AVX512;
    fprintf(stderr, "%s\n", w512 ? "AVX-512 kernels against AVX2 and the references"
                                 : "no AVX-512 here: the AVX2 kernels against the references");
    test_unary();
    test_binary();
    test_convert();
    if (w512 && fm_cpu_get_features()->avx512_bf16) test_convert_bf16_hw();
    test_softmax();
    test_ce_fused_long();
    test_adamw(fm_adamw_f32_avx2, "avx2");
    if (w512) test_adamw(fm_adamw_f32_avx512, "avx512");
    test_sgd(fm_sgd_f32_avx2, "avx2");
    if (w512) test_sgd(fm_sgd_f32_avx512, "avx512");
    test_bias_gelu();
    test_add_ln();
    if (w512) test_add_ln_bwd();
    test_gemv();
    test_linear_packed();
    test_conv_lanes();
    test_conv_wino();
    test_conv_wino_unpooled();
    test_attention();
    test_colsum();
    test_rowsum();
    TEST_DONE();
}
