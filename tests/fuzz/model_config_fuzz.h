/* Shared by fuzz_model_config.c and fuzz_model_config_pbtxt.c: the bytes as a model
 * folder's config file (config.json or config.pbtxt), through the server's config
 * reader; an accepted config is written back as the /v2/models/NAME/config reply. */
#ifndef FATHOM_FUZZ_MODEL_CONFIG_H
#define FATHOM_FUZZ_MODEL_CONFIG_H
#include <sys/stat.h>

#include "fuzz_util.h"
#include "serve/model_config.h"

static inline void fuzz_model_config_file(const uint8_t *data, size_t size, const char *file, const char *tag) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/fathom_fuzz_%ld_%s", fuzz_dir(), (long)getpid(), tag);
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    fm_model_config c;
    if (fm_model_config_load(&c, dir, "fuzz") == FM_OK) {
        json_t *j = fm_model_config_json(&c, "fathom_gpt");
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        free(s);
        json_decref(j);
    }
}
#endif
