/* Pruning masks as the trainer sees them: read from a model directory and
 * multiplied into the parameters after each optimizer step (fathom/recipe.h).
 * The pruning itself (choosing what to zero) is src/prune's. */
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>

#include "fathom/autograd.h"
#include "fathom/io.h"
#include "fathom/recipe.h"

fm_status fm_module_apply_masks(fm_module *m, const fm_named_list *masks) {
    if (!masks || masks->n == 0) return FM_OK;
    fm_named_list ps = {0};
    fm_status st = fm_module_parameters(m, &ps);
    if (st) return st;
    bool prev = fm_set_grad_enabled(false);
    char s1[96], s2[96];
    for (int i = 0; i < masks->n && st == FM_OK; i++) {
        const char *name = masks->items[i].name;
        fm_tensor *mk = masks->items[i].tensor;
        int k = fm_named_list_find(&ps, name);
        fm_tensor *w = k >= 0 ? ps.items[k].tensor : NULL;
        if (!w) {
            st = fm_set_error(FM_ERR_INVALID, "pruning mask '%s' names no parameter of the model", name);
            break;
        }
        if (w->ndim != mk->ndim || memcmp(w->shape, mk->shape, (size_t)w->ndim * sizeof *w->shape)) {
            st = fm_set_error(FM_ERR_INVALID, "pruning mask '%s' has shape %s but the parameter has %s", name,
                              fm_shape_str(mk->ndim, mk->shape, s1, sizeof s1), fm_shape_str(w->ndim, w->shape, s2, sizeof s2));
            break;
        }
        /* the trainer hands over masks already on the parameters' device and dtype */
        fm_tensor *md = fm_device_eq(mk->storage->device, w->storage->device) ? fm_tensor_retain(mk)
                                                                              : fm_tensor_to(mk, w->storage->device);
        fm_tensor *mt = md && md->dtype != w->dtype ? fm_to_dtype(md, w->dtype) : fm_tensor_retain(md);
        fm_tensor *p = mt ? fm_mul(w, mt) : NULL;
        st = p ? fm_copy_(w, p) : fm_last_status();
        fm_tensor_release_n(3, md, mt, p);
    }
    fm_set_grad_enabled(prev);
    fm_named_list_free(&ps);
    return st;
}

fm_status fm_masks_load(const char *dir, fm_named_list *out, bool *found) {
    char path[PATH_MAX];
    memset(out, 0, sizeof *out);
    out->owns_tensors = true;
    *found = false;
    if (snprintf(path, sizeof path, "%s/%s", dir, FM_PRUNE_MASKS_FILE) >= (int)sizeof path)
        return fm_set_error(FM_ERR_INVALID, "%s: path too long", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) return errno == ENOENT ? FM_OK : fm_set_error(FM_ERR_IO, "%s: %s", path, strerror(errno));
    *found = true;
    fm_kv_list meta = {0};
    fm_status st = fm_safetensors_load(path, out, &meta);
    fm_kv_free(&meta);
    for (int i = 0; st == FM_OK && i < out->n; i++) { /* 0/1 values only: anything else is not a mask */
        fm_tensor *t = out->items[i].tensor;
        for (int64_t j = 0, n = fm_tensor_numel(t); j < n && st == FM_OK; j++) {
            double v = fm_tensor_get(t, j);
            if (v != 0 && v != 1)
                st = fm_set_error(FM_ERR_FORMAT, "%s: mask '%s' holds %g at %lld; a pruning mask holds only 0 and 1",
                                  path, out->items[i].name, v, (long long)j);
        }
    }
    if (st) fm_named_list_free(out);
    return st;
}
