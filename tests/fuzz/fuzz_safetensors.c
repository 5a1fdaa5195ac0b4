/* safetensors headers and data spans (src/io/safetensors.c). */
#include "fathom/io.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = fuzz_file(data, size, ".safetensors");
    fm_named_list l;
    fm_kv_list meta = {0};
    if (fm_safetensors_load(p, &l, &meta) == FM_OK) fm_named_list_free(&l);
    fm_kv_free(&meta);
    fm_clear_error();
    return 0;
}
