/* onnx_internal.h: the ONNX importer's pieces.
 *
 *   onnx_file.c    file -> protobuf-c message (nesting depth bounded first, since
 *                  protobuf-c recurses once per nested message)
 *   onnx_tensor.c  TensorProto -> fm_tensor (typed fields, raw_data, external data)
 *   onnx_model.c   ModelProto -> fm_onnx_model: value slots, initializers, the
 *                  declared-shape checks, every node checked against the op table
 *   onnx_run.c     runs the nodes in order on fm tensors, freeing each value after
 *                  its last use
 *   onnx_ops_*.c   the ops: each a function on an onnx_op_ctx, listed in its
 *                  family's table with its opset range and attributes; _host.c
 *                  computes on the host what fathom has no kernel for; _seq.c the
 *                  sequence and optional values and their ops */
#ifndef FATHOM_ONNX_INTERNAL_H
#define FATHOM_ONNX_INTERNAL_H
#include <onnx.pb-c.h>
#include <stdbool.h>
#include <stdint.h>

#include "fathom/graph.h"
#include "fathom/onnx.h"
#include "fathom/ops.h"

/* Deepest message nesting accepted (subgraphs in attributes nest; real models stay
 * far below this). */
#define ONNX_MAX_DEPTH 64

/* ---- decoding (onnx_file.c) ---- */
/* Unpacks `data` as message `desc`; errors name `what` (the file). */
ProtobufCMessage *onnx_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t n,
                              const char *what);
/* FM_OK when the wire data nests messages at most ONNX_MAX_DEPTH deep. */
fm_status onnx_check_depth(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t n,
                           const char *what);

/* ---- tensors (onnx_tensor.c) ---- */
/* ONNX TensorProto.DataType -> fm dtype; false for types fathom lacks. */
bool onnx_dtype_to_fm(int32_t onnx_type, fm_dtype *out);
int32_t onnx_dtype_from_fm(fm_dtype dt);
const char *onnx_dtype_name(int32_t onnx_type);
/* A new CPU tensor holding `tp`. `dir` is the model's directory (external data
 * is looked up there; NULL refuses external data); `what` names the tensor in
 * errors. */
fm_tensor *onnx_tensor_from_proto(const Onnx__TensorProto *tp, const char *dir, const char *what);

/* ---- sequence and optional values (onnx_ops_seq.c) ----
 * The ONNX values that are not tensors: a sequence of tensors, and an optional that is
 * empty or holds a tensor or a sequence. They flow through the same value slots as
 * tensors, in an array beside the tensors' (a slot holds a tensor or a value, never
 * both), allocated only for models that can make one (onnx_op_makes_values, or a graph
 * input declared as one). A value is immutable once made and refcounted as tensors are
 * (not atomically: a value lives in one run); it is released after its last reader as a
 * tensor is. Only the ops that take them (onnx_op_takes_values: the sequence and
 * optional ops, Identity, If, Loop) see them, through onnx_op_ctx.xin and xout; a node of
 * any other op given one fails naming the input. */
typedef enum { ONNX_TENSOR, ONNX_SEQ, ONNX_OPT } onnx_kind;
typedef struct onnx_value {
    int refs;
    onnx_kind kind;       /* ONNX_SEQ or ONNX_OPT */
    fm_dtype dtype;       /* seq: its tensors' dtype, when typed */
    bool typed;           /* seq: dtype is known (SequenceEmpty's dtype, or its first tensor's) */
    int n, cap;           /* seq: its tensors, in order */
    fm_tensor **items;
    fm_tensor *t;         /* opt: the tensor it holds, or NULL */
    struct onnx_value *v; /* opt: the sequence it holds, or NULL (both NULL: an empty optional) */
} onnx_value;
/* An empty sequence (of dtype dt when typed), room for cap tensors; NULL with the error set. */
onnx_value *onnx_seq_new(fm_dtype dt, bool typed, int cap);
/* Appends t, taking its reference (released on an error too); the sequence's dtype
 * when untyped, else t must have it. */
