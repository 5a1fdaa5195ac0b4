/* Shared by the pruning files: the layer walk of a recipe's sequential model. */
#ifndef FATHOM_PRUNE_INTERNAL_H
#define FATHOM_PRUNE_INTERNAL_H
#include "fathom/prune.h"

/* One layer of the recipe's stack, with its input shape (batch 1). */
typedef struct prune_layer {
    fm_module *mod;
    fm_module_kind kind;
    int in_ndim;
    int64_t in[FM_MAX_DIMS];
} prune_layer;

/* The layers of m (a Sequential built from r: one child per recipe layer), or an error
 * naming why the model is not one fathom prune takes. *out is malloc'ed. */
fm_status prune_layers(const fm_recipe *r, fm_module *m, prune_layer **out, int *n);

/* Channels (fm_prune_classifier with kind FM_PRUNE_CHANNELS). */
fm_status prune_channels(const fm_recipe *r, fm_module *m, const prune_layer *L, int n, const fm_prune_options *o,
                         fm_recipe *out_recipe, fm_module **out_model, fm_prune_report *rep);

/* A new model of recipe r holding a copy of m's state (same shapes). */
fm_module *prune_clone(const fm_recipe *r, fm_module *m);
/* Report line name of layer i: "3 conv2d 32->64 k3 s1 p1". */
void prune_layer_name(const prune_layer *L, int i, char *buf, size_t n);
#endif
