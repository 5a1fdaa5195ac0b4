/* A served model's config.pbtxt: Triton's protobuf text (src/serve/pbtxt.c) read
 * into the JSON form, then through the same config reader and writer as
 * fuzz_model_config.c's config.json. The reader is hand-written (pbtxt.h says why):
 * no input may crash it or run its stack out. */
#include <sys/stat.h>

#include "fuzz_util.h"
#include "serve/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/fathom_fuzz_%ld_pb", fuzz_dir(), (long)getpid());
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/config.pbtxt", dir);
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
