/* The in-place KV cache of a graph decode loop (fm_graph_run_options.kv_append,
 * src/graph/graph_ops_attn.c): the same logits and caches as concatenating, step
 * after step, on the GPT-2 graph (cat nodes), its compiled form (attention_kv)
 * and the Llama graph (RoPE, grouped-query); appends really in place when the
 * past is the only holder of its cache (the present shares its storage), and
 * never changes a tensor a caller still holds: a second run from the same past
 * (a branch), a past shared by another view, borrowed memory and a full cache
 * all take a new cache. And attention on row-strided K/V (the dispatcher no
 * longer copies them for the CPU kernel) gives the contiguous bits. The f16 caches
 * (kv_dtype FM_F16) follow the f32 ones within their rounding (kv16_loop). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/fathom.h"
#include "fathom/gpt.h"
#include "fathom/graph.h"
#include "fathom/memory.h"
#include "tensor_compare.h"
#include "test_util.h"

static fm_tensor *randn(int ndim, const int64_t *shape, uint64_t seed) {
    fm_rng r;
    fm_rng_init(&r, seed);
    return fm_tensor_randn(ndim, shape, FM_F32, &r);
}


static fm_graph *gpt_graph(bool llama, fm_gpt **out_m) {
    fm_gpt_config c = fm_gpt_config_default(llama ? FM_GPT_LLAMA : FM_GPT_GPT2);
    c.n_layer = 2, c.n_head = 4, c.n_kv_head = llama ? 2 : 4, c.n_embd = 32, c.ffn_hidden = llama ? 48 : 128;
    c.block_size = 40, c.vocab_size = 50, c.dropout = 0;
    fm_rng r;
    fm_rng_init(&r, 11);
    fm_gpt *m = fm_gpt_new(&c, &r);
    fm_graph *g = m ? fm_graph_from_gpt(m) : NULL;
    CHECK_MSG(g != NULL, "%s", fm_last_error());
    *out_m = m;
    return g;
}

/* inputs: tokens [1, T] (ids from seed) and empty pasts */
static fm_tensor **first_inputs(const fm_graph *g, int64_t T, int seed) {
    int n = fm_graph_num_inputs(g);
    fm_tensor **in = calloc((size_t)n, sizeof *in);
    int64_t ids[16];
    for (int64_t i = 0; i < T; i++) ids[i] = (seed * 7 + i * 3) % 50;
    in[0] = fm_tensor_from_data(ids, 2, (int64_t[]){1, T}, FM_I64);
    for (int i = 1; i < n; i++) {
        fm_graph_io io;
        fm_graph_input_info(g, i, &io);
        in[i] = fm_tensor_zeros(4, (int64_t[]){1, io.shape[1], 0, io.shape[3]}, FM_F32, FM_CPU);
    }
    return in;
}

static void release_all(fm_tensor **t, int n) {
    for (int i = 0; i < n; i++) { fm_tensor_release(t[i]); t[i] = NULL; }
}

/* Both loops' next inputs: step s's token, and each run's presents as its pasts */
static void next_step(fm_tensor **ia, fm_tensor **ib, fm_tensor **oa, fm_tensor **ob, int n, int s) {
    int64_t tok = (s * 13 + 1) % 50;
    for (int k = 0; k < n; k++) {
        fm_tensor_release(ia[k]);
        fm_tensor_release(ib[k]);
        ia[k] = k ? oa[k] : fm_tensor_from_data(&tok, 2, (int64_t[]){1, 1}, FM_I64);
        ib[k] = k ? ob[k] : fm_tensor_from_data(&tok, 2, (int64_t[]){1, 1}, FM_I64);
        if (!k) { fm_tensor_release(oa[0]); fm_tensor_release(ob[0]); }
        oa[k] = ob[k] = NULL;
    }
}

/* A decode loop of `steps` steps, concatenating (a) and in place (b), side by
 * side: every step's logits and presents the same bits; from the second step on
 * every present of b shares its past's storage (appended in place). */
