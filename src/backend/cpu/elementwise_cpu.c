/* CPU kernels for elementwise ops: unary, unary backward, binary, comparisons,
 * where, copy.
 *
 * Every op has exactly two inner loops, over contiguous arrays: one in float
 * (AVX2 in elementwise_avx2.c for the hot ops, scalar otherwise) and one in
 * double. Any other case (strided or broadcast operands, f16/bf16/integer
 * dtypes) gathers operands in chunks into contiguous buffers of the compute
 * type (float for f32/f16/bf16, double for f64 and integers), runs the same
 * loop, and scatters the result. So each op's math is written once per compute
 * type and every layout and dtype gets it. Chunks are split over the pool. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/elementwise_math.h"
#include "backend/scalar_math.h"
#include "core/cpu_features.h"
#include "core/dtype_internal.h"
#include "core/parallel.h"

#define CHUNK 2048
/* Outputs at least this big are written with non-temporal stores (direct f32
 * path): they would not stay in cache for their consumer anyway, and streaming
 * skips the read-for-ownership of each output line (add over 4M floats: 64 ->
 * 48 MB). The threshold is FM_CPU_STREAM_MIN_BYTES (cpu_kernels.h), as for
 * softmax and the norms. Measured on the 4M-element rows of bench_core (quiet
 * machine, huge pages): add, GELU and tanh-GELU forward and backward are 0-10%
 * faster streamed (GELU is bound by memory as much as by arithmetic at two
 * threads). */

/* ---- scalar math (the reference for every dtype; activations from backend/scalar_math.h) ---- */

double fm_ew_unary_scalar(fm_op_id op, const fm_unary_attrs *at, double x) {
    switch (op) {
    case FM_OP_NEG: return -x;
    case FM_OP_ABS: return fabs(x);
    case FM_OP_EXP: return exp(x);
    case FM_OP_LOG: return log(x);
    case FM_OP_SQRT: return sqrt(x);
    case FM_OP_RSQRT: return 1.0 / sqrt(x);
    case FM_OP_SIN: return sin(x);
    case FM_OP_COS: return cos(x);
    FM_LIBM_UNARY_CASES(double)
    case FM_OP_TANH: return tanh(x);
    case FM_OP_SIGMOID: return fm_sigmoid_d(x);
    case FM_OP_RELU: return x > 0 || x != x ? x : 0.0; /* NaN stays NaN; -inf gives 0 */
    case FM_OP_LEAKY_RELU: return x > 0 ? x : x * at->a;
#define X(id, name, nin, nout, flags, prec, group) FM_OP_IF_ACT_##group(case FM_OP_##id: return fm_##name##_d(x);)
#include "fathom/ops.def" /* the activations: scalar_math.h */
#undef X
    case FM_OP_CLAMP: return x != x ? x : (x < at->a ? at->a : (x > at->b ? at->b : x));
    case FM_OP_COPY: return x;
    default: return NAN;
    }
}

/* d f(x) / dx, given x and y = f(x) */
double fm_ew_unary_deriv_scalar(fm_op_id op, const fm_unary_attrs *at, double x, double y) {
    switch (op) {
    case FM_OP_NEG: return -1;
    case FM_OP_ABS: return x > 0 ? 1 : (x < 0 ? -1 : 0);
    case FM_OP_EXP: return y;
    case FM_OP_LOG: return 1.0 / x;
    case FM_OP_SQRT: return 0.5 / y;
    case FM_OP_RSQRT: return -0.5 * y * y * y;
    case FM_OP_SIN: return cos(x);
    case FM_OP_COS: return -sin(x);
    FM_LIBM_UNARY_DERIV_CASES(double)
    case FM_OP_TANH: return 1 - y * y;
    case FM_OP_SIGMOID: return y * (1 - y);
    case FM_OP_RELU: return x > 0 ? 1 : 0;
    case FM_OP_LEAKY_RELU: return x > 0 ? 1 : at->a;
#define X(id, name, nin, nout, flags, prec, group) FM_OP_IF_ACT_##group(case FM_OP_##id: return fm_##name##_deriv_d(x);)
#include "fathom/ops.def"
#undef X
    case FM_OP_CLAMP: return (x >= at->a && x <= at->b) ? 1 : 0;
    case FM_OP_COPY: return 1;
    default: return NAN;
    }
}

