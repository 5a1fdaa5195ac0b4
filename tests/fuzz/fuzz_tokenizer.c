/* Tokenizer files (src/tokenizer/tokenizer.c), then a round trip through the
 * loaded tokenizer. */
#include "fathom/tokenizer.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_tokenizer *t = fm_tokenizer_load(fuzz_file(data, size, ".tok"));
    if (t) {
        int32_t *ids = NULL;
        int64_t n = 0;
        if (fm_tokenizer_encode(t, "in the beginning", 16, &ids, &n) == FM_OK) free(ids);
        fm_tokenizer_free(t);
    }
    fm_clear_error();
    return 0;
}
