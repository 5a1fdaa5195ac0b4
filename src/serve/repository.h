/* The model repository: DIR/<model>/config.pbtxt or config.json (optional) and numeric version
 * folders DIR/<model>/<version>/. Loaded versions each have a batcher and
 * statistics, and are reference counted: a request holds its version, so a
 * version that is unloaded or removed drains (its queued and running requests
 * finish) and is freed by whoever drops the last reference. */
#ifndef FATHOM_SERVE_REPOSITORY_H
#define FATHOM_SERVE_REPOSITORY_H
#include <jansson.h>
#include <stdatomic.h>

#include "serve/batcher.h"
#include "serve/embedder.h"
#include "serve/textgen.h"

typedef struct fm_serve_version {
    atomic_int refs;
    char model[FM_SERVE_NAME_MAX];
    int64_t version;
    int64_t loaded_unix;    /* when it loaded (seconds since 1970): OpenAI's model "created" */
    fm_model_config cfg;
    const char *platform;
    fm_batcher *batcher;    /* KServe models */
    fm_textgen *textgen;    /* text-generation models (/v1/completions) */
    /* a text model's own chat template that fathom could not parse (and its config
     * does not replace): why chat requests are refused rather than rendered wrongly */
    char chat_refusal[400];
    fm_embedder *embedder;  /* sentence-embedding models (/v1/embeddings) */
    fm_serve_stats stats;
    fm_serve_labels labels[FM_SERVE_MAX_IO]; /* per output: its config's label_filename, read at load */
    struct fm_serve_version *next; /* the model's loaded versions, highest first */
} fm_serve_version;

typedef struct fm_repo fm_repo;

fm_repo *fm_repo_open(const char *root, fm_device device);
/* Unloads everything (waits for nothing: call when no request is in flight). */
void fm_repo_close(fm_repo *r);
/* Model names: 1-63 of [A-Za-z0-9_.-], not starting with '.'; versions: 1-18 digits, > 0. */
bool fm_serve_valid_name(const char *name);
bool fm_serve_parse_version(const char *s, int64_t *out);
/* Loads a model, or reloads it to match its folder (new versions load, removed
 * ones drain; a changed config file reloads all). On failure the model keeps
 * serving what it had; the error names the file and what is wrong. */
fm_status fm_repo_load(fm_repo *r, const char *name);
/* The same with the configuration given (Triton's load request "config": its JSON
 * form) instead of the folder's config file; every version reloads with it, and a
 * later plain load reads the file again. */
fm_status fm_repo_load_config(fm_repo *r, const char *name, const json_t *config);
fm_status fm_repo_unload(fm_repo *r, const char *name);
/* Poll mode: fm_repo_load for every model folder, fm_repo_unload for vanished ones. */
void fm_repo_poll(fm_repo *r, FILE *log);
/* A loaded version (version 0: the highest) with a reference, or NULL with the
 * HTTP status (404) and a message. */
fm_serve_version *fm_repo_acquire(fm_repo *r, const char *name, int64_t version, int *status, char *err, size_t errn);
void fm_repo_release(fm_serve_version *v);
/* Loaded version numbers of a model, as strings (Triton's metadata form); NULL if none. */
json_t *fm_repo_versions_json(fm_repo *r, const char *name);
/* POST /v2/repository/index: every model folder and loaded model with its state. */
json_t *fm_repo_index(fm_repo *r, bool ready_only);
/* Prometheus text: every loaded version's statistics. */
void fm_repo_write_metrics(fm_repo *r, FILE *f);
int fm_repo_count_ready(fm_repo *r);
/* Triton's statistics extension: {"model_stats": [...]} for every loaded version
 * (name NULL), a model's loaded versions (version 0) or one version; NULL (404)
 * when the named model or version is not loaded. */
json_t *fm_repo_stats_json(fm_repo *r, const char *name, int64_t version);
/* GET /v1/models (name NULL): {"object": "list", "data": [...]} of the loaded
 * text-generation and embedding models (their highest version), in OpenAI's model
 * object form; GET /v1/models/{name}: that object, or NULL when no such model is loaded. */
json_t *fm_repo_text_models_json(fm_repo *r, const char *name);
#endif