double fm_ew_binary_scalar(fm_op_id op, double a, double b) {
    switch (op) {
    case FM_OP_ADD: return a + b;
    case FM_OP_SUB: return a - b;
    case FM_OP_MUL: return a * b;
    case FM_OP_DIV: return a / b;
    case FM_OP_POW: return pow(a, b);
    case FM_OP_MAXIMUM: return (a != a || b != b) ? NAN : (a > b ? a : b);
    case FM_OP_MINIMUM: return (a != a || b != b) ? NAN : (a < b ? a : b);
    case FM_OP_FMOD: return fmod(a, b);
    case FM_OP_REMAINDER: return fm_remainder_d(a, b);
    case FM_OP_EQ: return a == b;
    case FM_OP_NE: return a != b;
    case FM_OP_LT: return a < b;
    case FM_OP_LE: return a <= b;
    case FM_OP_GT: return a > b;
    case FM_OP_GE: return a >= b;
    default: return NAN;
    }
}

/* ---- contiguous loops ---- */

typedef struct ew_job {
    fm_op_id op;      /* the op to compute (for UNARY_BACKWARD: the forward op) */
    int kind;         /* 0 unary, 1 unary backward, 2 binary, 3 where */
    fm_unary_attrs at;
    int n_args;       /* inputs used by the loop */
    bool stream;      /* f32 SIMD loops write the (direct, aligned, large) output non-temporally */
} ew_job;

/* The comparisons as plain loops the compiler vectorizes (1 or 0, as the scalar
 * reference), in both compute types' binary switch. */
#define COMPARE_LOOP(ID, OP) \
    case FM_OP_##ID: for (int64_t i = 0; i < n; i++) out[i] = in[0][i] OP in[1][i] ? 1 : 0; break;
#define COMPARE_LOOPS COMPARE_LOOP(EQ, ==) COMPARE_LOOP(NE, !=) COMPARE_LOOP(LT, <) COMPARE_LOOP(LE, <=) \
    COMPARE_LOOP(GT, >) COMPARE_LOOP(GE, >=)

static void loop_f64(const ew_job *j, const double *const *in, double *out, int64_t n) {
    switch (j->kind) {
    case 0:
        for (int64_t i = 0; i < n; i++) out[i] = fm_ew_unary_scalar(j->op, &j->at, in[0][i]);
        break;
    case 1:
        for (int64_t i = 0; i < n; i++) {
            double y = in[2] ? in[2][i] : fm_ew_unary_scalar(j->op, &j->at, in[1][i]);
            out[i] = in[0][i] * fm_ew_unary_deriv_scalar(j->op, &j->at, in[1][i], y);
        }
        break;
    case 2:
        switch (j->op) { /* the common ones without a call per element */
        case FM_OP_ADD: for (int64_t i = 0; i < n; i++) out[i] = in[0][i] + in[1][i]; break;
        case FM_OP_SUB: for (int64_t i = 0; i < n; i++) out[i] = in[0][i] - in[1][i]; break;
        case FM_OP_MUL: for (int64_t i = 0; i < n; i++) out[i] = in[0][i] * in[1][i]; break;
        case FM_OP_DIV: for (int64_t i = 0; i < n; i++) out[i] = in[0][i] / in[1][i]; break;
        COMPARE_LOOPS
        default: for (int64_t i = 0; i < n; i++) out[i] = fm_ew_binary_scalar(j->op, in[0][i], in[1][i]);
        }
        break;
    case 3:
        for (int64_t i = 0; i < n; i++) out[i] = in[0][i] != 0 ? in[1][i] : in[2][i];
        break;
    }
}

