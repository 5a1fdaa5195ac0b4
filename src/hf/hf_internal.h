/* Internals shared by the src/hf files: config.json reading and the BERT config.
 * Not a public interface. */
#ifndef FATHOM_HF_INTERNAL_H
#define FATHOM_HF_INTERNAL_H

#include <jansson.h>

#include "fathom/hf.h"

/* A config.json being read: the first error sticks, later reads do nothing. */
typedef struct hf_cfg {
    json_t *j;
    const char *name;
    fm_status st;
} hf_cfg;

/* Refuses keys in neither list (nor in the keys every config may carry). */
fm_status hf_check_keys(hf_cfg *r, const char *model_type, const char *const *used, const char *const *ignored);
int hf_int(hf_cfg *r, const char *key, bool required, int def, int lo, int hi);
double hf_num(hf_cfg *r, const char *key, bool required, double def);
bool hf_bool(hf_cfg *r, const char *key, bool def);
const char *hf_str(hf_cfg *r, const char *key, const char *def);
/* Parses text as a JSON object for r (r->j owned by the caller: json_decref). */
fm_status hf_cfg_open(hf_cfg *r, const char *json, size_t len, const char *name);

typedef struct hf_bert_config {
    int vocab_size, hidden, layers, heads, intermediate, max_pos, type_vocab;
    double eps;
} hf_bert_config;
fm_status hf_bert_config_parse(hf_cfg *r, hf_bert_config *c);

/* dir/name (malloc'd) and a whole JSON text file (malloc'd, NUL-terminated, at
 * most 64 MiB, no NUL byte: fm_read_text_file; NULL with the error set, naming the
 * path and the reason, when it cannot be had). */
char *hf_path(const char *dir, const char *name);
char *hf_read_file(const char *path, size_t *len);

#endif
