/* CPU kernels of lstm_cell and gru_cell (src/ops/fused.c): one LSTM or GRU step's gates after
 * its two matmuls, what the ONNX importer's LSTM and GRU (src/onnx/onnx_ops_rnn.c) run per step
 * when the activations are the default ones. Composed, a step is eleven elementwise ops, each a
 * dispatch, a new tensor and a wake of the thread pool, and at batch 32 those overheads
 * were most of an exported nn.LSTM's time (docs/PERFORMANCE.md, "LSTM"); here a row of
 * the batch is one pass over its 4H (3H) gates. f32 rows use rnn_cell_avx512.c or rnn_cell_avx2.c
 * (fm_sigmoid512/fm_tanh512, the elementwise kernels' own functions); f64 and other CPUs
 * the scalar loop, in double. Rows are independent: the result does not depend on the
 * thread count. */
#include <math.h>

#include "core/cpu_features.h"
#include "core/parallel.h"
#include "cpu_kernels.h"

void fm_lstm_row_f32_avx512(const float *xg, const float *hg, const float *c, float *h, float *cn, int64_t H);
void fm_lstm_row_f32_avx2(const float *xg, const float *hg, const float *c, float *h, float *cn, int64_t H);
void fm_gru_row_f32_avx512(const float *xg, const float *hg, const float *h, float *hn, int64_t H);
void fm_gru_row_f32_avx2(const float *xg, const float *hg, const float *h, float *hn, int64_t H);

typedef struct {
    const void *xg, *hg, *c;
    void *h, *cn;
    int64_t H;
    int simd; /* 2: AVX-512, 1: AVX2, 0: scalar */
    bool f64, gru; /* gru: c is h, h is h', cn unused */
} lstm_job;

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

#define LSTM_ROW(TY)                                                                                       \
    do {                                                                                                   \
        const TY *xg = (const TY *)j->xg + r * 4 * H, *hg = (const TY *)j->hg + r * 4 * H;                 \
        const TY *c = (const TY *)j->c + r * H;                                                            \
        TY *h = (TY *)j->h + r * H, *cn = (TY *)j->cn + r * H;                                             \
        for (int64_t k = 0; k < H; k++) {                                                                  \
            const double i = sigm((double)xg[k] + hg[k]), o = sigm((double)xg[H + k] + hg[H + k]);        \
            const double f = sigm((double)xg[2 * H + k] + hg[2 * H + k]);                                  \
            const double g = tanh((double)xg[3 * H + k] + hg[3 * H + k]);                                  \
            const TY cv = (TY)(f * c[k] + i * g);                                                          \
            cn[k] = cv;                                                                                    \
            h[k] = (TY)(o * tanh((double)cv));                                                             \
        }                                                                                                  \
    } while (0)

#define GRU_ROW(TY)                                                                                        \
    do {                                                                                                   \
        const TY *xg = (const TY *)j->xg + r * 3 * H, *hg = (const TY *)j->hg + r * 3 * H;                 \
        const TY *hp = (const TY *)j->c + r * H;                                                           \
        TY *hn = (TY *)j->h + r * H;                                                                       \
        for (int64_t k = 0; k < H; k++) {                                                                  \
            const double z = sigm((double)xg[k] + hg[k]), rr = sigm((double)xg[H + k] + hg[H + k]);       \
            const double n = tanh((double)xg[2 * H + k] + rr * hg[2 * H + k]);                            \
            hn[k] = (TY)(n + z * ((double)hp[k] - n));                                                     \
        }                                                                                                  \
    } while (0)

static void gru_rows(const lstm_job *j, int64_t b, int64_t e) {
    const int64_t H = j->H;
    for (int64_t r = b; r < e; r++) {
        if (j->f64) GRU_ROW(double);
        else if (j->simd) {
            const int64_t g = r * 3 * H, s = r * H;
            const float *xg = (const float *)j->xg + g, *hg = (const float *)j->hg + g, *hp = (const float *)j->c + s;
            float *hn = (float *)j->h + s;
            if (j->simd > 1) fm_gru_row_f32_avx512(xg, hg, hp, hn, H);
            else fm_gru_row_f32_avx2(xg, hg, hp, hn, H);
        } else GRU_ROW(float);
    }
}

static void lstm_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const lstm_job *j = ctx;
    const int64_t H = j->H;
    if (j->gru) { gru_rows(j, b, e); return; }
    for (int64_t r = b; r < e; r++) {
        if (j->f64) LSTM_ROW(double);
        else if (j->simd) {
            const int64_t g = r * 4 * H, s = r * H;
            const float *xg = (const float *)j->xg + g, *hg = (const float *)j->hg + g, *c = (const float *)j->c + s;
            float *h = (float *)j->h + s, *cn = (float *)j->cn + s;
            if (j->simd > 1) fm_lstm_row_f32_avx512(xg, hg, c, h, cn, H);
            else fm_lstm_row_f32_avx2(xg, hg, c, h, cn, H);
        } else LSTM_ROW(float);
    }
}

/* LSTM_CELL: in = {xg [B, 4H], hg [B, 4H], c [B, H]}, out = {h, c'}; GRU_CELL: in = {xg [B, 3H],
 * hg [B, 3H], h [B, H]}, out = {h'} (contiguous) */
static fm_status lstm_cell_kernel(const fm_op_call *c) {
    const fm_tensor *cs = c->in[2];
    const bool gru = c->op == FM_OP_GRU_CELL;
    lstm_job j = {fm_tensor_data(c->in[0]), fm_tensor_data(c->in[1]), fm_tensor_data(cs), fm_tensor_data(c->out[0]),
                  gru ? NULL : fm_tensor_data(c->out[1]), cs->shape[1], 0, cs->dtype == FM_F64, gru};
    j.simd = j.f64 ? 0 : fm_cpu_use_avx512() ? 2 : fm_cpu_use_avx2() ? 1 : 0;
    const int64_t rows = cs->shape[0], grain = j.H > 0 ? 16384 / j.H : rows;
    if (rows > 0 && j.H > 0) fm_parallel_for(rows, grain < 1 ? 1 : grain, lstm_task, &j);
    return FM_OK;
}

void fm_cpu_kernels_lstm(fm_backend *b) {
    b->kernels[FM_OP_LSTM_CELL] = lstm_cell_kernel;
    b->kernels[FM_OP_GRU_CELL] = lstm_cell_kernel;
}
