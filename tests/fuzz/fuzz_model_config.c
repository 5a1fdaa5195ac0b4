/* A served model's config.json (src/serve/model_config.c: Triton's fields, the
 * dynamic batcher, instance groups, version policies, text generation with its KV
 * cache's blocks and dtype and a chat template, the platform). A config that is
 * accepted is written back as the server's /v2/models/NAME/config reply, so what
 * the parser lets through goes through the writer too. The repository belongs
 * to whoever runs the server, but a config that crashes it must not: it is read
 * in poll mode while the server is serving. */
#include <sys/stat.h>

#include "fuzz_util.h"
#include "serve/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/fathom_fuzz_%ld_mc", fuzz_dir(), (long)getpid());
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/config.json", dir);
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
    return 0;
}
