/* Sentence-embedding throughput of a BERT encoder in Hugging Face layout
 * (fathom/hf.h), the fathom side of bench/bench_hf.py: batches of 1 and 32 texts
 * of exactly SEQ tokens ([CLS] and [SEP] included), tokenization, encoder,
 * pooling and normalization all timed, as sentence-transformers' encode() does.
 *   build/bench_hf_embed MODEL_DIR [SEQ] [ROUNDS] [int8]
 * int8: the encoder's linears in dynamic int8 (fm_hf_encoder_quantize_int8).
 * One JSON line per batch size: median and best milliseconds per batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "fathom/hf.h"

/* Words that are one WordPiece each in BERT's uncased vocabulary; the text is cut
 * to the token count asked for (checked with the model's tokenizer). */
static char *make_text(fm_hf_encoder *e, int seq) {
    static const char *const words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and",
                                        "then", "runs", "into", "forest", "where", "it", "sleeps", "until", "morning"};
    size_t cap = (size_t)seq * 16 + 16, o = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = 0;
    for (int i = 0; i < seq - 2; i++) o += (size_t)snprintf(s + o, cap - o, "%s%s", i ? " " : "", words[i % 19]);
    int32_t *ids = NULL;
    int64_t n = 0;
    if (fm_hf_encoder_tokenize(e, s, &ids, &n) || n != seq) {
        fprintf(stderr, "bench_hf_embed: the text makes %lld tokens, not %d (max_seq_length too small?)\n",
                (long long)n, seq);
        free(s);
        s = NULL;
    }
    free(ids);
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: bench_hf_embed MODEL_DIR [SEQ] [ROUNDS]\n"); return 2; }
    int seq = argc > 2 ? atoi(argv[2]) : 128, rounds = argc > 3 ? atoi(argv[3]) : 10;
    if (seq < 3 || seq > 4096 || rounds < 1 || rounds > 10000) { fprintf(stderr, "bench_hf_embed: SEQ must be 3..4096 and ROUNDS 1..10000\n"); return 2; }
    fm_hf_encoder *e = fm_hf_encoder_load(argv[1]);
    bool int8 = argc > 4 && !strcmp(argv[4], "int8");
    if (!e || (int8 && fm_hf_encoder_quantize_int8(e))) { fprintf(stderr, "bench_hf_embed: %s\n", fm_last_error()); return 1; }
    char *text = make_text(e, seq);
    if (!text) { fm_hf_encoder_free(e); return 1; }
    const char *texts[32];
    for (int i = 0; i < 32; i++) texts[i] = text;
    int sizes[2] = {1, 32};
    double *t = malloc(sizeof(double) * (size_t)rounds);
    if (!t) { fprintf(stderr, "bench_hf_embed: out of memory\n"); return 1; }
    for (int k = 0; k < 2; k++) {
        fm_tensor *w = fm_hf_encoder_embed(e, texts, sizes[k]); /* warm-up */
        fm_tensor_release(w);
        for (int r = 0; r < rounds; r++) {
            double t0 = bench_now_ms();
            fm_tensor *x = fm_hf_encoder_embed(e, texts, sizes[k]);
            t[r] = bench_now_ms() - t0;
            if (!x) { fprintf(stderr, "bench_hf_embed: %s\n", fm_last_error()); return 1; }
            fm_tensor_release(x);
        }
        double med = bench_median(t, rounds);
        printf("{\"impl\": \"%s\", \"batch\": %d, \"seq\": %d, \"ms_median\": %.3f, \"ms_best\": %.3f, "
               "\"sentences_per_s\": %.2f}\n", int8 ? "fathom_int8" : "fathom", sizes[k], seq, med, t[0], sizes[k] * 1e3 / med);
        fflush(stdout);
    }
    free(t);
    free(text);
    fm_hf_encoder_free(e);
    return 0;
}
