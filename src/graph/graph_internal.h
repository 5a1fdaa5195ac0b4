/* graph_internal.h: the inference graph's data model (fathom/graph.h is the
 * public face), shared by the builder (graph.c), the op table (graph_ops*.c),
 * shape inference (graph_check.c), the files (graph_io.c) and the runner
 * (graph_run.c). */
#ifndef FATHOM_GRAPH_INTERNAL_H
#define FATHOM_GRAPH_INTERNAL_H
#include <stdint.h>

#include "fathom/graph.h"
#include "fathom/io.h"

#define G_MAX_SYMS 16

/* One element of an INTS attribute: a number, or a dim expression over the
 * graph's dynamic dims ("batch*seq"). */
typedef struct gdim { int64_t v; char *expr; } gdim;

typedef struct gattr {
    char *name;
    fm_graph_attr_type type;
    int64_t i;
    double f;
    char *s;
    int n;
    gdim *ints;
    double *floats;
} gattr;

typedef enum { GV_INPUT = 0, GV_CONST, GV_NODE } gv_kind;

/* A dtype and shape as shape inference sees them (ndim < 0: an absent input). */
typedef struct gtype { fm_dtype dt; int ndim; int64_t d[FM_MAX_DIMS]; } gtype;

typedef struct gvalue {
    char *name;
    gv_kind kind;
    int producer;             /* node index (GV_NODE) */
    gtype t;                  /* with the dynamic dims at their probe sizes */
    int64_t probe2[FM_MAX_DIMS]; /* the same with every probe plus one: dims that differ are dynamic */
    int sym[FM_MAX_DIMS];     /* inputs: the dynamic dims' symbol ids (-1: fixed) */
    bool typed;               /* t is known (inputs, constants, inferred outputs) */
    fm_tensor *tensor;        /* GV_CONST: the weight (on the graph's device) */
    int last_use;             /* index of the last node reading it (-1: none) */
    bool is_output;
    char *decl_shape;         /* from graph.json: the shape the file declares, checked after inference */
} gvalue;

typedef struct gnode {
    char *op, *name;
    int spec;                 /* index in the op table (graph_ops.c) */
    int n_in, n_out;
    int *in, *out;            /* value indices; in[i] < 0: absent optional input */
    int n_attrs;
    gattr *attrs;
} gnode;

typedef struct gsym { char *name; int64_t hint; } gsym;

typedef struct g_plan_cache g_plan_cache;

struct fm_graph {
    int n_values, cap_values;
    gvalue *values;
    int n_nodes, cap_nodes;
    gnode *nodes;
    int n_inputs, n_outputs, cap_inputs, cap_outputs;
    int *inputs, *outputs;    /* value indices */
    int n_syms;
    gsym syms[G_MAX_SYMS];
    fm_kv_list meta;
    fm_device device;
    bool validated;
    /* files saved with the graph (fm_graph_attach_file): names and source paths */
    int n_files;
    char *file_name[4], *file_path[4];
    /* name -> value index, open addressing (cap_hash a power of two, -1 empty) */
    int *hash;
    int cap_hash;
    /* per node, what a run reuses (g_prepare at validation and fm_graph_to_device):
     * conv2d_fused's and linear_fused's packed constant weights; NULL or n_prep entries */
    fm_tensor **prep;
    int n_prep;
    /* CPU graphs: the runner's memory plans by dim values (graph_arena.c), made at g_prepare */
    g_plan_cache *plans;
};

/* ---- graph_compile.c: the memory plan ---- */
/* One node value's bytes (size: rounded up to 64; bytes: exact), its arena offset
 * once placed, and its lifetime in node indices (graph outputs: to the end); out:
 * a graph output holds it (it is one, or one is a view of it). */
typedef struct g_span { int64_t size, off, bytes; int first, last, v; bool out; } g_span;
/* The node values' spans at these dim values (sp has room for n_values; with_outputs
 * false leaves out the values graph outputs hold); their count, or -1 (error set).
 * The output of a view op (g_op_is_view) has no span: it lives in its input's
 * memory, whose span lasts as long as the view does. all_bytes (NULL, or room for
 * n_values): every value's exact bytes at these dim values, spans or not. */
