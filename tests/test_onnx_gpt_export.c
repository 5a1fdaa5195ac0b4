/* The GPT's KV-cache graph (fm_graph_from_gpt) exported as ONNX: tokens and
 * past_key.<i>/past_value.<i> in, logits and present_key.<i>/present_value.<i> out,
 * with dynamic batch, seq and past. For a GPT-2 (biases, tied head), a Llama
 * (grouped-query attention, RoPE, SwiGLU, untied head) and a Llama with q/k/v
 * biases (Qwen2's model, tied head) with random weights (the q/k/v biases random
 * too, not the zeros fm_gpt_new gives them):
 *   0. the graph's logits over the prompt are the model's own (fm_gpt_forward)
 *      within 1e-5 relative;
 *   1. the file, reloaded by fathom's ONNX loader, gives the graph's logits and
 *      presents over a 5-token prompt and 3 decode steps (each step fed the
 *      previous step's presents) within 1e-5 relative;
 *   2. ONNX Runtime runs the same steps on its own presents and its logits match
 *      the graph's within 1e-5 relative, and onnx.checker accepts the file
 *      (tests/onnx_gpt_ort_check.py; that part is skipped, 77, with the reason,
 *      when onnx or onnxruntime is missing);
 *   3. the file imported back as a graph (fm_onnx_to_graph, batch, seq and past
 *      still dynamic: the position slice ends at past+seq, the causal mask's ranges
 *      follow the present cache) gives the same logits and presents over the same
 *      steps, on its own presents, within 1e-5 relative; and so does that graph
 *      compiled. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fathom/data.h"
#include "fathom/gpt.h"
#include "fathom/graph.h"
#include "fathom/onnx.h"
#include "hf_util.h"
#include "test_util.h"

#define STEPS 4 /* the prompt, then 3 decode steps */

static double rel_diff(const fm_tensor *a, const fm_tensor *b) {
    if (!a || !b || a->ndim != b->ndim || memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim)) return INFINITY;
    double m = 0, scale = 1e-12;
    for (int64_t i = 0; i < fm_tensor_numel(b); i++) scale = fmax(scale, fabs(fm_tensor_get(b, i)));
    for (int64_t i = 0; i < fm_tensor_numel(b); i++) {
        double d = fabs(fm_tensor_get(a, i) - fm_tensor_get(b, i));
        if (!(d <= m)) m = d;
    }
    return m / scale;
}

static const char *const *io_names(const fm_graph *g, bool inputs, int n) {
    static const char *names[2][64];
    for (int i = 0; i < n && i < 64; i++) {
        fm_graph_io io;
        if (inputs ? fm_graph_input_info(g, i, &io) : fm_graph_output_info(g, i, &io)) return NULL;
        names[inputs][i] = io.name;
    }
    return names[inputs];
}

/* Runs the prompt and the decode steps on the graph and on the exported file
 * (fathom's loader), comparing; writes each step's tokens and the graph's logits
 * to dir for the ONNX Runtime check. */
