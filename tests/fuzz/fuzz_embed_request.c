/* The body of an OpenAI embeddings request (src/serve/openai_embed.c): any bytes
 * are parsed; an accepted request's texts (bounded) are replied to with made-up
 * vectors in both encodings, so the reply writer and its base64 run on what the
 * parser lets through. */
#include "fuzz_util.h"
#include "serve/openai_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_openai_embed_req r;
    char err[512];
    if (fm_openai_embed_parse((const char *)data, size, &r, err, sizeof err) == 0) {
        int n = r.n < 64 ? r.n : 64, dim = 1 + (int)(size % 7);
        float *v = malloc(sizeof(float) * (size_t)n * (size_t)dim);
        for (int i = 0; v && i < n * dim; i++) v[i] = (float)i * 0.25f - (float)strlen(r.texts[i / dim]);
        for (int b = 0; v && b < 2; b++) {
            json_t *j = fm_openai_embed_reply(r.model, v, n, dim, b, (int64_t)size);
            char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
            free(s);
            json_decref(j);
        }
        free(v);
        fm_openai_embed_req_free(&r);
    }
    return 0;
}