static void loop_matches(const fm_graph *g, const char *what, int64_t capacity) {
    const int n = fm_graph_num_inputs(g);
    fm_tensor **ia = first_inputs(g, 5, 1), **ib = first_inputs(g, 5, 1), *oa[16] = {0}, *ob[16] = {0};
    const fm_graph_run_options opt = {.kv_append = true, .kv_capacity = capacity};
    int in_place = 0, checked = 0;
    for (int s = 0; s < 12; s++) {
        fm_status sa = fm_graph_run(g, ia, oa), sb = fm_graph_run_ex(g, ib, ob, &opt);
        CHECK_MSG(sa == FM_OK && sb == FM_OK, "%s step %d: %s", what, s, fm_last_error());
        if (sa || sb) break;
        for (int k = 0; k < n; k++) CHECK_MSG(t_same_bits(oa[k], ob[k]), "%s step %d output %d differs", what, s, k);
        for (int k = 1; s > 0 && k < n; k++, checked++) in_place += ob[k]->storage == ib[k]->storage;
        next_step(ia, ib, oa, ob, n, s);
    }
    /* with room for the whole loop every step after the first appends in place;
     * with the default growth (twice the length, at least 64) too at this length */
    CHECK_MSG(checked > 0 && in_place == checked, "%s: %d of %d presents appended in place", what, in_place, checked);
    release_all(ia, n);
    release_all(ib, n);
    free(ia);
    free(ib);
}

/* The refusals: each case's present must be right (equal to the concatenating
 * run's) and must not share the past's storage, and every tensor held before
 * keeps its bits. */
