/* GPT config.json files (src/gpt). */
#include "fathom/gpt.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_gpt_config c;
    (void)fm_gpt_config_load(fuzz_file(data, size, ".json"), &c);
    fm_clear_error();
    return 0;
}
