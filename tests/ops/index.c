/* Tests of cat (with stack and split), gather, scatter, scatter_nd, index_select, one_hot and pad: values
 * against references computed here, several dtypes and non-contiguous inputs,
 * gradient checks in f64 (repeated indices accumulate), and bad input: shape
 * mismatches, bad axes, wrong index dtypes, indices out of range. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "op_test.h"
#include "gradcheck.h"

#include "fathom/autograd.h"
#include "fathom/memory.h"
#include "fathom/ops.h"
#include "core/parallel.h" /* fm_set_num_threads: results must not depend on it */

/* Logical (row-major) element of a view at a multi-index. */
static double at(const fm_tensor *t, const int64_t *ix) {
    int64_t flat = 0;
    for (int d = 0; d < t->ndim; d++) flat = flat * t->shape[d] + ix[d];
    return fm_tensor_get(t, flat);
}

static void unravel(int64_t flat, int nd, const int64_t *shape, int64_t *ix) {
    for (int d = nd - 1; d >= 0; d--) { ix[d] = shape[d] ? flat % shape[d] : 0; flat = shape[d] ? flat / shape[d] : 0; }
}

/* ------------------------------------------------------------------- cat */

/* y must equal the inputs laid side by side along `ax`. */
static void check_cat(fm_tensor *y, int n, fm_tensor *const *ts, int ax, const char *what) {
    CHECK_MSG(y != NULL, "cat %s: %s", what, fm_last_error());
    if (!y) return;
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += ts[i]->shape[ax];
    CHECK(y->shape[ax] == total && y->dtype == ts[0]->dtype);
    int bad = 0;
    int64_t ix[FM_MAX_DIMS];
    for (int64_t e = 0; e < fm_tensor_numel(y); e++) {
        unravel(e, y->ndim, y->shape, ix);
        int64_t a = ix[ax];
        int i = 0;
        while (a >= ts[i]->shape[ax]) a -= ts[i++]->shape[ax];
        ix[ax] = a;
        if (fm_tensor_get(y, e) != at(ts[i], ix)) bad++;
    }
    CHECK_MSG(bad == 0, "cat %s: %d wrong elements", what, bad);
}

static int cat_forward(void) {
    OP_BEGIN;
    fm_dtype dts[5] = {FM_F32, FM_F64, FM_I64, FM_BOOL, FM_F16};
    for (int k = 0; k < 5; k++) {
        fm_tensor *a64 = op_randn(3, (int64_t[]){2, 3, 4}, FM_F64, 1), *b64 = op_randn(3, (int64_t[]){2, 5, 4}, FM_F64, 2);
        fm_tensor *c64 = op_randn(3, (int64_t[]){2, 4, 1}, FM_F64, 3); /* transposed below to [2, 1, 4] */
        fm_tensor *as = fm_mul_scalar(a64, 3), *bs = fm_mul_scalar(b64, 3), *cs = fm_mul_scalar(c64, 3);
        fm_tensor *a = fm_to_dtype(as, dts[k]), *b = fm_to_dtype(bs, dts[k]), *cb = fm_to_dtype(cs, dts[k]);
        fm_tensor *c = fm_transpose(cb, 1, 2);
        fm_tensor *ts[3] = {a, b, c};
        fm_tensor *y = fm_cat(3, ts, 1);
        check_cat(y, 3, ts, 1, fm_dtype_name(dts[k]));
        fm_tensor *y2 = fm_cat(3, ts, -2); /* negative axis */
        check_cat(y2, 3, ts, 1, "axis -2");
        /* non-contiguous along the last axis, and a strided slice */
        fm_tensor *at2 = fm_transpose(a, 0, 2), *bt = fm_transpose(b, 0, 2); /* [4, 3, 2], [4, 5, 2] */
        fm_tensor *ts2[2] = {at2, bt};
        fm_tensor *y3 = fm_cat(2, ts2, 1), *y4 = fm_cat(2, (fm_tensor *[]){bt, bt}, 2);
        check_cat(y3, 2, ts2, 1, "transposed");
        check_cat(y4, 2, (fm_tensor *[]){bt, bt}, 2, "transposed, last axis");
        fm_tensor *sl = fm_slice(b, 1, 0, 5, 2); /* [2, 3, 4] every other row */
        fm_tensor *y5 = fm_cat(2, (fm_tensor *[]){sl, a}, 0);
        check_cat(y5, 2, (fm_tensor *[]){sl, a}, 0, "slice, axis 0");
        /* an empty piece */
        fm_tensor *e = fm_narrow(b, 1, 0, 0);
        fm_tensor *y6 = fm_cat(3, (fm_tensor *[]){e, a, e}, 1);
        check_cat(y6, 3, (fm_tensor *[]){e, a, e}, 1, "empty piece");
        fm_tensor_release_n(20, a64, b64, c64, as, bs, cs, a, b, cb, c, y, y2, at2, bt, y3, y4, sl, y5, e, y6);
    }
    /* many inputs (also checked with autograd in cat_grad) */
    fm_tensor *ps[40];
    for (int i = 0; i < 40; i++) ps[i] = fm_tensor_full(2, (int64_t[]){1, 3}, i, FM_F32, FM_CPU);
    fm_tensor *y = fm_cat(40, ps, 0);
    check_cat(y, 40, ps, 0, "40 inputs");
    fm_tensor_release(y);
    /* stack = unsqueeze + cat */
    fm_tensor *sa = op_randn(2, (int64_t[]){2, 3}, FM_F32, 4), *sb = op_randn(2, (int64_t[]){2, 3}, FM_F32, 5);
    fm_tensor *st = fm_stack(2, (fm_tensor *[]){sa, sb}, 1), *st2 = fm_stack(2, (fm_tensor *[]){sa, sb}, -1);
    CHECK(st && st->ndim == 3 && st->shape[0] == 2 && st->shape[1] == 2 && st->shape[2] == 3);
    CHECK(st2 && st2->shape[0] == 2 && st2->shape[1] == 3 && st2->shape[2] == 2);
    if (st && st2)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) {
                CHECK(at(st, (int64_t[]){i, 0, j}) == at(sa, (int64_t[]){i, j}));
                CHECK(at(st, (int64_t[]){i, 1, j}) == at(sb, (int64_t[]){i, j}));
                CHECK(at(st2, (int64_t[]){i, j, 1}) == at(sb, (int64_t[]){i, j}));
            }
    /* split = narrow views */
    fm_tensor *parts[3] = {0};
    fm_tensor *big = op_randn(2, (int64_t[]){6, 4}, FM_F32, 6);
    CHECK(fm_split(big, 0, 3, (int64_t[]){1, 2, 3}, parts) == FM_OK);
    CHECK(parts[0] && parts[1] && parts[2] && parts[2]->shape[0] == 3 && parts[1]->shape[1] == 4);
    if (parts[2]) CHECK(at(parts[2], (int64_t[]){0, 1}) == at(big, (int64_t[]){3, 1}));
    if (parts[1]) CHECK(parts[1]->storage == big->storage); /* a view, no copy */
    fm_tensor_release_n(3, parts[0], parts[1], parts[2]);
    /* bad input */
    fm_tensor *b64 = op_randn(2, (int64_t[]){2, 3}, FM_F64, 7), *c4 = op_randn(2, (int64_t[]){3, 4}, FM_F32, 8);
    CHECK(fm_cat(2, (fm_tensor *[]){sa, c4}, 1) == NULL);
    CHECK_ERR_CONTAINS("cat: tensor 1 has shape [3, 4] but tensor 0 has [2, 3]");
    CHECK(fm_cat(2, (fm_tensor *[]){sa, b64}, 0) == NULL);
    CHECK_ERR_CONTAINS("cat: tensor 1 has dtype f64 but tensor 0 has f32");
    CHECK(fm_cat(2, (fm_tensor *[]){sa, sb}, 2) == NULL);
    CHECK_ERR_CONTAINS("cat");
    CHECK(fm_cat(0, ps, 0) == NULL);
    CHECK_ERR_CONTAINS("cat: needs at least one tensor");
    CHECK(fm_stack(2, (fm_tensor *[]){sa, c4}, 0) == NULL);
    CHECK_ERR_CONTAINS("stack: tensor 1 has shape [3, 4] but tensor 0 has [2, 3]");
    CHECK(fm_stack(2, (fm_tensor *[]){sa, sb}, 3) == NULL);
    CHECK_ERR_CONTAINS("stack");
    CHECK(fm_split(big, 0, 2, (int64_t[]){2, 3}, parts) != FM_OK);
    CHECK_ERR_CONTAINS("split: sizes sum to 5 but axis 0 of [6, 4] has size 6");
    CHECK(parts[0] == NULL && parts[1] == NULL);
    CHECK(fm_split(big, 5, 1, (int64_t[]){6}, parts) != FM_OK);
    CHECK_ERR_CONTAINS("split");
    for (int i = 0; i < 40; i++) fm_tensor_release(ps[i]);
    fm_tensor_release_n(7, sa, sb, st, st2, big, b64, c4);
    OP_END;
}

