/* Batched decoding over the paged KV cache (src/gpt/gpt_paged.c): sequences that
 * join and leave between steps, each at its own position, get the logits the
 * full forward gives for their whole prefix (GPT-2 and Llama with GQA), blocks
 * are shared out and returned, and a step that lacks blocks fails changing nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/gpt.h"
#include "fathom/ops.h"
#include "gpt/gpt_internal.h"
#include "gpt/gpt_paged.h"
#include "test_util.h"

/* set: heads that do not tile n_embd (3 heads of 8 over 32; Llama 2 heads in 1 kv group) */
static bool narrow_heads;
static bool untied; /* set: an output head of its own (lm_head), not the token embedding */
static bool kv_f16; /* set: the cache's blocks in f16 (the logits within its rounding, not 1e-4) */

static fm_gpt_config tiny(fm_gpt_arch arch) {
    fm_gpt_config c = fm_gpt_config_default(arch);
    c.n_layer = 2;
    c.n_head = narrow_heads ? (arch == FM_GPT_LLAMA ? 2 : 3) : 4;
    c.n_embd = 32;
    c.block_size = 16;
    c.vocab_size = 64;
    c.ffn_hidden = arch == FM_GPT_LLAMA ? 96 : 128;
    c.n_kv_head = arch == FM_GPT_LLAMA ? (narrow_heads ? 1 : 2) : c.n_head;
    c.head_dim = narrow_heads ? 8 : 0;
    c.untied_head = untied;
    c.dropout = 0;
    return c;
}

/* max |paged - full| over the last position's logits of seq[0..len) */
static double diff_vs_full(fm_gpt *m, const int32_t *seq, int len, const float *paged) {
    int64_t ids[16];
    for (int i = 0; i < len; i++) ids[i] = seq[i];
    fm_tensor *idx = fm_tensor_from_data(ids, 2, (int64_t[]){1, len}, FM_I64);
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *lg = fm_gpt_forward(m, idx, NULL, NULL);
    fm_set_grad_enabled(prev);
    double worst = 1e9;
    if (lg) {
        int V = (int)lg->shape[2];
        worst = 0;
        for (int v = 0; v < V; v++) {
            double d = fabs(fm_tensor_get(lg, (int64_t)(len - 1) * V + v) - paged[v]);
            if (d > worst) worst = d;
        }
    }
    fm_tensor_release_n(2, idx, lg);
    return worst;
}

static void check_arch(fm_gpt_arch arch) {
    fm_gpt_config c = tiny(arch);
    fm_rng r;
    fm_rng_init(&r, 7);
    fm_gpt *m = fm_gpt_new(&c, &r);
    fm_gpt_train_mode(m, false);
    /* 3 sequences of different lengths; B joins at step 2, C at step 5; A leaves after 9 */
    const int32_t toks[3][12] = {{1, 5, 9, 2, 33, 7, 7, 60, 4, 0, 0, 0}, {8, 8, 3, 21, 5, 6, 44, 1, 2, 3, 0, 0},
                                 {63, 0, 12, 13, 14, 15, 16, 0, 0, 0, 0, 0}};
    const int start[3] = {0, 2, 5}, stop[3] = {9, 12, 12};
    fm_gpt_paged *p = fm_gpt_paged_new_ex(m, NULL, 12, 4, 3, kv_f16 ? FM_F16 : FM_F32);
    CHECK(p != NULL);
    /* 2 layers x (k, v) x kv heads x 4 positions x head size, 4 or 2 bytes */
    const size_t per = (size_t)2 * 2 * (size_t)c.n_kv_head * 4 * (size_t)(c.head_dim ? c.head_dim : c.n_embd / c.n_head);
    CHECK_MSG(p && fm_gpt_paged_block_bytes(p) == per * (kv_f16 ? 2 : 4), "block bytes %zu", p ? fm_gpt_paged_block_bytes(p) : 0);
    int slot[3] = {-1, -1, -1};
    float *lg = malloc(sizeof(float) * 3 * 64);
    double worst = 0;
    int steps = 0, shared = 0;
    for (int step = 0; p && step < 12; step++) {
        int seqs[3], n = 0, who[3];
        int32_t tk[3];
        for (int s = 0; s < 3; s++) {
            if (step == start[s]) slot[s] = fm_gpt_paged_open(p);
            if (step == stop[s]) { fm_gpt_paged_close(p, slot[s]); slot[s] = -1; }
            if (slot[s] < 0) continue;
            seqs[n] = slot[s];
            tk[n] = toks[s][step - start[s]];
            who[n++] = s;
        }
        if (!n) continue;
        CHECK(fm_gpt_paged_step(m, p, n, seqs, tk, lg) == FM_OK);
        steps++;
        shared += n > 1;
        for (int i = 0; i < n; i++) {
            double d = diff_vs_full(m, toks[who[i]], step - start[who[i]] + 1, lg + (size_t)i * 64);
            if (d > worst) worst = d;
        }
    }
    if (kv_f16) { /* the halves' rounding (2^-11 relative) through two layers: above 0, well under 1e-2 */
        fprintf(stderr, "%s, f16 KV blocks: paged logits within %.3g of the full forward\n", fm_gpt_arch_name(arch), worst);
        CHECK_MSG(worst > 0 && worst < 1e-2, "%s f16 KV: paged logits differ from the full forward by %g", fm_gpt_arch_name(arch), worst);
    } else {
        CHECK_MSG(worst < 1e-4, "%s: paged logits differ from the full forward by %g", fm_gpt_arch_name(arch), worst);
    }
    CHECK(shared >= 6 && steps == 12);
    /* blocks: B and C are still open (12 and 7 tokens: 3 + 2 blocks of 4) */
    CHECK_MSG(p && fm_gpt_paged_free_blocks(p) == 12 - 5, "free blocks %d", p ? fm_gpt_paged_free_blocks(p) : -1);
    if (p) {
        fm_gpt_paged_close(p, slot[1]);
        fm_gpt_paged_close(p, slot[2]);
        CHECK(fm_gpt_paged_free_blocks(p) == 12);
    }
    fm_gpt_paged_free(p);
    free(lg);
    fm_gpt_free(m);
}