static void never_changes_held_tensors(const fm_graph *g) {
    const int n = fm_graph_num_inputs(g);
    const fm_graph_run_options opt = {.kv_append = true, .kv_capacity = 32};
    fm_tensor **in = first_inputs(g, 4, 2), *p[16] = {0}, *a[16] = {0}, *b[16] = {0}, *ref[16] = {0};
    CHECK(fm_graph_run_ex(g, in, p, &opt) == FM_OK); /* the prompt: presents with room for 32 */
    int64_t t1 = 3, t2 = 8;
    fm_tensor *tok1 = fm_tensor_from_data(&t1, 2, (int64_t[]){1, 1}, FM_I64), *tok2 = fm_tensor_from_data(&t2, 2, (int64_t[]){1, 1}, FM_I64);
    fm_tensor_release(p[0]);
    p[0] = tok1;
    /* step A from p: in place (p's caches are held by p alone) */
    CHECK(fm_graph_run_ex(g, p, a, &opt) == FM_OK);
    for (int k = 1; k < n; k++) CHECK_MSG(a[k] && a[k]->storage == p[k]->storage, "step A output %d not in place", k);
    fm_tensor *a_copy[16] = {0};
    for (int k = 0; k < n; k++) a_copy[k] = fm_clone(a[k]);
    /* step B from the same p, another token, while A is held: a branch. p's caches
     * are now shared with A's presents, so B must take new caches, and A keep its bits. */
    p[0] = tok2;
    CHECK(fm_graph_run_ex(g, p, b, &opt) == FM_OK);
    CHECK(fm_graph_run(g, p, ref) == FM_OK);
    for (int k = 0; k < n; k++) {
        CHECK_MSG(t_same_bits(b[k], ref[k]), "branch B output %d differs from concatenating", k);
        CHECK_MSG(t_same_bits(a[k], a_copy[k]), "branch B changed A's output %d", k);
        if (k) CHECK_MSG(b[k]->storage != p[k]->storage, "branch B output %d wrote into a shared cache", k);
    }
    release_all(b, n);
    release_all(ref, n);
    /* once A is gone, p holds its caches alone again: in place, and the same values */
    release_all(a, n);
    CHECK(fm_graph_run_ex(g, p, b, &opt) == FM_OK);
    CHECK(fm_graph_run(g, p, ref) == FM_OK);
    for (int k = 0; k < n; k++) {
        CHECK_MSG(t_same_bits(b[k], ref[k]), "after the branch output %d differs", k);
        if (k) CHECK_MSG(b[k]->storage == p[k]->storage, "after the branch output %d not in place", k);
    }
    release_all(b, n);
    release_all(ref, n);
    release_all(a_copy, n);

    /* a full cache (capacity 32 from the prompt): a past of 32 rows grows into a new one */
    fm_graph_io io;
    fm_graph_input_info(g, 1, &io);
    const int64_t KV = io.shape[1], D = io.shape[3];
    fm_tensor *full[16] = {0};
    full[0] = fm_tensor_retain(tok1);
    for (int k = 1; k < n; k++) {
        fm_tensor *cache = randn(4, (int64_t[]){1, KV, 32, D}, 40 + (uint64_t)k);
        full[k] = fm_narrow(cache, 2, 0, 32);
        fm_tensor_release(cache);
    }
    CHECK(fm_graph_run_ex(g, full, b, &opt) == FM_OK);
    CHECK(fm_graph_run(g, full, ref) == FM_OK);
    for (int k = 0; k < n; k++) {
        CHECK_MSG(t_same_bits(b[k], ref[k]), "full cache: output %d differs", k);
        if (k) CHECK_MSG(b[k] && b[k]->storage != full[k]->storage && b[k]->shape[2] == 33, "full cache: output %d", k);
    }
    release_all(b, n);
    release_all(ref, n);

    /* a past whose cache another view also holds: that view's rows must survive */
    fm_tensor *whole[16] = {0}, *before[16] = {0};
    for (int k = 1; k < n; k++) {
        whole[k] = randn(4, (int64_t[]){1, KV, 16, D}, 60 + (uint64_t)k);
        before[k] = fm_clone(whole[k]);
        fm_tensor_release(full[k]);
        full[k] = fm_narrow(whole[k], 2, 0, 6);
    }
    CHECK(fm_graph_run_ex(g, full, b, &opt) == FM_OK);
    CHECK(fm_graph_run(g, full, ref) == FM_OK);
    for (int k = 0; k < n; k++) {
        CHECK_MSG(t_same_bits(b[k], ref[k]), "shared cache: output %d differs", k);
        if (k) CHECK_MSG(t_same_bits(whole[k], before[k]) && b[k]->storage != whole[k]->storage, "shared cache %d was written", k);
    }
    release_all(b, n);
    release_all(ref, n);
    release_all(whole, n);
    release_all(before, n);

    /* borrowed memory (fm_tensor_from_buffer): never written, even with room and one holder */
    float *mem[16] = {0};
    const size_t per = (size_t)(KV * 16 * D);
    for (int k = 1; k < n; k++) {
        mem[k] = malloc(sizeof(float) * per);
        for (size_t i = 0; i < per; i++) mem[k][i] = (float)(i % 97) * 0.01f - 0.4f;
        fm_tensor *buf = fm_tensor_from_buffer(mem[k], 4, (int64_t[]){1, KV, 16, D}, FM_F32, NULL, NULL);
        fm_tensor_release(full[k]);
        full[k] = buf ? fm_narrow(buf, 2, 0, 6) : NULL;
        fm_tensor_release(buf);
    }
    CHECK(fm_graph_run_ex(g, full, b, &opt) == FM_OK);
    CHECK(fm_graph_run(g, full, ref) == FM_OK);
    for (int k = 0; k < n; k++) {
        CHECK_MSG(t_same_bits(b[k], ref[k]), "borrowed: output %d differs", k);
        if (!k) continue;
        bool untouched = true;
        for (size_t i = 0; i < per; i++) untouched &= mem[k][i] == (float)(i % 97) * 0.01f - 0.4f;
        CHECK_MSG(untouched && b[k]->storage != full[k]->storage, "borrowed memory %d was written", k);
    }
    release_all(b, n);
    release_all(ref, n);
    release_all(full, n);
    for (int k = 1; k < n; k++) free(mem[k]);

    /* a negative capacity is refused with the value named */
    const fm_graph_run_options bad = {.kv_append = true, .kv_capacity = -3};
    CHECK(fm_graph_run_ex(g, p, b, &bad) == FM_ERR_INVALID && strstr(fm_last_error(), "-3"));
    /* a capacity beyond the memory limit (1 GB of cache under a 256 MB limit; a limit, not
     * a failing malloc, so that the sanitizer build runs it too): an out-of-memory error
     * that names it, no output set */
    const fm_graph_run_options huge = {.kv_append = true, .kv_capacity = (int64_t)1 << 24};
    fm_tensor **in2 = first_inputs(g, 3, 4);
    CHECK(fm_memory_set_limit(FM_CPU, (size_t)256 << 20) == FM_OK);
    CHECK_MSG(fm_graph_run_ex(g, in2, b, &huge) == FM_ERR_OOM && strstr(fm_last_error(), "kv_capacity"), "%s", fm_last_error());
    CHECK(fm_memory_set_limit(FM_CPU, 0) == FM_OK);
    for (int k = 0; k < n; k++) CHECK(b[k] == NULL);
    release_all(in2, n);
    free(in2);
    fm_tensor_release(tok2);
    p[0] = NULL; /* tok1 and tok2 are released above */
    fm_tensor_release(tok1);
    release_all(p + 1, n - 1);
    release_all(in, n);
    free(in);
}