typedef struct cat_gc { int mode; } cat_gc; /* 0 cat, 1 stack, 2 split (pieces re-ordered) */
static fm_tensor *cat_gc_fn(fm_tensor **in, void *ctx) {
    const cat_gc *c = ctx;
    if (c->mode == 0) return fm_cat(3, in, 1);
    if (c->mode == 1) return fm_stack(2, (fm_tensor *[]){in[0], in[1]}, 0);
    fm_tensor *p[3] = {0};
    if (fm_split(in[0], 1, 3, (int64_t[]){1, 2, 1}, p) != FM_OK) return NULL;
    fm_tensor *sq = fm_mul(p[1], p[1]); /* something non-linear per piece */
    fm_tensor *r = fm_cat(3, (fm_tensor *[]){p[2], sq, p[0]}, 1);
    fm_tensor_release_n(4, p[0], p[1], p[2], sq);
    return r;
}

static int cat_grad(void) {
    OP_BEGIN;
    fm_tensor *a = op_randn(2, (int64_t[]){3, 2}, FM_F64, 10), *b = op_randn(2, (int64_t[]){3, 4}, FM_F64, 11);
    fm_tensor *cb = op_randn(2, (int64_t[]){1, 3}, FM_F64, 12), *c = fm_transpose(cb, 0, 1); /* [3, 1] */
    fm_tensor_requires_grad_(a, true);
    fm_tensor_requires_grad_(b, true);
    fm_tensor_requires_grad_(c, true);
    cat_gc m0 = {0}, m1 = {1}, m2 = {2};
    fm_tensor *in[3] = {a, b, c};
    CHECK(gradcheck("cat", cat_gc_fn, 3, in, &m0, 1e-6, 1e-6));
    fm_tensor *in2[3] = {b, b, NULL};
    CHECK(gradcheck("stack (same tensor twice)", cat_gc_fn, 2, in2, &m1, 1e-6, 1e-6));
    fm_tensor *in3[1] = {b};
    CHECK(gradcheck("split", cat_gc_fn, 1, in3, &m2, 1e-6, 1e-6));
    /* more inputs than one node holds: grouped, gradients still reach every input */
    fm_tensor *ps[30];
    for (int i = 0; i < 30; i++) {
        ps[i] = fm_tensor_full(1, (int64_t[]){2}, i, FM_F64, FM_CPU);
        fm_tensor_requires_grad_(ps[i], true);
    }
    fm_tensor *y = fm_cat(30, ps, 0), *w = fm_tensor_arange(0, 60, 1, FM_F64);
    fm_tensor *yw = fm_mul(y, w), *s = fm_sum(yw, 0, NULL, false);
    CHECK(s && fm_backward(s, NULL, false) == FM_OK);
    for (int i = 0; i < 30; i++) {
        CHECK(ps[i]->grad != NULL);
        if (ps[i]->grad) CHECK(fm_tensor_get(ps[i]->grad, 0) == 2 * i && fm_tensor_get(ps[i]->grad, 1) == 2 * i + 1);
        fm_tensor_release(ps[i]);
    }
    fm_tensor_release_n(8, a, b, cb, c, y, w, yw, s);
    OP_END;
}

/* ---------------------------------------------------------------- gather */

static void check_gather(fm_tensor *t, int ax, fm_tensor *idx, const char *what) {
    fm_tensor *y = fm_gather(t, ax, idx);
    CHECK_MSG(y != NULL, "gather %s: %s", what, fm_last_error());
    if (!y) return;
    CHECK(y->ndim == idx->ndim && y->dtype == t->dtype);
    int bad = 0;
    int64_t ix[FM_MAX_DIMS];
    for (int64_t e = 0; e < fm_tensor_numel(idx); e++) {
        unravel(e, idx->ndim, idx->shape, ix);
        double v = fm_tensor_get(y, e);
        ix[ax < 0 ? ax + idx->ndim : ax] = (int64_t)fm_tensor_get(idx, e);
        if (v != at(t, ix)) bad++;
    }
    CHECK_MSG(bad == 0, "gather %s: %d wrong elements", what, bad);
    fm_tensor_release(y);
}

