/* Files around the transformer: weights under Hugging Face names (safetensors via
 * fathom/io.h), token files with a versioned header, and the windows training
 * and evaluation read from them.
 *
 * Token files exist so a corpus is tokenized once: training then reads a flat
 * array of ids and never touches the tokenizer again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h" /* fm_detach */
#include "fathom/io.h"       /* fm_safetensors_*, fm_atomic_write */
#include "fathom/ops.h"
#include "gpt/gpt_internal.h"

/* ---------------- Hugging Face weights ---------------- */

/* The HF view of one entry: a (possibly transposed) slice of the parameter. */
static fm_tensor *hf_view(const gpt_hf_entry *e) {
    fm_tensor *t = fm_narrow(e->t, 0, e->row0, e->rows);
    if (t && e->transpose) {
        fm_tensor *tt = fm_transpose(t, 0, 1);
        fm_tensor_release(t);
        t = tt;
    }
    return t;
}

fm_status fm_gpt_hf_tensors(const fm_gpt *m, fm_named_list *l) {
    memset(l, 0, sizeof *l);
    l->owns_tensors = true;
    fm_status st = FM_OK;
    for (int i = 0; i < m->n_hf && st == FM_OK; i++) {
        fm_tensor *v = hf_view(&m->hf[i]);
        fm_tensor *c = v ? fm_contiguous(v) : NULL;
        fm_tensor *d = c ? fm_detach(c) : NULL;
        st = d ? fm_named_list_push(l, m->hf[i].name, d, false, false) : fm_last_status();
        fm_tensor_release_n(3, v, c, d);
    }
    return st;
}

fm_status fm_gpt_save_hf(const fm_gpt *m, const char *path) {
    if (m->tp) return fm_set_error(FM_ERR_UNSUPPORTED, "%s: a tensor-parallel model holds shards; save the whole "
                                   "model from fm_gpt_tp_gather_model", path);
    fm_named_list l;
    fm_status st = fm_gpt_hf_tensors(m, &l);
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    if (st == FM_OK) st = fm_kv_set(&meta, "format", "pt");
    if (st == FM_OK) st = fm_kv_set(&meta, "fathom_arch", fm_gpt_arch_name(m->cfg.arch));
    if (st == FM_OK) st = fm_safetensors_save(path, &l, &meta);
    fm_kv_free(&meta);
    fm_named_list_free(&l);
    return st;
}

/* Tensors an HF file may carry that the model does not need (tied head,
 * GPT-2's stored causal-mask buffers). */
static bool ignorable(const char *name) {
    size_t n = strlen(name);
    return !strcmp(name, "lm_head.weight") || (n > 9 && !strcmp(name + n - 9, ".attn.bias")) ||
           (n > 16 && !strcmp(name + n - 16, ".attn.masked_bias"));
}

fm_status fm_gpt_load_hf(fm_gpt *m, const char *path) {
    fm_named_list l;
    memset(&l, 0, sizeof l);
    fm_status st = fm_safetensors_load(path, &l, NULL);
    if (st == FM_OK) st = fm_gpt_load_hf_tensors(m, &l, path);
    fm_named_list_free(&l);
    return st;
}

fm_status fm_gpt_load_hf_tensors(fm_gpt *m, const fm_named_list *lp, const char *path) {
    if (m->tp) return fm_set_error(FM_ERR_UNSUPPORTED, "%s: a tensor-parallel model holds shards; load a whole model "
                                   "and split it (fm_gpt_tp_load_model)", path);
    const fm_named_list l = *lp;
    fm_status st = FM_OK;
    fm_tensor **views = calloc((size_t)m->n_hf, sizeof *views);
    int *src = calloc((size_t)m->n_hf, sizeof *src);
    char a[96], b[96];
    if (!views || !src) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); goto done; }
    /* check everything before changing anything */
    for (int i = 0; i < m->n_hf && st == FM_OK; i++) {
        const gpt_hf_entry *e = &m->hf[i];
        views[i] = hf_view(e);
        if (!views[i]) { st = fm_last_status(); break; }
        int j = fm_named_list_find(&l, e->name);
        if (j < 0) {
            st = fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' (shape %s) is missing: not a %s checkpoint of this size?",
                              path, e->name, fm_shape_str(views[i]->ndim, views[i]->shape, a, sizeof a),
                              fm_gpt_arch_name(m->cfg.arch));
            break;
        }
        const fm_tensor *t = l.items[j].tensor;
        if (t->ndim != views[i]->ndim || memcmp(t->shape, views[i]->shape, sizeof(int64_t) * (size_t)t->ndim)) {
            st = fm_set_error(FM_ERR_FORMAT,
                              "%s: tensor '%s' has shape %s but the model expects %s (a checkpoint of a different "
                              "architecture or size)",
                              path, e->name, fm_shape_str(t->ndim, t->shape, a, sizeof a),
                              fm_shape_str(views[i]->ndim, views[i]->shape, b, sizeof b));
            break;
        }
        if (!fm_dtype_is_float(t->dtype)) {
            st = fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected a floating-point type", path,
                              e->name, fm_dtype_name(t->dtype));
            break;
        }
        src[i] = j;
    }
    for (int j = 0; j < l.n && st == FM_OK; j++) {
        bool known = ignorable(l.items[j].name);
        for (int i = 0; i < m->n_hf && !known; i++) known = !strcmp(m->hf[i].name, l.items[j].name);
        if (!known)
            st = fm_set_error(FM_ERR_FORMAT, "%s: unexpected tensor '%s' (shape %s): not a %s checkpoint of this config",
                              path, l.items[j].name,
                              fm_shape_str(l.items[j].tensor->ndim, l.items[j].tensor->shape, a, sizeof a),
                              fm_gpt_arch_name(m->cfg.arch));
    }
    for (int i = 0; i < m->n_hf && st == FM_OK; i++) st = fm_copy_(views[i], l.items[src[i]].tensor);
