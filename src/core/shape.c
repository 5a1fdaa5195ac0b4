/* Shape rules shared by the op front ends: broadcasting, device/dtype checks. */
#include "core/tensor_internal.h"

fm_status fm_broadcast_shapes(const char *op, int na, const int64_t *a, int nb, const int64_t *b, int *nout, int64_t *out) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - na), ib = i - (n - nb);
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[128], sb[128];
            return fm_set_error(FM_ERR_INVALID, "%s: shapes %s and %s cannot be broadcast together (dimension %d: %lld vs %lld)",
                                op, fm_shape_str(na, a, sa, sizeof sa), fm_shape_str(nb, b, sb, sizeof sb), i,
                                (long long)da, (long long)db);
        }
        out[i] = da == 1 ? db : da;
    }
    *nout = n;
    return FM_OK;
}

fm_status fm_check_same_device(const char *op, const fm_tensor *a, const fm_tensor *b) {
    if (fm_device_eq(a->storage->device, b->storage->device)) return FM_OK;
    char d1[32], d2[32];
    return fm_set_error(FM_ERR_INVALID, "%s: tensors are on different devices (%s and %s); move one with fm_tensor_to", op,
                        fm_device_name(a->storage->device, d1, sizeof d1), fm_device_name(b->storage->device, d2, sizeof d2));
}

fm_status fm_check_same_dtype(const char *op, const fm_tensor *a, const fm_tensor *b) {
    if (a->dtype == b->dtype) return FM_OK;
    return fm_set_error(FM_ERR_INVALID, "%s: dtype mismatch (%s and %s); convert one with fm_to_dtype", op,
                        fm_dtype_name(a->dtype), fm_dtype_name(b->dtype));
}