fm_status onnx_seq_push(onnx_value *s, fm_tensor *t);
/* An optional holding t or v (NULL, NULL: empty), taking their references. */
onnx_value *onnx_opt_new(fm_tensor *t, onnx_value *v);
onnx_value *onnx_value_retain(onnx_value *v);
void onnx_value_release(onnx_value *v);
/* "a sequence", "an empty optional", "an optional" (for messages). */
const char *onnx_value_what(const onnx_value *v);
/* The device of v's first tensor (false: it holds none). */
bool onnx_value_device(const onnx_value *v, fm_device *dev);
/* v with every tensor on dev (a new reference; v's own when they all are there). */
onnx_value *onnx_value_to(onnx_value *v, fm_device dev);

/* ---- the model (onnx_model.c) ---- */
typedef struct onnx_node {
    const Onnx__NodeProto *proto;
    const struct onnx_op *op;
    int *in, *out; /* value slots; -1: an omitted optional input/output */
    int n_in, n_out;
    int *imp, n_imp;              /* the values of this graph its subgraphs read (If, Loop, Scan bodies) */
    struct fm_onnx_model **subs;  /* per attribute: the subgraph of a GRAPH attribute, else NULL (NULL: none) */
    bool values;                  /* its op takes or gives sequences and optionals (onnx_op_takes_values) */
} onnx_node;

typedef struct onnx_input {
    int slot;
    onnx_kind kind;    /* declared a tensor (or not declared), a sequence or an optional */
    int32_t item_type; /* a sequence's or optional's tensors' element type (0: not declared) */
    int32_t elem_type; /* a tensor's; 0: not declared (and for a sequence or optional) */
    int ndim;          /* -1: rank not declared */
    int64_t dims[FM_MAX_DIMS]; /* -1: symbolic or unknown */
} onnx_input;

struct fm_onnx_model {
    char *path;  /* as given, for errors (a subgraph's: its node and attribute appended) */
    char *dir;   /* its directory: external data is read from here */
    Onnx__ModelProto *proto; /* NULL in a subgraph (its model owns the messages) */
    const Onnx__GraphProto *graph; /* proto->graph, or the subgraph's */
    int opset;
    int *cap_local, *cap_outer, n_cap; /* a subgraph's values from the enclosing graph: its slot, the slot there */
    struct fm_onnx_model *root; /* the model loaded from the file (itself there) */
    int64_t max_iterations;     /* the root's: fm_onnx_set_max_iterations (0: no limit) */
    bool has_values;            /* the root's: an op that makes sequences or optionals, or a graph input declared as
                                   one, is somewhere in it (its runs keep a slot array for them) */
    int n_values;
    char **value_names;      /* borrowed from proto */
    fm_tensor **constants;   /* per slot: initializer, or NULL */
    fm_tensor **dev_constants; /* the constants on dev_of (made by the first run there), or NULL */
    fm_device dev_of;
    int *last_use;           /* per slot: index of the last node reading it (-1: none; n_nodes: an output) */
    onnx_node *nodes;
    int n_nodes;
    onnx_input *inputs;
    int n_inputs;
    int *outputs;
    onnx_input *out_decl; /* per output: its declared type (slot unused) */
    int n_outputs;
    char fixed_dims[16][64]; /* fm_onnx_set_dim: dynamic dims given a size for the graph form */
    int64_t fixed_sizes[16];
    int n_fixed;
};

/* ---- running (onnx_run.c) ---- */
/* fm_onnx_run; with keep non-NULL, keep[slot] also receives a reference to every
 * value computed (constants and inputs included), for the graph import. */
fm_status onnx_execute(fm_onnx_model *m, int n_inputs, const char *const *names, fm_tensor *const *inputs,
                       fm_tensor **outputs, fm_tensor **keep);
