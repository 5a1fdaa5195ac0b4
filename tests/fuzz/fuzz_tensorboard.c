/* TensorBoard event files (src/observe/tensorboard.c reader). */
#include "fathom/observe.h"
#include "fuzz_util.h"

static void on_value(void *ctx, const char *tag, int64_t step, double wall_time, double value, const fm_tb_histo *h) {
    (void)ctx; (void)tag; (void)step; (void)wall_time; (void)value; (void)h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int64_t n = 0;
    (void)fm_tb_read_file(fuzz_file(data, size, ".tfevents"), on_value, NULL, &n);
    fm_clear_error();
    return 0;
}
