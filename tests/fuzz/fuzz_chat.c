/* Chat completions' message rendering and template config (src/serve/chat_template.c):
 * the first byte picks the case. 'm': the rest is a request body, whose "messages"
 * are rendered with the default template; otherwise the rest is a config.json
 * "chat_template" object, which (when it parses) renders a fixed conversation. The
 * rendered prompt must hold every piece of text it was built from. */
#include <jansson.h>

#include "fuzz_util.h"
#include "serve/chat_template.h"

static void render(const fm_chat_template *t, const json_t *messages) {
    char err[512];
    size_t n = 0;
    char *p = fm_chat_render(t, messages, &n, err, sizeof err);
    if (!p) {
        if (!err[0]) abort(); /* a refusal always says why */
        return;
    }
    if (p[n] != 0 || n < strlen(t->generation)) abort();
    if (memcmp(p + n - strlen(t->generation), t->generation, strlen(t->generation))) abort();
    free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    json_error_t je;
    json_t *j = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES, &je);
    if (!j) return 0;
    fm_chat_template t;
    fm_chat_template_default(&t);
    if (data[0] == 'm') {
        render(&t, json_object_get(j, "messages"));
    } else if (fm_chat_template_parse(&t, j, "fuzz") == FM_OK) {
        json_t *conv = json_pack("[{s:s,s:s},{s:s,s:s},{s:s,s:[{s:s,s:s}]}]", "role", "system", "content", "be brief",
                                 "role", "user", "content", "hi", "role", "assistant", "content", "type", "text", "text", "hello");
        render(&t, conv);
        json_t *back = fm_chat_template_json(&t);
        if (!back) abort();
        json_decref(back);
        json_decref(conv);
    }
    json_decref(j);
    return 0;
}
