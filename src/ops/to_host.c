/* Reading a tensor on the host: one element (fm_tensor_item), a row-major copy
 * (fm_tensor_copy_to_host) and printing. A device tensor is first brought to the
 * cpu with fm_tensor_to (a copy kernel), so these live above core. */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "core/dtype_internal.h"
#include "core/tensor_internal.h"

double fm_tensor_item(const fm_tensor *t) {
    if (!t) { fm_set_error(FM_ERR_INVALID, "item: tensor is NULL"); return NAN; }
    if (fm_tensor_numel(t) != 1) {
        char sb[128];
        fm_set_error(FM_ERR_INVALID, "item: tensor of shape %s has %" PRId64 " elements, expected 1",
                     fm_shape_str(t->ndim, t->shape, sb, sizeof sb), fm_tensor_numel(t));
        return NAN;
    }
    if (t->storage->device.type != FM_DEV_CPU) {
        double v = NAN;
        if (fm_tensor_copy_to_host(t, &v, FM_F64) != FM_OK) return NAN;
        return v;
    }
    return fm_tensor_get(t, 0);
}

fm_status fm_tensor_copy_to_host(const fm_tensor *t, void *dst, fm_dtype dt) {
    if (!t || !dst) return fm_set_error(FM_ERR_INVALID, "copy_to_host: NULL argument");
    if (t->storage->device.type != FM_DEV_CPU) {
        fm_tensor *h = fm_tensor_to((fm_tensor *)t, FM_CPU);
        if (!h) return fm_last_status();
        fm_status st = fm_tensor_copy_to_host(h, dst, dt);
        fm_tensor_release(h);
        return st;
    }
    int64_t n = fm_tensor_numel(t);
    if (t->dtype == dt && fm_tensor_is_contiguous(t)) {
        memcpy(dst, fm_tensor_data(t), (size_t)n * fm_dtype_size(dt));
        return FM_OK;
    }
    size_t es = fm_dtype_size(t->dtype), ds = fm_dtype_size(dt);
    for (int64_t i = 0; i < n; i++)
        fm_store_f64((char *)dst + i * (int64_t)ds, dt,
                     fm_load_f64((char *)t->storage->data + fm_tensor_elem_offset(t, i) * (int64_t)es, t->dtype));
    return FM_OK;
}

/* ---------------- printing ---------------- */

static void print_rec(const fm_tensor *t, FILE *f, int dim, int64_t off, int indent, bool is_float) {
    const int64_t edge = 3, limit = 8;
    size_t es = fm_dtype_size(t->dtype);
    if (t->ndim == 0) {
        double v = fm_load_f64((char *)t->storage->data + off * (int64_t)es, t->dtype);
        if (is_float) fprintf(f, "%.6g", v); else fprintf(f, "%.0f", v);
        return;
    }
    fputc('[', f);
    int64_t n = t->shape[dim];
    for (int64_t i = 0; i < n; i++) {
        if (n > limit && i == edge) {
            fprintf(f, dim == t->ndim - 1 ? "..., " : "...,\n%*s", dim == t->ndim - 1 ? 0 : indent + 1, "");
            i = n - edge;
        }
        int64_t o = off + i * t->strides[dim];
        if (dim == t->ndim - 1) {
            double v = fm_load_f64((char *)t->storage->data + o * (int64_t)es, t->dtype);
            if (t->dtype == FM_BOOL) fprintf(f, "%s", v != 0 ? "true" : "false");
            else if (is_float) fprintf(f, "%10.4g", v);
            else fprintf(f, "%.0f", v);
        } else {
            print_rec(t, f, dim + 1, o, indent + 1, is_float);
        }
        if (i + 1 < n) {
            if (dim == t->ndim - 1) fputs(", ", f);
            else fprintf(f, ",\n%*s", indent + 1, "");
        }
    }
    fputc(']', f);
}

fm_status fm_tensor_print(const fm_tensor *t, FILE *f) {
    if (!t) return fm_set_error(FM_ERR_INVALID, "print: tensor is NULL");
    fm_tensor *h = NULL;
    if (t->storage->device.type != FM_DEV_CPU) {
        h = fm_tensor_to((fm_tensor *)t, FM_CPU);
        if (!h) return fm_last_status();
        t = h;
    }
    char sb[128], dn[32];
    fprintf(f, "tensor(");
    print_rec(t, f, 0, t->offset, 7, fm_dtype_is_float(t->dtype));
    fprintf(f, ", shape=%s, dtype=%s, device=%s%s)\n", fm_shape_str(t->ndim, t->shape, sb, sizeof sb),
            fm_dtype_name(t->dtype), fm_device_name(t->storage->device, dn, sizeof dn),
            t->requires_grad ? ", requires_grad" : "");
    fm_tensor_release(h);
    return FM_OK;
}
