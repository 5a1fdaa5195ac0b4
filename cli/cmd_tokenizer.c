/* `fathom tokenizer`: train, apply and invert tokenizers. Thin: parsing only.
 *
 *   fathom tokenizer train CORPUS --out TOKENIZER [--kind bpe|char|byte] [--vocab N]
 *   fathom tokenizer encode TOKENIZER TEXT_FILE --out TOKENS.bin   (a token file)
 *   fathom tokenizer decode TOKENIZER TOKENS.bin                   (text to stdout) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "io/io_internal.h" /* fm_read_file, fm_read_text_file */
#include "fathom/gpt.h" /* token files */
#include "fathom/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: fathom tokenizer train CORPUS --out TOKENIZER [--kind bpe|char|byte] [--vocab N]\n"
               "       fathom tokenizer encode TOKENIZER TEXT_FILE --out TOKENS.bin\n"
               "       fathom tokenizer decode TOKENIZER TOKENS.bin\n");
}

/* A corpus or a text to encode, whole: bytes (NUL allowed: a byte tokenizer takes
 * them), at most 16 GiB, a pipe read to its end (it read as empty before: no size),
 * a directory named as such (fm_read_file). */
static int slurp(const char *path, char **buf, size_t *n) {
    fm_status st;
    const char *why;
    *buf = fm_read_file(path, (size_t)16 << 30, n, &st, &why);
    if (*buf) return 0;
    if (st == FM_ERR_IO && errno == EISDIR) fm_cli_error("%s: is a directory, not a text file", path);
    else if (st == FM_ERR_IO) fm_cli_error("%s: %s (%s)", path, why, strerror(errno));
    else if (st == FM_ERR_OOM) fm_cli_error("%s: out of host memory reading it", path);
    else fm_cli_error("%s: %s (at most 16 GiB)", path, why);
    return 1;
}

int fm_cmd_tokenizer(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1], *pos[2] = {NULL, NULL}, *out = NULL, *kind = "bpe";
    int vocab = 512, npos = 0;
    for (int i = 2; i < argc; i++) {
        bool has = i + 1 < argc;
        if (!strcmp(argv[i], "--out") && has) out = argv[++i];
        else if (!strcmp(argv[i], "--kind") && has) kind = argv[++i];
        else if (!strcmp(argv[i], "--vocab") && has) {
            long long v = 0;
            if (!fm_cli_parse_int("tokenizer", "--vocab", argv[++i], 1, &v) || v > 1 << 30) {
                if (v > 1 << 30) fm_cli_error("tokenizer: --vocab %lld is too large", v);
                usage(stderr);
                return 2;
            }
            vocab = (int)v;
        }
        else if (argv[i][0] != '-' && npos < 2) pos[npos++] = argv[i];
        else { fm_cli_error("unknown or incomplete option '%s'", argv[i]); usage(stderr); return 2; }
    }
    if (!strcmp(sub, "train")) {
        if (npos != 1 || !out) { usage(stderr); return 2; }
        fm_tokenizer_kind k;
        if (fm_tokenizer_kind_parse(kind, &k)) { fm_cli_error("%s", fm_last_error()); return 2; }
        char *text;
        size_t n;
        if (slurp(pos[0], &text, &n)) return 1;
        fm_tokenizer *t = k == FM_TOK_BYTE ? fm_tokenizer_byte()
                          : k == FM_TOK_CHAR ? fm_tokenizer_char_from_corpus(text, n)
                                             : fm_tokenizer_train_bpe(text, n, vocab);
        free(text);
        if (!t || fm_tokenizer_save(t, out)) {
            fm_cli_error("%s: %s", pos[0], fm_last_error());
            fm_tokenizer_free(t);
            return 1;
        }
        printf("{\"tokenizer\":\"%s\",\"kind\":\"%s\",\"vocab\":%d}\n", out, kind, fm_tokenizer_vocab_size(t));
        fm_tokenizer_free(t);
        return 0;
    }
    if (npos != 2) { usage(stderr); return 2; }
    fm_tokenizer *t = fm_tokenizer_load(pos[0]);
    if (!t) { fm_cli_error("%s", fm_last_error()); return 1; }
    int rc = 0;
    if (!strcmp(sub, "encode")) {
        char *text = NULL;
        size_t n = 0;
        int32_t *ids = NULL;
        int64_t k = 0;
        if (!out) { usage(stderr); rc = 2; }
        else if (slurp(pos[1], &text, &n)) rc = 1;
        else if (fm_tokenizer_encode(t, text, n, &ids, &k) || fm_token_file_write(out, ids, k, fm_tokenizer_vocab_size(t))) {
            fm_cli_error("%s", fm_last_error());
            rc = 1;
        } else {
            printf("{\"bytes\":%zu,\"tokens\":%lld,\"out\":\"%s\"}\n", n, (long long)k, out);
        }
        free(text);
        free(ids);
    } else if (!strcmp(sub, "decode")) {
        fm_token_data d;
        char *text = NULL;
        size_t n = 0;
        if (fm_token_file_read(pos[1], fm_tokenizer_vocab_size(t), &d) || fm_tokenizer_decode(t, d.ids, d.n, &text, &n)) {
            fm_cli_error("%s", fm_last_error());
            rc = 1;
        } else {
            fwrite(text, 1, n, stdout);
        }
        free(text);
        fm_token_data_free(&d);
    } else {
        fm_cli_error("unknown tokenizer subcommand '%s'", sub);
        usage(stderr);
        rc = 2;
    }
    fm_tokenizer_free(t);
    return rc;
}
