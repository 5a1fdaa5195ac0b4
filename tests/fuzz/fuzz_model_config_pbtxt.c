/* A served model's config.pbtxt: Triton's protobuf text (src/serve/pbtxt.c) read
 * into the JSON form, then through the same config reader and writer as
 * fuzz_model_config.c's config.json. The reader is hand-written (pbtxt.h says why):
 * no input may crash it or run its stack out. */
#include "model_config_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_model_config_file(data, size, "config.pbtxt", "pb");
    return 0;
}