/* max |a - b| over max |a| */
static double rel_diff(const fm_tensor *a, const fm_tensor *b) {
    double d = 0, m = 0;
    const int64_t n = fm_tensor_numel(a);
    for (int64_t i = 0; i < n; i++) {
        const double x = fm_tensor_get(a, i), y = fm_tensor_get(b, i);
        d = fabs(x - y) > d ? fabs(x - y) : d;
        m = fabs(x) > m ? fabs(x) : m;
    }
    return m > 0 ? d / m : d;
}

/* f16 caches (kv_dtype FM_F16) on a compiled graph: the prompt's presents are the f32
 * run's rounded to f16 (the same bits), every step's presents are f16 and appended in
 * place, and the logits stay within the f16 rounding of k and v of the f32 caches'
 * (and differ from them: the halves were used). A past given in f32 is converted. The
 * refusals name what is wrong: another kv_dtype, f16 without kv_append, a graph with no
 * attention_kv nodes, and f16 pasts in a run that did not ask for them. */
static void kv16_loop(const fm_graph *c, const fm_graph *uncompiled, const char *what) {
    const int n = fm_graph_num_inputs(c);
    fm_tensor **ia = first_inputs(c, 5, 1), **ib = first_inputs(c, 5, 1), *oa[16] = {0}, *ob[16] = {0};
    const fm_graph_run_options opt = {.kv_append = true, .kv_capacity = 20, .kv_dtype = FM_F16};
    double worst = 0;
    int in_place = 0, checked = 0;
    for (int s = 0; s < 12; s++) {
        fm_status sa = fm_graph_run(c, ia, oa), sb = fm_graph_run_ex(c, ib, ob, &opt);
        CHECK_MSG(sa == FM_OK && sb == FM_OK, "%s f16 KV step %d: %s", what, s, fm_last_error());
        if (sa || sb) break;
        const double e = rel_diff(oa[0], ob[0]);
        worst = e > worst ? e : worst;
        for (int k = 1; k < n; k++) {
            CHECK_MSG(ob[k]->dtype == FM_F16 && ob[k]->shape[2] == oa[k]->shape[2], "%s step %d present %d: %s", what, s, k, fm_dtype_name(ob[k]->dtype));
            if (s == 0) {
                fm_tensor *r = fm_to_dtype(oa[k], FM_F16), *cb = fm_contiguous(ob[k]);
                CHECK_MSG(r && cb && t_same_bits(r, cb), "%s: the prompt's present %d is not the f32 one rounded to f16", what, k);
                fm_tensor_release_n(2, r, cb);
            } else {
                in_place += ob[k]->storage == ib[k]->storage;
                checked++;
            }
        }
        next_step(ia, ib, oa, ob, n, s);
    }
    fprintf(stderr, "%s: f16 KV cache, largest logit difference over 12 steps %.3g of the largest logit\n", what, worst);
    CHECK_MSG(worst > 0 && worst < 5e-3, "%s: f16 KV logits differ by %g of the largest logit", what, worst);
    CHECK_MSG(checked > 0 && in_place == checked, "%s f16 KV: %d of %d presents appended in place", what, in_place, checked);
    /* f32 pasts (ia: the f32 run's presents) into an f16 run: converted, f16 presents,
     * the logits within the same bound of the f32 run's */
    CHECK(fm_graph_run_ex(c, ia, ob, &opt) == FM_OK);
    CHECK(fm_graph_run(c, ia, oa) == FM_OK);
    CHECK_MSG(ob[1] && ob[1]->dtype == FM_F16 && oa[0] && ob[0] && rel_diff(oa[0], ob[0]) < 5e-3, "%s: f32 pasts into an f16 run", what);
    release_all(oa, n);
    release_all(ob, n);
    /* the refusals */
    fm_graph_run_options bad = opt;
    bad.kv_dtype = FM_BF16;
    CHECK(fm_graph_run_ex(c, ib, ob, &bad) == FM_ERR_INVALID && strstr(fm_last_error(), "bf16"));
    bad.kv_dtype = FM_F16;
    bad.kv_append = false;
    CHECK(fm_graph_run_ex(c, ib, ob, &bad) == FM_ERR_INVALID && strstr(fm_last_error(), "kv_append"));
    CHECK(fm_graph_run_ex(uncompiled, ib, ob, &opt) == FM_ERR_INVALID && strstr(fm_last_error(), "attention_kv"));
    CHECK_MSG(fm_graph_run(c, ib, ob) == FM_ERR_INVALID && strstr(fm_last_error(), "must be f32, got f16"), "%s", fm_last_error());
    for (int k = 0; k < n; k++) CHECK(ob[k] == NULL);
    release_all(ia, n);
    release_all(ib, n);
    free(ia);
    free(ib);
}