/* fm_onnx_run with sequence and optional values (the conformance runner's entry point):
 * input i is inputs[i] or, where that is NULL, xinputs[i] (either array may be NULL: all
 * of the other kind); output i comes in outputs[i] when it is a tensor, else in xoutputs[i]
 * (a new reference; the other NULL). fm_onnx_run is this with xinputs and xoutputs NULL:
 * a model that declares a sequence or optional input or output is refused there. */
fm_status onnx_execute_values(fm_onnx_model *m, int n_inputs, const char *const *names, fm_tensor *const *inputs,
                              onnx_value *const *xinputs, fm_tensor **outputs, onnx_value **xoutputs);

/* ---- the graph form (onnx_graph.c, onnx_graph_ops.c) ---- */
#define ONNX_GRAPH_MAX_SYMS 16
typedef struct onnx_graph_ctx {
    fm_onnx_model *m;
    fm_graph *g;
    fm_tensor **va, **vb;     /* every value, with the dynamic dims at probe a and b */
    fm_tensor **vc;           /* the same at a third probe (NULL: no dynamic dims, or that run failed) */
    bool *folded;             /* computed from constants: a graph constant */
    bool *shape_like;         /* computed from shapes only, but follows a dynamic dim */
    bool *emitted;            /* already a graph input or constant */
    int *gelu_in;             /* per node: the slot of x where the node ends a GELU (onnx_graph_fuse.c), else -1 */
    bool *gelu_tanh;          /* per node: that GELU is the tanh form */
    bool *skip;               /* per node: inside such a GELU (or a dynamic int8 pattern), not emitted */
    int *dyn_out, *dyn_scale; /* per MatMulInteger node of onnx_graph_match_dynamic_int8: the pattern's output slot
                                 and the weight scale's slot, else -1 */
    char syms[ONNX_GRAPH_MAX_SYMS][64];
    int n_syms, tmp;
} onnx_graph_ctx;
fm_status onnx_graph_translate(onnx_graph_ctx *x, int node);
/* Dynamic dim k's size at probe p (0: a, 1: b, 2: the third run): sizes no fixed dim is
 * likely to equal, from which a size computed from the dims is read back (onnx_graph_ops.c). */
static inline int64_t onnx_probe_size(int k, int p) { return p == 0 ? 3 + 2 * k : p == 1 ? 4 + 3 * k : 2 + 7 * k; }
bool onnx_graph_shape_input_ok(const char *op, int input);
/* Value slot, computed from shapes only and one of the dynamic dims' sizes (a scalar), as a
 * dim_size node reading that dim of a graph input, so that data ops can read it. */
fm_status onnx_graph_materialize(onnx_graph_ctx *x, int slot);
fm_status onnx_graph_const(onnx_graph_ctx *x, int slot);
/* Finds the exported erf GELU, x * 0.5 * (1 + Erf(x / sqrt 2)), and the tanh one,
 * x * 0.5 * (1 + Tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in their usual orders, and
 * marks each for one graph `gelu` or `gelu_tanh` (gelu_in, gelu_tanh, skip); needs `folded`. */
fm_status onnx_graph_match_gelu(onnx_graph_ctx *x);
/* Finds what ONNX Runtime's quantize_dynamic writes around a MatMul: DynamicQuantizeLinear(x)
 * -> MatMulInteger(q, Wq int8 constant, zp) -> Cast(float) -> Mul by (x_scale * w_scale), and
 * marks it for one dynamic qlinear_int8 at the MatMulInteger (dyn_out, dyn_scale; the rest
 * skipped, the DynamicQuantizeLinear too when every reader is such a pattern); needs `folded`. */
fm_status onnx_graph_match_dynamic_int8(onnx_graph_ctx *x);

