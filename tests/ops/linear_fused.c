/* linear_fused: relu?(x w^T + b) against a reference computed here in double, with
 * the tolerance of an f32 sum of K products in any order (|error| <= 2 K 2^-24
 * (|b| + sum_k |x_k w_k|), the recursive-summation bound, which a wrong index or a
 * lost term exceeds by orders of magnitude), over shapes where M, N and K are not
 * multiples of the packed kernel's tile (6 rows x 16 columns, K blocks of 256,
 * row blocks of 120), M = 1, a tail panel of 1 column, 3-D inputs, and with and
 * without the bias, the ReLU and the packed weights (fm_linear_fused_pack).
 * test_ops runs it at every FATHOM_ISA level: avx2 takes the packed kernel,
 * scalar the GEMM + ReLU path; both are held to the same reference, and the
 * packed result to the unpacked one. Also: NaN propagation, f64, a packed tensor
 * of another shape (ignored), bad input. */
#include <math.h>
#include <stdlib.h>

#include "test_util.h"
#include "op_test.h"
#include "fathom/autograd.h"
#include "fathom/ops.h"

/* The double reference of x w^T (no bias) and, per output, sum_k |x_k w_k|. */
static void reference(const double *x, const double *w, int64_t M, int64_t N, int64_t K, double *ref, double *mag) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < K; k++) s += x[i * K + k] * w[n * K + k], m += fabs(x[i * K + k] * w[n * K + k]);
            ref[i * N + n] = s, mag[i * N + n] = m;
        }
}

/* max over outputs of |y - ref| / bound (<= 1 passes), and in *vs_other the max of
 * |y - other| / bound (other: another computation of the same) */
static double worst_ratio(const double *y, const double *other, const double *ref, const double *mag, const double *b, int64_t M,
                          int64_t N, int64_t K, int relu, double *vs_other) {
    double worst = 0;
    *vs_other = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t n = 0; n < N; n++) {
            double s = ref[i * N + n] + (b ? b[n] : 0), m = mag[i * N + n] + (b ? fabs(b[n]) : 0);
            if (relu && s < 0) s = 0;
            double bound = 2.0 * (double)(K + 1) * ldexp(1.0, -24) * m + 1e-30, r = fabs(y[i * N + n] - s) / bound;
            if (!(r <= worst)) worst = r; /* NaN counts as a failure */
            double o = fabs(y[i * N + n] - other[i * N + n]) / bound;
            if (!(o <= *vs_other)) *vs_other = o;
        }
    return worst;
}

/* largest |a - b| (a NaN or an unreadable tensor: infinity) */
static double max_abs(const fm_tensor *a, const fm_tensor *b) {
    if (!a || !b || fm_tensor_numel(a) != fm_tensor_numel(b)) return INFINITY;
    double *ha = op_host(a), *hb = op_host(b), worst = ha && hb ? 0 : INFINITY;
    for (int64_t i = 0; ha && hb && i < fm_tensor_numel(a); i++) {
        double d = fabs(ha[i] - hb[i]);
        if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
    }
    free(ha), free(hb);
    return worst;
}

static int linear_fused_forward(void) {
    OP_BEGIN;
    /* M, N, K */
    const int64_t shapes[][3] = {{1, 10, 128},  {1, 128, 3136}, {32, 128, 3136}, {32, 10, 128}, {7, 33, 19}, {6, 16, 256},
                                 {13, 17, 257}, {125, 40, 513}, {2, 1, 1},       {5, 130, 1},   {1, 1, 300}, {241, 48, 64}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t M = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
        fm_tensor *x = op_randn(2, (int64_t[]){M, K}, FM_F32, 100 + i), *w = op_randn(2, (int64_t[]){N, K}, FM_F32, 200 + i);
        fm_tensor *b = op_randn(1, &N, FM_F32, 300 + i), *pk = fm_linear_fused_pack(w);
        CHECK_MSG(pk, "linear_fused_pack: %s", fm_last_error());
        double *hx = op_host(x), *hw = op_host(w), *hb = op_host(b);
        double *ref = malloc(sizeof(double) * (size_t)(M * N)), *mag = malloc(sizeof(double) * (size_t)(M * N));
        reference(hx, hw, M, N, K, ref, mag);
        for (int v = 0; v < 8; v++) {
            const int relu = v & 1, bias = v & 2, packed = v & 4;
            fm_tensor *y = fm_linear_fused(x, w, bias ? b : NULL, packed ? pk : NULL, relu);
            CHECK_MSG(y && y->ndim == 2 && y->shape[0] == M && y->shape[1] == N, "linear_fused M%lld N%lld K%lld: %s", (long long)M,
                      (long long)N, (long long)K, fm_last_error());
            if (!y) continue;
            /* against the reference, and against the path it replaces (linear, then relu:
             * both round, so twice the bound) */
            fm_tensor *l = fm_linear(x, w, bias ? b : NULL), *lr = l && relu ? fm_relu(l) : NULL;
            double *hy = op_host(y), *hl = l ? op_host(lr ? lr : l) : NULL, vs = 0;
            double r = hl ? worst_ratio(hy, hl, ref, mag, bias ? hb : NULL, M, N, K, relu, &vs) : INFINITY;
            CHECK_MSG(r <= 1 && vs <= 2, "linear_fused M%lld N%lld K%lld relu %d bias %d packed %d: error %.3g of the bound, %.3g from linear + relu",
                      (long long)M, (long long)N, (long long)K, relu, !!bias, !!packed, r, vs);
            free(hy), free(hl);
            fm_tensor_release_n(3, y, l, lr);
        }
        free(hx), free(hw), free(hb), free(ref), free(mag);
        fm_tensor_release_n(4, x, w, b, pk);
    }
    OP_END;
}