/* SDPA on K/V views with spare rows (what the in-place cache hands it): the
 * contiguous copies' bits, one query row (decode) and four, two batches, GQA. */
static void sdpa_row_strided(void) {
    const int64_t B = 2, H = 4, KV = 2, D = 24, cap = 40;
    for (int64_t Tq = 1; Tq <= 4; Tq += 3)
        for (int64_t Tk = 7; Tk <= 33; Tk += 26) {
            fm_tensor *q = randn(4, (int64_t[]){B, H, Tq, D}, 1), *kc = randn(4, (int64_t[]){B, KV, cap, D}, 2),
                      *vc = randn(4, (int64_t[]){B, KV, cap, D}, 3);
            fm_tensor *k = fm_narrow(kc, 2, 0, Tk), *v = fm_narrow(vc, 2, 0, Tk), *k2 = fm_contiguous(k), *v2 = fm_contiguous(v);
            fm_tensor *y = fm_scaled_dot_product_attention(q, k, v, false, 0), *y2 = fm_scaled_dot_product_attention(q, k2, v2, false, 0);
            CHECK_MSG(y && y2 && t_same_bits(y, y2), "sdpa on strided k/v (Tq %lld, Tk %lld) differs", (long long)Tq, (long long)Tk);
            fm_tensor_release_n(9, q, kc, vc, k, v, k2, v2, y, y2);
        }
}

int main(void) {
    fm_set_grad_enabled(false);
    sdpa_row_strided();
    for (int llama = 0; llama < 2; llama++) {
        fm_gpt *m = NULL;
        fm_graph *g = gpt_graph(llama, &m);
        if (!g) { fm_gpt_free(m); continue; }
        loop_matches(g, llama ? "llama" : "gpt2", 20);
        loop_matches(g, llama ? "llama, default growth" : "gpt2, default growth", 0);
        { /* the compiled graph: attention_kv nodes (Llama's with its ropes inside: none left alone) */
            fm_compile_report rep;
            fm_graph *c = fm_graph_compile(g, &rep);
            CHECK_MSG(c != NULL, "%s", fm_last_error());
            int fused = 0, ropes = 0;
            for (int i = 0; c && i < fm_graph_num_nodes(c); i++) {
                fused += !strcmp(fm_graph_node_op(c, i), "attention_kv");
                ropes += !strcmp(fm_graph_node_op(c, i), "rope");
            }
            CHECK_MSG(fused == 2 && ropes == 0, "compiled %s: %d attention_kv nodes, %d ropes", llama ? "llama" : "gpt2", fused, ropes);
            if (c) loop_matches(c, llama ? "llama compiled" : "gpt2 compiled", 20);
            if (c) never_changes_held_tensors(c);
            if (c) kv16_loop(c, g, llama ? "llama compiled" : "gpt2 compiled");
            fm_graph_free(c);
        }
        never_changes_held_tensors(g);
        fm_graph_free(g);
        fm_gpt_free(m);
    }
    TEST_DONE();
}
