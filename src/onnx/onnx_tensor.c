/* TensorProto -> fm_tensor: initializers, Constant values and the .pb test data.
 * Data comes from raw_data (little-endian bytes), the typed repeated fields, or an
 * external file beside the model (data_location EXTERNAL), whose path must stay
 * inside the model's directory and whose byte range must lie inside the file. */
#include "onnx/onnx_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data_internal.h"

bool onnx_dtype_to_fm(int32_t t, fm_dtype *out) {
    switch (t) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: *out = FM_F32; return true;
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: *out = FM_F64; return true;
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: *out = FM_F16; return true;
    case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: *out = FM_BF16; return true;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT8: *out = FM_I8; return true;
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8: *out = FM_U8; return true;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: *out = FM_I32; return true;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: *out = FM_I64; return true;
    case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: *out = FM_BOOL; return true;
    default: return false;
    }
}

int32_t onnx_dtype_from_fm(fm_dtype dt) {
    static const int32_t map[FM_DTYPE_COUNT] = {
        [FM_F32] = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT,   [FM_F64] = ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE,
        [FM_F16] = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16, [FM_BF16] = ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16,
        [FM_I8] = ONNX__TENSOR_PROTO__DATA_TYPE__INT8,     [FM_U8] = ONNX__TENSOR_PROTO__DATA_TYPE__UINT8,
        [FM_I32] = ONNX__TENSOR_PROTO__DATA_TYPE__INT32,   [FM_I64] = ONNX__TENSOR_PROTO__DATA_TYPE__INT64,
        [FM_BOOL] = ONNX__TENSOR_PROTO__DATA_TYPE__BOOL,
    };
    return (unsigned)dt < FM_DTYPE_COUNT ? map[dt] : 0;
}

const char *onnx_dtype_name(int32_t t) {
    static const char *names[] = {"undefined", "float", "uint8",  "int8",   "uint16",    "int16",      "int32",
                                  "int64",     "string", "bool",  "float16", "double",   "uint32",     "uint64",
                                  "complex64", "complex128", "bfloat16"};
    if (t >= 0 && t < (int32_t)(sizeof names / sizeof *names)) return names[t];
    return t >= 17 && t <= 25 ? "an 8-bit/4-bit float or int type" : "an unknown type";
}

/* The directory holding `rel`, checked: relative, no "..", and (symlinks
 * resolved) inside `dir`. Writes the joined path into out. */
static fm_status external_path(const char *dir, const char *rel, const char *what, char *out, size_t n) {
    if (!rel || !*rel) return fm_set_error(FM_ERR_FORMAT, "%s: external data without a 'location'", what);
    if (rel[0] == '/')
        return fm_set_error(FM_ERR_FORMAT, "%s: external data location '%s' is absolute; it must be relative to the model's directory",
                            what, rel);
    for (const char *s = rel; *s;) {
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 2 && s[0] == '.' && s[1] == '.')
            return fm_set_error(FM_ERR_FORMAT, "%s: external data location '%s' leaves the model's directory ('..')", what, rel);
        s += len + (e != NULL);
    }
    if ((size_t)snprintf(out, n, "%s/%s", dir, rel) >= n)
        return fm_set_error(FM_ERR_FORMAT, "%s: external data path too long", what);
    char rdir[PATH_MAX], rfile[PATH_MAX];
    if (!realpath(dir, rdir)) return fm_set_error(FM_ERR_IO, "%s: model directory %s: %s", what, dir, strerror(errno));
    if (!realpath(out, rfile))
        return fm_set_error(FM_ERR_IO, "%s: external data file %s: %s", what, out, strerror(errno));
    size_t dl = strlen(rdir);
    if (strncmp(rfile, rdir, dl) != 0 || (rfile[dl] != '/' && strcmp(rdir, "/") != 0))
        return fm_set_error(FM_ERR_FORMAT, "%s: external data location '%s' resolves to %s, outside the model's directory %s",
                            what, rel, rfile, rdir);
    return FM_OK;
}