/* A row with a NaN gives NaN in all its outputs (ReLU keeps NaN, as relu); other
 * rows are untouched. A 3-D input keeps its leading dims. f64 runs the GEMM path. */
static int linear_fused_cases(void) {
    OP_BEGIN;
    const int64_t M = 9, N = 20, K = 40;
    fm_tensor *x = op_randn(2, (int64_t[]){M, K}, FM_F32, 1), *w = op_randn(2, (int64_t[]){N, K}, FM_F32, 2);
    fm_tensor *b = op_randn(1, &N, FM_F32, 3), *pk = fm_linear_fused_pack(w);
    fm_tensor_set(x, 4 * K + 7, NAN);
    fm_tensor *y = fm_linear_fused(x, w, b, pk, true);
    CHECK(y != NULL);
    if (y) {
        double *h = op_host(y);
        int nan_row = 1, others = 1;
        for (int64_t i = 0; i < M; i++)
            for (int64_t n = 0; n < N; n++) {
                if (i == 4) nan_row &= isnan(h[i * N + n]);
                else others &= !isnan(h[i * N + n]) && h[i * N + n] >= 0;
            }
        CHECK_MSG(nan_row && others, "linear_fused: a NaN input must give NaN in its row only (with ReLU)");
        free(h);
    }
    fm_tensor *x3 = op_randn(3, (int64_t[]){2, 5, K}, FM_F32, 4), *y3 = fm_linear_fused(x3, w, b, pk, false);
    fm_tensor *x2 = fm_reshape(x3, 2, (int64_t[]){10, K}), *y2 = fm_linear_fused(x2, w, b, NULL, false);
    CHECK_MSG(y3 && y3->ndim == 3 && y3->shape[0] == 2 && y3->shape[1] == 5 && y3->shape[2] == N, "linear_fused 3-D: %s", fm_last_error());
    CHECK_MSG(max_abs(y3, y2) <= 1e-4, "linear_fused 3-D against 2-D");
    /* f64: the GEMM path, to the f64 reference */
    fm_tensor *xd = fm_to_dtype(x3, FM_F64), *wd = fm_to_dtype(w, FM_F64), *bd = fm_to_dtype(b, FM_F64);
    fm_tensor *yd = fm_linear_fused(xd, wd, bd, pk, true), *ld = fm_linear(xd, wd, bd), *lr = ld ? fm_relu(ld) : NULL;
    CHECK_MSG(yd && yd->dtype == FM_F64 && lr && max_abs(yd, lr) <= 1e-12, "linear_fused f64: %s", fm_last_error());
    /* a packed tensor of another weight shape is ignored: the result is the unpacked one's */
    fm_tensor *w2 = op_randn(2, (int64_t[]){N + 1, K}, FM_F32, 5), *pk2 = fm_linear_fused_pack(w2);
    fm_tensor *ya = fm_linear_fused(x3, w, b, pk2, false), *yb = fm_linear_fused(x3, w, b, NULL, false);
    CHECK_MSG(op_bitwise_equal(ya, yb), "linear_fused: a packed tensor of another shape must be ignored");
    fm_tensor_release_n(17, x, w, b, pk, y, x3, y3, x2, y2, xd, wd, bd, yd, ld, lr, w2, pk2);
    fm_tensor_release_n(2, ya, yb);
    OP_END;
}