/* ---- ops (onnx_ops*.c) ---- */
typedef struct onnx_op_ctx {
    const fm_onnx_model *model;
    const Onnx__NodeProto *node;
    int opset;
    int n_in, n_out;
    fm_tensor **in;  /* NULL where an optional input is omitted */
    fm_tensor **out; /* the op sets each one it produces (new references) */
    fm_tensor **scope;  /* the running graph's values: what its subgraphs capture (NULL outside a run) */
    /* Sequences and optionals, for the ops that take them (onnx_node.values; NULL for the others):
     * xin[k] is input k where it is one (in[k] NULL then); the op sets xout[k] (a new reference)
     * instead of out[k] for such a result; xscope is the running graph's values of that kind
     * (NULL when the model makes none). */
    onnx_value **xin, **xout, **xscope;
    fm_device dev;      /* the device the graph runs on */
    struct fm_onnx_model *const *subs; /* per attribute: its subgraph (onnx_node.subs) */
} onnx_op_ctx;

typedef fm_status (*onnx_op_fn)(onnx_op_ctx *c);

typedef struct onnx_op {
    const char *name;
    int min_opset;      /* the earliest opset whose semantics the function implements */
    int min_in, max_in; /* max_in -1: variadic */
    int max_out;
    const char *attrs;  /* the attributes it reads, comma-separated */
    onnx_op_fn fn;
} onnx_op;

/* Runs the subgraph of the attribute `attr` of c's node (If's branches, Loop's and Scan's body) on
 * c's device: in[] are its inputs in order (n_in of them), out[] receives its n_outputs outputs
 * (new references); the values it reads from the enclosing graphs come from c->scope. */
fm_onnx_model *onnx_subgraph(const onnx_op_ctx *c, const char *attr);
fm_status onnx_run_subgraph(const onnx_op_ctx *c, fm_onnx_model *sub, int n_in, fm_tensor *const *in, fm_tensor **out);
/* The same with sequence and optional values: input i is in[i] or, where that is NULL,
 * xin[i]; output i comes in out[i] or xout[i] (xin, xout may be NULL: tensors only, and a
 * subgraph giving a value then fails naming it). */
fm_status onnx_run_subgraph_values(const onnx_op_ctx *c, fm_onnx_model *sub, int n_in, fm_tensor *const *in,
                                   onnx_value *const *xin, fm_tensor **out, onnx_value **xout);
/* The sequence and optional ops (onnx_ops_seq.c) make such values; they, Identity, If and
 * Loop take them (and pass them on). */
bool onnx_op_makes_values(const onnx_op *op);
bool onnx_op_takes_values(const onnx_op *op);

const onnx_op *onnx_find_op(const char *name);
/* The op of a node's domain: the default one ("", "ai.onnx") or "ai.onnx.preview"
 * (onnx_ops_preview); NULL for others and for names neither lists. */
const onnx_op *onnx_find_op_domain(const char *domain, const char *name);
/* The op lists of each family (NULL-name terminated), joined by onnx_find_op. */
extern const onnx_op onnx_ops_math[], onnx_ops_nn[], onnx_ops_shape[], onnx_ops_host[], onnx_ops_resize[], onnx_ops_quant[],
    onnx_ops_rnn[], onnx_ops_loss[], onnx_ops_misc[], onnx_ops_dyn[], onnx_ops_signal[], onnx_ops_sample[], onnx_ops_attn[], onnx_ops_extra[],
    onnx_ops_flow[], onnx_ops_linattn[], onnx_ops_more[], onnx_ops_seq[], onnx_ops_preview[];

/* DepthToSpace / SpaceToDepth of an [N, C, H, W] x: reshape to mid, permute, reshape to out
 * (onnx_ops_misc.c; the interpreter and the graph form). */
typedef struct onnx_space_depth { int64_t mid[6]; int perm[6]; int64_t out[4]; } onnx_space_depth;
fm_status onnx_space_depth_plan(const onnx_op_ctx *c, const int64_t *xs, onnx_space_depth *p);
/* Einsum (onnx_einsum.c): the equation parsed into labels per operand dim ('a'..'z',
 * 'A'..'Z'; the ellipsis' dims 128 + i, right-aligned) and the output's, then run as steps
 * through an executor: fathom ops for the interpreter, graph nodes for the graph form.
 * Handles are the executor's (tensors, value names); each step returns a new handle. */
