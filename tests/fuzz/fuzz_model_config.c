/* A served model's config.json (src/serve/model_config.c: Triton's fields, the
 * dynamic batcher, instance groups, version policies, text generation with its KV
 * cache's blocks and dtype and a chat template, the platform). A config that is
 * accepted is written back as the server's /v2/models/NAME/config reply, so what
 * the parser lets through goes through the writer too. The repository belongs
 * to whoever runs the server, but a config that crashes it must not: it is read
 * in poll mode while the server is serving. */
#include "model_config_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_model_config_file(data, size, "config.json", "mc");
    return 0;
}
