/* Hugging Face config.json (src/hf/hf_config.c): the GPT-2 / Llama / Qwen2 reader, then
 * the BERT one, on the same bytes. */
#include "fathom/hf.h"
#include "fuzz_util.h"
#include "hf/hf_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_gpt_config c;
    if (fm_hf_gpt_config_parse((const char *)data, size, "fuzz", &c) == FM_OK && fm_gpt_config_validate(&c))
        __builtin_trap(); /* a parsed config must be one the model accepts */
    hf_cfg r;
    hf_bert_config b;
    if (hf_cfg_open(&r, (const char *)data, size, "fuzz") == FM_OK) (void)hf_bert_config_parse(&r, &b);
    json_decref(r.j);
    fm_clear_error();
    return 0;
}
