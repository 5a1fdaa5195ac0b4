/* GPT config.json files (src/gpt), and the same JSON as a graph's gpt_config
 * metadata string (gpt_config_parse, what text generation from a graph reads). */
#include <stdlib.h>
#include <string.h>

#include "fathom/gpt.h"
#include "fuzz_util.h"
#include "gpt/gpt_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_gpt_config c;
    (void)fm_gpt_config_load(fuzz_file(data, size, ".json"), &c);
    fm_clear_error();
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    if (gpt_config_parse(s, "<fuzz>", &c) == FM_OK) { /* what parses validates, and writes back to JSON that parses the same */
        char *j = gpt_config_json(&c, false);
        fm_gpt_config c2;
        if (!j || gpt_config_parse(j, "<fuzz>", &c2) != FM_OK || c2.n_layer != c.n_layer || c2.block_size != c.block_size) abort();
        free(j);
    }
    fm_clear_error();
    free(s);
    return 0;
}