int g_plan_spans(const fm_graph *g, const int64_t *vals, bool with_outputs, g_span *sp, int64_t *all_bytes);
/* fm_graph_plan_memory at these dim values. */
fm_status g_plan_memory_at(const fm_graph *g, const int64_t *vals, fm_memory_plan *out);
/* Offsets in one arena, greedily, largest first, each at the lowest offset clear of
 * every placed value alive at the same time (sorts sp); the arena's bytes, or -1. */
int64_t g_plan_place(g_span *sp, int n);

/* ---- graph_arena.c: the runner's arena ---- */
typedef struct g_arena_run g_arena_run;
g_plan_cache *g_plan_cache_new(void);
void g_plan_cache_free(g_plan_cache *c);
/* The run's arena at these dim values, or NULL: none for this run (not planned yet:
 * a shape gets its plan the second time it runs; or the plan failed, its error cleared). */
g_arena_run *g_arena_begin(const fm_graph *g, const int64_t *syms);
/* Offers node i's planned outputs their places (the calling thread's storage slots)
 * around its run; g_arena_node_end takes them back. */
void g_arena_node_begin(g_arena_run *r, const gnode *n);
void g_arena_node_end(g_arena_run *r);
void g_arena_end(g_arena_run *r);
/* Whether s is a place in some run's arena (a graph output there is copied out). */
bool g_arena_owns(const fm_storage *s);

/* ---- graph_run.c ---- */
/* Makes what runs on the graph's device reuse (prep), after validation; frees it. */
fm_status g_prepare(fm_graph *g);
void g_unprepare(fm_graph *g);

/* ---- graph.c ---- */
int g_find_value(const fm_graph *g, const char *name);
int g_find_sym(const fm_graph *g, const char *name);
/* Adds a symbol (dynamic dim name) if new; returns its id or -1 (error set). */
int g_add_sym(fm_graph *g, const char *name);
/* A new value named `name` (unique); returns its index or -1 (error set). */
int g_new_value(fm_graph *g, const char *name, gv_kind kind);
bool g_is_ident(const char *s);
const gattr *g_node_attr(const gnode *n, const char *name);
/* An integer attribute of n, def when absent or not an integer (the passes' reads) */
int64_t g_node_int(const gnode *n, const char *name, int64_t def);
/* Whether the comma-separated list holds name as one of its items ("a,b,c"; NULL: empty). */
bool g_list_has(const char *list, const char *name);
/* A conv node with stride 1, dilation 1, one group and NCHW: the geometry of the CPU's
 * direct conv2d_fused kernels (lanes, Winograd), which read packed weights. */
bool g_conv_direct_geometry(const gnode *n);

/* ---- dim expressions (graph_expr.c) ---- */
/* Checks syntax and that every name is a symbol of g. */
fm_status g_expr_check(const fm_graph *g, const char *expr);
/* Evaluates with symbol values vals[sym id]. */
fm_status g_expr_eval(const fm_graph *g, const char *expr, const int64_t *vals, int64_t *out);

/* Devices that run the CPU's kernels (the CPU, the checked device, the meta device's
 * accounting of them): the fused and packed graph kernels run there; elsewhere unfused. */
static inline bool g_cpu_kernels(fm_device_type t) { return t == FM_DEV_CPU || t == FM_DEV_CHECK || t == FM_DEV_META; }

/* ---- the op table (graph_ops.c) ---- */
/* What an op's rules see: the node, the graph (for expressions) and the
 * current symbol values. */
typedef struct gctx { const fm_graph *g; const gnode *n; const int64_t *syms; const fm_graph_run_options *opt; /* NULL: defaults */ } gctx;
/* The in-place KV cache (fm_graph_run_options.kv_append, graph_ops_attn.c):
 * whether this run wants it (and the graph is on the CPU), and present = past ++ x
 * along axis 2 of [B, KV, P, D], appended in place when past allows. */
