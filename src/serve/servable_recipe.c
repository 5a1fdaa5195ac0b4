/* The servable for a model directory written by `fathom train` (model.safetensors
 * with the recipe in its metadata): one input "input" (FP32, the recipe's input
 * shape; pixel values in [0, 1], as `fathom predict` reads images; INT64 token ids
 * in [0, V) for a recipe whose first layer is `embedding V D`) and one output
 * "logits" (FP32, [classes]). The recipe's channel normalisation is applied here,
 * as `fathom predict` applies it, so clients send the same values to both.
 * On a device (a GPU, or the check device in tests) the module is moved there once
 * (fm_module_to); each batch goes there, and its logits come back to the host for
 * the response. */
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "fathom/recipe.h"
#include "serve/servable.h"

typedef struct recipe_impl {
    fm_recipe r;
    fm_module *m;
    fm_device dev;
} recipe_impl;

static fm_status recipe_run(fm_servable *s, fm_tensor *const *in, fm_tensor **out) {
    recipe_impl *ri = s->impl;
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *x = fm_tensor_to(in[0], ri->dev), *norm = NULL, *y = NULL;
    if (x && ri->r.transforms.normalize_channels) {
        fm_tensor *c = fm_add_scalar(x, -ri->r.transforms.mean[0]);
        norm = c ? fm_mul_scalar(c, 1.0 / ri->r.transforms.std[0]) : NULL;
        fm_tensor_release(c);
    }
    fm_tensor *xin = ri->r.transforms.normalize_channels ? norm : x;
    y = xin ? fm_module_forward(ri->m, xin) : NULL;
    out[0] = y ? fm_tensor_to(y, FM_CPU) : NULL; /* y itself on the CPU */
    fm_tensor_release_n(3, x, norm, y);
    fm_set_grad_enabled(prev);
    return out[0] ? FM_OK : fm_last_status();
}

static void recipe_free(fm_servable *s) {
    recipe_impl *ri = s->impl;
    if (ri) {
        fm_module_free(ri->m);
        fm_recipe_free(&ri->r);
        free(ri);
    }
    free(s);
}

fm_servable *fm_servable_open_recipe(const char *dir, fm_device dev);
fm_servable *fm_servable_open_recipe(const char *dir, fm_device dev) {
    fm_servable *s = calloc(1, sizeof *s);
    recipe_impl *ri = calloc(1, sizeof *ri);
    if (!s || !ri) { free(s); free(ri); fm_set_error(FM_ERR_OOM, "serve: out of memory"); return NULL; }
    if (fm_model_load(dir, &ri->r, &ri->m) != FM_OK) { free(s); free(ri); return NULL; }
    ri->dev = dev;
    if (dev.type != FM_DEV_CPU && fm_module_to(ri->m, dev) != FM_OK) {
        fm_error_prefix("%s: moving the model to its device", dir);
        fm_module_free(ri->m);
        fm_recipe_free(&ri->r);
        free(ri);
        free(s);
        return NULL;
    }
    s->impl = ri;
    s->platform = "fathom_recipe";
    s->run = recipe_run;
    s->free = recipe_free;
    s->n_inputs = s->n_outputs = 1;
    fm_serve_io *i0 = &s->inputs[0], *o0 = &s->outputs[0];
    strcpy(i0->name, "input");
    i0->id_limit = fm_recipe_token_vocab(&ri->r); /* ids are checked per request (infer_codec.c) */
    i0->dtype = i0->id_limit > 0 ? FM_I64 : FM_F32;
    i0->ndim = ri->r.input_ndim;
    memcpy(i0->dims, ri->r.input_shape, sizeof(int64_t) * (size_t)ri->r.input_ndim);
    /* the output's shape: one forward pass on a zero sample (also a warm-up) */
    int64_t shape[FM_MAX_DIMS];
    shape[0] = 1;
    memcpy(shape + 1, i0->dims, sizeof(int64_t) * (size_t)i0->ndim);
    fm_tensor *z = fm_tensor_zeros(i0->ndim + 1, shape, i0->dtype, FM_CPU), *y = NULL;
    if (!z || recipe_run(s, &z, &y) != FM_OK) { fm_tensor_release(z); recipe_free(s); return NULL; }
    strcpy(o0->name, "logits");
    o0->dtype = y->dtype;
    o0->ndim = y->ndim - 1;
    memcpy(o0->dims, y->shape + 1, sizeof(int64_t) * (size_t)o0->ndim);
    fm_tensor_release_n(2, z, y);
    return s;
}
