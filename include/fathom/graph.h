/* fathom/graph.h: the inference graph, the one form that deploy (compile),
 * interchange (ONNX import/export) and serve (KServe v2) share.
 *
 * A graph is a static list of nodes in execution order. Each node is an op
 * (the forward ops of fathom/ops.def by their ops.def names, plus graph-only
 * ops such as reshape, permute and cast: docs/GRAPH.md lists them with their
 * inputs and attributes), reading named values and writing named values.
 * A value is a graph input, a constant (a weight) or a node output; each has a
 * dtype and a shape. Names are unique across the whole graph.
 *
 * Dynamic dimensions. A dimension of an input may be symbolic: a name such as
 * "batch" or "seq" (an identifier), bound at run time from the inputs given.
 * Attributes that hold sizes (reshape's target shape, expand, slice bounds)
 * may use dim expressions over those names: "batch", "batch*seq", "past+seq",
 * "2*seq" (sums of products of names and integers). Loading runs shape
 * inference with the names bound to probe values (fm_graph_set_dim_hint, else
 * 2) and again with each one plus one, so every node is checked before
 * anything runs, and output dimensions that follow a name are reported as
 * dynamic (-1).
 *
 * On disk a graph is a directory: graph.json (human-readable: inputs, outputs,
 * nodes with their attributes, the dtype and shape of every value) and
 * weights.safetensors (the constants by name). It is written atomically: into
 * a temporary directory renamed into place, so a crash leaves the old
 * directory or the new one, never a mix.
 *
 * Quantized weights: constants of any fathom dtype (i8 / packed-u8 weights with
 * f32 or f16 scales as separate constants), read by the quantized ops
 * (qlinear_int8, qlinear_int4, qembedding_int4; fathom/quant.h makes them).
 *
 * Running: fm_graph_run does not modify the graph, so several threads may run
 * one graph at the same time (the server's instances). */
#ifndef FATHOM_GRAPH_H
#define FATHOM_GRAPH_H
#include "fathom/export.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fm_graph fm_graph;

/* The most inputs/outputs one node may have (cat takes up to this many). */
#define FM_GRAPH_MAX_NODE_IO 64
/* A dynamic dimension in shapes reported by the getters. */
#define FM_DIM_DYNAMIC (-1)

typedef enum fm_graph_attr_type {
    FM_ATTR_INT = 0, FM_ATTR_FLOAT, FM_ATTR_INTS, FM_ATTR_FLOATS, FM_ATTR_STRING
} fm_graph_attr_type;

/* One node attribute, as the builder takes it (everything is copied). For
 * FM_ATTR_INTS, `dims` may be NULL; where dims[k] is not NULL, element k is that
 * dim expression ("batch*seq") instead of ints[k]. */
typedef struct fm_graph_attr {
    const char *name;
    fm_graph_attr_type type;
    int64_t i;
    double f;
    const char *s;
    int n;
    const int64_t *ints;
    const double *floats;
    const char *const *dims;
} fm_graph_attr;
FM_API fm_graph_attr fm_graph_attr_int(const char *name, int64_t v);
FM_API fm_graph_attr fm_graph_attr_float(const char *name, double v);
FM_API fm_graph_attr fm_graph_attr_ints(const char *name, int n, const int64_t *v);
FM_API fm_graph_attr fm_graph_attr_floats(const char *name, int n, const double *v);
FM_API fm_graph_attr fm_graph_attr_string(const char *name, const char *s);

/* ---- building ---- */
FM_API fm_graph *fm_graph_new(void);
FM_API void fm_graph_free(fm_graph *g);
/* A graph input. dims[k] >= 0 is fixed; dims[k] < 0 is dynamic, named
 * dim_names[k] (an identifier; the same name in two places is the same size).
 * dim_names may be NULL when no dim is dynamic. */
FM_API fm_status fm_graph_add_input(fm_graph *g, const char *name, fm_dtype dt, int ndim, const int64_t *dims,
                                    const char *const *dim_names);
