/* Shared by the CPU attention kernels (attention_cpu.c, attention_avx2.c, attention_avx512.c).
 *
 * Every operand is a set of rows of D contiguous elements, one row per (batch,
 * head, position); where row (b, h, t) starts is base + b*sb + h*sh + t*st
 * (elements). The plain layout [B, heads, T, D] is one such set; so are the
 * heads inside a fused QKV projection [B, T, (H+2KV)*D] and the merged output
 * [B, T, H*D] that the output projection reads, which lets sdpa_qkv attend
 * straight out of the projection and into the merged heads without copies. */
#ifndef FATHOM_ATTENTION_CPU_H
#define FATHOM_ATTENTION_CPU_H
#include <stdint.h>
#include <string.h>

typedef struct fm_sdpa_lay {
    int64_t sb, sh, st;
} fm_sdpa_lay;

static inline int64_t fm_sdpa_row(fm_sdpa_lay l, int64_t b, int64_t h, int64_t t) { return b * l.sb + h * l.sh + t * l.st; }

/* [B, heads, T, D] contiguous */
static inline fm_sdpa_lay fm_sdpa_lay_plain(int64_t heads, int64_t T, int64_t D) {
    return (fm_sdpa_lay){heads * T * D, T * D, D};
}

/* Operands of one attention call. lse is always [B, H, Tq] contiguous (f32). */
typedef struct fm_sdpa_io {
    int64_t B, H, Hkv, Tq, Tk, D;
    int causal;
    double scale;
    const void *q, *k, *v;
    fm_sdpa_lay lq, lk, lv;
    void *o;                /* forward output; backward: the saved output (read) */
    fm_sdpa_lay lo;
    const void *dout;       /* backward */
    fm_sdpa_lay ldo;
    void *dq, *dk, *dv;     /* backward outputs */
    fm_sdpa_lay ldq, ldk, ldv;
    float *lse;             /* forward: may be NULL (sdpa_mask keeps none) */
    int lowp;               /* FM_BF16: the products in bf16 where fm_sdpa_bf16_usable says so */
    /* forward only (sdpa_mask): an additive mask, element (b, h, i, j) at
     * b*msb + h*msh + i*msi + j*msj (0 along broadcast dims), added to the scaled
     * scores; NULL: none. A query whose every key is masked (-inf) gets 0. */
    const void *mask;
    int64_t msb, msh, msi, msj;
} fm_sdpa_io;

/* n rows of D floats, row stride st: zeroed, or scaled by s (the gradients' last step) */
static inline void fm_sdpa_zero_rows(float *x, int64_t n, int64_t D, int64_t st) {
    for (int64_t i = 0; i < n; i++) memset(x + i * st, 0, sizeof(float) * (size_t)D);
}
static inline void fm_sdpa_scale_rows(float *x, int64_t n, int64_t D, int64_t st, float s) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < D; d++) x[i * st + d] *= s;
}

/* sdpa_kv16 (ops.def SDPA_KV16): f32 queries over a KV cache stored as f16 (the
 * graph's decode with fm_graph_run_options.kv_dtype FM_F16). Query row i of T
 * attends to keys [0, L - T + i] (the cache holds the past, then these T rows).
 * One row: the scores q . k_j (f32 sums of the widened halves), their softmax, and
 * the f32 sum of p_j v_j. scratch: L + 2 D floats. The AVX2 version (F16C) and the
 * reference differ in summation order and exp (fm_exp256, about 1 ulp). */
typedef struct fm_kv16_io {
    int64_t B, H, Hkv, T, L, D;
    float scale;
    const float *q;
    fm_sdpa_lay lq;
    const uint16_t *k, *v;
    fm_sdpa_lay lk, lv;
    float *o;
    fm_sdpa_lay lo;
} fm_kv16_io;
void fm_sdpa_kv16_row_ref(const fm_kv16_io *io, int64_t b, int64_t h, int64_t i, float *scratch);
void fm_sdpa_kv16_row_avx2(const fm_kv16_io *io, int64_t b, int64_t h, int64_t i, float *scratch); /* only with fm_cpu_use_avx2() */

/* attention_avx2.c and attention_avx512.c (f32 only, the loops of attention_simd.h);
 * they return -1 when scratch memory ran out. */
int fm_sdpa_f32_avx2_forward(const fm_sdpa_io *io);
int fm_sdpa_f32_avx2_backward(const fm_sdpa_io *io);
int fm_sdpa_f32_avx512_forward(const fm_sdpa_io *io);
int fm_sdpa_f32_avx512_backward(const fm_sdpa_io *io);
/* attention_avx512bf16.c: the same tiles with the products in bf16 (f32 operands rounded as
 * they are packed, f32 accumulation); only where fm_sdpa_bf16_usable(io) (attention_cpu.c). */
int fm_sdpa_bf16_forward(const fm_sdpa_io *io);
int fm_sdpa_bf16_backward(const fm_sdpa_io *io);
#endif
