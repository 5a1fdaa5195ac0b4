/* FLOP and byte counts of one op call, for the profiler's op table
 * (achieved GFLOP/s and GB/s). FLOPs count a multiply-add as 2; elementwise ops
 * count one FLOP per output element; data movement ops count zero FLOPs. */
#include "profile/op_cost.h"
#include "backend/kernel.h"

static int64_t numel(const fm_tensor *t) { return t ? fm_tensor_numel(t) : 0; }

double fm_op_flops(const fm_op_call *c) {
    const fm_tensor *y = c->n_out ? c->out[0] : NULL;
    switch (c->op) {
    case FM_OP_MATMUL: {
        const fm_tensor *a = c->in[0];
        int64_t K = a->shape[a->ndim - 1];
        return 2.0 * (double)numel(y) * (double)K;
    }
    case FM_OP_CONV2D: {
        const fm_tensor *w = c->in[1];
        /* each output element: Cin/groups * kH * kW multiply-adds */
        return 2.0 * (double)numel(y) * (double)(w->shape[1] * w->shape[2] * w->shape[3]);
    }
    case FM_OP_QCONV2D_INT8: {
        /* each output element: kh kw C integer multiply-adds */
        const fm_qconv8_attrs *a = c->attrs;
        return a ? 2.0 * (double)numel(y) * (double)a->kh * a->kw * (double)c->in[0]->shape[1] : 0;
    }
    case FM_OP_CONV2D_BACKWARD: {
        const fm_tensor *dy = c->in[0], *w = c->in[2];
        double per = 2.0 * (double)numel(dy) * (double)(w->shape[1] * w->shape[2] * w->shape[3]);
        int parts = (c->out[0] != NULL) + (c->out[1] != NULL);
        return per * parts;
    }
    case FM_OP_SDPA: case FM_OP_SDPA_MASK: { /* sdpa_mask's attrs have causal 0 */
        const fm_tensor *q = c->in[0], *k = c->in[1];
        double B = (double)q->shape[0], H = (double)q->shape[1], Tq = (double)q->shape[2], D = (double)q->shape[3];
        double Tk = (double)k->shape[2];
        const fm_sdpa_attrs *a = c->attrs;
        double f = 4.0 * B * H * Tq * Tk * D; /* QK^T and PV */
        return a && a->causal ? f / 2 : f;
    }
    case FM_OP_SDPA_KV16: { /* query i of T sees L - T + i + 1 keys: T L - T (T - 1) / 2 pairs, two products each */
        const fm_tensor *q = c->in[0], *k = c->in[1];
        double T = (double)q->shape[2], L = (double)k->shape[2];
        return 4.0 * (double)q->shape[0] * (double)q->shape[1] * (T * L - T * (T - 1) / 2) * (double)q->shape[3];
    }
    case FM_OP_SDPA_BACKWARD: {
        const fm_tensor *q = c->in[1], *k = c->in[2];
        double f = 8.0 * (double)q->shape[0] * (double)q->shape[1] * (double)q->shape[2] * (double)k->shape[2] * (double)q->shape[3];
        const fm_sdpa_attrs *a = c->attrs;
        return a && a->causal ? f / 2 : f; /* recompute QK^T, dV, dP, dQ, dK: about 2.5x forward; counted as 2x */
    }
    case FM_OP_SDPA_QKV: case FM_OP_SDPA_QKV_BACKWARD: {
        /* forward as SDPA's, backward as SDPA_BACKWARD's (qkv is in[0] forward, in[1] backward) */
        const fm_tensor *x = c->in[c->op == FM_OP_SDPA_QKV ? 0 : 1];
        const fm_sdpa_qkv_attrs *a = c->attrs;
        if (!a) return 0;
        double f = (c->op == FM_OP_SDPA_QKV ? 4.0 : 8.0) * (double)x->shape[0] * (double)a->n_head *
                   (double)x->shape[1] * (double)x->shape[1] * (double)a->head_dim;
        return a->causal ? f / 2 : f;
    }
    case FM_OP_LINEAR_FUSED: case FM_OP_QLINEAR_INT8: case FM_OP_QLINEAR_INT4: {
        /* x [..., K] times a weight [N, K] (f32, int8 or int4 codes): int8/int4 multiply-adds
         * count as FLOPs too, so that a quantized model's products are compared with its f32 ones */
        const fm_tensor *x = c->in[0];
        return 2.0 * (double)numel(y) * (double)x->shape[x->ndim - 1];
    }
    case FM_OP_CONV2D_FUSED: {
        /* y is after the max pool: count the convolution's own outputs */
        const fm_tensor *x = c->in[0], *w = c->in[1];
        const fm_conv2d_fused_attrs *a = c->attrs;
        if (!a || x->ndim != 4) return 0;
        bool nhwc = a->p.layout == FM_NHWC;
        int64_t H = x->shape[nhwc ? 1 : 2], W = x->shape[nhwc ? 2 : 3];
        int64_t Ho = fm_conv2d_out_size(H, (int)w->shape[2], a->p.stride[0], a->p.padding[0], a->p.dilation[0]);
        int64_t Wo = fm_conv2d_out_size(W, (int)w->shape[3], a->p.stride[1], a->p.padding[1], a->p.dilation[1]);
        if (Ho < 1 || Wo < 1) return 0;
        return 2.0 * (double)(x->shape[0] * w->shape[0] * Ho * Wo) * (double)(w->shape[1] * w->shape[2] * w->shape[3]);
    }
    case FM_OP_QEMBEDDING_INT4: case FM_OP_QEMBEDDING_INT8:
    case FM_OP_COPY: case FM_OP_CAT: case FM_OP_GATHER: case FM_OP_INDEX_SELECT: case FM_OP_EMBEDDING:
    case FM_OP_ONE_HOT:
        return 0;
    default:
        if (c->n_in && c->in[0] && !c->var_in) {
            int64_t m = numel(c->in[0]) > numel(y) ? numel(c->in[0]) : numel(y);
            return (double)m;
        }
        return (double)numel(y);
    }
}

double fm_op_bytes(const fm_op_call *c) {
    double b = 0;
    fm_tensor *const *ins = c->var_in ? c->var_in : c->in;
    for (int i = 0; i < c->n_in; i++)
        if (ins[i]) b += (double)fm_tensor_nbytes(ins[i]);
    for (int i = 0; i < c->n_out; i++)
        if (c->out[i]) b += (double)fm_tensor_nbytes(c->out[i]);
    return b;
}