/* Prefill: prompts fed in chunks (one forward each) alongside a decoding sequence
 * give the full forward's logits for each sequence's last token; blocks follow. */
static void check_prefill(fm_gpt_arch arch) {
    fm_gpt_config c = tiny(arch);
    fm_rng r;
    fm_rng_init(&r, 11);
    fm_gpt *m = fm_gpt_new(&c, &r);
    fm_gpt_train_mode(m, false);
    const int32_t a[14] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7}, b[9] = {2, 7, 1, 8, 2, 8, 1, 8, 28};
    fm_gpt_paged *p = fm_gpt_paged_new(m, 7, 4, 2);
    float lg[2 * 64];
    int sa = fm_gpt_paged_open(p), sb = fm_gpt_paged_open(p);
    double worst = 0;
    /* step 1: A's first 7 prompt tokens in one chunk; step 2: A's next 5 with B's first 1;
     * step 3: A decodes 1 while B prefills 8; step 4: both 1 */
    const int plan[4][2] = {{7, 0}, {5, 1}, {1, 8}, {1, 0}};
    int fa = 0, fb = 0;
    for (int st = 0; st < 4; st++) {
        int seqs[2], cnt[2], n = 0;
        int32_t tk[16];
        int k = 0;
        if (plan[st][0]) { seqs[n] = sa; cnt[n++] = plan[st][0]; for (int i = 0; i < plan[st][0]; i++) tk[k++] = a[fa + i]; }
        if (plan[st][1]) { seqs[n] = sb; cnt[n++] = plan[st][1]; for (int i = 0; i < plan[st][1]; i++) tk[k++] = b[fb + i]; }
        CHECK(fm_gpt_paged_step_n(m, p, n, seqs, cnt, tk, lg) == FM_OK);
        fa += plan[st][0];
        fb += plan[st][1];
        int i = 0;
        if (plan[st][0]) { double d = diff_vs_full(m, a, fa, lg + (size_t)(i++) * 64); worst = d > worst ? d : worst; }
        if (plan[st][1]) { double d = diff_vs_full(m, b, fb, lg + (size_t)i * 64); worst = d > worst ? d : worst; }
    }
    CHECK_MSG(worst < 1e-4, "%s: chunked prefill logits differ from the full forward by %g", fm_gpt_arch_name(arch), worst);
    CHECK(fm_gpt_paged_len(p, sa) == 14 && fm_gpt_paged_len(p, sb) == 9);
    CHECK_MSG(fm_gpt_paged_free_blocks(p) == 7 - 4 - 3, "free blocks %d", fm_gpt_paged_free_blocks(p));
    /* past the context (16): refused, nothing taken */
    CHECK(fm_gpt_paged_step_n(m, p, 1, &sa, (int[]){3}, a, lg) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("context size 16");
    /* a chunk needing a block when none is free: refused, nothing taken */
    CHECK(fm_gpt_paged_step_n(m, p, 1, &sb, (int[]){7}, a, lg) == FM_ERR_OOM);
    CHECK_ERR_CONTAINS("1 blocks needed, 0 free");
    CHECK(fm_gpt_paged_free_blocks(p) == 0 && fm_gpt_paged_len(p, sb) == 9);
    CHECK(fm_gpt_paged_step_n(m, p, 1, &sb, (int[]){3}, a, lg) == FM_OK); /* fits in B's last block */
    CHECK(fm_gpt_paged_step_n(m, p, 1, &sb, (int[]){0}, a, lg) == FM_ERR_INVALID);
    fm_gpt_paged_free(p);
    fm_gpt_free(m);
}

