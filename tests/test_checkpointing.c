/* Activation checkpointing gives bitwise the same loss and gradients as the
 * plain graph on CPU, including a dropout inside the segment, and saves memory. */
#include "core/parallel.h"
#include "fathom/fathom.h"
#include "test_util.h"

typedef struct blk { fm_tensor *w1, *w2; } blk;

/* a residual MLP block with dropout: x + W2 gelu(dropout(W1 x)) */
static fm_status block(fm_tensor *const *in, void *ctx, fm_tensor **out) {
    blk *b = ctx;
    fm_tensor *h = fm_linear(in[0], b->w1, NULL);
    fm_tensor *d = h ? fm_dropout(h, 0.2, true, NULL) : NULL;
    fm_tensor *g = d ? fm_gelu(d) : NULL;
    fm_tensor *o = g ? fm_linear(g, b->w2, NULL) : NULL;
    out[0] = o ? fm_add(in[0], o) : NULL;
    fm_tensor_release_n(4, h, d, g, o);
    return out[0] ? FM_OK : fm_last_status();
}

static fm_tensor *run(blk *b, int nb, fm_tensor *x, bool ck, size_t *peak) {
    fm_manual_seed(77);
    fm_memory_reset_peak(FM_CPU);
    fm_memory_stats s0;
    fm_memory_stats_get(FM_CPU, &s0);
    fm_tensor *cur = fm_tensor_retain(x);
    for (int i = 0; i < nb; i++) {
        fm_tensor *nx = NULL;
        fm_status st = ck ? fm_checkpoint(block, &b[i], 1, &cur, 1, &nx) : block(&cur, &b[i], &nx);
        CHECK(st == FM_OK);
        fm_tensor_release(cur);
        cur = nx;
    }
    fm_tensor *sq = fm_mul(cur, cur), *loss = fm_mean(sq, 0, NULL, false);
    fm_memory_stats s1;
    fm_memory_stats_get(FM_CPU, &s1);
    *peak = s1.allocated_peak - s0.allocated;
    CHECK(fm_backward(loss, NULL, false) == FM_OK);
    fm_tensor_release_n(2, cur, sq);
    return loss;
}

int main(void) {
    enum { NB = 4 };
    int64_t sx[2] = {64, 128}, sw[2] = {512, 128}, sw2[2] = {128, 512};
    fm_rng r;
    fm_rng_init(&r, 5);
    blk b[NB];
    for (int i = 0; i < NB; i++) {
        b[i].w1 = fm_tensor_randn(2, sw, FM_F32, &r);
        b[i].w2 = fm_tensor_randn(2, sw2, FM_F32, &r);
        fm_tensor *s1 = fm_mul_scalar(b[i].w1, 0.05), *s2 = fm_mul_scalar(b[i].w2, 0.05);
        fm_tensor_release_n(2, b[i].w1, b[i].w2);
        b[i].w1 = s1;
        b[i].w2 = s2;
        fm_tensor_requires_grad_(b[i].w1, true);
        fm_tensor_requires_grad_(b[i].w2, true);
    }
    fm_tensor *x = fm_tensor_randn(2, sx, FM_F32, &r);
    fm_tensor_requires_grad_(x, true);
    size_t peak_plain, peak_ck;
    fm_tensor *l1 = run(b, NB, x, false, &peak_plain);
    fm_tensor *g_plain[2 * NB + 1];
    for (int i = 0; i < NB; i++) {
        g_plain[2 * i] = fm_clone(b[i].w1->grad);
        g_plain[2 * i + 1] = fm_clone(b[i].w2->grad);
        fm_tensor_zero_grad(b[i].w1);
        fm_tensor_zero_grad(b[i].w2);
    }
    g_plain[2 * NB] = fm_clone(x->grad);
    fm_tensor_zero_grad(x);
    fm_tensor *l2 = run(b, NB, x, true, &peak_ck);
    CHECK(fm_tensor_item(l1) == fm_tensor_item(l2));
    int diff = 0;
    for (int i = 0; i < NB; i++) {
        fm_tensor *pair[2] = {b[i].w1->grad, b[i].w2->grad};
        for (int k = 0; k < 2; k++) {
            CHECK(pair[k] != NULL);
            if (!pair[k]) continue;
            for (int64_t e = 0; e < fm_tensor_numel(pair[k]); e++)
                diff += fm_tensor_get(pair[k], e) != fm_tensor_get(g_plain[2 * i + k], e);
        }
    }
    for (int64_t e = 0; x->grad && e < fm_tensor_numel(x->grad); e++) diff += fm_tensor_get(x->grad, e) != fm_tensor_get(g_plain[2 * NB], e);
    CHECK_MSG(diff == 0, "%d gradient elements differ with checkpointing", diff);
    CHECK_MSG(peak_ck < peak_plain, "peak with checkpointing %zu vs %zu without", peak_ck, peak_plain);
    fprintf(stderr, "forward peak: plain %zu bytes, checkpointed %zu bytes\n", peak_plain, peak_ck);
    for (int i = 0; i < 2 * NB + 1; i++) fm_tensor_release(g_plain[i]);
    for (int i = 0; i < NB; i++) fm_tensor_release_n(2, b[i].w1, b[i].w2);
    fm_tensor_release_n(3, x, l1, l2);
    fm_parallel_shutdown();
    TEST_DONE();
}