/* A constant: t (any device, any strides) is copied to host memory now. */
FM_API fm_status fm_graph_add_const(fm_graph *g, const char *name, const fm_tensor *t);
/* A node. inputs name values defined earlier ("" for an absent optional
 * input); outputs are new value names. `name` may be NULL (one is made up). */
FM_API fm_status fm_graph_add_node(fm_graph *g, const char *op, const char *name, int n_in, const char *const *inputs,
                                   int n_out, const char *const *outputs, int n_attrs, const fm_graph_attr *attrs);
/* Marks a value as a graph output (in call order). */
FM_API fm_status fm_graph_add_output(fm_graph *g, const char *value);
/* The probe size used for dynamic dim `name` while checking shapes (default 2;
 * give a typical size when small ones are invalid, e.g. an image side). */
FM_API fm_status fm_graph_set_dim_hint(fm_graph *g, const char *name, int64_t size);
/* Free-form string metadata kept in graph.json ("model_kind", ...). */
FM_API fm_status fm_graph_set_meta(fm_graph *g, const char *key, const char *value);
FM_API const char *fm_graph_get_meta(const fm_graph *g, const char *key);
/* Checks every node (op known, inputs defined, attributes, dtypes, shapes) and
 * infers each value's dtype and shape. fm_graph_run and fm_graph_save call it
 * when needed; errors name the node, its op and what is wrong. */
FM_API fm_status fm_graph_validate(fm_graph *g);

/* ---- files ---- */
/* Writes DIR/graph.json and DIR/weights.safetensors atomically (DIR is
 * replaced as a whole if it exists and holds a graph). */
FM_API fm_status fm_graph_save(fm_graph *g, const char *dir);
/* Reads and validates a graph directory; NULL with the reason on error. */
FM_API fm_graph *fm_graph_load(const char *dir);
/* True when DIR holds a graph.json (what the commands test to tell a graph
 * directory from a trained model's). */
FM_API bool fm_graph_dir_is_graph(const char *dir);

/* ---- metadata (for servers and tools) ---- */
typedef struct fm_graph_io {
    const char *name;
    fm_dtype dtype;
    int ndim;
    int64_t shape[FM_MAX_DIMS];          /* FM_DIM_DYNAMIC where dynamic */
    const char *dim_names[FM_MAX_DIMS]; /* the dynamic dims' names (NULL for fixed ones, and for
                                         * output dims that depend on several names) */
} fm_graph_io;
FM_API int fm_graph_num_inputs(const fm_graph *g);
FM_API int fm_graph_num_outputs(const fm_graph *g);
FM_API int fm_graph_num_nodes(const fm_graph *g);
FM_API int fm_graph_num_consts(const fm_graph *g);
/* Node i's op name (NULL when out of range). */
FM_API const char *fm_graph_node_op(const fm_graph *g, int i);
/* Valid after fm_graph_validate (fm_graph_load validates). */
FM_API fm_status fm_graph_input_info(const fm_graph *g, int i, fm_graph_io *out);
/* When input i (an integer input) feeds the indices of an embedding lookup on a
 * constant table directly (embedding, or qembedding_int4; what an ONNX Gather on a
 * constant 2-D table imports as), the table's row count: every id must be in
 * [0, rows). The smallest such count when it feeds several; 0 when it feeds none. */
FM_API int64_t fm_graph_input_id_limit(const fm_graph *g, int i);
FM_API fm_status fm_graph_output_info(const fm_graph *g, int i, fm_graph_io *out);

/* ---- running ---- */
/* Moves the constants to `dev` (once; runs then happen there). */
FM_API fm_status fm_graph_to_device(fm_graph *g, fm_device dev);
FM_API fm_device fm_graph_device(const fm_graph *g);
/* Runs the graph: inputs[i] for the i-th declared input (moved to the graph's
 * device when elsewhere; shapes must match the declared ones, dynamic dims
 * consistently); outputs[j] receives a new reference to the j-th output, on the
 * graph's device. On error no output is set and the message names the input or
 * the node. */