static fm_status parse_u64(const char *v, const char *key, const char *what, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = v ? strtoull(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || v[0] == '-')
        return fm_set_error(FM_ERR_FORMAT, "%s: external data '%s' is not a byte count: '%s'", what, key, v ? v : "");
    *out = x;
    return FM_OK;
}

static fm_status read_external(const Onnx__TensorProto *tp, const char *dir, const char *what, void *dst, size_t nbytes) {
    if (!dir) return fm_set_error(FM_ERR_FORMAT, "%s: external data is only read for tensors of a model file", what);
    const char *loc = NULL;
    uint64_t off = 0, len = nbytes;
    bool has_len = false;
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const char *k = tp->external_data[i]->key, *v = tp->external_data[i]->value;
        if (!k) continue;
        if (!strcmp(k, "location")) loc = v;
        else if (!strcmp(k, "offset")) { if (parse_u64(v, k, what, &off)) return fm_last_status(); }
        else if (!strcmp(k, "length")) { if (parse_u64(v, k, what, &len)) return fm_last_status(); has_len = true; }
    }
    char path[PATH_MAX];
    if (external_path(dir, loc, what, path, sizeof path)) return fm_last_status();
    if (has_len && len != nbytes)
        return fm_set_error(FM_ERR_FORMAT, "%s: external data length %" PRIu64 " does not match its shape and type (%zu bytes)",
                            what, len, nbytes);
    FILE *f = fopen(path, "rb");
    if (!f) return fm_set_error(FM_ERR_IO, "%s: cannot open external data %s (%s)", what, path, strerror(errno));
    struct stat st;
    fm_status s = FM_OK;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) s = fm_set_error(FM_ERR_IO, "%s: %s is not a regular file", what, path);
    else if (off > (uint64_t)st.st_size || nbytes > (uint64_t)st.st_size - off)
        s = fm_set_error(FM_ERR_FORMAT, "%s: external data %s holds %lld bytes; the tensor needs %zu at offset %" PRIu64, what,
                         path, (long long)st.st_size, nbytes, off);
    else if (fseeko(f, (off_t)off, SEEK_SET) != 0 || fread(dst, 1, nbytes, f) != nbytes)
        s = fm_set_error(FM_ERR_IO, "%s: cannot read %zu bytes of %s at offset %" PRIu64, what, nbytes, path, off);
    fclose(f);
    return s;
}

/* Copies the typed repeated field matching `tp`'s type into dst (n elements);
 * dst NULL: only checks the count. */
static fm_status read_typed(const Onnx__TensorProto *tp, fm_dtype dt, int64_t n, void *dst, const char *what) {
    size_t have;
    switch (tp->data_type) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: have = tp->n_float_data; break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: have = tp->n_double_data; break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: have = tp->n_int64_data; break;
    default: have = tp->n_int32_data; break;
    }
    if ((int64_t)have != n)
        return fm_set_error(FM_ERR_FORMAT, "%s: holds %zu values; its shape needs %" PRId64, what, have, n);
    if (!dst) return FM_OK; /* the count check only */
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case FM_F32: ((float *)dst)[i] = tp->float_data[i]; break;
        case FM_F64: ((double *)dst)[i] = tp->double_data[i]; break;
        case FM_I64: ((int64_t *)dst)[i] = tp->int64_data[i]; break;
        case FM_I32: ((int32_t *)dst)[i] = tp->int32_data[i]; break;
        case FM_I8: ((int8_t *)dst)[i] = (int8_t)tp->int32_data[i]; break;
        case FM_U8: ((uint8_t *)dst)[i] = (uint8_t)tp->int32_data[i]; break;
        case FM_BOOL: ((uint8_t *)dst)[i] = tp->int32_data[i] != 0; break;
        default: ((uint16_t *)dst)[i] = (uint16_t)tp->int32_data[i]; break; /* f16/bf16 bit patterns */
        }
    }
    return FM_OK;
}