done:
    for (int i = 0; views && i < m->n_hf; i++) fm_tensor_release(views[i]);
    free(views);
    free(src);
    return st;
}

/* ---------------- token files ---------------- */

#define TOK_MAGIC "FMTOKENS"
#define TOK_VERSION 1u
#define TOK_HEADER 32

fm_status fm_token_file_write(const char *path, const int32_t *ids, int64_t n, int vocab_size) {
    if (vocab_size < 1) return fm_set_error(FM_ERR_INVALID, "token file: vocab size %d must be >= 1", vocab_size);
    uint32_t width = vocab_size <= 65536 ? 2 : 4;
    unsigned char h[TOK_HEADER];
    memset(h, 0, sizeof h);
    memcpy(h, TOK_MAGIC, 8);
    uint32_t ver = TOK_VERSION, vs = (uint32_t)vocab_size;
    uint64_t cnt = (uint64_t)n;
    memcpy(h + 8, &ver, 4);
    memcpy(h + 12, &vs, 4);
    memcpy(h + 16, &width, 4);
    memcpy(h + 24, &cnt, 8);
    void *body = malloc((size_t)(n ? n : 1) * width);
    if (!body) return fm_set_error(FM_ERR_OOM, "token file: out of memory for %lld tokens", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab_size) {
            free(body);
            return fm_set_error(FM_ERR_INVALID, "token file: id %d at %lld is outside the vocabulary (%d)", ids[i],
                                (long long)i, vocab_size);
        }
        if (width == 2) ((uint16_t *)body)[i] = (uint16_t)ids[i];
        else ((uint32_t *)body)[i] = (uint32_t)ids[i];
    }
    fm_io_chunk ch[2] = {{h, sizeof h}, {body, (size_t)n * width}};
    fm_status st = fm_atomic_write(path, 2, ch);
    free(body);
    return st;
}

fm_status fm_token_file_read(const char *path, int expect_vocab, fm_token_data *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return fm_set_error(FM_ERR_IO, "%s: cannot open token file", path);
    unsigned char h[TOK_HEADER];
    fm_status st = FM_OK;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    rewind(f);
    if (size < TOK_HEADER || fread(h, 1, sizeof h, f) != sizeof h) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: not a token file (shorter than its %d-byte header)", path, TOK_HEADER);
        goto done;
    }
    uint32_t ver, vs, width;
    uint64_t cnt;
    memcpy(&ver, h + 8, 4);
    memcpy(&vs, h + 12, 4);
    memcpy(&width, h + 16, 4);
    memcpy(&cnt, h + 24, 8);
    if (memcmp(h, TOK_MAGIC, 8)) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: not a token file (bad magic; expected \"%s\")", path, TOK_MAGIC);
        goto done;
    }
    if (ver != TOK_VERSION) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: token file version %u is not supported (this build reads %u)", path, ver,
                          TOK_VERSION);
        goto done;
    }
    if ((width != 2 && width != 4) || vs < 1 || (width == 2 && vs > 65536)) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: bad token file header (token width %u bytes, vocab size %u)", path,
                          width, vs);
        goto done;
    }
    if (cnt > (uint64_t)(size - TOK_HEADER) / width || (uint64_t)(size - TOK_HEADER) != cnt * width) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: header says %llu tokens of %u bytes but the file holds %ld bytes of data",
                          path, (unsigned long long)cnt, width, size - TOK_HEADER);
        goto done;
    }
    if (expect_vocab > 0 && (uint32_t)expect_vocab != vs) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: token file was made with vocab size %u, but the tokenizer/model has %d",
                          path, vs, expect_vocab);
        goto done;
    }
    out->ids = malloc(sizeof(int32_t) * (size_t)(cnt ? cnt : 1));
    void *raw = malloc((size_t)(cnt ? cnt : 1) * width);
    if (!out->ids || !raw) {
        free(raw);
        st = fm_set_error(FM_ERR_OOM, "%s: out of memory for %llu tokens", path, (unsigned long long)cnt);
        goto done;
    }
    if (fread(raw, width, (size_t)cnt, f) != cnt) {
        free(raw);
        st = fm_set_error(FM_ERR_IO, "%s: short read", path);
        goto done;
    }
    for (uint64_t i = 0; i < cnt; i++) {
        uint32_t v = width == 2 ? ((uint16_t *)raw)[i] : ((uint32_t *)raw)[i];
        if (v >= vs) {
            free(raw);
            st = fm_set_error(FM_ERR_FORMAT, "%s: token %llu has id %u, outside the vocabulary of %u", path,
                              (unsigned long long)i, v, vs);
            goto done;
        }
        out->ids[i] = (int32_t)v;
    }
    free(raw);
    out->n = (int64_t)cnt;
    out->vocab_size = (int)vs;
