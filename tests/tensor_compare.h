/* Whole-tensor comparisons for the tests: the largest magnitude, the largest
 * difference relative to it (NaN, a missing tensor or a size mismatch: infinity),
 * and bitwise equality. */
#ifndef FATHOM_TENSOR_COMPARE_H
#define FATHOM_TENSOR_COMPARE_H
#include <math.h>
#include <string.h>

#include "fathom/tensor.h"

static inline double t_max_abs(fm_tensor *a) {
    double m = 0;
    for (int64_t i = 0; i < fm_tensor_numel(a); i++) m = fmax(m, fabs(fm_tensor_get(a, i)));
    return m;
}

/* max |a - b| / max |b| */
static inline double t_rel_err(fm_tensor *a, fm_tensor *b) {
    if (!a || !b || fm_tensor_numel(a) != fm_tensor_numel(b)) return INFINITY;
    double m = 0;
    for (int64_t i = 0; i < fm_tensor_numel(a); i++) {
        double e = fabs(fm_tensor_get(a, i) - fm_tensor_get(b, i));
        if (!(e <= m)) m = e;
    }
    double s = t_max_abs(b);
    return s > 0 ? m / s : m;
}
/* a and b: the same shape and the same bits (read through their strides) */
static inline bool t_same_bits(const fm_tensor *a, const fm_tensor *b) {
    if (!a || !b || a->ndim != b->ndim || memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim)) return false;
    for (int64_t i = 0; i < fm_tensor_numel(a); i++) {
        double x = fm_tensor_get(a, i), y = fm_tensor_get(b, i);
        if (memcmp(&x, &y, sizeof x)) return false;
    }
    return true;
}
#endif
