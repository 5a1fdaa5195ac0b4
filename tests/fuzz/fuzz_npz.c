/* .npz archives: zip directory, stored and deflated members (src/data/npz.c). */
#include "fathom/data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_npz *z = fm_npz_open_mem(data, size, "fuzz.npz");
    for (int i = 0; z && i < fm_npz_count(z) && i < 8; i++) {
        fm_tensor *t = fm_npz_get(z, fm_npz_name(z, i));
        fm_tensor_release(t);
    }
    fm_npz_close(z);
    fm_clear_error();
    return 0;
}