/* Two blocks only: a third sequence's first token cannot be cached. */
static void check_exhaustion(void) {
    fm_gpt_config c = tiny(FM_GPT_GPT2);
    fm_gpt *m = fm_gpt_new(&c, NULL);
    fm_gpt_paged *p = fm_gpt_paged_new(m, 2, 4, 3);
    float lg[3 * 64];
    int s[3] = {fm_gpt_paged_open(p), fm_gpt_paged_open(p), fm_gpt_paged_open(p)};
    CHECK(fm_gpt_paged_open(p) == -1);
    CHECK(fm_gpt_paged_step(m, p, 2, s, (int32_t[]){1, 2}, lg) == FM_OK);
    CHECK(fm_gpt_paged_step(m, p, 3, s, (int32_t[]){1, 2, 3}, lg) == FM_ERR_OOM);
    CHECK_ERR_CONTAINS("1 blocks needed, 0 free");
    CHECK(fm_gpt_paged_len(p, s[0]) == 1 && fm_gpt_paged_len(p, s[2]) == 0);
    CHECK(fm_gpt_paged_step(m, p, 2, s, (int32_t[]){1, 99}, lg) == FM_ERR_INVALID);
    CHECK(fm_gpt_paged_step(m, p, 2, (int[]){s[0], s[0]}, (int32_t[]){1, 2}, lg) == FM_ERR_INVALID);
    fm_gpt_paged_close(p, s[0]);
    CHECK(fm_gpt_paged_step(m, p, 1, &s[2], (int32_t[]){3}, lg) == FM_OK);
    fm_gpt_paged_free(p);
    fm_gpt_free(m);
}

/* A model moved to another device (here the checked test device) after its cache was
 * made is refused with the reason, not read through host pointers (which would fault
 * there); moved back, it decodes again. */
static void check_moved_model(void) {
    fm_gpt_config c = tiny(FM_GPT_GPT2);
    fm_gpt *m = fm_gpt_new(&c, NULL);
    fm_gpt_paged *p = fm_gpt_paged_new(m, 2, 4, 1);
    float lg[64];
    int s = fm_gpt_paged_open(p);
    CHECK(fm_gpt_to(m, (fm_device){FM_DEV_CHECK, 0}) == FM_OK);
    CHECK(fm_gpt_paged_step(m, p, 1, &s, (int32_t[]){1}, lg) == FM_ERR_UNSUPPORTED);
    CHECK_ERR_CONTAINS("paged decoding runs on the CPU");
    CHECK(fm_gpt_paged_len(p, s) == 0);
    CHECK(fm_gpt_paged_new(m, 2, 4, 1) == NULL); /* and a new cache for it is refused too */
    CHECK(fm_gpt_to(m, FM_CPU) == FM_OK);
    CHECK(fm_gpt_paged_step(m, p, 1, &s, (int32_t[]){1}, lg) == FM_OK);
    CHECK(fm_gpt_paged_len(p, s) == 1);
    fm_gpt_paged_free(p);
    fm_gpt_free(m);
}

/* A sequence's logits are bitwise the same decoded alone one token per step, with
 * its prompt in one chunk, or sharing every step with 1-5 others (the packed
 * linear sums each output in one order whatever the rows: gpt_paged.c). */
