/* fathom/nn.h: modules (layers) built on the differentiable ops.
 *
 * A module owns its parameters (leaf tensors that require grad) and buffers
 * (BatchNorm running statistics). Sequential containers name their children
 * by index, so parameters have dotted names as in PyTorch ("features.0.weight"
 * when a Sequential is itself a child named "features"), and a checkpoint
 * written by fathom loads into the same PyTorch model and back.
 *
 * A stack's shapes are checked before any data flows: fm_module_infer_shape()
 * walks the layers with an input shape and names the first layer that cannot
 * take what the previous one produces. */
#ifndef FATHOM_NN_H
#define FATHOM_NN_H
#include "fathom/export.h"
#include "fathom/ops.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fm_module_kind {
    FM_MOD_LINEAR = 0, FM_MOD_CONV2D, FM_MOD_BATCHNORM2D, FM_MOD_LAYERNORM, FM_MOD_RMSNORM,
    FM_MOD_EMBEDDING, FM_MOD_DROPOUT, FM_MOD_RELU, FM_MOD_GELU, FM_MOD_SILU, FM_MOD_TANH,
    FM_MOD_SIGMOID, FM_MOD_MAXPOOL2D, FM_MOD_AVGPOOL2D, FM_MOD_FLATTEN, FM_MOD_SEQUENTIAL,
    FM_MOD_MEANPOOL, /* [batch, tokens, dim] -> [batch, dim]: the mean over the tokens (x.mean(dim=1)) */
    FM_MOD_KIND_COUNT
} fm_module_kind;

typedef enum fm_init_kind {
    FM_INIT_DEFAULT = 0, /* PyTorch's defaults: Kaiming-uniform(a=sqrt 5) weights, U(+-1/sqrt fan_in) biases */
    FM_INIT_KAIMING,     /* Kaiming-normal for ReLU nets, zero biases */
    FM_INIT_XAVIER,      /* Xavier-uniform, zero biases */
    FM_INIT_NORMAL       /* N(0, 0.02), zero biases (transformer style) */
} fm_init_kind;

typedef struct fm_module fm_module;

/* A parameter or buffer with its dotted name (the name is owned by the list). */
typedef struct fm_named_tensor {
    char *name;
    fm_tensor *tensor; /* borrowed from the module (or owned, for loaded lists) */
    bool no_decay;     /* biases and normalization weights: excluded from weight decay */
    bool is_buffer;    /* running statistics: saved, never optimized */
} fm_named_tensor;

typedef struct fm_named_list {
    int n, cap;
    fm_named_tensor *items;
    bool owns_tensors; /* release the tensors too in fm_named_list_free */
} fm_named_list;
FM_API void fm_named_list_free(fm_named_list *l);
/* Appends (copies the name; retains the tensor when the list owns tensors). */
FM_API fm_status fm_named_list_push(fm_named_list *l, const char *name, fm_tensor *t, bool no_decay, bool is_buffer);
/* Index of `name`, or -1. */
FM_API int fm_named_list_find(const fm_named_list *l, const char *name);

/* ---- construction: every constructor returns NULL with fm_last_error() on bad sizes.
 * rng (may be NULL: the global generator) seeds the initial weights. ---- */
FM_API fm_module *fm_nn_linear(int64_t in_features, int64_t out_features, bool bias, fm_rng *rng);
FM_API fm_module *fm_nn_conv2d(int64_t in_ch, int64_t out_ch, int kernel, int stride, int padding, bool bias, fm_rng *rng);
FM_API fm_module *fm_nn_batchnorm2d(int64_t channels, double eps, double momentum);
FM_API fm_module *fm_nn_layernorm(int64_t dim, double eps);
FM_API fm_module *fm_nn_rmsnorm(int64_t dim, double eps);
FM_API fm_module *fm_nn_embedding(int64_t num, int64_t dim, fm_rng *rng);
/* rng: the generator masks are drawn from (NULL: the global one); borrowed. */
FM_API fm_module *fm_nn_dropout(double p, fm_rng *rng);
/* FM_MOD_RELU, GELU, SILU, TANH, SIGMOID, FLATTEN */
FM_API fm_module *fm_nn_simple(fm_module_kind kind);
FM_API fm_module *fm_nn_maxpool2d(int kernel, int stride, int padding);
FM_API fm_module *fm_nn_avgpool2d(int kernel, int stride, int padding);
FM_API fm_module *fm_nn_sequential(void);
/* Takes ownership of child (also on failure). */
FM_API fm_status fm_sequential_add(fm_module *seq, fm_module *child);
/* A named child instead of an index ("features"), for nested models. */
FM_API fm_status fm_sequential_add_named(fm_module *seq, const char *name, fm_module *child);

