/* Token files (tokens.bin, src/gpt/gpt_io.c). */
#include "fathom/gpt.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_token_data d;
    if (fm_token_file_read(fuzz_file(data, size, ".bin"), 0, &d) == FM_OK) fm_token_data_free(&d);
    fm_clear_error();
    return 0;
}