fm_tensor *onnx_tensor_from_proto(const Onnx__TensorProto *tp, const char *dir, const char *what) {
    fm_dtype dt;
    if (!tp->has_data_type || !onnx_dtype_to_fm(tp->data_type, &dt)) {
        fm_set_error(FM_ERR_UNSUPPORTED, "%s: element type %s is not supported (fathom has float, double, float16, bfloat16, "
                     "int8, uint8, int32, int64, bool)", what, tp->has_data_type ? onnx_dtype_name(tp->data_type) : "(none)");
        return NULL;
    }
    if (tp->segment) { fm_set_error(FM_ERR_UNSUPPORTED, "%s: segmented tensors are not supported", what); return NULL; }
    if (tp->n_dims > FM_MAX_DIMS) {
        fm_set_error(FM_ERR_UNSUPPORTED, "%s: %zu dimensions; fathom supports at most %d", what, tp->n_dims, FM_MAX_DIMS);
        return NULL;
    }
    int64_t shape[FM_MAX_DIMS], n = 1;
    for (size_t i = 0; i < tp->n_dims; i++) {
        shape[i] = tp->dims[i];
        if (shape[i] < 0 || (shape[i] > 0 && n > ((int64_t)1 << 40) / shape[i])) {
            fm_set_error(FM_ERR_FORMAT, "%s: dimension %zu is %" PRId64 " (negative or too large)", what, i, shape[i]);
            return NULL;
        }
        n *= shape[i];
    }
    size_t nbytes = (size_t)n * fm_dtype_size(dt);
    bool external = tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    /* sizes are checked before anything is allocated (a small file may claim huge dims) */
    if (!external && tp->has_raw_data && tp->raw_data.len != nbytes) {
        fm_set_error(FM_ERR_FORMAT, "%s: raw_data holds %zu bytes; shape and type need %zu", what, tp->raw_data.len, nbytes);
        return NULL;
    }
    if (external && !dir) {
        fm_set_error(FM_ERR_FORMAT, "%s: external data is only read for tensors of a model file", what);
        return NULL;
    }
    if (!external && !tp->has_raw_data && read_typed(tp, dt, n, NULL, what)) return NULL;
    fm_tensor *t = fm_tensor_empty((int)tp->n_dims, shape, dt, FM_CPU);
    if (!t) { fm_error_prefix("%s", what); return NULL; }
    fm_status s;
    if (external)
        s = read_external(tp, dir, what, fm_tensor_data(t), nbytes);
    else if (tp->has_raw_data) {
        {
            if (nbytes) memcpy(fm_tensor_data(t), tp->raw_data.data, nbytes);
            s = FM_OK;
            if (dt == FM_BOOL) /* any non-zero byte is true; fathom's bool is 0 or 1 */
                for (int64_t i = 0; i < n; i++) ((uint8_t *)fm_tensor_data(t))[i] = ((uint8_t *)fm_tensor_data(t))[i] != 0;
        }
    } else
        s = read_typed(tp, dt, n, fm_tensor_data(t), what);
    if (s) {
        fm_tensor_release(t);
        return NULL;
    }
    return t;
}

fm_tensor *fm_onnx_read_tensor(const char *path) {
    unsigned char *buf;
    size_t n;
    if (fm_data_read_file(path, &buf, &n)) return NULL;
    Onnx__TensorProto *tp = (Onnx__TensorProto *)onnx_unpack(&onnx__tensor_proto__descriptor, buf, n, path);
    free(buf);
    if (!tp) return NULL;
    char what[512];
    snprintf(what, sizeof what, "%s: tensor '%s'", path, tp->name ? tp->name : "");
    fm_tensor *t = onnx_tensor_from_proto(tp, NULL, what);
    protobuf_c_message_free_unpacked(&tp->base, NULL);
    return t;
}
