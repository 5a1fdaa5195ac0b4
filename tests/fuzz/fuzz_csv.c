/* CSV tables, with and without a label column (src/data/csv.c). */
#include "fathom/data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_csv_options o;
    fm_csv_options_init(&o);
    fm_tensor *x = NULL, *y = NULL;
    if (fm_csv_read_mem((const char *)data, size, "fuzz.csv", &o, &x, &y) == FM_OK) fm_tensor_release_n(2, x, y);
    fm_clear_error();
    return 0;
}