done:
    fclose(f);
    if (st) fm_token_data_free(out);
    return st;
}

void fm_token_data_free(fm_token_data *d) {
    if (!d) return;
    free(d->ids);
    memset(d, 0, sizeof *d);
}

/* ---------------- windows ---------------- */

static fm_status make_xy(const fm_token_data *d, const int64_t *starts, int B, int T, fm_tensor **x, fm_tensor **y) {
    int64_t shape[2] = {B, T};
    *x = fm_tensor_empty(2, shape, FM_I64, FM_CPU);
    *y = fm_tensor_empty(2, shape, FM_I64, FM_CPU);
    if (!*x || !*y) {
        fm_tensor_release_n(2, *x, *y);
        *x = *y = NULL;
        return fm_last_status();
    }
    int64_t *xp = fm_tensor_data(*x), *yp = fm_tensor_data(*y);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            xp[(int64_t)b * T + t] = d->ids[starts[b] + t];
            yp[(int64_t)b * T + t] = d->ids[starts[b] + t + 1];
        }
    return FM_OK;
}

fm_status fm_gpt_batch_random(const fm_token_data *d, int64_t lo, int64_t hi, int B, int T, uint64_t seed,
                              int64_t step, fm_tensor **x, fm_tensor **y) {
    return fm_gpt_batch_random_rows(d, lo, hi, B, T, seed, step, 0, B, x, y);
}

fm_status fm_gpt_batch_random_rows(const fm_token_data *d, int64_t lo, int64_t hi, int B, int T, uint64_t seed,
                                   int64_t step, int first, int rows, fm_tensor **x, fm_tensor **y) {
    *x = *y = NULL;
    if (first < 0 || rows < 1 || first + rows > B)
        return fm_set_error(FM_ERR_INVALID, "batch: rows [%d, %d) are not within a batch of %d", first, first + rows, B);
    if (B < 1 || T < 1) return fm_set_error(FM_ERR_INVALID, "batch: B %d and T %d must be >= 1", B, T);
    if (lo < 0 || hi > d->n || hi - lo < (int64_t)T + 1)
        return fm_set_error(FM_ERR_INVALID,
                            "batch: the split holds %lld tokens, too few for one window of %d (+1 for the target)",
                            (long long)(hi - lo), T);
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)rows);
    if (!starts) return fm_set_error(FM_ERR_OOM, "out of host memory");
    uint64_t span = (uint64_t)(hi - lo - T); /* start in [lo, hi - T - 1] */
    for (int b = 0; b < rows; b++) { /* window b of the batch depends on (seed, step, b) alone */
        uint32_t r[4];
        fm_philox4x32(seed, (uint64_t)step, (uint64_t)(first + b), r);
        uint64_t u = ((uint64_t)r[0] << 32) | r[1];
        starts[b] = lo + (int64_t)(u % span);
    }
    fm_status st = make_xy(d, starts, rows, T, x, y);
    free(starts);
    return st;
}

fm_status fm_gpt_batch_eval(const fm_token_data *d, int64_t lo, int64_t hi, int B, int T, int64_t index,
                            fm_tensor **x, fm_tensor **y) {
    *x = *y = NULL;
    if (B < 1 || T < 1) return fm_set_error(FM_ERR_INVALID, "batch: B %d and T %d must be >= 1", B, T);
    int64_t n_windows = (hi - lo - 1) / T;
    if (lo < 0 || hi > d->n || n_windows < 1)
        return fm_set_error(FM_ERR_INVALID,
                            "eval batch: the held-out split holds %lld tokens, too few for one window of %d",
                            (long long)(hi - lo), T);
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)B);
    if (!starts) return fm_set_error(FM_ERR_OOM, "out of host memory");
    for (int b = 0; b < B; b++) starts[b] = lo + ((index * B + b) % n_windows) * T;
    fm_status st = make_xy(d, starts, B, T, x, y);
    free(starts);
    return st;
}