FM_API void fm_module_free(fm_module *m);

/* Short forms for small programs (the global generator seeds the weights):
 * fm_sequential(3, fm_linear_new(4, 16, true), fm_relu_new(), fm_linear_new(16, 2, true)).
 * fm_sequential takes ownership of its n children, also when it fails. */
FM_API fm_module *fm_sequential(int n, ...);
FM_API fm_module *fm_linear_new(int64_t in_features, int64_t out_features, bool bias);
FM_API fm_module *fm_relu_new(void);

/* ---- use ---- */
/* New reference to the output, or NULL. Records the tape when grad mode is on. */
FM_API fm_tensor *fm_module_forward(fm_module *m, fm_tensor *x);
/* Blocks of a sequential conv net: runs of layers ending in a pooling layer (0 for
 * anything else). fm_module_forward_blocks computes what fm_module_forward does,
 * with each block checkpointed when gradients are recorded (`fathom train
 * --checkpointing blocks`): only the blocks' inputs are kept, the rest is recomputed
 * in the backward, without a second update of batch norm's running statistics and
 * with the same dropout masks, so losses and gradients equal the plain forward's. */
FM_API int fm_module_num_blocks(const fm_module *m);
FM_API fm_tensor *fm_module_forward_blocks(fm_module *m, fm_tensor *x);
/* Training mode (batch statistics, dropout active) or evaluation mode; recursive. */
FM_API void fm_module_train(fm_module *m, bool training);
FM_API bool fm_module_is_training(const fm_module *m);
/* Moves every parameter (with its .grad) and buffer to dev, in place, as PyTorch's
 * module.to(device): tensors keep their identity, so move the model before making
 * its optimizer (whose state is made on the parameters' device). Fails before
 * moving anything when dev does not exist here (fm_device_validate says why). */
FM_API fm_status fm_module_to(fm_module *m, fm_device dev);
/* Drop every parameter's .grad. */
FM_API void fm_module_zero_grad(fm_module *m);
/* Parameters (requires_grad leaves) with dotted names, in registration order. */
FM_API fm_status fm_module_parameters(fm_module *m, fm_named_list *out);
/* Parameters and buffers: what a checkpoint holds (PyTorch's state_dict). */
FM_API fm_status fm_module_state(fm_module *m, fm_named_list *out);
FM_API int64_t fm_module_num_params(fm_module *m);
/* Re-initialize every weight with `kind` from rng (NULL: global). */
FM_API fm_status fm_module_init(fm_module *m, fm_init_kind kind, fm_rng *rng);
/* Point every Dropout in the tree at rng (borrowed). */
FM_API void fm_module_set_rng(fm_module *m, fm_rng *rng);

/* Shape inference: the output shape for an input of shape in (batch dim included).
 * On a mismatch the error names the layer ("layer 3 (linear 784->10)") and the
 * shapes, so a bad stack is reported when it is built, not mid-training. */
FM_API fm_status fm_module_infer_shape(const fm_module *m, int ndim, const int64_t *in, int *out_ndim, int64_t *out);

FM_API fm_module_kind fm_module_get_kind(const fm_module *m);
/* A layer's hyperparameters (what fm_module_describe prints, plus eps): for
 * graph export. Fields a kind does not use are 0. */
typedef struct fm_module_hparams {
    int64_t a, b;          /* in/out features, channels, num/dim */
    int kernel, stride, padding;
    double eps, momentum, p;
} fm_module_hparams;
FM_API fm_module_hparams fm_module_get_hparams(const fm_module *m);
/* "linear 784->10", "conv2d 1->32 k3 s1 p1", ... */
FM_API const char *fm_module_describe(const fm_module *m, char *buf, size_t n);
FM_API int fm_module_num_children(const fm_module *m);
FM_API fm_module *fm_module_child(const fm_module *m, int i);
/* The name child i has in parameter names ("0", "features"); NULL if no such child. */
FM_API const char *fm_module_child_name(const fm_module *m, int i);

/* Initializers (in place, no tape). fan_in/fan_out are computed from the shape
 * ([out, in, ...] layout); gain as in torch.nn.init. */
FM_API fm_status fm_init_kaiming_normal_(fm_tensor *w, double gain, fm_rng *rng);
FM_API fm_status fm_init_kaiming_uniform_(fm_tensor *w, double gain, fm_rng *rng);
FM_API fm_status fm_init_xavier_uniform_(fm_tensor *w, double gain, fm_rng *rng);
FM_API fm_status fm_init_normal_(fm_tensor *w, double mean, double std, fm_rng *rng);

#ifdef __cplusplus
}
#endif
#endif