static void check_batch_invariance(fm_gpt_arch arch) {
    fm_gpt_config c = tiny(arch);
    fm_rng r;
    fm_rng_init(&r, 5);
    fm_gpt *m = fm_gpt_new(&c, &r);
    fm_gpt_train_mode(m, false);
    const int32_t x[10] = {4, 8, 15, 16, 23, 42, 7, 1, 2, 3};
    float alone[10][64], lg[6 * 64];
    fm_gpt_paged *p = fm_gpt_paged_new(m, 24, 4, 6);
    int s = fm_gpt_paged_open(p);
    for (int t = 0; t < 10; t++) CHECK(fm_gpt_paged_step(m, p, 1, &s, &x[t], alone[t]) == FM_OK);
    fm_gpt_paged_close(p, s);
    /* the first 6 tokens as one chunk, then with company that changes every step */
    int seqs[6];
    for (int i = 0; i < 6; i++) seqs[i] = fm_gpt_paged_open(p);
    CHECK(fm_gpt_paged_step_n(m, p, 1, seqs, (int[]){6}, x, lg) == FM_OK);
    bool same = memcmp(lg, alone[5], sizeof(float) * 64) == 0;
    for (int t = 6; t < 10; t++) {
        int n = 1 + (t * 3) % 6, cnt[6];
        int32_t tk[6 * 2];
        int k = 0;
        for (int i = 0; i < n; i++) {
            cnt[i] = i == 0 ? 1 : 1 + (i + t) % 2; /* others: one token or a chunk of two */
            for (int j = 0; j < cnt[i]; j++) tk[k++] = i == 0 ? x[t] : (int32_t)((t * 7 + i * 5 + j) % 64);
        }
        CHECK(fm_gpt_paged_step_n(m, p, n, seqs, cnt, tk, lg) == FM_OK);
        same = same && memcmp(lg, alone[t], sizeof(float) * 64) == 0;
    }
    CHECK_MSG(same, "%s: logits depend on the other sequences in the step", fm_gpt_arch_name(arch));
    fm_gpt_paged_free(p);
    fm_gpt_free(m);
}

/* The cache holds packed copies of the weights it was made with: a model whose
 * weight tensors were replaced since is refused, not run with the stale copies. */
static void check_replaced_weights(void) {
    fm_gpt_config c = tiny(FM_GPT_GPT2);
    fm_gpt *m = fm_gpt_new(&c, NULL);
    fm_gpt_paged *p = fm_gpt_paged_new(m, 2, 4, 1);
    float lg[64];
    int s = fm_gpt_paged_open(p);
    fm_tensor *w = m->layers[1].fc2_w, *w2 = fm_tensor_zeros(w->ndim, w->shape, w->dtype, fm_tensor_device(w));
    m->layers[1].fc2_w = w2;
    CHECK(fm_gpt_paged_step(m, p, 1, &s, (int32_t[]){1}, lg) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("make a new cache");
    CHECK(fm_gpt_paged_len(p, s) == 0);
    m->layers[1].fc2_w = w;
    CHECK(fm_gpt_paged_step(m, p, 1, &s, (int32_t[]){1}, lg) == FM_OK);
    fm_tensor_release(w2);
    fm_gpt_paged_free(p);
    fm_gpt_free(m);
}

int main(void) {
    check_batch_invariance(FM_GPT_GPT2);
    check_batch_invariance(FM_GPT_LLAMA);
    check_replaced_weights();
    check_arch(FM_GPT_GPT2);
    check_arch(FM_GPT_LLAMA);
    check_prefill(FM_GPT_GPT2);
    check_prefill(FM_GPT_LLAMA);
    check_exhaustion();
    check_moved_model();
    narrow_heads = true; /* a head-pruned model's shape */
    check_arch(FM_GPT_GPT2);
    check_arch(FM_GPT_LLAMA);
    check_prefill(FM_GPT_GPT2);
    check_prefill(FM_GPT_LLAMA);
    narrow_heads = false;
    untied = true; /* the logits come from lm_head */
    check_arch(FM_GPT_LLAMA);
    check_prefill(FM_GPT_GPT2);
    untied = false;
    /* the attention's (row, kv head) pairs over the pool, as large steps run it: these
     * models are too small to reach the default bound */
    fm_gpt_paged_set_parallel_min(0);
    check_batch_invariance(FM_GPT_GPT2);
    check_batch_invariance(FM_GPT_LLAMA);
    check_arch(FM_GPT_GPT2);
    check_arch(FM_GPT_LLAMA);
    check_prefill(FM_GPT_GPT2);
    check_prefill(FM_GPT_LLAMA);
    /* f16 blocks (kv_dtype FM_F16, what "kv_cache_dtype": "f16" gives the server) */
    kv_f16 = true;
    check_arch(FM_GPT_GPT2);
    check_arch(FM_GPT_LLAMA);
    kv_f16 = false;
    {
        fm_gpt_config c = tiny(FM_GPT_GPT2);
        fm_rng r;
        fm_rng_init(&r, 7);
        fm_gpt *m = fm_gpt_new(&c, &r);
        CHECK(fm_gpt_paged_new_ex(m, NULL, 4, 4, 1, FM_BF16) == NULL);
        CHECK_ERR_CONTAINS("must be f32 or f16, got bf16");
        fm_gpt_free(m);
    }
    TEST_DONE();
}