static void loop_f32(const ew_job *j, const float *const *in, float *out, int64_t n) {
    if (fm_cpu_use_avx512()) {
        switch (j->kind) {
        case 0: if (fm_ew_unary_f32_avx512(j->op, &j->at, in[0], out, n, j->stream)) return; break;
        case 1: if (fm_ew_unary_bwd_f32_avx512(j->op, &j->at, in[0], in[1], in[2], out, n, j->stream)) return; break;
        case 2: if (fm_ew_binary_f32_avx512(j->op, in[0], in[1], out, n, j->stream)) return; break;
        case 3: if (fm_ew_where_f32_avx512(in[0], in[1], in[2], out, n)) return; break;
        }
    }
    if (fm_cpu_use_avx2()) {
        switch (j->kind) {
        case 0: if (fm_ew_unary_f32_avx2(j->op, &j->at, in[0], out, n, j->stream)) return; break;
        case 1: if (fm_ew_unary_bwd_f32_avx2(j->op, &j->at, in[0], in[1], in[2], out, n, j->stream)) return; break;
        case 2: if (fm_ew_binary_f32_avx2(j->op, in[0], in[1], out, n, j->stream)) return; break;
        case 3: if (fm_ew_where_f32_avx2(in[0], in[1], in[2], out, n)) return; break;
        }
    }
    switch (j->kind) {
    case 0:
        for (int64_t i = 0; i < n; i++) out[i] = (float)fm_ew_unary_scalar(j->op, &j->at, in[0][i]);
        break;
    case 1:
        for (int64_t i = 0; i < n; i++) {
            double y = in[2] ? in[2][i] : fm_ew_unary_scalar(j->op, &j->at, in[1][i]);
            out[i] = (float)(in[0][i] * fm_ew_unary_deriv_scalar(j->op, &j->at, in[1][i], y));
        }
        break;
    case 2:
        switch (j->op) {
        case FM_OP_ADD: for (int64_t i = 0; i < n; i++) out[i] = in[0][i] + in[1][i]; break;
        case FM_OP_SUB: for (int64_t i = 0; i < n; i++) out[i] = in[0][i] - in[1][i]; break;
        case FM_OP_MUL: for (int64_t i = 0; i < n; i++) out[i] = in[0][i] * in[1][i]; break;
        case FM_OP_DIV: for (int64_t i = 0; i < n; i++) out[i] = in[0][i] / in[1][i]; break;
        COMPARE_LOOPS
        default: for (int64_t i = 0; i < n; i++) out[i] = (float)fm_ew_binary_scalar(j->op, in[0][i], in[1][i]);
        }
        break;
    case 3:
        for (int64_t i = 0; i < n; i++) out[i] = in[0][i] != 0 ? in[1][i] : in[2][i];
        break;
    }
}

/* ---- operands: geometry relative to the output's shape ---- */

typedef struct operand {
    char *base;    /* element 0 of the view */
    fm_dtype dt;
    int64_t st[FM_MAX_DIMS]; /* strides over the output's dims; 0 where broadcast */
    bool contig;   /* same shape as output and contiguous */
} operand;

typedef struct ew_exec {
    ew_job job;
    int ndim;
    int64_t shape[FM_MAX_DIMS];
    int64_t n;
    int n_in;
    operand in[3];
    operand out;
    fm_dtype ct;   /* compute type: FM_F32 or FM_F64 */
    bool direct;   /* all operands contiguous in the compute type: no gather */
} ew_exec;

static void make_operand(operand *o, const fm_tensor *t, int ndim, const int64_t *shape) {
    o->base = (char *)t->storage->data + t->offset * (int64_t)fm_dtype_size(t->dtype);
    o->dt = t->dtype;
    int off = ndim - t->ndim;
    bool same = t->ndim == ndim;
    for (int i = 0; i < ndim; i++) {
        int ti = i - off;
        if (ti < 0 || t->shape[ti] == 1) o->st[i] = 0;
        else o->st[i] = t->strides[ti];
        if (ti < 0 || t->shape[ti] != shape[i]) same = false;
    }
    o->contig = same && fm_tensor_is_contiguous(t);
}

