/* Chrome trace files (src/observe/trace_summary.c). */
#include "fathom/observe.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_trace_summary s;
    if (fm_trace_summarize(fuzz_file(data, size, ".json"), 0, &s) == FM_OK) fm_trace_summary_free(&s);
    fm_clear_error();
    return 0;
}
