/* Plain recipes (src/recipe/recipe.c) and GPT recipes (src/gpt/gpt_recipe.c);
 * only parsed: building a parsed model may legitimately ask for any size. */
#include "fathom/gpt.h"
#include "fathom/recipe.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    fm_recipe r;
    if (fm_recipe_parse(text, "fuzz.ini", &r) == FM_OK) {
        (void)fm_recipe_token_vocab(&r); /* the first layer's table size, read back from its text */
        fm_recipe_free(&r);
    }
    fm_clear_error();
    free(text);
    fm_gpt_recipe g;
    if (fm_gpt_recipe_load(fuzz_file(data, size, ".ini"), &g) == FM_OK) fm_gpt_recipe_free(&g);
    fm_clear_error();
    return 0;
}