static int gather_forward(void) {
    OP_BEGIN;
    fm_dtype dts[3] = {FM_F32, FM_F64, FM_I32};
    for (int k = 0; k < 3; k++) {
        fm_tensor *t64 = op_randn(3, (int64_t[]){3, 4, 5}, FM_F64, 20), *ts = fm_mul_scalar(t64, 10);
        fm_tensor *t = fm_to_dtype(ts, dts[k]);
        /* index smaller than t in the other dims, values with repeats */
        int64_t iv[2 * 6 * 3];
        for (int i = 0; i < 36; i++) iv[i] = (i * 7) % 4;
        fm_tensor *idx = fm_tensor_from_data(iv, 3, (int64_t[]){2, 6, 3}, FM_I64);
        check_gather(t, 1, idx, "axis 1, index [2,6,3]");
        int32_t iv32[3 * 2 * 2];
        for (int i = 0; i < 12; i++) iv32[i] = (i * 3) % 5;
        fm_tensor *idx32 = fm_tensor_from_data(iv32, 3, (int64_t[]){3, 2, 2}, FM_I32);
        check_gather(t, -1, idx32, "axis -1, i32 index");
        fm_tensor *idx0 = fm_tensor_from_data((int64_t[]){2, 0, 1, 1}, 3, (int64_t[]){4, 1, 1}, FM_I64);
        check_gather(t, 0, idx0, "axis 0");
        /* non-contiguous input and index */
        fm_tensor *tt = fm_transpose(t, 0, 2); /* [5, 4, 3] */
        fm_tensor *it = fm_transpose(idx, 0, 2); /* [3, 6, 2] */
        check_gather(tt, 1, it, "transposed");
        fm_tensor_release_n(8, t64, ts, t, idx, idx32, idx0, tt, it);
    }
    /* bad input */
    fm_tensor *t = op_randn(2, (int64_t[]){3, 4}, FM_F32, 21);
    fm_tensor *ibad = fm_tensor_from_data((int64_t[]){0, 7, 1}, 2, (int64_t[]){1, 3}, FM_I64);
    fm_tensor *ineg = fm_tensor_from_data((int32_t[]){0, -1}, 2, (int64_t[]){1, 2}, FM_I32);
    fm_tensor *ifl = fm_tensor_zeros(2, (int64_t[]){1, 2}, FM_F32, FM_CPU);
    fm_tensor *i1d = fm_tensor_from_data((int64_t[]){0, 1}, 1, (int64_t[]){2}, FM_I64);
    fm_tensor *ibig = fm_tensor_zeros(2, (int64_t[]){4, 2}, FM_I64, FM_CPU);
    CHECK(fm_gather(t, 1, ibad) == NULL);
    CHECK_ERR_CONTAINS("gather: index 7 is out of range for axis 1 with size 4");
    CHECK(fm_last_status() == FM_ERR_INVALID);
    CHECK(fm_gather(t, 1, ineg) == NULL);
    CHECK_ERR_CONTAINS("gather: index -1 is out of range for axis 1 with size 4");
    CHECK(fm_gather(t, 1, ifl) == NULL);
    CHECK_ERR_CONTAINS("gather: index must be i64 or i32, got f32");
    CHECK(fm_gather(t, 1, i1d) == NULL);
    CHECK_ERR_CONTAINS("gather: index shape [2] does not fit input [3, 4]");
    CHECK(fm_gather(t, 1, ibig) == NULL);
    CHECK_ERR_CONTAINS("gather: index shape [4, 2] does not fit input [3, 4]");
    CHECK(fm_gather(t, 2, ibad) == NULL);
    CHECK_ERR_CONTAINS("gather");
    fm_tensor_release_n(6, t, ibad, ineg, ifl, i1d, ibig);
    OP_END;
}

typedef struct ix_gc { int ax; fm_tensor *idx; int sel; } ix_gc;
static fm_tensor *ix_gc_fn(fm_tensor **in, void *ctx) {
    const ix_gc *c = ctx;
    return c->sel ? fm_index_select(in[0], c->ax, c->idx) : fm_gather(in[0], c->ax, c->idx);
}

static int gather_grad(void) {
    OP_BEGIN;
    fm_tensor *tb = op_randn(3, (int64_t[]){4, 3, 5}, FM_F64, 30), *t = fm_transpose(tb, 0, 2); /* [5, 3, 4] */
    fm_tensor_requires_grad_(t, true);
    int64_t iv[4 * 3 * 3];
    for (int i = 0; i < 36; i++) iv[i] = (i * 3) % 5; /* repeats along axis 0: gradients accumulate */
    fm_tensor *idx = fm_tensor_from_data(iv, 3, (int64_t[]){4, 3, 3}, FM_I64);
    ix_gc c = {0, idx, 0};
    fm_tensor *in[1] = {t};
    CHECK(gradcheck("gather axis 0", ix_gc_fn, 1, in, &c, 1e-6, 1e-6));
    fm_tensor *idx2 = fm_tensor_from_data((int32_t[]){3, 3, 0, 1, 3, 2}, 3, (int64_t[]){1, 2, 3}, FM_I32);
    ix_gc c2 = {2, idx2, 0};
    CHECK(gradcheck("gather axis 2", ix_gc_fn, 1, in, &c2, 1e-6, 1e-6));
    fm_tensor_release_n(4, tb, t, idx, idx2);
    OP_END;
}

/* ---------------------------------------------------------- index_select */