static void run_steps(fm_gpt *m, fm_graph *g, fm_onnx_model *om, const fm_gpt_config *c, const char *dir,
                      const char *tag) {
    const int n_io = 1 + 2 * c->n_layer, KV = c->n_kv_head ? c->n_kv_head : c->n_head, D = fm_gpt_head_dim(c);
    fm_tensor *gin[64] = {0}, *oin[64] = {0}, *gout[64] = {0}, *oout[64] = {0}, *iin[2][64] = {{0}}, *iout[2][64] = {{0}};
    fm_graph *ig[2] = {fm_onnx_to_graph(om), NULL}; /* the file as a graph; then compiled */
    CHECK_MSG(ig[0] != NULL, "%s: the exported file as a graph: %s", tag, fm_last_error());
    fm_compile_report rep;
    ig[1] = ig[0] ? fm_graph_compile(ig[0], &rep) : NULL;
    CHECK_MSG(!ig[0] || ig[1], "%s: the imported graph compiled: %s", tag, fm_last_error());
    double worst_import = 0;
    const char *const *in_names = io_names(g, true, n_io);
    CHECK(in_names != NULL && fm_onnx_input_count(om) == n_io && fm_onnx_output_count(om) == n_io);
    if (!in_names) return;
    for (int i = 1; i < n_io; i++) {
        gin[i] = fm_tensor_zeros(4, (int64_t[]){1, KV, 0, D}, FM_F32, FM_CPU);
        oin[i] = fm_tensor_retain(gin[i]);
        iin[0][i] = fm_tensor_retain(gin[i]), iin[1][i] = fm_tensor_retain(gin[i]);
    }
    double worst_logits = 0, worst_cache = 0;
    for (int s = 0; s < STEPS; s++) {
        int64_t T = s == 0 ? 5 : 1, ids[5];
        for (int i = 0; i < T; i++) ids[i] = (11 * s + 7 * i + 3) % c->vocab_size;
        fm_tensor *tok = fm_tensor_from_data(ids, 2, (int64_t[]){1, T}, FM_I64);
        fm_tensor_release(gin[0]);
        fm_tensor_release(oin[0]);
        gin[0] = fm_tensor_retain(tok), oin[0] = tok;
        fm_status gs = fm_graph_run(g, gin, gout), os = fm_onnx_run(om, n_io, in_names, oin, oout);
        CHECK_MSG(gs == FM_OK && os == FM_OK, "%s step %d: %s", tag, s, fm_last_error());
        if (gs || os) break;
        for (int k = 0; k < 2 && ig[k]; k++) { /* the imported graph on its own presents */
            fm_tensor_release(iin[k][0]);
            iin[k][0] = fm_tensor_retain(tok);
            fm_status is = fm_graph_run(ig[k], iin[k], iout[k]);
            CHECK_MSG(is == FM_OK, "%s step %d, imported graph%s: %s", tag, s, k ? " compiled" : "", fm_last_error());
            for (int i = 0; i < n_io; i++) {
                worst_import = fmax(worst_import, is == FM_OK ? rel_diff(iout[k][i], gout[i]) : INFINITY);
                if (i) fm_tensor_release(iin[k][i]), iin[k][i] = is == FM_OK ? iout[k][i] : NULL;
                else fm_tensor_release(iout[k][i]);
                iout[k][i] = NULL;
            }
        }
        worst_logits = fmax(worst_logits, rel_diff(oout[0], gout[0]));
        if (s == 0) { /* the graph against the model it was made from */
            fm_tensor *eager = fm_gpt_forward(m, tok, NULL, NULL);
            double d = rel_diff(gout[0], eager);
            printf("%s: the graph vs fm_gpt_forward over the prompt: logits %.3g (relative)\n", tag, d);
            CHECK_MSG(d <= 1e-5, "%s: the graph's logits differ from the model's by %.3g", tag, d);
            fm_tensor_release(eager);
        }
        for (int i = 1; i < n_io; i++) worst_cache = fmax(worst_cache, rel_diff(oout[i], gout[i]));
        char p[600];
        snprintf(p, sizeof p, "%s/%s_tokens_%d.npy", dir, tag, s);
        CHECK(fm_npy_write(p, tok) == FM_OK);
        snprintf(p, sizeof p, "%s/%s_logits_%d.npy", dir, tag, s);
        CHECK(fm_npy_write(p, gout[0]) == FM_OK);
        for (int i = 1; i < n_io; i++) { /* the presents are the next step's pasts */
            fm_tensor_release(gin[i]);
            fm_tensor_release(oin[i]);
            gin[i] = gout[i], oin[i] = oout[i], gout[i] = oout[i] = NULL;
        }
        fm_tensor_release(gout[0]);
        fm_tensor_release(oout[0]);
        gout[0] = oout[0] = NULL;
    }
    printf("%s: fathom's ONNX loader vs the graph over %d steps: logits %.3g, caches %.3g (relative)\n", tag, STEPS,
           worst_logits, worst_cache);
    CHECK_MSG(worst_logits <= 1e-5 && worst_cache <= 1e-5, "%s: exported file differs from the graph: %.3g / %.3g", tag,
              worst_logits, worst_cache);
    printf("%s: the file imported as a graph (and compiled) vs the graph over %d steps: %.3g (relative)\n", tag, STEPS,
           worst_import);
    CHECK_MSG(worst_import <= 1e-5, "%s: the imported graph differs from the graph: %.3g", tag, worst_import);
    for (int i = 0; i < n_io; i++) fm_tensor_release_n(4, gin[i], oin[i], iin[0][i], iin[1][i]);
    fm_graph_free(ig[0]);
    fm_graph_free(ig[1]);
}

