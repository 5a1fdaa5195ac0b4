/* A model's configuration: DIR/<model>/config.pbtxt, Triton's ModelConfig in protobuf
 * text, or config.json, its JSON form (the same fields GET /v2/models/{m}/config returns). Every field is
 * optional; what is missing comes from the model itself (inputs, outputs) or the
 * defaults below. docs/SERVING.md lists the fields. */
#ifndef FATHOM_SERVE_MODEL_CONFIG_H
#define FATHOM_SERVE_MODEL_CONFIG_H
#include <jansson.h>

#include "serve/chat_template.h"
#include "serve/servable.h"

#define FM_SERVE_MAX_PREFERRED 16
#define FM_SERVE_MAX_SPECIFIC 64

typedef enum { FM_VP_LATEST = 0, FM_VP_ALL, FM_VP_SPECIFIC } fm_version_policy_kind;

typedef struct fm_model_config {
    char name[FM_SERVE_NAME_MAX];
    int64_t max_batch_size;            /* rows one execution may hold (default 32); 0: Triton's "no batching":
                                          dims are whole shapes and each request runs alone */
    bool max_batch_size_set;           /* given in the config (else a model with a fixed first dim gets 0) */
    bool dynamic_batching;             /* "dynamic_batching" present */
    int n_preferred;
    int64_t preferred[FM_SERVE_MAX_PREFERRED];
    int64_t max_queue_delay_us;        /* default 0 */
    int64_t max_queue_size;            /* queued requests; 0: unbounded (default 0) */
    int64_t default_timeout_us;        /* 0: none */
    int instance_count;                /* default 1 */
    fm_device device;                  /* instance_group kind: KIND_CPU / KIND_GPU */
    bool device_set;                   /* kind given: else the server's --device */
    fm_version_policy_kind policy;
    int latest_n;                      /* default 1 */
    int n_specific;
    int64_t specific[FM_SERVE_MAX_SPECIFIC];
    /* text generation: KV cache blocks (0: half of max_batch_size full contexts) and tokens per block (0: 16) */
    int kv_cache_blocks, kv_block_tokens;
    fm_dtype kv_cache_dtype;  /* the blocks' dtype: FM_F32 (default) or FM_F16 ("kv_cache_dtype") */
    int prefill_chunk_tokens; /* a step's token budget for prompt chunks (0: 256) */
    int stream_interval_tokens; /* a streamed completion's tokens per event after the first (0: 1) */
    fm_chat_template chat;
    char platform[32];            /* "platform" (or "backend") named in config.json, normalised; "": any */
    char model_filename[128];     /* "default_model_filename" of an ONNX model; "": model.onnx */    /* /v1/chat/completions: messages -> prompt (the default unless configured) */
    /* declared inputs/outputs (n = 0: taken from the model) */
    int n_inputs, n_outputs;
    fm_serve_io inputs[FM_SERVE_MAX_IO], outputs[FM_SERVE_MAX_IO];
} fm_model_config;

/* Defaults for `name`. */
void fm_model_config_init(fm_model_config *c, const char *name);
/* Reads DIR/<name>/config.pbtxt (Triton's protobuf text) or config.json (its JSON
 * form) when one exists (defaults otherwise). Errors name the file and field (and
 * the line, in a pbtxt): FM_ERR_FORMAT. */
fm_status fm_model_config_load(fm_model_config *c, const char *model_dir, const char *name);
/* The config file of a model folder into path ("" when there is none); both files
 * at once is an error (path then names the pbtxt). */
fm_status fm_model_config_file(const char *model_dir, char *path, size_t cap);
fm_status fm_model_config_parse(fm_model_config *c, const json_t *j, const char *where);
/* Checks the declared inputs/outputs against what the model has (or adopts the
 * model's when none are declared). A model with a fixed first dim gets
 * max_batch_size 0 (and refuses another); max_batch_size 0 makes a batched
 * servable's shapes whole (fm_servable_unbatch). */
fm_status fm_model_config_complete(fm_model_config *c, fm_servable *s, const char *where);
/* Triton's JSON form, for GET .../config. New reference. */
json_t *fm_model_config_json(const fm_model_config *c, const char *platform);
#endif