bool g_kv_append_on(const gctx *c);
bool g_kv16_on(const gctx *c);
fm_tensor *g_kv_append(const gctx *c, fm_tensor *past, fm_tensor *x, fm_dtype dt);
typedef fm_status (*g_infer_fn)(const gctx *c, const gtype *in, gtype *out);
typedef fm_status (*g_run_fn)(const gctx *c, fm_tensor *const *in, fm_tensor **out);
typedef struct g_op_spec {
    const char *name;
    int min_in, max_in, n_out;
    const char *attrs;        /* the attribute names it accepts, comma-separated */
    g_infer_fn infer;
    g_run_fn run;
    void (*fn)(void);         /* the front end, for the rules shared by a family */
} g_op_spec;
/* The families' rules (graph_ops.c, graph_ops_nn.c, graph_ops_shape.c, graph_ops_quant.c). */
extern const g_op_spec g_ops_core[], g_ops_nn[], g_ops_shape[], g_ops_quant[], g_ops_attn[];
extern const int g_n_ops_core, g_n_ops_nn, g_n_ops_shape, g_n_ops_quant, g_n_ops_attn;
/* Sets an error naming the shape: "got [2, 3]" helpers. */
const char *g_tshape(const gtype *t, char *buf, size_t n);
fm_status g_norm_axis(int64_t axis, int ndim, int *out);
/* Index of op `name`, or -1. */
int g_op_find(const char *name);
/* Whether op's output is a view of its input 0 (no memory of its own) when the input allows:
 * the shape ops (reshape, permute, transpose, slice, squeeze, unsqueeze, flatten, expand)
 * and the identities (identity, dropout). */
bool g_op_is_view(const char *op);
/* Whether op is a one-input elementwise op (neg, exp, relu, gelu, clamp, ...: the table's
 * unary entries), whose output element i depends on input element i alone. */
bool g_op_is_pointwise(const char *op);
const g_op_spec *g_op_spec_at(int i);
int g_op_count(void);

/* Attribute readers for the rules: a missing attribute gives `def`; a wrong
 * type is an error naming the node. */
fm_status ga_int(const gctx *c, const char *name, int64_t def, int64_t *out);
fm_status ga_float(const gctx *c, const char *name, double def, double *out);
/* a (may be NULL: def) as a number: a float, an int, or the strings inf, -inf and nan that graph.json writes for them */
fm_status g_attr_float(const gattr *a, const char *name, double def, double *out);
/* INTS with expressions evaluated; *n = -1 when absent. max: capacity of out. */
fm_status ga_ints(const gctx *c, const char *name, int64_t *out, int *n, int max);
const char *ga_string(const gctx *c, const char *name, const char *def);
/* A linear_fused node's activation ("relu", an fm_linear_fused_act name) or NULL, checked. */
fm_status g_linear_fused_act(const gnode *n, const char **act);
/* conv2d's attributes (stride, padding, dilation, groups, layout) and its shape rule
 * (in = {x, w, bias}), for the ops that take a convolution's geometry (qconv2d_int8) */
fm_status g_conv_params(const gctx *c, fm_conv2d_params *p);
fm_status g_inf_conv2d(const gctx *c, const gtype *in, gtype *out);

/* ---- checking (graph_check.c) ---- */
/* Shape inference over all nodes with symbols at vals; fills value types (and
 * probe2 when `second`). */
fm_status g_infer_all(fm_graph *g, const int64_t *vals, bool second);
/* The same into types[] (one per value), leaving the graph as it is. */
fm_status g_infer_types(const fm_graph *g, const int64_t *vals, gtype *types);
/* Node context for errors: "node 'fc1' (linear)". */
const char *g_node_label(const gnode *n, char *buf, size_t size);
/* Writes a value's shape as JSON-style text ("[\"batch\", 10]") into buf. */
const char *g_shape_text(const fm_graph *g, const gvalue *v, char *buf, size_t size);
#endif