static int linear_fused_errors(void) {
    OP_BEGIN;
    fm_tensor *x = op_randn(2, (int64_t[]){3, 8}, FM_F32, 1), *w = op_randn(2, (int64_t[]){4, 8}, FM_F32, 2);
    fm_tensor *wbad = op_randn(2, (int64_t[]){4, 9}, FM_F32, 3), *bbad = op_randn(1, (int64_t[]){5}, FM_F32, 4);
    fm_tensor *xh = fm_to_dtype(x, FM_F16), *wh = fm_to_dtype(w, FM_F16), *w3 = op_randn(3, (int64_t[]){1, 4, 8}, FM_F32, 5);
    fm_tensor *bad = op_randn(2, (int64_t[]){3, 25}, FM_F32, 6);
    CHECK(!fm_linear_fused(x, wbad, NULL, NULL, false));
    CHECK_ERR_CONTAINS("does not match weight");
    CHECK(!fm_linear_fused(x, w, bbad, NULL, false));
    CHECK_ERR_CONTAINS("bias");
    CHECK(!fm_linear_fused(xh, wh, NULL, NULL, true));
    CHECK_ERR_CONTAINS("f32 or f64");
    CHECK(!fm_linear_fused(x, w, NULL, bad, true));
    CHECK_ERR_CONTAINS("packed weights");
    CHECK(!fm_linear_fused(NULL, w, NULL, NULL, true));
    CHECK(!fm_linear_fused_pack(w3));
    CHECK_ERR_CONTAINS("[out, in]");
    CHECK(!fm_linear_fused_pack(wh));
    CHECK(!fm_linear_fused_pack(NULL));
    fm_tensor_requires_grad_(w, true);
    CHECK(!fm_linear_fused(x, w, NULL, NULL, true));
    CHECK_ERR_CONTAINS("inference only");
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *y = fm_linear_fused(x, w, NULL, NULL, true);
    CHECK_MSG(y != NULL, "linear_fused with grad off: %s", fm_last_error());
    fm_set_grad_enabled(prev);
    fm_tensor_release_n(9, x, w, wbad, bbad, xh, wh, w3, bad, y);
    OP_END;
}

/* The other activations (fm_linear_fused_act): GELU (erf and tanh), SiLU, sigmoid, tanh
 * against linear then the op, with and without packed weights, at shapes where the
 * threads split the panels (few rows) and the rows (many: several 60-row activation
 * blocks and a tail), and f64 (the GEMM path); a NaN row stays NaN; an unknown name is
 * refused, naming the choices. */
static int linear_fused_acts(void) {
    OP_BEGIN;
    static const char *const acts[] = {"gelu", "gelu_tanh", "silu", "sigmoid", "tanh"};
    fm_tensor *(*const ops[])(fm_tensor *) = {fm_gelu, fm_gelu_tanh, fm_silu, fm_sigmoid, fm_tanh};
    const int64_t shapes[][3] = {{3, 200, 64}, {200, 70, 96}, {7, 33, 19}, {1, 1, 300}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t M = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
        fm_tensor *x = op_randn(2, (int64_t[]){M, K}, FM_F32, 400 + i), *w = op_randn(2, (int64_t[]){N, K}, FM_F32, 500 + i);
        fm_tensor *b = op_randn(1, &N, FM_F32, 600 + i), *pk = fm_linear_fused_pack(w), *l = fm_linear(x, w, b);
        fm_tensor *xd = fm_to_dtype(x, FM_F64), *wd = fm_to_dtype(w, FM_F64), *bd = fm_to_dtype(b, FM_F64), *ld = fm_linear(xd, wd, bd);
        for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
            fm_tensor *ref = ops[a](l), *refd = ops[a](ld);
            for (int packed = 0; packed < 2; packed++) {
                fm_tensor *y = fm_linear_fused_act(x, w, b, packed ? pk : NULL, acts[a]);
                double d = y ? max_abs(y, ref) : INFINITY;
                CHECK_MSG(d <= 2e-5 * sqrt((double)K), "linear_fused %s M%lld N%lld K%lld packed %d: %.3g from linear + %s", acts[a], (long long)M,
                          (long long)N, (long long)K, packed, d, acts[a]);
                fm_tensor_release(y);
            }
            fm_tensor *yd = fm_linear_fused_act(xd, wd, bd, NULL, acts[a]);
            CHECK_MSG(yd && refd && max_abs(yd, refd) <= 1e-12, "linear_fused %s f64: %s", acts[a], fm_last_error());
            fm_tensor_release_n(3, ref, refd, yd);
        }
        fm_tensor_release_n(9, x, w, b, pk, l, xd, wd, bd, ld);
    }
    fm_tensor *x = op_randn(2, (int64_t[]){5, 8}, FM_F32, 7), *w = op_randn(2, (int64_t[]){20, 8}, FM_F32, 8), *pk = fm_linear_fused_pack(w);
    fm_tensor_set(x, 2 * 8 + 3, NAN);
    fm_tensor *y = fm_linear_fused_act(x, w, NULL, pk, "silu");
    int nan_row = y != NULL;
    for (int64_t n = 0; y && n < 20; n++) nan_row &= isnan(fm_tensor_get(y, 2 * 20 + n)) && !isnan(fm_tensor_get(y, 1 * 20 + n));
    CHECK_MSG(nan_row, "linear_fused silu: a NaN input must give NaN in its row only");
    CHECK(!fm_linear_fused_act(x, w, NULL, pk, "swish"));
    CHECK_ERR_CONTAINS("unknown activation 'swish' (none, relu, gelu, gelu_tanh, silu, sigmoid or tanh)");
    fm_tensor_release_n(4, x, w, pk, y);
    OP_END;
}

static int linear_fused_pack_cases(void) { return linear_fused_cases() + linear_fused_errors() + linear_fused_acts(); }

OP_TEST("linear_fused", linear_fused_forward, NULL)
OP_TEST("linear_fused_pack", linear_fused_pack_cases, NULL)