#define ONNX_EINSUM_MAX_IN 8
typedef struct onnx_einsum { int n_in, nd[ONNX_EINSUM_MAX_IN], lab[ONNX_EINSUM_MAX_IN][FM_MAX_DIMS], nout, out[FM_MAX_DIMS]; } onnx_einsum;
typedef struct onnx_einsum_exec {
    void *ctx;
    void *(*retain)(void *ctx, void *h);
    void (*release)(void *ctx, void *h);
    void *(*permute)(void *ctx, void *h, int nd, const int *perm);
    /* h (nd dims of sizes sz) to n dims sh; the first nkeep dims are h's own (dynamic ones may be among them) */
    void *(*reshape)(void *ctx, void *h, int nd, const int64_t *sz, int n, const int64_t *sh, int nkeep);
    void *(*sum)(void *ctx, void *h, int nd, const int64_t *sz, int n, const int *axes);
    void *(*matmul)(void *ctx, void *a, void *b);
    void *(*expand)(void *ctx, void *h, int nd, const int64_t *sz, const int64_t *want);
    void *(*diag)(void *ctx, void *h, int nd, const int64_t *sz, int64_t n); /* last two dims (n, n) to (n) */
} onnx_einsum_exec;
fm_status onnx_einsum_parse(const char *eq, int n_in, const int *ranks, onnx_einsum *p);
/* The result's handle, or NULL with the error set; shapes[i]: operand i's sizes. */
void *onnx_einsum_run(const onnx_einsum *p, const onnx_einsum_exec *x, void *const *in, const int64_t *const *shapes);
fm_status onnx_op_einsum(onnx_op_ctx *c);
/* GatherND's ranks, batch_dims and the batch dims' sizes checked (data rank r, indices rank q). */
fm_status onnx_gather_nd_check(const onnx_op_ctx *c, int r, const int64_t *ds, int q, const int64_t *is, int b);

/* host computation (onnx_ops_host.c), for ops with no fathom kernel */
/* x as a new contiguous CPU tensor of dtype dt. */
fm_tensor *onnx_host(fm_tensor *x, fm_dtype dt);
/* y (CPU) converted to dt on dev; takes y's reference (NULL passes through). */
fm_tensor *onnx_host_back(fm_tensor *y, fm_dtype dt, fm_device dev);
/* ScatterElements' and ScatterND's reduction attribute (none, add, mul, max, min) as fathom's. */
fm_status onnx_scatter_reduction(onnx_op_ctx *c, fm_scatter_reduce *r);

