/* Autoregressive generation (batch 1), with or without a KV cache. Sampling is
 * gpt_sample.c: the sequence of samples depends only on the seed and the logits,
 * which is what lets the test show that the cached and uncached paths produce the
 * same tokens. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "gpt/gpt_internal.h"

/* Last row of logits [1, T, V] as floats. */
static fm_status last_logits(fm_tensor *logits, float *dst) {
    fm_tensor *row = fm_select(logits, 1, logits->shape[1] - 1);
    fm_status st = row ? fm_tensor_copy_to_host(row, dst, FM_F32) : fm_last_status();
    fm_tensor_release(row);
    return st;
}

fm_status fm_gpt_generate(fm_gpt *m, const int32_t *prompt, int n_prompt, int n_new,
                          const fm_gpt_sample_params *p, bool use_cache, int32_t *out, int *out_n,
                          bool *hit_limit, fm_gpt_token_fn cb, void *ctx) {
    if (out_n) *out_n = 0;
    if (hit_limit) *hit_limit = false;
    const int V = m->cfg.vocab_size, ctx_len = m->cfg.block_size;
    if (n_prompt < 1) return fm_set_error(FM_ERR_INVALID, "generate: the prompt is empty (it needs at least one token)");
    if (n_prompt > ctx_len)
        return fm_set_error(FM_ERR_INVALID,
                            "generate: the prompt is %d tokens but the model's context is %d (shorten the prompt)",
                            n_prompt, ctx_len);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return fm_set_error(FM_ERR_INVALID, "generate: unknown token id %d at prompt position %d (vocab size %d)",
                                prompt[i], i, V);
    if (n_new < 0) return fm_set_error(FM_ERR_INVALID, "generate: token count %d must be >= 0", n_new);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(n_prompt + n_new + 1));
    float *lg = malloc(sizeof(float) * (size_t)V);
    fm_gpt_kv_cache *cache = use_cache ? fm_gpt_kv_cache_new(m, 1) : NULL;
    fm_status st = FM_OK;
    if (!seq || !lg || (use_cache && !cache)) {
        st = cache || !use_cache ? fm_set_error(FM_ERR_OOM, "out of host memory") : fm_last_status();
        goto done;
    }
    memcpy(seq, prompt, sizeof(int32_t) * (size_t)n_prompt);
    int len = n_prompt, made = 0;
    bool prev = fm_set_grad_enabled(false), was_training = m->training;
    m->training = false;
    /* under bf16 autocast: the linears read bf16 copies of their weights, made once
     * here, instead of converting every weight at every step (the caller's, if it
     * holds copies already, are used and kept) */
    const bool own_lowp = m->n_lowp == 0;
    if (own_lowp && (st = fm_gpt_keep_lowp_weights(m, true)) != FM_OK) {
        m->training = was_training;
        fm_set_grad_enabled(prev);
        goto done;
    }
    int fed = 0; /* tokens already in the cache */
    while (made < n_new) {
        if (len >= ctx_len) {
            if (hit_limit) *hit_limit = true;
            break;
        }
        fm_tensor *idx = NULL, *logits = NULL;
        int start = use_cache ? fed : 0;
        int64_t shape[2] = {1, len - start};
        int64_t *buf = malloc(sizeof(int64_t) * (size_t)(len - start));
        if (!buf) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); break; }
        for (int i = start; i < len; i++) buf[i - start] = seq[i];
        idx = fm_tensor_from_data(buf, 2, shape, FM_I64);
        free(buf);
        if (idx && !fm_device_eq(fm_tensor_device(idx), fm_gpt_device(m))) { /* the ids go to the model's device */
            fm_tensor *d = fm_tensor_to(idx, fm_gpt_device(m));
            fm_tensor_release(idx);
            idx = d;
        }
        if (idx) logits = use_cache ? fm_gpt_forward_cached(m, idx, cache) : fm_gpt_forward(m, idx, NULL, NULL);
        fm_tensor_release(idx);
        if (!logits) { st = fm_last_status(); break; }
        fed = len;
        st = last_logits(logits, lg);
        fm_tensor_release(logits);
        if (st) break;
        int tok = fm_gpt_sample(lg, V, p, (uint64_t)made);
        if (tok < 0) { st = fm_set_error(FM_ERR_OOM, "generate: out of memory while sampling"); break; }
        seq[len++] = tok;
        if (out) out[made] = tok;
        made++;
        if (cb && cb(tok, ctx)) break;
    }
    if (own_lowp) fm_gpt_keep_lowp_weights(m, false);
    m->training = was_training;
    fm_set_grad_enabled(prev);
    if (out_n) *out_n = made;
done:
    fm_gpt_kv_cache_free(cache);
    free(seq);
    free(lg);
    return st;
}