static int index_select_forward(void) {
    OP_BEGIN;
    fm_dtype dts[3] = {FM_F32, FM_F64, FM_I64};
    for (int k = 0; k < 3; k++) {
        fm_tensor *t64 = op_randn(3, (int64_t[]){4, 5, 3}, FM_F64, 40), *ts = fm_mul_scalar(t64, 10);
        fm_tensor *t = fm_to_dtype(ts, dts[k]), *tt = fm_transpose(t, 0, 1); /* [5, 4, 3] */
        fm_tensor *idx = fm_tensor_from_data((int64_t[]){4, 0, 4, 2, 1, 1, 3}, 1, (int64_t[]){7}, FM_I64);
        fm_tensor *idx32 = fm_tensor_from_data((int32_t[]){2, 0}, 1, (int64_t[]){2}, FM_I32);
        for (int ax = 0; ax < 3; ax++) {
            fm_tensor *src = ax == 0 ? tt : t; /* size >= 5 along the axis for idx; t axis 1 has 5 */
            fm_tensor *ii = ax == 2 ? idx32 : idx;
            int use_ax = ax == 0 ? 0 : ax == 1 ? 1 : 2;
            fm_tensor *y = fm_index_select(src, use_ax, ii);
            CHECK_MSG(y != NULL, "index_select axis %d: %s", ax, fm_last_error());
            if (!y) continue;
            CHECK(y->shape[use_ax] == fm_tensor_numel(ii));
            int bad = 0;
            int64_t ix[FM_MAX_DIMS];
            for (int64_t e = 0; e < fm_tensor_numel(y); e++) {
                unravel(e, y->ndim, y->shape, ix);
                ix[use_ax] = (int64_t)fm_tensor_get(ii, ix[use_ax]);
                if (fm_tensor_get(y, e) != at(src, ix)) bad++;
            }
            CHECK_MSG(bad == 0, "index_select %s axis %d: %d wrong", fm_dtype_name(dts[k]), use_ax, bad);
            fm_tensor_release(y);
        }
        fm_tensor *y = fm_index_select(t, -2, idx);
        CHECK(y && y->shape[1] == 7);
        fm_tensor_release_n(7, t64, ts, t, tt, idx, idx32, y);
    }
    /* bad input */
    fm_tensor *t = op_randn(2, (int64_t[]){3, 4}, FM_F32, 41);
    fm_tensor *ibad = fm_tensor_from_data((int64_t[]){0, 3}, 1, (int64_t[]){2}, FM_I64);
    fm_tensor *i2d = fm_tensor_zeros(2, (int64_t[]){1, 2}, FM_I64, FM_CPU);
    fm_tensor *ifl = fm_tensor_zeros(1, (int64_t[]){2}, FM_F64, FM_CPU);
    CHECK(fm_index_select(t, 0, ibad) == NULL);
    CHECK_ERR_CONTAINS("index_select: index 3 is out of range for axis 0 with size 3");
    CHECK(fm_index_select(t, 0, i2d) == NULL);
    CHECK_ERR_CONTAINS("index_select: index must be 1-D, got [1, 2]");
    CHECK(fm_index_select(t, 0, ifl) == NULL);
    CHECK_ERR_CONTAINS("index_select: index must be i64 or i32, got f64");
    CHECK(fm_index_select(t, -3, ibad) == NULL);
    CHECK_ERR_CONTAINS("index_select");
    fm_tensor_release_n(4, t, ibad, i2d, ifl);
    OP_END;
}

static int index_select_grad(void) {
    OP_BEGIN;
    fm_tensor *tb = op_randn(3, (int64_t[]){3, 4, 2}, FM_F64, 50), *t = fm_transpose(tb, 0, 1); /* [4, 3, 2] */
    fm_tensor_requires_grad_(t, true);
    fm_tensor *idx = fm_tensor_from_data((int64_t[]){1, 1, 3, 0, 1}, 1, (int64_t[]){5}, FM_I64);
    fm_tensor *in[1] = {t};
    for (int ax = 0; ax < 3; ax++) {
        fm_tensor *ii = ax == 0 ? idx : fm_tensor_from_data((int64_t[]){1, 0, 1}, 1, (int64_t[]){3}, FM_I64);
        ix_gc c = {ax, ii, 1};
        CHECK_MSG(gradcheck("index_select", ix_gc_fn, 1, in, &c, 1e-6, 1e-6), "axis %d", ax);
        if (ii != idx) fm_tensor_release(ii);
    }
    /* a wide row: index_add splits columns into blocks */
    fm_tensor *wide = op_randn(2, (int64_t[]){3, 700}, FM_F32, 51);
    fm_tensor_requires_grad_(wide, true);
    fm_tensor *iw = fm_tensor_from_data((int64_t[]){2, 2, 0}, 1, (int64_t[]){3}, FM_I64);
    fm_tensor *y = fm_index_select(wide, 0, iw);
    fm_tensor *s = y ? fm_sum(y, 0, NULL, false) : NULL;
    CHECK(s && fm_backward(s, NULL, false) == FM_OK);
    if (wide->grad) CHECK(fm_tensor_get(wide->grad, 2 * 700 + 699) == 2 && fm_tensor_get(wide->grad, 5) == 1 &&
                          fm_tensor_get(wide->grad, 700 + 3) == 0);
    fm_tensor_release_n(7, tb, t, idx, wide, iw, y, s);
    OP_END;
}

/* ---------------------------------------------------------------- one_hot */

static int one_hot_forward(void) {
    OP_BEGIN;
    fm_tensor *i64 = fm_tensor_from_data((int64_t[]){0, 2, 1, 2, 0, 3}, 2, (int64_t[]){2, 3}, FM_I64);
    fm_tensor *y = fm_one_hot(i64, 4);
    CHECK(y && y->dtype == FM_F32 && y->ndim == 3 && y->shape[2] == 4);
    if (y) {
        int64_t v[6] = {0, 2, 1, 2, 0, 3};
        int bad = 0;
        for (int i = 0; i < 6; i++)
            for (int k = 0; k < 4; k++)
                if (fm_tensor_get(y, i * 4 + k) != (k == v[i] ? 1.0 : 0.0)) bad++;
        CHECK(bad == 0);
    }
    fm_tensor *it = fm_transpose(i64, 0, 1), *i32 = fm_tensor_from_data((int32_t[]){1, 0}, 1, (int64_t[]){2}, FM_I32);
    fm_tensor *yt = fm_one_hot(it, 4), *y32 = fm_one_hot(i32, 2);
    CHECK(yt && fm_tensor_get(yt, (0 * 2 + 1) * 4 + 2) == 1.0); /* it[0][1] = i64[1][0] = 2 */
    CHECK(y32 && fm_tensor_get(y32, 1) == 1.0 && fm_tensor_get(y32, 2) == 1.0 && fm_tensor_get(y32, 0) == 0.0);
    /* bad input */
    CHECK(fm_one_hot(i64, 3) == NULL);
    CHECK_ERR_CONTAINS("one_hot: index 3 is out of range for num_classes 3");
    CHECK(fm_one_hot(i64, 0) == NULL);
    CHECK_ERR_CONTAINS("one_hot: num_classes must be >= 1, got 0");
    fm_tensor *fl = fm_tensor_zeros(1, (int64_t[]){2}, FM_F32, FM_CPU);
    CHECK(fm_one_hot(fl, 3) == NULL);
    CHECK_ERR_CONTAINS("one_hot: index must be an integer tensor");
    fm_tensor *neg = fm_tensor_from_data((int64_t[]){-1}, 1, (int64_t[]){1}, FM_I64);
    CHECK(fm_one_hot(neg, 3) == NULL);
    CHECK_ERR_CONTAINS("one_hot: index -1 is out of range");
    fm_tensor_release_n(8, i64, y, it, i32, yt, y32, fl, neg);
    OP_END;
}

/* -------------------------------------------------------------------- pad */

/* The source index along a dim of size n of output position i (pad b before), or -1 for the constant. */
static int64_t pad_src(int64_t i, int64_t n, int64_t b, fm_pad_mode m) {
    int64_t j = i - b;
    if (j >= 0 && j < n) return j;
    if (m == FM_PAD_CONSTANT) return -1;
    if (m == FM_PAD_EDGE) return j < 0 ? 0 : n - 1;
    if (m == FM_PAD_REFLECT) return j < 0 ? -j : 2 * (n - 1) - j;
    return ((j % n) + n) % n;
}

