/* IDX (MNIST) files (src/data/idx.c). */
#include "fathom/data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_tensor *t = fm_idx_read_mem(data, size, "fuzz.idx");
    fm_tensor_release(t);
    fm_clear_error();
    return 0;
}
