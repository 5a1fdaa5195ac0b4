/* Sentence-embedding models served on OpenAI's POST /v1/embeddings: a BERT
 * encoder in sentence-transformers layout (config.json with model_type "bert",
 * model.safetensors, vocab.txt, optional modules.json / 1_Pooling; what `fathom
 * embed` reads, fm_hf_encoder_load). Platform "fathom_embed".
 *
 * Each of the config's instance_group count instances is one loaded encoder; a
 * request takes a free one and embeds all of its texts in one batch (the
 * encoder pads them to the longest), so concurrent requests run side by side
 * up to the instance count. Requests are not joined across clients. */
#ifndef FATHOM_SERVE_EMBEDDER_H
#define FATHOM_SERVE_EMBEDDER_H
#include <jansson.h>
#include <stdbool.h>

#include "serve/metrics.h"
#include "serve/model_config.h"

typedef struct fm_embedder fm_embedder;

/* Whether a version folder holds such an encoder (its config.json says model_type bert). */
bool fm_embedder_dir(const char *dir);
/* Loads cfg->instance_count encoders (on the CPU); NULL with the error set. */
fm_embedder *fm_embedder_open(const char *dir, const fm_model_config *cfg, fm_serve_stats *stats);
void fm_embedder_free(fm_embedder *e);
int fm_embedder_dim(const fm_embedder *e);

/* Embeds n texts (each non-empty UTF-8) into out[n * dim] (as the encoder pools and
 * normalizes them); *tokens gets the number of tokens they were cut to. Returns 0, or
 * an HTTP status with err set. Blocks while every instance is busy. */
int fm_embedder_run(fm_embedder *e, const char *const *texts, int n, float *out, int64_t *tokens, char *err, size_t errn);
#endif
