/* A GPT to run from a directory, for the commands that take one (generate, eval): a
 * graph directory (`fathom compile`, `fathom quantize`) with its tokenizer.txt, a
 * Hugging Face layout, or a `fathom train` GPT directory. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "gpt_dir.h"
#include "fathom/hf.h"
#include "fathom/onnx.h"

/* a graph meta value that must be a whole number in [1, INT_MAX] */
static bool meta_whole(const char *v, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < 1 || x > INT_MAX) return false;
    *out = x;
    return true;
}

fm_status fm_cli_gpt_open(const char *dir, fm_graph *loaded, fm_cli_gpt *out) {
    out->m = NULL;
    out->g = NULL;
    out->tok = NULL;
    out->ctx_len = out->vocab = 0;
    out->dev = FM_CPU;
    if (!loaded && !fm_graph_dir_is_graph(dir)) {
        out->m = fm_hf_is_model_dir(dir) ? fm_hf_gpt_load(dir, &out->tok) : fm_gpt_load_dir(dir, &out->tok);
        if (!out->m) return fm_last_status();
        out->ctx_len = fm_gpt_get_config(out->m)->block_size;
        out->vocab = fm_gpt_get_config(out->m)->vocab_size;
        return FM_OK;
    }
    fm_graph *g = loaded ? loaded : fm_graph_load(dir);
    const char *bs = g ? fm_graph_get_meta(g, "block_size") : NULL, *vs = g ? fm_graph_get_meta(g, "vocab_size") : NULL;
    long long block = 0, vocab = 0;
    fm_tokenizer *tok = NULL;
    if (g && !bs) fm_set_error(FM_ERR_INVALID, "%s: this graph is not a GPT graph (no block_size in its meta)", dir);
    /* the meta is a file header: whole numbers in range, or the graph is refused (atoi made 'x' a context of 0) */
    else if (g && (!meta_whole(bs, &block) || !meta_whole(vs ? vs : "", &vocab)))
        fm_set_error(FM_ERR_FORMAT, "%s/graph.json: meta block_size '%s' and vocab_size '%s' must be whole numbers in [1, %d]",
                     dir, bs, vs ? vs : "(missing)", INT_MAX);
    else if (bs) tok = fm_hf_tokenizer_load(dir, (int)vocab); /* tokenizer.txt, or a Hugging Face model's files */
    if (!tok) { fm_status st = fm_last_status(); fm_graph_free(g); return st ? st : FM_ERR_INVALID; }
    out->g = g;
    out->tok = tok;
    out->ctx_len = (int)block;
    out->vocab = (int)vocab;
    return FM_OK;
}

fm_graph *fm_cli_graph_from_dir(const char *dir) {
    if (fm_cli_is_onnx(dir)) { /* an ONNX file, imported as `fathom import` does */
        fm_onnx_model *m = fm_onnx_load(dir);
        fm_graph *g = m ? fm_onnx_to_graph(m) : NULL;
        fm_onnx_free(m);
        return g;
    }
    if (fm_graph_dir_is_graph(dir) || !fm_hf_is_model_dir(dir)) return fm_graph_from_model_dir(dir);
    fm_gpt *m = fm_hf_gpt_load(dir, NULL);
    fm_graph *g = m ? fm_graph_from_gpt(m) : NULL;
    fm_gpt_free(m);
    const char *const *files = g ? fm_hf_tokenizer_files(dir) : NULL;
    for (int i = 0; files && files[i] && g; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (fm_graph_attach_file(g, files[i], p)) {
            fm_graph_free(g);
            g = NULL;
        }
    }
    /* and the files serving reads beside them: generation_config.json (the end-of-sequence
     * ids text generation stops at) and the chat template's (fm_chat_jinja_load) */
    const char *more[] = {"generation_config.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json"};
    for (int i = 0; i < 4 && g; i++) {
        char p[4096];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, more[i]);
        if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode) && fm_graph_attach_file(g, more[i], p)) {
            fm_graph_free(g);
            g = NULL;
        }
    }
    return g;
}

fm_status fm_cli_gpt_to(fm_cli_gpt *p, fm_device dev) {
    fm_status st = p->g ? fm_graph_to_device(p->g, dev) : fm_gpt_to(p->m, dev);
    if (st == FM_OK) p->dev = dev;
    return st;
}

fm_tensor *fm_cli_gpt_logits(fm_cli_gpt *p, fm_tensor *tokens) {
    if (p->g) return fm_graph_gpt_forward(p->g, tokens);
    /* the model's forward wants its ids where its weights are (a graph copies its inputs itself) */
    if (fm_device_eq(tokens->storage->device, p->dev)) return fm_gpt_forward(p->m, tokens, NULL, NULL);
    fm_tensor *td = fm_tensor_to(tokens, p->dev), *l = td ? fm_gpt_forward(p->m, td, NULL, NULL) : NULL;
    fm_tensor_release(td);
    return l;
}

void fm_cli_gpt_close(fm_cli_gpt *p) {
    fm_tokenizer_free(p->tok);
    fm_gpt_free(p->m);
    fm_graph_free(p->g);
    p->tok = NULL;
    p->m = NULL;
    p->g = NULL;
}
