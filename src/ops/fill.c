/* Tensors made filled (full, zeros, ones, scalar): an empty tensor (core) and
 * fm_fill_, which runs a kernel, so they live above core. */
#include "fathom/tensor.h"

fm_tensor *fm_tensor_full(int ndim, const int64_t *shape, double value, fm_dtype dt, fm_device dev) {
    fm_tensor *t = fm_tensor_empty(ndim, shape, dt, dev);
    if (t && fm_fill_(t, value) != FM_OK) { fm_tensor_release(t); return NULL; }
    return t;
}
fm_tensor *fm_tensor_zeros(int ndim, const int64_t *shape, fm_dtype dt, fm_device dev) { return fm_tensor_full(ndim, shape, 0, dt, dev); }
fm_tensor *fm_tensor_ones(int ndim, const int64_t *shape, fm_dtype dt, fm_device dev) { return fm_tensor_full(ndim, shape, 1, dt, dev); }
fm_tensor *fm_tensor_zeros_like(const fm_tensor *t) { return fm_tensor_zeros(t->ndim, t->shape, t->dtype, t->storage->device); }
fm_tensor *fm_tensor_scalar(double value, fm_dtype dt) { return fm_tensor_full(0, NULL, value, dt, FM_CPU); }
