/* GPT recipes ([model] type = gpt): the peak of `fathom train <recipe>`
 * (src/gpt/gpt_train.c), from the GPT's own code run for two steps on the meta
 * device (plan_step.c): the model the recipe builds, AdamW with its state made
 * up front, the batch, the step, and the run's end (a validation batch and the
 * checkpoint's transposed copies). What the planner adds is only what the
 * trainer decides outside the model: the tokenizer's vocabulary size. GPT-2 and
 * Llama recipes alike, at any precision, checkpointing and accumulation the
 * trainer takes. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/dist.h"
#include "fathom/gpt.h"
#include "plan/plan_fathom.h"

/* Distinct UTF-8 code points of a file (a char tokenizer's vocabulary is
 * those plus 256 byte fallbacks); -1 if it cannot be read. */
static int count_chars(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    unsigned char *seen = calloc(0x110000 / 8, 1);
    if (!seen) { fclose(f); return -1; }
    int count = 0, c;
    while ((c = fgetc(f)) != EOF) {
        uint32_t cp = (uint32_t)c;
        int more = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
        if (more < 0) continue; /* invalid lead byte: the byte fallback */
        cp = more == 0 ? (uint32_t)c : more == 1 ? (uint32_t)(c & 0x1f) : more == 2 ? (uint32_t)(c & 0x0f) : (uint32_t)(c & 0x07);
        int ok = 1;
        for (int k = 0; k < more; k++) {
            int n = fgetc(f);
            if (n == EOF || (n & 0xc0) != 0x80) { ok = 0; if (n != EOF) ungetc(n, f); break; }
            cp = cp << 6 | (uint32_t)(n & 0x3f);
        }
        if (!ok || cp >= 0x110000) continue;
        if (!(seen[cp >> 3] & (1u << (cp & 7)))) { seen[cp >> 3] |= (unsigned char)(1u << (cp & 7)); count++; }
    }
    fclose(f);
    free(seen);
    return count;
}

/* The vocabulary the trainer will build: bytes 256, a char tokenizer the
 * corpus's characters + 256 byte fallbacks, BPE the recipe's vocab_size. */
static fm_status recipe_vocab(const char *path, const fm_gpt_train_opts *go, int *V, const char **note) {
    *note = "";
    if (go->tokenizer == FM_TOK_BYTE) { *V = 256; return FM_OK; }
    if (go->tokenizer == FM_TOK_CHAR) {
        const char *corpus = go->corpus ? go->corpus : "kjv";
        int n = strcmp(corpus, "kjv") ? count_chars(corpus) : -1;
        if (n < 0) return fm_set_error(FM_ERR_IO, "%s: a char tokenizer's vocabulary is the corpus's characters, and the "
                                       "corpus '%s' cannot be read", path, corpus);
        *V = n + 256;
        return FM_OK;
    }
    *V = go->tokenizer_vocab;
    *note = "BPE vocabulary taken as the recipe's vocab_size (training stops early only on a corpus too small to repeat pairs)";
    return FM_OK;
}