FM_API fm_status fm_graph_run(const fm_graph *g, fm_tensor *const *inputs, fm_tensor **outputs);
/* Options of fm_graph_run_ex (zeroed: fm_graph_run's behaviour).
 * kv_append: the attention_kv nodes of a KV-cache graph (the GPT's decode step,
 * docs/GRAPH.md), on the CPU, return their present caches as views with spare
 * rows along the sequence axis, and append a step's keys and values in place to
 * a past cache that is such a view and that no other tensor shares storage with,
 * instead of copying the whole past into a new present each step (what a decode
 * loop that feeds each present back as the next past wants). The presents may
 * then be non-contiguous views; no tensor a caller holds changes value (the rows
 * written lie beyond every view of that storage). kv_capacity: the rows per head
 * such a cache gets when one is made (the longest sequence the caller expects;
 * 0 or too few: twice the present length, at least 64).
 * no_arena: on the CPU a run places its intermediates at the offsets of the
 * graph's memory plan in one block (docs/GRAPH.md, "Memory plan"), once the same
 * dim values have run before; true allocates each one on its own instead (as
 * FATHOM_GRAPH_ARENA=0 does for every run). The outputs are the same either way. */
typedef struct fm_graph_run_options {
    bool kv_append;
    int64_t kv_capacity;
    bool no_arena;
    /* kv_dtype: FM_F32 (0: the caches in the graph's dtype) or FM_F16, with kv_append,
     * on the CPU, in a graph with attention_kv nodes (a compiled GPT or Llama): the
     * caches are made and kept in half precision (half the memory, and half the bytes
     * each decode step reads; llama.cpp's default), the presents come back f16, and
     * past inputs may be given f16 (as earlier presents) or f32 (converted). The
     * attention then runs over the f16 keys and values (fm_sdpa_kv16): outputs differ
     * from the f32 caches' by the f16 rounding of k and v (2^-11 relative). */
    fm_dtype kv_dtype;
} fm_graph_run_options;
FM_API fm_status fm_graph_run_ex(const fm_graph *g, fm_tensor *const *inputs, fm_tensor **outputs, const fm_graph_run_options *opt);
/* The same by name: any order of inputs, and only the outputs asked for. */
FM_API fm_status fm_graph_run_named(const fm_graph *g, int n_in, const char *const *in_names, fm_tensor *const *inputs,
                                    int n_out, const char *const *out_names, fm_tensor **outputs);

/* ---- producing graphs from models ---- */
struct fm_module;
struct fm_gpt;
/* Traces a module tree (a recipe model) on `example` ([batch, ...]): each layer
 * runs in evaluation mode and is recorded as its op, weights as constants named
 * as in the model's state; dim 0 becomes the dynamic dim "batch". The graph's
 * output on the example must equal the model's exactly. */
FM_API fm_graph *fm_graph_trace_module(struct fm_module *m, const fm_tensor *example);
/* The GPT with its KV cache as inputs and outputs (docs/GRAPH.md): tokens
 * [batch, seq] and past_key.<i>/past_value.<i> [batch, kv_heads, past, head_dim]
 * -> logits [batch, seq, vocab] and present_key.<i>/present_value.<i>. Checked
 * against the model's own forward on a prompt and a decode step (relative 1e-4). */
FM_API fm_graph *fm_graph_from_gpt(struct fm_gpt *m);
/* A graph from any model directory: a graph directory is loaded; a trained
 * recipe model is traced (batch dynamic); a trained GPT gives its KV-cache graph
 * (its tokenizer.txt goes with it). Anything else is refused, saying what was
 * expected. */
FM_API fm_graph *fm_graph_from_model_dir(const char *dir);
/* A file saved into the graph directory with the graph (copied from `path` at
 * fm_graph_save; name: a plain file name). fm_graph_load attaches tokenizer.txt. */
FM_API fm_status fm_graph_attach_file(fm_graph *g, const char *name, const char *path);

/* ---- compiling ---- */
/* Memory of one run at the planning sizes (dim hints; batch > 0 overrides the
 * dim "batch"): all node values summed (no reuse), the peak of live bytes
 * (freed after the last reader), and the arena a greedy offset plan needs, all
 * with the graph outputs counted in. What a CPU run takes: run_arena_bytes, the
 * block for the intermediates alone (outputs outlive the run, so they are not in
 * it), and output_bytes, the outputs allocated on their own. run_uses_arena: the
 * runner uses the block at these sizes (it does when the block plus the outputs
 * exceed the live peak by at most 1/8 of it or 1 MiB; else each value is allocated
 * on its own). */