/* compiled: the graph after fathom compile (attention_kv nodes, Llama's with their ropes inside) */
static void one_model(fm_gpt_config c, const char *dir, const char *tag, bool compiled) {
    fm_rng r;
    fm_rng_init(&r, 42);
    fm_gpt *m = fm_gpt_new(&c, &r);
    CHECK_MSG(m != NULL, "%s: %s", tag, fm_last_error());
    for (int i = 0; m && i < fm_gpt_parameters(m)->n; i++)
        if (strstr(fm_gpt_parameters(m)->items[i].name, ".attn.qkv.bias"))
            CHECK(fm_tensor_normal_(fm_gpt_parameters(m)->items[i].tensor, 0.0, 0.5, &r) == FM_OK);
    fm_graph *g = m ? fm_graph_from_gpt(m) : NULL;
    CHECK_MSG(g != NULL, "%s: %s", tag, fm_last_error());
    if (g && compiled) {
        fm_compile_report rep;
        fm_graph *cg = fm_graph_compile(g, &rep);
        CHECK_MSG(cg != NULL, "%s: compile: %s", tag, fm_last_error());
        fm_graph_free(g);
        g = cg;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/%s.onnx", dir, tag);
    fm_status st = g ? fm_graph_export_onnx(g, path) : FM_ERR_INVALID;
    CHECK_MSG(st == FM_OK, "%s: export: %s", tag, fm_last_error());
    fm_onnx_model *om = st == FM_OK ? fm_onnx_load(path) : NULL;
    CHECK_MSG(om != NULL, "%s: reload: %s", tag, fm_last_error());
    if (om) run_steps(m, g, om, &c, dir, tag);
    fm_onnx_free(om);
    fm_graph_free(g);
    fm_gpt_free(m);
}

int main(void) {
    char dir[] = "/tmp/fathom_onnx_gpt.XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 2; }
    fm_gpt_config a = fm_gpt_config_default(FM_GPT_GPT2);
    a.n_layer = 2, a.n_head = 4, a.n_kv_head = 4, a.n_embd = 32, a.block_size = 32, a.vocab_size = 61, a.ffn_hidden = 128;
    a.dropout = 0, a.bias = true;
    one_model(a, dir, "gpt2", false);
    one_model(a, dir, "gpt2_compiled", true);
    fm_gpt_config b = fm_gpt_config_default(FM_GPT_LLAMA);
    b.n_layer = 2, b.n_head = 4, b.n_kv_head = 2, b.n_embd = 32, b.block_size = 32, b.vocab_size = 61, b.ffn_hidden = 96;
    b.dropout = 0, b.untied_head = true, b.rope_theta = 500000;
    one_model(b, dir, "llama", false);
    one_model(b, dir, "llama_compiled", true);
    fm_gpt_config q = b;
    q.qkv_bias = true, q.untied_head = false, q.n_kv_head = 1, q.rope_theta = 1e6;
    one_model(q, dir, "qwen2", false);
    /* heads that do not tile n_embd (a head-pruned GPT-2: 3 heads of 8 over 32) */
    fm_gpt_config h = a;
    h.n_head = 3, h.n_kv_head = 3, h.head_dim = 8;
    one_model(h, dir, "gpt2_head_dim", false);
    char cmd[1024], why[2048];
    snprintf(cmd, sizeof cmd, "%s tests/onnx_gpt_ort_check.py '%s' %d gpt2 gpt2_compiled llama llama_compiled qwen2 gpt2_head_dim 2>&1", hf_python(), dir, STEPS);
    FILE *f = popen(cmd, "r");
    size_t o = 0;
    why[0] = 0;
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        fputs(line, stdout);
        size_t l = strlen(line);
        if (o + l < sizeof why) memcpy(why + o, line, l + 1), o += l;
    }
    int rc = f ? pclose(f) : -1, code = rc >= 0 && WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
    if (code == 77 || code == 127) TEST_SKIP("the ONNX Runtime check: %s", code == 127 ? "no python" : why);
    else CHECK_MSG(code == 0, "tests/onnx_gpt_ort_check.py failed (exit %d)", code);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    TEST_DONE();
}