/* Merges adjacent dims that every operand (and the output) walks as one: dim i into
 * dim i + 1 where st[i] == st[i + 1] * shape[i + 1] for all of them (a broadcast
 * operand's 0 strides included), and drops dims of size 1. The flat order of the
 * elements is unchanged, so gather/scatter give the same values; a [N, C, 1, 1] scale
 * over [N, C, H, W] becomes runs of H * W with stride 0 instead of runs of W (SE
 * blocks at 7x7: 7x slower than a same-shape multiply before). */
static void coalesce(ew_exec *e) {
    operand *ops[4];
    int n = 0;
    for (int k = 0; k < e->n_in; k++)
        if (e->in[k].base) ops[n++] = &e->in[k];
    ops[n++] = &e->out;
    int nd = 0;
    for (int i = 0; i < e->ndim; i++) {
        if (e->shape[i] == 1 && e->ndim > 1) continue; /* a size-1 dim adds nothing to any offset */
        bool merge = nd > 0;
        for (int k = 0; merge && k < n; k++) merge = ops[k]->st[nd - 1] == ops[k]->st[i] * e->shape[i];
        if (merge) {
            e->shape[nd - 1] *= e->shape[i];
            for (int k = 0; k < n; k++) ops[k]->st[nd - 1] = ops[k]->st[i];
        } else {
            e->shape[nd] = e->shape[i];
            for (int k = 0; k < n; k++) ops[k]->st[nd] = ops[k]->st[i];
            nd++;
        }
    }
    if (nd == 0) { /* every dim was 1: one element */
        e->shape[0] = 1;
        for (int k = 0; k < n; k++) ops[k]->st[0] = 0;
        nd = 1;
    }
    e->ndim = nd;
}

/* Offset (elements) of logical index `flat` in operand o. */
static int64_t op_offset(const operand *o, int ndim, const int64_t *shape, int64_t flat) {
    int64_t off = 0;
    for (int i = ndim - 1; i >= 0; i--) {
        int64_t idx = flat % shape[i];
        flat /= shape[i];
        off += idx * o->st[i];
    }
    return off;
}

/* n copies of v: cloned per vector width (this file is built for the baseline ISA, whose
 * 4-float stores made filling a per-row scale's buffer as slow as the product itself: the
 * SE blocks' [N, C, H, W] x [N, C, 1, 1], 2 threads, AMD EPYC Zen 5). The same bits at
 * every width. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void fill_f32(float *restrict b, float v, int64_t n) {
    for (int64_t r = 0; r < n; r++) b[r] = v;
}

static void gather(const ew_exec *e, const operand *o, int64_t start, int64_t n, void *buf) {
    size_t es = fm_dtype_size(o->dt);
    if (o->contig) {
        const char *src = o->base + start * (int64_t)es;
        if (o->dt == e->ct) { memcpy(buf, src, (size_t)n * es); return; }
        if (e->ct == FM_F32) {
            float *b = buf;
            if (o->dt == FM_F16) { fm_convert_f16_to_f32((const uint16_t *)src, b, (size_t)n); return; }
            if (o->dt == FM_BF16) { fm_convert_bf16_to_f32((const uint16_t *)src, b, (size_t)n); return; }
            if (o->dt == FM_BOOL || o->dt == FM_U8) { /* a where's condition, a comparison's operand */
                const uint8_t *u = (const uint8_t *)src;
                if (o->dt == FM_BOOL) for (int64_t i = 0; i < n; i++) b[i] = u[i] ? 1.0f : 0.0f;
                else for (int64_t i = 0; i < n; i++) b[i] = (float)u[i];
                return;
            }
            for (int64_t i = 0; i < n; i++) b[i] = (float)fm_load_f64(src + i * (int64_t)es, o->dt);
        } else {
            double *b = buf;
            for (int64_t i = 0; i < n; i++) b[i] = fm_load_f64(src + i * (int64_t)es, o->dt);
        }
        return;
    }
    /* strided: walk a multi-index */
    int nd = e->ndim;
    int64_t idx[FM_MAX_DIMS];
    int64_t rem = start, off = 0;
    for (int i = nd - 1; i >= 0; i--) { idx[i] = rem % e->shape[i]; rem /= e->shape[i]; off += idx[i] * o->st[i]; }
    int64_t inner_st = nd ? o->st[nd - 1] : 0, inner_n = nd ? e->shape[nd - 1] : 1;
    for (int64_t k = 0; k < n;) {
        int64_t run = inner_n - (nd ? idx[nd - 1] : 0);
        if (run > n - k) run = n - k;
        if (e->ct == FM_F32) {
            float *b = (float *)buf + k;
            if (o->dt == FM_F32) {
                const float *s = (const float *)o->base + off;
                if (inner_st == 1) memcpy(b, s, (size_t)run * sizeof *b); /* a broadcast bias row */
                else if (inner_st == 0) fill_f32(b, s[0], run); /* a per-row scale: one value over the run */
                else for (int64_t r = 0; r < run; r++) b[r] = s[r * inner_st];
            } else {
                for (int64_t r = 0; r < run; r++) b[r] = (float)fm_load_f64(o->base + (off + r * inner_st) * (int64_t)es, o->dt);
            }
        } else {
            double *b = (double *)buf + k;
            if (o->dt == FM_F64) {
                const double *s = (const double *)o->base + off;
                if (inner_st == 1) memcpy(b, s, (size_t)run * sizeof *b);
                else for (int64_t r = 0; r < run; r++) b[r] = s[r * inner_st];
            } else {
                for (int64_t r = 0; r < run; r++) b[r] = fm_load_f64(o->base + (off + r * inner_st) * (int64_t)es, o->dt);
            }
        }
        k += run;
        if (k >= n || nd == 0) break;
        /* advance the multi-index by `run` along the innermost dim, carrying */
        off += run * inner_st;
        idx[nd - 1] += run;
        for (int i = nd - 1; i > 0 && idx[i] == e->shape[i]; i--) {
            off -= idx[i] * o->st[i];
            idx[i] = 0;
            idx[i - 1]++;
            off += o->st[i - 1];
        }
    }
}

