/* PNG images (src/data/png.c, through libpng): whatever the bytes, fm_png_read
 * returns a tensor or NULL with an error set, and leaks nothing. */
#include "fathom/data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_tensor *t = fm_png_read(fuzz_file(data, size, ".png"));
    fm_tensor_release(t);
    fm_clear_error();
    return 0;
}