static void check_pad(fm_tensor *x, const int64_t *pads, fm_pad_mode m, double v, const char *what) {
    fm_tensor *y = fm_pad(x, pads, m, v);
    CHECK_MSG(y != NULL, "pad %s %s: %s", fm_pad_mode_name(m), what, fm_last_error());
    if (!y) return;
    const int nd = x->ndim;
    bool shape_ok = y->ndim == nd && y->dtype == x->dtype;
    for (int d = 0; shape_ok && d < nd; d++) shape_ok = y->shape[d] == x->shape[d] + pads[d] + pads[nd + d];
    CHECK_MSG(shape_ok, "pad %s %s: shape", fm_pad_mode_name(m), what);
    int bad = 0;
    int64_t ix[FM_MAX_DIMS];
    for (int64_t e = 0; shape_ok && e < fm_tensor_numel(y); e++) {
        unravel(e, nd, y->shape, ix);
        bool fill = false;
        for (int d = 0; d < nd; d++) {
            const int64_t j = pad_src(ix[d], x->shape[d], pads[d], m);
            fill |= j < 0;
            ix[d] = j;
        }
        if (fm_tensor_get(y, e) != (fill ? v : at(x, ix))) bad++;
    }
    CHECK_MSG(bad == 0, "pad %s %s: %d wrong elements", fm_pad_mode_name(m), what, bad);
    fm_tensor_release(y);
}

static int pad_forward(void) {
    OP_BEGIN;
    fm_tensor *b = op_randn(3, (int64_t[]){4, 3, 5}, FM_F32, 40), *x = fm_transpose(b, 0, 2); /* [5, 3, 4], not contiguous */
    const int64_t cases[][6] = {
        {0, 1, 2, 0, 2, 1}, /* before and after on several dims */
        {1, 0, 0, 1, 0, 3},
        {-1, 0, 2, 0, 0, -1}, /* crops on dims 0 and 2, a pad after the crop on dim 2 */
        {0, 0, 0, 0, 0, 0},
    };
    for (int m = 0; m < 4; m++)
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            char what[32];
            snprintf(what, sizeof what, "case %zu", k);
            check_pad(x, cases[k], (fm_pad_mode)m, m == FM_PAD_CONSTANT ? -2.5 : 0.0, what);
        }
    check_pad(x, (const int64_t[]){7, 0, 0, 9, 0, 0}, FM_PAD_WRAP, 0, "wrap beyond the size");
    fm_tensor *xi = fm_to_dtype(b, FM_I64);
    check_pad(xi, (const int64_t[]){1, 0, 0, 0, 2, 1}, FM_PAD_CONSTANT, 7, "i64");
    check_pad(xi, (const int64_t[]){1, 0, 2, 0, 2, 1}, FM_PAD_REFLECT, 0, "i64");
    fm_pad_mode mode;
    CHECK(fm_pad_mode_parse("reflect", &mode) == FM_OK && mode == FM_PAD_REFLECT);
    /* bad input: nothing computed, the error names the dim and why */
    CHECK(fm_pad(x, (const int64_t[]){0, 0, 4, 0, 0, 0}, FM_PAD_REFLECT, 0) == NULL);
    CHECK_ERR_CONTAINS("pad: reflect padding of 4 before and 0 after dim 2 of [5, 3, 4] reflects more elements than the dim has less one");
    CHECK(fm_pad(x, (const int64_t[]){-6, 0, 0, 2, 0, 0}, FM_PAD_CONSTANT, 0) == NULL);
    CHECK_ERR_CONTAINS("crops more elements than the dim has");
    CHECK(fm_pad(x, (const int64_t[]){0, -9, 0, 0, 0, 0}, FM_PAD_EDGE, 0) == NULL);
    CHECK_ERR_CONTAINS("dim 1 of [5, 3, 4] leaves a negative or too large size");
    CHECK(fm_pad(x, NULL, FM_PAD_EDGE, 0) == NULL);
    CHECK_ERR_CONTAINS("pad: pads is NULL");
    /* an edge pad within the 2^40 bound but too large to hold (2^33 rows: 64 GiB of indices
     * alone): refused by the memory limit as out of memory, nothing allocated past it (the
     * ONNX fuzzer's input; its indices went to malloc before) */
    CHECK(fm_memory_set_limit(FM_CPU, (size_t)64 << 20) == FM_OK);
    CHECK(fm_pad(x, (const int64_t[]){0, 0, 0, INT64_C(1) << 33, 0, 0}, FM_PAD_EDGE, 0) == NULL);
    CHECK(fm_last_status() == FM_ERR_OOM);
    CHECK(fm_memory_set_limit(FM_CPU, 0) == FM_OK);
    CHECK(fm_pad_mode_parse("mirror", &mode) != FM_OK);
    CHECK_ERR_CONTAINS("pad: mode 'mirror' is not one of constant, edge, reflect, wrap");
    fm_tensor *empty = fm_tensor_zeros(2, (int64_t[]){0, 3}, FM_F32, FM_CPU);
    CHECK(fm_pad(empty, (const int64_t[]){1, 0, 0, 0}, FM_PAD_EDGE, 0) == NULL);
    CHECK_ERR_CONTAINS("has no element to repeat");
    fm_tensor_release_n(4, b, x, xi, empty);
    OP_END;
}

typedef struct pad_gc { const int64_t *pads; fm_pad_mode m; } pad_gc;
static fm_tensor *pad_gc_fn(fm_tensor **in, void *ctx) {
    const pad_gc *c = ctx;
    return fm_pad(in[0], c->pads, c->m, 0.5);
}

static int pad_grad(void) {
    OP_BEGIN;
    fm_tensor *x = op_randn(3, (int64_t[]){2, 3, 4}, FM_F64, 41);
    fm_tensor_requires_grad_(x, true);
    fm_tensor *in[1] = {x};
    const int64_t pads[6] = {0, 2, -1, 1, 1, 3}; /* reflected elements get gradient from two places */
    for (int m = 0; m < 4; m++) {
        pad_gc c = {pads, (fm_pad_mode)m};
        CHECK(gradcheck(fm_pad_mode_name((fm_pad_mode)m), pad_gc_fn, 1, in, &c, 1e-6, 1e-6));
    }
    fm_tensor_release(x);
    OP_END;
}

/* ---------------------------------------------------- scatter, scatter_nd */

