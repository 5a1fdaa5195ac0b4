/* CPU kernels of the fused transformer helpers (src/ops/fused.c).
 *
 * qkv_split_heads is pure data movement, so one byte-copy kernel serves every
 * dtype; rows (b, t) are independent, so threads split them with no effect on
 * the result. */
#include <string.h>

#include "core/parallel.h"
#include "cpu_kernels.h"

typedef struct {
    const fm_op_call *c;
    int64_t T, H, KV, D;
    size_t es;
} split_ctx;

static void split_fwd_range(void *ctx, int64_t begin, int64_t end, int tid) {
    const split_ctx *s = ctx;
    const int64_t T = s->T, H = s->H, KV = s->KV, D = s->D, W = (H + 2 * KV) * D;
    const size_t es = s->es, row = (size_t)D * es;
    const char *x = fm_tensor_data(s->c->in[0]);
    char *q = fm_tensor_data(s->c->out[0]), *k = fm_tensor_data(s->c->out[1]), *v = fm_tensor_data(s->c->out[2]);
    for (int64_t r = begin; r < end; r++) {
        const int64_t b = r / T, t = r % T;
        const char *src = x + (size_t)(r * W) * es;
        for (int64_t h = 0; h < H; h++) memcpy(q + (size_t)(((b * H + h) * T + t) * D) * es, src + (size_t)(h * D) * es, row);
        for (int64_t h = 0; h < KV; h++) {
            memcpy(k + (size_t)(((b * KV + h) * T + t) * D) * es, src + (size_t)((H + h) * D) * es, row);
            memcpy(v + (size_t)(((b * KV + h) * T + t) * D) * es, src + (size_t)((H + KV + h) * D) * es, row);
        }
    }
}

static void split_bwd_range(void *ctx, int64_t begin, int64_t end, int tid) {
    const split_ctx *s = ctx;
    const int64_t T = s->T, H = s->H, KV = s->KV, D = s->D, W = (H + 2 * KV) * D;
    const size_t es = s->es, row = (size_t)D * es;
    const fm_tensor *g[3] = {s->c->in[0], s->c->in[1], s->c->in[2]};
    const char *gq = g[0] ? fm_tensor_data(g[0]) : NULL, *gk = g[1] ? fm_tensor_data(g[1]) : NULL,
               *gv = g[2] ? fm_tensor_data(g[2]) : NULL;
    char *dx = fm_tensor_data(s->c->out[0]);
    for (int64_t r = begin; r < end; r++) {
        const int64_t b = r / T, t = r % T;
        char *dst = dx + (size_t)(r * W) * es;
        for (int64_t h = 0; h < H; h++) {
            char *d = dst + (size_t)(h * D) * es;
            if (gq) memcpy(d, gq + (size_t)(((b * H + h) * T + t) * D) * es, row);
            else memset(d, 0, row); /* all-zero bits are 0.0 in every float format */
        }
        for (int64_t h = 0; h < KV; h++) {
            char *dk = dst + (size_t)((H + h) * D) * es, *dv = dst + (size_t)((H + KV + h) * D) * es;
            if (gk) memcpy(dk, gk + (size_t)(((b * KV + h) * T + t) * D) * es, row);
            else memset(dk, 0, row);
            if (gv) memcpy(dv, gv + (size_t)(((b * KV + h) * T + t) * D) * es, row);
            else memset(dv, 0, row);
        }
    }
}

static fm_status qkv_split(const fm_op_call *c, bool bwd) {
    const fm_qkv_split_attrs *a = c->attrs;
    const fm_tensor *x = bwd ? c->out[0] : c->in[0];
    split_ctx s = {c, x->shape[1], a->n_head, a->n_kv_head, a->head_dim, fm_dtype_size(x->dtype)};
    const int64_t rows = x->shape[0] * x->shape[1];
    /* each row moves (H+2KV)*D elements: aim for ~16 KiB per task */
    int64_t bytes = (a->n_head + 2 * a->n_kv_head) * a->head_dim * (int64_t)s.es, grain = 16384 / (bytes ? bytes : 1);
    fm_parallel_for(rows, grain < 1 ? 1 : grain, bwd ? split_bwd_range : split_fwd_range, &s);
    return FM_OK;
}

static fm_status qkv_split_kernel(const fm_op_call *c) { return qkv_split(c, false); }
static fm_status qkv_split_bwd_kernel(const fm_op_call *c) { return qkv_split(c, true); }

void fm_cpu_kernels_fused(fm_backend *b) {
    b->kernels[FM_OP_QKV_SPLIT_HEADS] = qkv_split_kernel;
    b->kernels[FM_OP_QKV_SPLIT_HEADS_BACKWARD] = qkv_split_bwd_kernel;
}