static void scatter(const ew_exec *e, const operand *o, int64_t start, int64_t n, const void *buf) {
    size_t es = fm_dtype_size(o->dt);
    if (o->contig) {
        char *dst = o->base + start * (int64_t)es;
        if (o->dt == e->ct) { memcpy(dst, buf, (size_t)n * es); return; }
        if (e->ct == FM_F32) {
            const float *b = buf;
            if (o->dt == FM_F16) { fm_convert_f32_to_f16(b, (uint16_t *)dst, (size_t)n); return; }
            if (o->dt == FM_BF16) { fm_convert_f32_to_bf16(b, (uint16_t *)dst, (size_t)n); return; }
            if (o->dt == FM_BOOL) { /* a comparison's result */
                for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = b[i] != 0;
                return;
            }
            for (int64_t i = 0; i < n; i++) fm_store_f64(dst + i * (int64_t)es, o->dt, b[i]);
        } else {
            const double *b = buf;
            for (int64_t i = 0; i < n; i++) fm_store_f64(dst + i * (int64_t)es, o->dt, b[i]);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t off = op_offset(o, e->ndim, e->shape, start + i);
        double v = e->ct == FM_F32 ? ((const float *)buf)[i] : ((const double *)buf)[i];
        fm_store_f64(o->base + off * (int64_t)es, o->dt, v);
    }
}

static void run_range(void *vctx, int64_t cb, int64_t ce, int tid) {
    (void)tid;
    const ew_exec *e = vctx;
    size_t cs = fm_dtype_size(e->ct);
    if (e->direct) {
        int64_t b = cb * CHUNK, en = ce * CHUNK;
        if (en > e->n) en = e->n;
        const void *ins[3] = {0};
        for (int k = 0; k < e->n_in; k++) ins[k] = e->in[k].base ? e->in[k].base + b * (int64_t)cs : NULL;
        if (e->ct == FM_F32) loop_f32(&e->job, (const float *const *)ins, (float *)e->out.base + b, en - b);
        else loop_f64(&e->job, (const double *const *)ins, (double *)e->out.base + b, en - b);
        return;
    }
    /* Mixed: operands that are contiguous in the compute type are read in place,
     * scalars are broadcast into a buffer once, the rest are gathered per chunk. */
    _Alignas(64) double bufs[4][CHUNK];
    bool in_place[3] = {0}, scalar[3] = {0};
    for (int k = 0; k < e->n_in; k++) {
        const operand *o = &e->in[k];
        if (!o->base) continue;
        in_place[k] = o->contig && o->dt == e->ct;
        bool all0 = true;
        for (int d = 0; d < e->ndim; d++) all0 &= o->st[d] == 0;
        if (!in_place[k] && all0) {
            scalar[k] = true;
            gather(e, o, 0, 1, bufs[k]);
            if (e->ct == FM_F32) {
                float *fb = (float *)(void *)bufs[k];
                for (int i = 1; i < CHUNK; i++) fb[i] = fb[0];
            } else {
                for (int i = 1; i < CHUNK; i++) bufs[k][i] = bufs[k][0];
            }
        }
    }
    bool out_in_place = e->out.contig && e->out.dt == e->ct;
    for (int64_t c = cb; c < ce; c++) {
        int64_t b = c * CHUNK, n = e->n - b < CHUNK ? e->n - b : CHUNK;
        const void *ins[3] = {0};
        for (int k = 0; k < e->n_in; k++) {
            if (!e->in[k].base) continue;
            if (in_place[k]) { ins[k] = e->in[k].base + b * (int64_t)cs; continue; }
            if (!scalar[k]) gather(e, &e->in[k], b, n, bufs[k]);
            ins[k] = bufs[k];
        }
        void *dst = out_in_place ? (void *)(e->out.base + b * (int64_t)cs) : (void *)bufs[3];
        if (e->ct == FM_F32) loop_f32(&e->job, (const float *const *)ins, (float *)dst, n);
        else loop_f64(&e->job, (const double *const *)ins, (double *)dst, n);
        if (!out_in_place) scatter(e, &e->out, b, n, bufs[3]);
    }
}

static fm_dtype compute_type(fm_dtype dt) {
    return (dt == FM_F32 || dt == FM_F16 || dt == FM_BF16) ? FM_F32 : FM_F64;
}

/* Runs job over out (any layout) with inputs broadcast to out's shape. */
static fm_status ew_run(const ew_job *job, fm_tensor *out, int n_in, fm_tensor *const *in, fm_dtype ct) {
    ew_exec e;
    memset(&e, 0, sizeof e);
    e.job = *job;
    e.ndim = out->ndim;
    memcpy(e.shape, out->shape, sizeof e.shape);
    e.n = fm_tensor_numel(out);
    e.n_in = n_in;
    e.ct = ct;
    if (e.n == 0) return FM_OK;
    e.direct = out->dtype == ct;
    for (int k = 0; k < n_in; k++) {
        if (!in[k]) continue;
        make_operand(&e.in[k], in[k], e.ndim, e.shape);
        if (!e.in[k].contig || in[k]->dtype != ct) e.direct = false;
    }
    make_operand(&e.out, out, e.ndim, e.shape);
    if (!e.out.contig) e.direct = false;
    if (!e.direct) coalesce(&e);
    /* chunks start at multiples of CHUNK floats, so an aligned base keeps every chunk aligned */
    e.job.stream = e.direct && ct == FM_F32 && e.n * 4 >= FM_CPU_STREAM_MIN_BYTES && ((uintptr_t)e.out.base & 31) == 0;
    int64_t chunks = (e.n + CHUNK - 1) / CHUNK;
    /* ~32K elements per thread before splitting pays for the wake-up */
    fm_parallel_for(chunks, 16, run_range, &e);
    return FM_OK;
}

/* ---- kernels ---- */

/* int64 copies and selections (copy, where) element by element, exact: the double compute
 * type would round values beyond 2^53 (hashed ids, int64 bit patterns). A contiguous copy
 * is one memcpy. */
static fm_status i64_select(const fm_op_call *c) {
    fm_tensor *out = c->out[0];
    const int64_t n = fm_tensor_numel(out);
    const bool where = c->op == FM_OP_WHERE;
    operand o, in[3];
    make_operand(&o, out, out->ndim, out->shape);
    for (int k = 0; k < (where ? 3 : 1); k++) make_operand(&in[k], c->in[k], out->ndim, out->shape);
    if (!where && o.contig && in[0].contig) {
        if (n) memcpy(o.base, in[0].base, (size_t)n * sizeof(int64_t));
        return FM_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        const operand *src = &in[0];
        if (where) src = fm_load_f64(in[0].base + op_offset(&in[0], out->ndim, out->shape, i) * (int64_t)fm_dtype_size(in[0].dt), in[0].dt) != 0
                             ? &in[1] : &in[2];
        memcpy(o.base + op_offset(&o, out->ndim, out->shape, i) * 8, src->base + op_offset(src, out->ndim, out->shape, i) * 8, 8);
    }
    return FM_OK;
}

static fm_status k_unary(const fm_op_call *c) {
    ew_job j = {.op = c->op, .kind = 0};
    if (c->attrs) j.at = *(const fm_unary_attrs *)c->attrs;
    fm_dtype dt = c->in[0]->dtype;
    if (!fm_dtype_is_float(dt) && !fm_ew_unary_takes_ints(c->op)) return fm_cpu_unsupported_dtype(c, dt);
    if (c->op == FM_OP_COPY && dt == FM_I64 && c->out[0]->dtype == FM_I64) return i64_select(c);
    fm_dtype ct = compute_type(c->out[0]->dtype);
    if (c->op == FM_OP_COPY && c->in[0]->dtype == FM_F64) ct = FM_F64;
    return ew_run(&j, c->out[0], 1, c->in, ct);
}

static fm_status k_unary_bwd(const fm_op_call *c) {
    const fm_unary_bwd_attrs *a = c->attrs;
    ew_job j = {.op = a->fwd, .kind = 1, .at = a->fa};
    if (!fm_dtype_is_float(c->out[0]->dtype)) return fm_cpu_unsupported_dtype(c, c->out[0]->dtype);
    return ew_run(&j, c->out[0], 3, c->in, compute_type(c->out[0]->dtype));
}

static fm_status k_binary(const fm_op_call *c) {
    ew_job j = {.op = c->op, .kind = 2};
    fm_dtype dt = c->in[0]->dtype;
    if ((c->op == FM_OP_POW || c->op == FM_OP_DIV) && !fm_dtype_is_float(dt) && c->out[0]->dtype == dt)
        return fm_cpu_unsupported_dtype(c, dt);
    return ew_run(&j, c->out[0], 2, c->in, compute_type(dt));
}

static fm_status k_where(const fm_op_call *c) {
    if (c->out[0]->dtype == FM_I64 && c->in[1]->dtype == FM_I64 && c->in[2]->dtype == FM_I64) return i64_select(c);
    ew_job j = {.op = FM_OP_WHERE, .kind = 3};
    return ew_run(&j, c->out[0], 3, c->in, compute_type(c->out[0]->dtype));
}

fm_status fm_cpu_unsupported_dtype(const fm_op_call *c, fm_dtype dt) {
    const fm_op_info *info = fm_op_get_info(c->op);
    return fm_set_error(FM_ERR_UNSUPPORTED, "%s: dtype %s is not supported on cpu", info ? info->name : "op", fm_dtype_name(dt));
}

/* Every op of the UNARY/ACT and BINARY/COMPARE groups of ops.def, as the CUDA backend. */
void fm_cpu_kernels_elementwise(fm_backend *b) {
    for (int op = 0; op < FM_OP_COUNT; op++) {
        fm_op_group g = fm_op_get_info((fm_op_id)op)->group;
        if (g == FM_GROUP_UNARY || g == FM_GROUP_ACT) b->kernels[op] = k_unary;
        if (g == FM_GROUP_BINARY || g == FM_GROUP_COMPARE) b->kernels[op] = k_binary;
    }
    b->kernels[FM_OP_COPY] = k_unary;
    b->kernels[FM_OP_UNARY_BACKWARD] = k_unary_bwd;
    b->kernels[FM_OP_WHERE] = k_where;
}
