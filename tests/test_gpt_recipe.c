/* GPT recipes (fm_gpt_recipe_load, src/gpt/gpt_recipe.c), the one parser that
 * `fathom train` and `fathom summary` share: keys land in the trainer's options,
 * keys a recipe leaves out keep the trainer's defaults, errors name the file and
 * the line of the first bad key, and the corpus string is owned and freed. */
#include <stdlib.h>
#include <unistd.h>

#include "fathom/fathom.h"
#include "fathom/gpt.h"
#include "test_util.h"

static char path[] = "/tmp/fathom_gpt_recipe_XXXXXX";

static void write_recipe(const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void expect_error(const char *text, fm_status code, const char *needle) {
    write_recipe(text);
    fm_gpt_recipe r;
    CHECK(fm_gpt_recipe_load(path, &r) == code);
    char want[512];
    snprintf(want, sizeof want, "%s: %s", path, needle);
    CHECK_ERR_CONTAINS(want);
}

int main(void) {
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    fm_gpt_train_opts def = fm_gpt_train_defaults();

    write_recipe("[recipe]\nname = tiny\n[model]\ntype = gpt\narch = llama\nn_layer = 3\nn_head = 4\nn_kv_head = 2\n"
                 "n_embd = 32\nblock_size = 64\nffn_hidden = 96\ndropout = 0.25\n[tokenizer]\nkind = byte\n"
                 "[data]\ncorpus = first.txt\ncorpus = second.txt\nval_fraction = 0.2\n"
                 "[train]\nbatch_size = 6\nsteps = 70\nlr = 3e-4\nseed = 99\nlog_every = 7\n");
    fm_gpt_recipe r;
    CHECK(fm_gpt_recipe_load(path, &r) == FM_OK);
    CHECK(r.opts.model.arch == FM_GPT_LLAMA && !r.opts.model.bias);
    CHECK(r.opts.model.n_layer == 3 && r.opts.model.n_head == 4 && r.opts.model.n_kv_head == 2);
    CHECK(r.opts.model.n_embd == 32 && r.opts.model.block_size == 64 && r.opts.model.ffn_hidden == 96);
    CHECK_NEAR(r.opts.model.dropout, 0.25, 0);
    CHECK(r.opts.tokenizer == FM_TOK_BYTE);
    CHECK(r.opts.corpus && !strcmp(r.opts.corpus, "second.txt") && r.opts.corpus == r.corpus); /* the last one wins */
    CHECK_NEAR(r.opts.val_fraction, 0.2, 0);
    CHECK(r.opts.batch_size == 6 && r.opts.steps == 70 && r.opts.seed == 99 && r.opts.log_every == 7);
    CHECK_NEAR(r.opts.lr, 3e-4, 0);
    /* what the recipe leaves out is the trainer's default */
    CHECK(r.opts.warmup == def.warmup && r.opts.eval_every == def.eval_every && r.opts.tokenizer_vocab == def.tokenizer_vocab);
    CHECK_NEAR(r.opts.weight_decay, def.weight_decay, 0);
    CHECK(fm_gpt_recipe_is_gpt(path));
    fm_gpt_recipe_free(&r);
    CHECK(r.corpus == NULL && !strcmp(r.opts.corpus, def.corpus));
    fm_gpt_recipe_free(&r); /* twice is harmless */

    /* without [data] corpus: the default, nothing owned */
    write_recipe("[model]\ntype = gpt\n");
    CHECK(fm_gpt_recipe_load(path, &r) == FM_OK);
    CHECK(r.corpus == NULL && !strcmp(r.opts.corpus, def.corpus) && r.opts.model.n_layer == def.model.n_layer);
    fm_gpt_recipe_free(&r);

    expect_error("[model]\ntype = gpt\nn_lyer = 3\n", FM_ERR_INVALID, "line 3: unknown recipe key [model] n_lyer");
    expect_error("[model]\ntype = gpt\n[train]\nstepz = 3\n", FM_ERR_INVALID, "line 4: unknown recipe key [train] stepz");
    expect_error("[model]\ntype = gpt\n[train]\nsteps = many\n", FM_ERR_INVALID, "line 4: [train] steps = 'many' is not a number");
    expect_error("[model]\ntype = gpt\narch = bert\n", FM_ERR_INVALID, "line 3: ");
    CHECK_ERR_CONTAINS("bert");
    expect_error("[model]\ntype = gpt\n[tokenizer]\nkind = words\n", FM_ERR_INVALID, "line 4: ");
    CHECK_ERR_CONTAINS("words");
    expect_error("[model]\ntype = sequential\n", FM_ERR_INVALID, "line 2: [model] type = sequential: not a GPT recipe");
    /* the first bad line is the one named, with its own message, even with more errors after it (and
     * a corpus parsed before the error is freed: valgrind) */
    expect_error("[data]\ncorpus = x.txt\n[model]\nn_head = four\nn_embd = x\nbogus = 1\n", FM_ERR_INVALID,
                 "line 4: [model] n_head = 'four' is not a number");
    expect_error("[model]\ntype = gpt\nthis line has no equals sign\n", FM_ERR_INVALID, "line 3: syntax error");
    write_recipe("[model]\ntype = sequential\n");
    CHECK(!fm_gpt_recipe_is_gpt(path));
    unlink(path);
    CHECK(fm_gpt_recipe_load(path, &r) == FM_ERR_IO);
    CHECK_ERR_CONTAINS("cannot read the recipe");
    CHECK(!fm_gpt_recipe_is_gpt(path) && !fm_gpt_recipe_is_gpt(NULL));
    TEST_DONE();
}