fm_status plan_fathom_gpt(const char *path, const fm_plan_run_opts *o, int explain, fm_plan_run *out) {
    /* the trainer's own parser: the same keys, defaults and file:line errors */
    fm_gpt_recipe rec;
    if (fm_gpt_recipe_load(path, &rec) != FM_OK) { /* a bad recipe is a bad file here, not bad usage */
        if (fm_last_status() != FM_ERR_INVALID) return fm_last_status();
        char msg[512];
        snprintf(msg, sizeof msg, "%s", fm_last_error());
        return fm_set_error(FM_ERR_FORMAT, "%s", msg);
    }
    fm_gpt_train_opts go = rec.opts;
    int V = 0;
    const char *vnote;
    fm_status st = recipe_vocab(path, &go, &V, &vnote);
    go.model.vocab_size = V;
    int64_t B = o->batch > 0 ? o->batch : go.batch_size;
    int accum = o->grad_accum > 1 ? o->grad_accum : 1;
    /* one rank of mpirun -np N --tensor-parallel T: the trainer's refusals (gpt_tp_setup,
     * gpt_dist_init), then its part of the batch */
    const int T = o->tensor_parallel > 1 ? o->tensor_parallel : 1, N = o->ranks > 1 ? o->ranks : T, DP = N / T;
    if (st == FM_OK && N % T)
        st = fm_set_error(FM_ERR_INVALID, "--tensor-parallel %d needs a world of a multiple of %d ranks (world size = "
                          "tensor parallel x data parallel), got --ranks %d", T, T, N);
    /* bad usage (FM_ERR_INVALID: `fathom plan` exits 2), as `fathom train` refuses them (exit 2) */
    if (st == FM_OK && T > 1 && (st = fm_gpt_tp_check(&go.model, T)) == FM_OK && o->zero && DP < 2)
        st = fm_set_error(FM_ERR_INVALID, "--zero 1 with --tensor-parallel %d shards the optimizer state over the "
                          "data-parallel ranks (world / %d): plan it with --ranks %d or more", T, T, 2 * T);
    if (st == FM_OK && o->zero && DP < 2)
        st = fm_set_error(FM_ERR_INVALID, "--zero 1 shards the optimizer state across MPI ranks: plan it with --ranks N "
                          "(N >= 2 data-parallel ranks)");
    if (st == FM_OK && B % DP)
        st = fm_set_error(FM_ERR_INVALID, "the batch (%lld) does not split evenly over %d ranks: give --batch a multiple "
                          "of %d", (long long)B, DP, DP);
    const int64_t Bl = st == FM_OK ? B / DP : B; /* this rank's windows per step */
    if (st == FM_OK && Bl % accum)
        st = fm_set_error(FM_ERR_INVALID, "--batch %lld%s is not divisible by --grad-accum %d (each micro-batch must "
                          "have the same size)", (long long)Bl, DP > 1 ? " per rank" : "", accum);
    if (st == FM_OK && (st = fm_gpt_config_validate(&go.model)))
        st = fm_set_error(FM_ERR_FORMAT, "%s: %s", path, fm_last_error());
    plan_step_opts so;
    plan_step_defaults(&so);
    so.dev = (fm_device){FM_DEV_META, 0};
    so.batch = Bl;
    so.eval_batch = B;
    so.tensor_parallel = T;
    so.ranks = N;
    so.zero = o->zero;
    so.precision = plan_fathom_dtype(o->precision);
    so.checkpointing = (fm_checkpointing)o->checkpointing;
    so.grad_accum = accum;
    so.finish = true;
    fm_efficiency_opts eo = fm_efficiency_defaults();
    eo.precision = so.precision;
    eo.checkpointing = so.checkpointing;
    eo.grad_accum = accum;
    eo.loss_scaling = so.precision == FM_F16;
    if (st == FM_OK) st = fm_efficiency_validate(&eo, true, (int)Bl); /* the trainer's own option errors */
    plan_sb log = {0};
    if (explain) so.log = &log;
    plan_step_mem m;
    if (st == FM_OK) st = plan_step_gpt(&go, &so, &m);
    if (st) { fm_gpt_recipe_free(&rec); free(log.buf); return st; }
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", path);
    const char *base = strrchr(path, '/');
    snprintf(out->name, sizeof out->name, "%.63s", base ? base + 1 : path);
    char *dot = strstr(out->name, ".ini");
    if (dot) *dot = 0;
    snprintf(out->trainer, sizeof out->trainer, "gpt");
    out->opts = *o;
    out->opts.grad_accum = accum;
    out->batch = B;
    snprintf(out->notes, sizeof out->notes, "%s", vnote);
    const fm_gpt_config *c = &go.model;
    snprintf(out->model, sizeof out->model, "%s style, %d layers, %d heads%s, width %d, MLP %d, context %d, vocab %d, AdamW",
             c->arch == FM_GPT_LLAMA ? "Llama" : "GPT-2", c->n_layer, c->n_head,
             c->arch == FM_GPT_LLAMA && c->n_kv_head && c->n_kv_head != c->n_head ? " (grouped KV)" : "", c->n_embd,
             c->ffn_hidden, c->block_size, V);
    plan_fathom_fill(out, &m, 0, 0);
    if (explain) {
        static const char *ck[] = {"none", "blocks", "selective"};
        plan_sb hdr = {0};
        plan_sb_printf(&hdr, "`fathom train %s --batch %lld --precision %s --checkpointing %s --grad-accum %d`, its model and "
                       "steps run on the meta device (no data; the CPU allocator's block sizes), each kernel with the "
                       "bytes live after it and the peak so far:\n", path, (long long)B,
                       fm_plan_precision_name(o->precision), ck[o->checkpointing], accum);
        plan_sb_printf(&hdr, "%s", log.buf ? log.buf : "");
        out->explain = plan_sb_take(&hdr);
    }
    fm_gpt_recipe_free(&rec);
    free(log.buf);
    return FM_OK;
}
