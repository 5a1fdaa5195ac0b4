/* idx reader (the MNIST / Fashion-MNIST file format): magic 00 00 TYPE NDIM,
 * NDIM big-endian u32 sizes, then the elements big-endian, optionally gzip'd.
 * Every size is checked against the bytes actually present before allocating. */
#include "data/data_internal.h"

#include <stdlib.h>
#include <string.h>

/* idx files above this (inflated) are refused rather than risk exhausting memory */
#define IDX_MAX_BYTES ((size_t)1 << 36)

static fm_tensor *idx_parse(const unsigned char *p, size_t n, const char *name) {
    if (n < 4) {
        fm_set_error(FM_ERR_FORMAT, "%s: idx file truncated: %zu bytes, the header needs at least 4", name, n);
        return NULL;
    }
    if (p[0] != 0 || p[1] != 0) {
        fm_set_error(FM_ERR_FORMAT, "%s: not an idx file (magic %02x %02x %02x %02x, expected 00 00 TYPE NDIM)",
                     name, p[0], p[1], p[2], p[3]);
        return NULL;
    }
    fm_dtype dt;
    size_t esize;
    switch (p[2]) {
    case 0x08: dt = FM_U8; esize = 1; break;
    case 0x09: dt = FM_I8; esize = 1; break;
    case 0x0B: dt = FM_I32; esize = 2; break; /* i16 widened: fathom has no i16 */
    case 0x0C: dt = FM_I32; esize = 4; break;
    case 0x0D: dt = FM_F32; esize = 4; break;
    case 0x0E: dt = FM_F64; esize = 8; break;
    default:
        fm_set_error(FM_ERR_FORMAT, "%s: unknown idx element type 0x%02x (expected 08, 09, 0B, 0C, 0D or 0E)", name, p[2]);
        return NULL;
    }
    int ndim = p[3];
    if (ndim < 1 || ndim > FM_MAX_DIMS) {
        fm_set_error(FM_ERR_FORMAT, "%s: idx header declares %d dimensions (supported: 1 to %d)", name, ndim, FM_MAX_DIMS);
        return NULL;
    }
    size_t header = 4 + 4 * (size_t)ndim;
    if (n < header) {
        fm_set_error(FM_ERR_FORMAT, "%s: idx file truncated in its header (%zu bytes, %d dimensions need %zu)", name, n,
                     ndim, header);
        return NULL;
    }
    int64_t shape[FM_MAX_DIMS];
    size_t count = 1, strides = 1; /* strides: the product of the nonzero sizes (a 0 makes count 0, not them) */
    for (int i = 0; i < ndim; i++) {
        uint32_t d = fm_rd_be32(p + 4 + 4 * i);
        shape[i] = d;
        if (!fm_mul_ok(count, d, &count) || (d && (!fm_mul_ok(strides, d, &strides) || strides > ((size_t)1 << 48)))) {
            fm_set_error(FM_ERR_FORMAT, "%s: idx dimensions overflow (dimension %d is %u)", name, i, d);
            return NULL;
        }
    }
    size_t need;
    if (!fm_mul_ok(count, esize, &need) || need > n - header) {
        char sb[160];
        fm_set_error(FM_ERR_FORMAT, "%s: idx file truncated: shape %s of %zu-byte elements needs %zu data bytes, file has %zu",
                     name, fm_shape_str(ndim, shape, sb, sizeof sb), esize, count * esize, n - header);
        if (!fm_mul_ok(count, esize, &need))
            fm_set_error(FM_ERR_FORMAT, "%s: idx declares shape %s, too large for memory", name,
                         fm_shape_str(ndim, shape, sb, sizeof sb));
        return NULL;
    }
    if (need != n - header) {
        fm_set_error(FM_ERR_FORMAT, "%s: idx file has %zu bytes after its data (expected exactly %zu data bytes)", name,
                     n - header - need, need);
        return NULL;
    }
    fm_tensor *t = fm_tensor_empty(ndim, shape, dt, FM_CPU);
    if (!t) {
        fm_error_prefix("%s", name);
        return NULL;
    }
    const unsigned char *s = p + header;
    void *dst = fm_tensor_data(t);
    switch (p[2]) {
    case 0x08:
    case 0x09: memcpy(dst, s, count); break;
    case 0x0B: {
        int32_t *o = dst;
        for (size_t i = 0; i < count; i++) o[i] = (int16_t)(uint16_t)(s[2 * i] << 8 | s[2 * i + 1]);
        break;
    }
    case 0x0C:
    case 0x0D: {
        uint32_t *o = dst;
        for (size_t i = 0; i < count; i++) o[i] = fm_rd_be32(s + 4 * i);
        break;
    }
    case 0x0E: {
        uint64_t *o = dst;
        for (size_t i = 0; i < count; i++) o[i] = (uint64_t)fm_rd_be32(s + 8 * i) << 32 | fm_rd_be32(s + 8 * i + 4);
        break;
    }
    }
    return t;
}