/* attributes (onnx_attrs.c) */
const Onnx__AttributeProto *onnx_attr(const onnx_op_ctx *c, const char *name);
int64_t onnx_attr_int(const onnx_op_ctx *c, const char *name, int64_t dflt);
float onnx_attr_float(const onnx_op_ctx *c, const char *name, float dflt);
/* The ints of an INTS attribute (NULL and *n = 0 when absent). */
const int64_t *onnx_attr_ints(const onnx_op_ctx *c, const char *name, int *n);
/* The string of a STRING attribute, NUL-terminated into buf (dflt when absent). */
const char *onnx_attr_string(const onnx_op_ctx *c, const char *name, const char *dflt, char *buf, size_t n);
/* An integer tensor input's values (at most max); FM_ERR_INVALID naming the input. */
fm_status onnx_tensor_ints(const onnx_op_ctx *c, int input, int64_t *vals, int max, int *n);
/* TopK's k, from the attribute (opset < 10) or the input (onnx_ops_math.c). */
fm_status onnx_topk_k(onnx_op_ctx *c, int64_t *k);
/* Records an error naming the node; returns `st`. */
fm_status onnx_node_error(const onnx_op_ctx *c, fm_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The spatial geometry of a Conv/ConvTranspose/pool node (the interpreter's, and the
 * graph form's): kernel (kernel_shape, else kshape, the weight's spatial dims),
 * strides, dilations and (begin, end) pads per spatial dim, auto_pad resolved on x's
 * sizes. Errors (named for the node): 0 or more than 3 spatial dims, non-positive
 * kernel/stride/dilation, negative pads, an unknown auto_pad. */
#define ONNX_MAX_SPATIAL 3
typedef struct onnx_window {
    int nsp;
    int64_t k[ONNX_MAX_SPATIAL], s[ONNX_MAX_SPATIAL], d[ONNX_MAX_SPATIAL], pb[ONNX_MAX_SPATIAL], pe[ONNX_MAX_SPATIAL];
} onnx_window;
fm_status onnx_window_of(const onnx_op_ctx *c, const fm_tensor *x, const int64_t *kshape, onnx_window *w);
/* out[0] = t, or the last error when t is NULL. */
fm_status onnx_set_out(onnx_op_ctx *c, int i, fm_tensor *t);
/* Pad's mode, its pads as fm_pad takes them for an ndim-dim input (all: 2 ndim values) and
 * its constant, from either opset's form (onnx_ops_shape.c; the interpreter and the graph form). */
fm_status onnx_pad_args(const onnx_op_ctx *c, int ndim, int64_t *all, fm_pad_mode *mode, double *value);
/* ConvTranspose (1 or 2 spatial dims) as fm_conv_transpose2d's parameters and output padding
 * (1-D: the second of the two dims), then the crop (begin, end per dim) of its uneven pads,
 * negative where the pads add zeros (extends: an output_shape beyond the full size)
 * (onnx_ops_nn.c; the interpreter and the graph form). */
typedef struct onnx_convt { fm_conv2d_params p; int op[2]; int64_t crop_b[2], crop_e[2]; int nsp; bool extends; } onnx_convt;
fm_status onnx_convt_geom(const onnx_op_ctx *c, const fm_tensor *x, const fm_tensor *wt, onnx_convt *g);
/* Resize (and Upsample) as the graph form builds it (onnx_ops_resize.c): per axis that changes,
 * n taps per output position, output o's k-th tap reading source index idx[o n + k] with weight
 * w[o n + k] (malloc'd: the caller frees idx and w of every entry, also on an error). */
typedef struct onnx_resize_axis { int ax, n; int64_t in, out; int64_t *idx; double *w; } onnx_resize_axis;
fm_status onnx_resize_plan(onnx_op_ctx *c, const fm_tensor *x, onnx_resize_axis *axes, int *n_axes);
/* Attention and RotaryEmbedding as the interpreter checks them (onnx_ops_attn.c; the
 * interpreter and the graph form). Attention: sizes as [batch, heads, seq, head_size] (3-D
 * inputs split by q_num_heads / kv_num_heads), past the past's length (0: none given), total =
 * past + K's; scale 0: 1 / sqrt(d); wt the math's dtype, sm_dt the softmax's; mode the
 * qk_matmul_output_mode. RotaryEmbedding: batch, seq, heads, head size, rotated dims (rd). */
typedef struct onnx_attn_plan {
    int64_t b, hq, hkv, sq, skv, past, total, d, dv;
    bool rank3, causal, want_qk, has_past, has_mask, has_nonpad;
    double scale, softcap;
    int mode;
    fm_dtype wt, sm_dt;
} onnx_attn_plan;
fm_status onnx_attention_plan(onnx_op_ctx *c, onnx_attn_plan *p);
typedef struct onnx_rope_plan { int64_t b, s, h, d, rd; bool rank3, interleaved; } onnx_rope_plan;
fm_status onnx_rope_check(onnx_op_ctx *c, onnx_rope_plan *r);

#endif