static double ref_combine(int r, double d, double v) {
    switch (r) {
    case FM_SCATTER_ADD: return d + v;
    case FM_SCATTER_MUL: return d * v;
    case FM_SCATTER_AMAX: return d > v ? d : v;
    case FM_SCATTER_AMIN: return d < v ? d : v;
    default: return v;
    }
}

/* y against t with src applied element by element in index order (duplicates included). */
static void check_scatter(fm_tensor *t, int ax, fm_tensor *idx, fm_tensor *src, int r, const char *what) {
    fm_tensor *y = fm_scatter(t, ax, idx, src, (fm_scatter_reduce)r);
    CHECK_MSG(y != NULL, "scatter %s: %s", what, fm_last_error());
    if (!y) return;
    const int64_t n = fm_tensor_numel(t);
    double *want = malloc(sizeof(double) * (size_t)n);
    int64_t ix[FM_MAX_DIMS];
    for (int64_t e = 0; e < n; e++) unravel(e, t->ndim, t->shape, ix), want[e] = at(t, ix);
    const int a = ax < 0 ? ax + t->ndim : ax;
    for (int64_t e = 0; e < fm_tensor_numel(idx); e++) {
        unravel(e, idx->ndim, idx->shape, ix);
        const double v = at(src, ix);
        ix[a] = (int64_t)fm_tensor_get(idx, e);
        int64_t flat = 0;
        for (int d = 0; d < t->ndim; d++) flat = flat * t->shape[d] + ix[d];
        want[flat] = ref_combine(r, want[flat], v);
    }
    int bad = 0;
    for (int64_t e = 0; e < n; e++) bad += fabs(fm_tensor_get(y, e) - want[e]) > 1e-5 * (1 + fabs(want[e]));
    CHECK_MSG(bad == 0 && y->dtype == t->dtype, "scatter %s reduce %s: %d wrong elements", what, fm_scatter_reduce_name((fm_scatter_reduce)r), bad);
    free(want);
    fm_tensor_release(y);
}