fm_tensor *fm_idx_read_mem(const void *data, size_t n, const char *name) {
    if (!name) name = "(memory)";
    if (!data && n) {
        fm_set_error(FM_ERR_INVALID, "%s: NULL data", name);
        return NULL;
    }
    const unsigned char *p = data;
    if (fm_data_is_gzip(p, n)) {
        unsigned char *raw;
        size_t rn;
        if (fm_data_gunzip(p, n, name, IDX_MAX_BYTES, &raw, &rn) != FM_OK) return NULL;
        fm_tensor *t = idx_parse(raw, rn, name);
        free(raw);
        return t;
    }
    return idx_parse(p, n, name);
}

fm_tensor *fm_idx_read(const char *path) {
    unsigned char *buf;
    size_t n;
    if (fm_data_read_file(path, &buf, &n) != FM_OK) return NULL;
    fm_tensor *t = fm_idx_read_mem(buf, n, path);
    free(buf);
    return t;
}

fm_tensor *fm_idx_read_images(const char *path) {
    fm_tensor *t = fm_idx_read(path);
    if (!t) return NULL;
    if (t->dtype != FM_U8 || t->ndim != 3) {
        char sb[160];
        fm_set_error(FM_ERR_FORMAT, "%s: expected u8 images [N, H, W], got %s %s", path, fm_dtype_name(t->dtype),
                     fm_shape_str(t->ndim, t->shape, sb, sizeof sb));
        fm_tensor_release(t);
        return NULL;
    }
    int64_t shape[4] = {t->shape[0], 1, t->shape[1], t->shape[2]};
    fm_tensor *out = fm_tensor_empty(4, shape, FM_F32, FM_CPU);
    if (out) {
        const uint8_t *s = fm_tensor_data(t);
        float *d = fm_tensor_data(out);
        int64_t cnt = fm_tensor_numel(t);
        for (int64_t i = 0; i < cnt; i++) d[i] = (float)s[i] / 255.0f;
    } else {
        fm_error_prefix("%s", path);
    }
    fm_tensor_release(t);
    return out;
}

fm_tensor *fm_idx_read_labels(const char *path) {
    fm_tensor *t = fm_idx_read(path);
    if (!t) return NULL;
    if (t->ndim != 1 || (t->dtype != FM_U8 && t->dtype != FM_I8 && t->dtype != FM_I32)) {
        char sb[160];
        fm_set_error(FM_ERR_FORMAT, "%s: expected integer labels [N], got %s %s", path, fm_dtype_name(t->dtype),
                     fm_shape_str(t->ndim, t->shape, sb, sizeof sb));
        fm_tensor_release(t);
        return NULL;
    }
    fm_tensor *out = fm_tensor_empty(1, t->shape, FM_I64, FM_CPU);
    if (out) {
        int64_t *d = fm_tensor_data(out);
        for (int64_t i = 0; i < t->shape[0]; i++) {
            switch (t->dtype) {
            case FM_U8: d[i] = ((const uint8_t *)fm_tensor_data(t))[i]; break;
            case FM_I8: d[i] = ((const int8_t *)fm_tensor_data(t))[i]; break;
            default: d[i] = ((const int32_t *)fm_tensor_data(t))[i]; break;
            }
        }
    } else {
        fm_error_prefix("%s", path);
    }
    fm_tensor_release(t);
    return out;
}