typedef struct fm_memory_plan {
    int64_t batch;
    int n_values;
    size_t naive_bytes, live_peak_bytes, planned_bytes;
    size_t run_arena_bytes, output_bytes;
    bool run_uses_arena;
} fm_memory_plan;
FM_API fm_status fm_graph_plan_memory(const fm_graph *g, int64_t batch, fm_memory_plan *out);
typedef struct fm_compile_pass_report {
    char name[32];
    int nodes_before, nodes_after, consts_before, consts_after;
    double seconds;
    char note[256]; /* what the pass did, in words */
} fm_compile_pass_report;
typedef struct fm_compile_report {
    int n_passes;
    fm_compile_pass_report passes[24];
    double max_rel_diff; /* compiled vs input graph on random inputs (max |diff| / max |output|) */
    fm_memory_plan plan_before, plan_after;
} fm_compile_report;
/* One pass by name ("dce", "fold", "cse", "fuse-conv-bn", "fuse-add-layer-norm",
 * "fuse-bias-gelu"): a new graph, g unchanged; note (may be NULL) says what it did. */
FM_API fm_graph *fm_graph_pass(const fm_graph *g, const char *name, char *note, size_t n);
/* All passes in order; the result must match g within 1e-4 relative on random
 * inputs at the dim hints (else NULL and an error); rep says what each did. */
FM_API fm_graph *fm_graph_compile(const fm_graph *g, fm_compile_report *rep);
/* Runs both graphs (same inputs and outputs) on one set of random inputs at the
 * dim hints; *max_rel = max |a - b| / max |a| over the outputs. */
FM_API fm_status fm_graph_compare(const fm_graph *a, const fm_graph *b, double *max_rel);

/* ---- running graphs as the commands run models ---- */
struct fm_recipe;
struct fm_dataset;
struct fm_transforms;
struct fm_gpt_sample_params;
/* The recipe a classifier graph was traced from (its input shape, data set,
 * normalization); an error for other graphs. Free with fm_recipe_free. */
FM_API fm_status fm_graph_classifier_recipe(const fm_graph *g, struct fm_recipe *r);
/* One input in, the first output back (new reference), or NULL. */
FM_API fm_tensor *fm_graph_run1(const fm_graph *g, fm_tensor *x);
/* fm_evaluate for a classifier graph: accuracy and mean cross-entropy. */
FM_API fm_status fm_graph_evaluate(const fm_graph *g, struct fm_dataset *d, const struct fm_transforms *tf, int64_t batch_size,
                                   double *accuracy, double *loss, FILE *log);
/* A GPT graph's logits [B, T, V] for tokens [B, T] (i64 ids) with empty caches: the
 * forward of fm_gpt_forward, for evaluation. A new reference, or NULL. */
FM_API fm_tensor *fm_graph_gpt_forward(const fm_graph *g, fm_tensor *tokens);
/* fm_gpt_generate for a GPT graph: the prompt runs once (past = 0), then one
 * token per step with the presents fed back as the pasts. */
FM_API fm_status fm_graph_generate(const fm_graph *g, const int32_t *prompt, int n_prompt, int n_new,
                                   const struct fm_gpt_sample_params *p, int32_t *out, int *out_n, bool *hit_limit,
                                   int (*cb)(int token, void *ctx), void *ctx);
/* The same with the KV caches in kv_dtype: FM_F32 (fm_graph_generate's), or FM_F16
 * on the CPU for a compiled graph (attention_kv nodes): half the cache's memory and
 * reads, outputs within its rounding (fm_graph_run_options.kv_dtype). */
FM_API fm_status fm_graph_generate_ex(const fm_graph *g, const int32_t *prompt, int n_prompt, int n_new,
                                      const struct fm_gpt_sample_params *p, fm_dtype kv_dtype, int32_t *out, int *out_n,
                                      bool *hit_limit, int (*cb)(int token, void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