static int scatter_forward(void) {
    OP_BEGIN;
    fm_dtype dts[3] = {FM_F32, FM_F64, FM_I64};
    for (int k = 0; k < 3; k++)
        for (int th = 1; th <= 2; th++) {
            fm_set_num_threads(th);
            fm_tensor *t64 = op_randn(3, (int64_t[]){4, 5, 3}, FM_F64, 50), *ts = fm_mul_scalar(t64, 4);
            fm_tensor *t = fm_to_dtype(ts, dts[k]), *tt = fm_transpose(t, 0, 2); /* [3, 5, 4], a strided view */
            fm_tensor *s64 = op_randn(3, (int64_t[]){5, 6, 3}, FM_F64, 51), *ss = fm_mul_scalar(s64, 4), *src = fm_to_dtype(ss, dts[k]);
            int64_t iv[3 * 4 * 2];
            for (int i = 0; i < 24; i++) iv[i] = (i * 7 + i / 5) % 3; /* repeats along every axis */
            fm_tensor *idx = fm_tensor_from_data(iv, 3, (int64_t[]){3, 4, 2}, FM_I64);
            int32_t iv32[24];
            for (int i = 0; i < 24; i++) iv32[i] = (int32_t)((i * 5 + 1) % 4);
            fm_tensor *idx32 = fm_tensor_from_data(iv32, 3, (int64_t[]){3, 4, 2}, FM_I32);
            for (int r = 0; r <= FM_SCATTER_AMIN; r++) {
                check_scatter(t, 0, idx, src, r, "axis 0, src larger than index");
                check_scatter(t, 1, idx, src, r, "axis 1");
                check_scatter(t, -1, idx, src, r, "axis -1");
                check_scatter(tt, 2, idx32, src, r, "transposed input, i32 index along axis 2");
            }
            fm_tensor_release_n(9, t64, ts, t, tt, s64, ss, src, idx, idx32);
        }
    fm_set_num_threads(0);
    /* bad input */
    fm_tensor *t = op_randn(2, (int64_t[]){3, 4}, FM_F32, 52), *src = op_randn(2, (int64_t[]){3, 4}, FM_F32, 53);
    fm_tensor *ibad = fm_tensor_from_data((int64_t[]){0, 4}, 2, (int64_t[]){1, 2}, FM_I64);
    fm_tensor *ineg = fm_tensor_from_data((int64_t[]){-1}, 2, (int64_t[]){1, 1}, FM_I64);
    fm_tensor *ifl = fm_tensor_zeros(2, (int64_t[]){1, 1}, FM_F32, FM_CPU), *ibig = fm_tensor_zeros(2, (int64_t[]){4, 1}, FM_I64, FM_CPU);
    fm_tensor *s64 = fm_tensor_zeros(2, (int64_t[]){3, 4}, FM_F64, FM_CPU), *small = fm_tensor_zeros(2, (int64_t[]){1, 1}, FM_F32, FM_CPU);
    const struct { int axis; fm_tensor *index, *src; int reduce; const char *err; } bad[] = {
        {1, ibad, src, FM_SCATTER_NONE, "scatter: index 4 is out of range for axis 1 with size 4"},
        {1, ineg, src, FM_SCATTER_ADD, "scatter: index -1 is out of range"},
        {1, ifl, src, FM_SCATTER_NONE, "scatter: index must be i64 or i32, got f32"},
        {1, ibig, src, FM_SCATTER_NONE, "does not fit input [3, 4]"},
        {0, ibig, small, FM_SCATTER_NONE, "does not fit input"},
        {0, ineg, s64, FM_SCATTER_NONE, "scatter: src has dtype f64 but the input f32"},
        {2, ineg, src, FM_SCATTER_NONE, "axis 2"},
        {0, ineg, src, 9, "unknown reduce 9"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        CHECK_MSG(fm_scatter(t, bad[k].axis, bad[k].index, bad[k].src, (fm_scatter_reduce)bad[k].reduce) == NULL, "bad scatter %zu", k);
        CHECK_ERR_CONTAINS(bad[k].err);
    }
    fm_scatter_reduce red;
    CHECK(fm_scatter_reduce_parse("amax", &red) == FM_OK && red == FM_SCATTER_AMAX);
    CHECK(fm_scatter_reduce_parse("max", &red) != FM_OK);
    CHECK_ERR_CONTAINS("reduce 'max' is not one of none, add, mul, amax, amin");
    fm_tensor_requires_grad_(src, true);
    fm_tensor *i0 = fm_tensor_zeros(2, (int64_t[]){1, 1}, FM_I64, FM_CPU);
    CHECK(fm_scatter(t, 0, i0, src, FM_SCATTER_MUL) == NULL);
    CHECK_ERR_CONTAINS("scatter with reduce 'mul' has no gradient");
    fm_tensor_release_n(9, t, src, ibad, ineg, ifl, ibig, s64, small, i0);
    OP_END;
}

typedef struct sc_gc { int ax; fm_tensor *idx; fm_scatter_reduce r; } sc_gc;
static fm_tensor *sc_gc_fn(fm_tensor **in, void *ctx) {
    const sc_gc *c = ctx;
    return fm_scatter(in[0], c->ax, c->idx, in[1], c->r);
}

static int scatter_grad(void) {
    OP_BEGIN;
    fm_tensor *t = op_randn(3, (int64_t[]){4, 5, 3}, FM_F64, 54), *src = op_randn(3, (int64_t[]){3, 4, 2}, FM_F64, 55);
    fm_tensor_requires_grad_(t, true);
    fm_tensor_requires_grad_(src, true);
    int64_t iv[24]; /* distinct along axis 1 within each line (none's gradient is defined then) */
    for (int i = 0; i < 24; i++) iv[i] = ((i / 2) % 4 + i / 8 + i % 2) % 5;
    fm_tensor *idx = fm_tensor_from_data(iv, 3, (int64_t[]){3, 4, 2}, FM_I64);
    fm_tensor *in[2] = {t, src};
    sc_gc none = {1, idx, FM_SCATTER_NONE}, add = {1, idx, FM_SCATTER_ADD};
    CHECK(gradcheck("scatter none", sc_gc_fn, 2, in, &none, 1e-6, 1e-6));
    CHECK(gradcheck("scatter add", sc_gc_fn, 2, in, &add, 1e-6, 1e-6));
    fm_tensor_release_n(3, t, src, idx);
    OP_END;
}

static int scatter_nd_forward(void) {
    OP_BEGIN;
    const int64_t sh[3] = {4, 3, 5};
    fm_dtype dts[2] = {FM_F64, FM_I32};
    for (int d = 0; d < 2; d++)
        for (int k = 1; k <= 3; k++)
            for (int r = 0; r <= FM_SCATTER_AMIN; r++) {
                fm_tensor *t64 = op_randn(3, sh, FM_F64, 60), *ts = fm_mul_scalar(t64, 5), *t = fm_to_dtype(ts, dts[d]);
                const int64_t m = 6; /* tuples, two of them the same slice (one through a negative index) */
                int64_t iv[6 * 3], ish[3] = {2, 3, k}, ush[5] = {2, 3}, un = m;
                for (int64_t i = 0; i < m; i++)
                    for (int j = 0; j < k; j++) iv[i * k + j] = (i * (j + 2) + j) % sh[j];
                iv[5 * k] = iv[0] - sh[0]; /* update 5 lands where update 0 did, counted from the end */
                for (int j = 1; j < k; j++) iv[5 * k + j] = iv[j];
                for (int j = k; j < 3; j++) ush[2 + j - k] = sh[j], un *= sh[j];
                fm_tensor *idx = fm_tensor_from_data(iv, 3, ish, FM_I64), *u64 = op_randn(2 + 3 - k, ush, FM_F64, 61 + k);
                fm_tensor *us = fm_mul_scalar(u64, 5), *up = fm_to_dtype(us, dts[d]);
                fm_tensor *y = fm_scatter_nd(t, idx, up, (fm_scatter_reduce)r);
                CHECK_MSG(y != NULL, "scatter_nd k %d: %s", k, fm_last_error());
                double want[60];
                for (int e = 0; e < 60; e++) want[e] = fm_tensor_get(t, e);
                const int64_t slice = un / m;
                for (int64_t i = 0; i < m; i++) {
                    int64_t o = 0;
                    for (int j = 0; j < k; j++) o = o * sh[j] + (iv[i * k + j] + sh[j]) % sh[j];
                    for (int64_t e = 0; e < slice; e++) want[o * slice + e] = ref_combine(r, want[o * slice + e], fm_tensor_get(up, i * slice + e));
                }
                int bad = 0;
                for (int e = 0; y && e < 60; e++) bad += fabs(fm_tensor_get(y, e) - want[e]) > 1e-9 * (1 + fabs(want[e]));
                CHECK_MSG(bad == 0, "scatter_nd %s k %d reduce %s: %d wrong", fm_dtype_name(dts[d]), k, fm_scatter_reduce_name((fm_scatter_reduce)r), bad);
                fm_tensor_release_n(8, t64, ts, t, idx, u64, us, up, y);
            }
    /* bad input */
    fm_tensor *t = fm_tensor_zeros(2, (int64_t[]){3, 4}, FM_F32, FM_CPU), *u = fm_tensor_zeros(2, (int64_t[]){2, 4}, FM_F32, FM_CPU);
    fm_tensor *ibad = fm_tensor_from_data((int64_t[]){1, -4}, 2, (int64_t[]){2, 1}, FM_I64);
    fm_tensor *ik3 = fm_tensor_zeros(2, (int64_t[]){2, 3}, FM_I64, FM_CPU), *iok = fm_tensor_zeros(2, (int64_t[]){2, 1}, FM_I64, FM_CPU);
    fm_tensor *u3 = fm_tensor_zeros(2, (int64_t[]){2, 3}, FM_F32, FM_CPU);
    CHECK(fm_scatter_nd(t, ibad, u, FM_SCATTER_NONE) == NULL);
    CHECK_ERR_CONTAINS("scatter_nd: index -4 (update 1) is out of range for dim 0 with size 3 (valid: -3..2)");
    CHECK(fm_scatter_nd(t, ik3, u, FM_SCATTER_NONE) == NULL);
    CHECK_ERR_CONTAINS("do not fit input [3, 4]");
    CHECK(fm_scatter_nd(t, iok, u3, FM_SCATTER_NONE) == NULL);
    CHECK_ERR_CONTAINS("updates of shape indices.shape[:-1] + input.shape[k:]");
    fm_tensor_requires_grad_(u, true);
    CHECK(fm_scatter_nd(t, iok, u, FM_SCATTER_NONE) == NULL);
    CHECK_ERR_CONTAINS("scatter_nd with reduce 'none' has no gradient");
    fm_tensor *tb = fm_tensor_zeros(2, (int64_t[]){3, 4}, FM_BOOL, FM_CPU), *ub = fm_tensor_zeros(2, (int64_t[]){2, 4}, FM_BOOL, FM_CPU);
    CHECK(fm_scatter_nd(tb, iok, ub, FM_SCATTER_ADD) == NULL); /* the front end refuses it, on every device */
    CHECK_ERR_CONTAINS("scatter_nd: reduce 'add' needs a numeric dtype of at most 8 bytes; got bool");
    fm_tensor *yb = fm_scatter_nd(tb, iok, ub, FM_SCATTER_NONE);
    CHECK(yb != NULL);
    fm_tensor_release_n(9, t, u, ibad, ik3, iok, u3, tb, ub, yb);
    OP_END;
}

/* ------------------------------------------------------------------ topk */

/* Does the element b come before a in topk's order? NaN ranks above every number; equal
 * values: the lower index first. */
static bool tk_before(double b, int64_t ib, double a, int64_t ia, bool largest) {
    bool nb = isnan(b), na = isnan(a);
    int r = nb || na ? (int)nb - (int)na : (b > a) - (b < a);
    if (!largest) r = -r; /* smallest first: NaN last */
    return r > 0 || (r == 0 && ib < ia);
}

/* Every element's place in the order is the count of elements before it (a reference that
 * shares nothing with the kernel's heap and sort); those with a place below k must be there. */
static int check_topk(fm_tensor *x, int64_t k, int axis, bool largest, const char *what) {
    fm_tensor *v = NULL, *ix = NULL;
    fm_status st = fm_topk(x, k, axis, largest, &v, &ix);
    CHECK_MSG(st == FM_OK && v && ix, "topk %s: %s", what, fm_last_error());
    if (st) return 1;
    int ax = axis < 0 ? axis + x->ndim : axis, bad = 0;
    CHECK_MSG(v->dtype == x->dtype && ix->dtype == FM_I64 && v->shape[ax] == k, "topk %s: dtypes or shape", what);
    int64_t id[FM_MAX_DIMS], jd[FM_MAX_DIMS];
    for (int64_t e = 0; e < fm_tensor_numel(x); e++) {
        unravel(e, x->ndim, x->shape, id);
        memcpy(jd, id, sizeof id);
        double a = at(x, id);
        int64_t place = 0;
        for (jd[ax] = 0; jd[ax] < x->shape[ax]; jd[ax]++) place += tk_before(at(x, jd), jd[ax], a, id[ax], largest);
        if (place >= k) continue;
        jd[ax] = place;
        double got = at(v, jd);
        bad += at(ix, jd) != (double)id[ax] || !(got == a || (isnan(got) && isnan(a)));
    }
    CHECK_MSG(bad == 0, "topk %s k %lld %s: %d wrong", what, (long long)k, largest ? "largest" : "smallest", bad);
    fm_tensor_release_n(2, v, ix);
    return bad != 0;
}

static int topk_forward(void) {
    OP_BEGIN;
    const int64_t sh[3] = {3, 7, 4};
    fm_dtype dts[4] = {FM_F32, FM_F64, FM_I32, FM_I64};
    for (int d = 0; d < 4; d++) {
        fm_tensor *r = op_randn(3, sh, FM_F64, 70), *r3 = fm_mul_scalar(r, 2), *rr = fm_round(r3); /* ties */
        if (fm_dtype_is_float(dts[d])) fm_tensor_set(rr, 5, NAN), fm_tensor_set(rr, 40, NAN), fm_tensor_set(rr, 41, NAN);
        fm_tensor *x = fm_to_dtype(rr, dts[d]);
        for (int ax = -1; ax < 3; ax++)
            for (int lg = 0; lg < 2; lg++) {
                int64_t n = sh[ax < 0 ? 2 : ax], ks[4] = {0, 1, n / 2, n};
                for (int q = 0; q < 4; q++) check_topk(x, ks[q], ax, lg, fm_dtype_name(dts[d]));
            }
        fm_tensor *xt = fm_transpose(x, 0, 2); /* a strided view */
        check_topk(xt, 2, 1, true, "transposed");
        fm_tensor_release_n(5, r, r3, rr, x, xt);
    }
    /* long lines: the heap (k small) and the sort (k large), on one thread and on several */
    fm_tensor *r = op_randn(2, (int64_t[]){3, 1000}, FM_F32, 71), *r8 = fm_mul_scalar(r, 8), *x = fm_round(r8);
    for (int t = 1; t <= 2; t++) {
        fm_set_num_threads(t);
        check_topk(x, 5, 1, true, "heap");
        check_topk(x, 7, 1, false, "heap");
        check_topk(x, 400, 1, true, "sort");
    }
    fm_set_num_threads(0);
    /* bad input */
    fm_tensor *v = NULL, *i = NULL, *s = fm_tensor_scalar(1.0, FM_F32);
    CHECK(fm_topk(x, 1001, 1, true, &v, &i) != FM_OK && !v && !i);
    CHECK_ERR_CONTAINS("topk: k = 1001 is outside [0, 1000], the size of axis 1");
    CHECK(fm_topk(x, -1, 1, true, &v, &i) != FM_OK);
    CHECK_ERR_CONTAINS("topk: k = -1 is outside");
    CHECK(fm_topk(x, 1, 2, true, &v, &i) != FM_OK);
    CHECK_ERR_CONTAINS("topk");
    CHECK(fm_topk(s, 1, 0, true, &v, &i) != FM_OK);
    CHECK_ERR_CONTAINS("topk: the input must have at least one dim");
    CHECK(fm_topk(NULL, 1, 0, true, &v, &i) != FM_OK);
    CHECK_ERR_CONTAINS("topk: input is NULL");
    fm_tensor_release_n(4, r, r8, x, s);
    OP_END;
}

typedef struct tk_gc { int64_t k; int ax; bool largest; } tk_gc;
static fm_tensor *tk_gc_fn(fm_tensor **in, void *ctx) {
    const tk_gc *c = ctx;
    fm_tensor *v = NULL, *i = NULL;
    fm_topk(in[0], c->k, c->ax, c->largest, &v, &i);
    fm_tensor_release(i);
    return v;
}

static int topk_grad(void) {
    OP_BEGIN;
    fm_tensor *x = op_randn(3, (int64_t[]){3, 6, 4}, FM_F64, 72); /* distinct values: the choice is stable under the probe */
    fm_tensor_requires_grad_(x, true);
    tk_gc a = {3, 1, true}, b = {2, -1, false};
    CHECK(gradcheck("topk largest", tk_gc_fn, 1, &x, &a, 1e-6, 1e-6));
    CHECK(gradcheck("topk smallest", tk_gc_fn, 1, &x, &b, 1e-6, 1e-6));
    fm_tensor_release(x);
    OP_END;
}

OP_TEST("cat", cat_forward, cat_grad)
OP_TEST("topk", topk_forward, topk_grad)
OP_TEST("gather", gather_forward, gather_grad)
OP_TEST("index_select", index_select_forward, index_select_grad)
OP_TEST("one_hot", one_hot_forward, NULL)
OP_TEST("scatter", scatter_forward, scatter_grad)
OP_TEST("scatter_nd", scatter_nd_forward, NULL)
OP_TEST("index_select", pad_forward, pad_grad) /* fm_pad: cat, slice and index_select put together */
