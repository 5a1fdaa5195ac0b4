/* Chat templates (src/serve/jinja.h): any bytes as a template, parsed and, when that
 * succeeds, rendered over a fixed conversation. Checked: a refusal says why, a
 * rendering stays within the output limit and its length is what it says; nothing
 * else may happen (no crash, leak, hang or undefined behaviour: loops, ranges,
 * nesting and output are bounded). */
#include <jansson.h>

#include "fuzz_util.h"
#include "serve/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *vars;
    if (!vars)
        vars = json_pack("{s:[{s:s,s:s},{s:s,s:s},{s:s,s:[{s:s,s:s}]}],s:b,s:s,s:s,s:{s:i,s:[i,i]}}", "messages", "role", "system",
                         "content", "Be brief.", "role", "user", "content", "Hi \xc3\xa9", "role", "assistant", "content", "type",
                         "text", "text", "Hello", "add_generation_prompt", 1, "bos_token", "<s>", "eos_token", "</s>", "d", "k",
                         1, "xs", 1, 2);
    if (!vars) abort();
    char err[512] = "";
    fm_jinja *t = fm_jinja_parse((const char *)data, size, err, sizeof err);
    if (!t) {
        if (!err[0]) abort();
        return 0;
    }
    size_t n = 0;
    err[0] = 0;
    char *out = fm_jinja_render(t, vars, &n, err, sizeof err);
    if (!out && !err[0]) abort();
    if (out && (n > (4u << 20) || out[n])) abort();
    free(out);
    fm_jinja_free(t);
    return 0;
}
