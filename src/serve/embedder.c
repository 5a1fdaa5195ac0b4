/* The sentence-embedding servable (embedder.h): a pool of loaded encoders. */
#include "serve/embedder.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/error.h"
#include "fathom/hf.h"
#include "fathom/tensor.h"
#include "serve/batcher.h" /* fm_now_ns */

struct fm_embedder {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, n_free;
    fm_hf_encoder **enc;
    int *free_idx; /* a stack of the idle encoders' indices */
    fm_serve_stats *stats;
};

bool fm_embedder_dir(const char *dir) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    const char *t = json_string_value(json_object_get(j, "model_type"));
    bool yes = t && !strcmp(t, "bert");
    json_decref(j);
    return yes;
}

void fm_embedder_free(fm_embedder *e) {
    if (!e) return;
    for (int i = 0; e->enc && i < e->n; i++) fm_hf_encoder_free(e->enc[i]);
    free(e->enc);
    free(e->free_idx);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

fm_embedder *fm_embedder_open(const char *dir, const fm_model_config *cfg, fm_serve_stats *stats) {
    if (cfg->device.type != FM_DEV_CPU) {
        char dn[32];
        fm_set_error(FM_ERR_UNSUPPORTED, "%s: a sentence-embedding model runs on the CPU only (this one is asked for %s)", dir,
                     fm_device_name(cfg->device, dn, sizeof dn));
        return NULL;
    }
    fm_embedder *e = calloc(1, sizeof *e);
    if (!e) { fm_set_error(FM_ERR_OOM, "serve: out of memory"); return NULL; }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->stats = stats;
    e->enc = calloc((size_t)cfg->instance_count, sizeof *e->enc);
    e->free_idx = calloc((size_t)cfg->instance_count, sizeof *e->free_idx);
    if (!e->enc || !e->free_idx) { fm_embedder_free(e); fm_set_error(FM_ERR_OOM, "serve: out of memory"); return NULL; }
    for (int i = 0; i < cfg->instance_count; i++) {
        if (!(e->enc[i] = fm_hf_encoder_load(dir))) { fm_embedder_free(e); return NULL; }
        e->free_idx[e->n_free++] = i;
        e->n++;
    }
    return e;
}

int fm_embedder_dim(const fm_embedder *e) { return fm_hf_encoder_dim(e->enc[0]); }

int fm_embedder_run(fm_embedder *e, const char *const *texts, int n, float *out, int64_t *tokens, char *err, size_t errn) {
    pthread_mutex_lock(&e->mu);
    while (e->n_free == 0) pthread_cond_wait(&e->cv, &e->mu);
    int k = e->free_idx[--e->n_free];
    pthread_mutex_unlock(&e->mu);
    int64_t t1 = fm_now_ns();
    fm_hf_encoder *enc = e->enc[k];
    int status = 0;
    *tokens = 0;
    for (int i = 0; i < n && !status; i++) {
        int32_t *ids = NULL;
        int64_t len = 0;
        if (fm_hf_encoder_tokenize(enc, texts[i], &ids, &len)) {
            snprintf(err, errn, "input %d: %s", i, fm_last_error());
            status = 400;
        }
        free(ids);
        *tokens += len;
    }
    fm_tensor *y = status ? NULL : fm_hf_encoder_embed(enc, texts, n);
    int64_t t2 = fm_now_ns();
    if (!status && !y) {
        snprintf(err, errn, "embedding failed: %s", fm_last_error());
        status = 500;
    }
    if (y) memcpy(out, fm_tensor_data(y), sizeof(float) * (size_t)n * (size_t)fm_hf_encoder_dim(enc));
    fm_tensor_release(y);
    pthread_mutex_lock(&e->mu);
    e->free_idx[e->n_free++] = k;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (!status) fm_serve_stats_exec(e->stats, (uint64_t)n, 1, 0, (uint64_t)(t2 - t1) / 1000, 0);
    return status;
}
