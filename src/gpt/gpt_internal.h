/* Internals shared by the src/gpt files: the model struct (its layers and the
 * Hugging Face name table) and the KV cache. Not a public interface. */
#ifndef FATHOM_GPT_INTERNAL_H
#define FATHOM_GPT_INTERNAL_H

#include "fathom/efficiency.h"
#include "fathom/gpt.h"

/* Contexts of the segment functions that checkpointing re-runs during backward:
 * they live in the model because they must outlive the forward that made them. */
typedef struct gpt_norm_ctx {
    const struct fm_gpt *m;
    fm_tensor *w, *b;
} gpt_norm_ctx;
typedef struct gpt_block_ctx {
    struct fm_gpt *m;
    int layer;
    uint64_t rng_offset; /* the dropout generator's offset when the block's forward began */
} gpt_block_ctx;

typedef struct gpt_layer {
    fm_tensor *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    fm_tensor *ln2_w, *ln2_b, *fc_w, *fc_b, *fc2_w, *fc2_b;
    gpt_norm_ctx ln1c, ln2c;
    gpt_block_ctx blk;
} gpt_layer;

/* One Hugging Face tensor: rows [row0, row0+rows) of a fathom parameter,
 * transposed when HF stores it as Conv1D ([in, out]). */
typedef struct gpt_hf_entry {
    char name[160];
    fm_tensor *t;
    int64_t row0, rows;
    bool transpose;
} gpt_hf_entry;

struct fm_gpt {
    fm_gpt_config cfg;
    int n_kv;
    fm_named_list params; /* owns the parameter tensors */
    fm_tensor *wte, *wpe, *lnf_w, *lnf_b;
    fm_tensor *lm_head; /* untied_head only; else the output uses wte */
    gpt_layer *layers;
    gpt_hf_entry *hf;
    int n_hf, cap_hf;
    fm_tensor *rope_cos, *rope_sin; /* [block, D] */
    bool training;
    fm_rng own_rng, *rng;
    fm_efficiency_opts eff; /* only .checkpointing is read (fm_gpt_set_checkpointing) */
    bool unfused;           /* fm_gpt_set_fusion(m, false): the unfused ops (for comparisons) */
    gpt_norm_ctx lnfc;
    /* tensor parallel (fm_gpt_set_tensor_parallel; tp NULL, tp_size 1: off): this rank
     * holds n_head/tp_size heads, ffn_hidden/tp_size MLP columns and vocab_size/tp_size
     * embedding rows; cfg keeps the full sizes */
    fm_dist *tp;
    int tp_size, tp_rank;
    /* bf16 copies of the linear weights while a bf16 decode loop runs
     * (fm_gpt_keep_lowp_weights; lowp_src[i] is the f32 weight lowp_w[i] copies) */
    fm_tensor **lowp_src, **lowp_w;
    int n_lowp;
    /* gpt_new_bound's weight source, while the model is built (NULL after) */
    struct fm_tensor *(*src)(void *ctx, const char *name, int ndim, const int64_t *shape);
    void *src_ctx;
};
/* Where gpt_new_bound takes each parameter from: a new reference to an f32 tensor of
 * exactly shape (ndim 1 or 2), contiguous on the CPU, or on the meta device (a
 * placeholder for a weight the caller keeps in another form, e.g. quantized: such a
 * model runs only where that form is used, as the paged decoder does); NULL with the
 * error set to fail the build. */
typedef fm_tensor *(*gpt_param_source)(void *ctx, const char *name, int ndim, const int64_t *shape);
/* A model of config c whose weights come from src (no initialization, no gradients,
 * eval mode): for inference from weights held elsewhere (an inference graph's
 * constants, shared rather than copied). */
fm_gpt *gpt_new_bound(const fm_gpt_config *c, gpt_param_source src, void *ctx);

/* fm_gpt_config_save's JSON as a string (malloc'd; compact unless pretty), and back
 * (where names the source in errors). */
char *gpt_config_json(const fm_gpt_config *c, bool pretty);
fm_status gpt_config_parse(const char *text, const char *where, fm_gpt_config *c);

/* The tensors fm_gpt_save_hf writes, in its order: Conv1D weights as transposed
 * contiguous copies, the rest as views (the planner counts the copies). */
fm_status fm_gpt_hf_tensors(const fm_gpt *m, fm_named_list *l);

typedef struct fm_gpt_kv_cache {
    int n_layer, batch;
    int64_t len, cap;
    fm_tensor **k, **v; /* per layer [B, KV, cap, D] */
} gpt_kv;

/* Tensor parallel training (gpt_tp.c): the whole optimizer state from this rank's
 * (split tensors gathered: a collective); this rank's parts of a whole state read from
 * path into local (same names); the clipping norm's reduction (fm_optim_set_norm_reduce,
 * ctx: the model); the parameters one rank holds. */
fm_status gpt_tp_full_state(const fm_gpt *m, const fm_named_list *local, fm_named_list *full);
fm_status gpt_tp_load_state(const fm_gpt *m, const fm_named_list *file, const char *path, fm_named_list *local);
fm_status gpt_tp_norm_reduce(double *ss, void *ctx);
/* ... and with ZeRO-1 (ctx: the model, the sharded optimizer, the data-parallel group) */
typedef struct gpt_tp_zero_norm {
    const fm_gpt *m;
    fm_optim *shard;
    fm_dist *dp;
} gpt_tp_zero_norm;
fm_status gpt_tp_zero_norm_reduce(double *ss, void *ctx);
int64_t gpt_tp_num_params(const fm_gpt_config *c, int tp);
/* A tensor-parallel checkpoint's parts put together: the whole parameters (into whole, a
 * model built whole) and the whole optimizer state ("<param>.<slot>", into state) from the
 * T files of one tensor-parallel group (parts[t]: rank t's tensors, named "model.<param>"
 * and "optim.<param>.<slot>"). path names the unit in errors. */
fm_status gpt_tp_assemble(fm_gpt *whole, int T, const fm_named_list *parts, const char *path, fm_named_list *state);

/* The trainer's AdamW for m (gpt_train.c; the planner's meta-device step uses it too):
 * decay on matrices only, *params NULL-terminated (caller frees), state made when
 * make_state. */
fm_status gpt_adamw_setup(fm_gpt *m, const fm_gpt_train_opts *o, bool make_state, fm_optim **opt, fm_tensor ***params);
#endif
