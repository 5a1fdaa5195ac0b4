/* numpy .npy reader and writer. The header is a Python dict literal
 * ({'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }); we parse exactly
 * that grammar (strings, True/False, tuples of integers) and refuse anything
 * else, then check the declared shape against the bytes present. */
#include "data/data_internal.h"
#include "fathom/io.h" /* fm_atomic_write */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct npy_header {
    char descr[16];
    bool have_descr, have_order, have_shape;
    bool fortran;
    int ndim;
    int64_t shape[FM_MAX_DIMS];
} npy_header;

typedef struct cursor {
    const char *s, *begin, *end;
    const char *name;
} cursor;

static void skip_ws(cursor *c) {
    while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\n' || *c->s == '\r')) c->s++;
}

static bool eat(cursor *c, char ch) {
    skip_ws(c);
    if (c->s < c->end && *c->s == ch) {
        c->s++;
        return true;
    }
    return false;
}

static fm_status bad(cursor *c, const char *what) {
    return fm_set_error(FM_ERR_FORMAT, "%s: malformed .npy header: %s at offset %d of the header", c->name, what,
                        (int)(c->s - c->begin));
}

/* A quoted Python string without escapes (numpy never writes any in a header). */
static fm_status parse_str(cursor *c, char *out, size_t cap) {
    skip_ws(c);
    if (c->s >= c->end || (*c->s != '\'' && *c->s != '"')) return bad(c, "expected a quoted string");
    char q = *c->s++;
    size_t n = 0;
    while (c->s < c->end && *c->s != q) {
        if (*c->s == '\\') return bad(c, "escape sequences are not supported");
        if (n + 1 >= cap) return bad(c, "string too long");
        out[n++] = *c->s++;
    }
    if (c->s >= c->end) return bad(c, "unterminated string");
    c->s++;
    out[n] = 0;
    return FM_OK;
}

static fm_status parse_header(const char *text, size_t len, const char *name, npy_header *h) {
    cursor c = {text, text, text + len, name};
    memset(h, 0, sizeof *h);
    if (!eat(&c, '{')) return bad(&c, "expected '{'");
    for (;;) {
        if (eat(&c, '}')) break;
        char key[32];
        if (parse_str(&c, key, sizeof key) != FM_OK) return FM_ERR_FORMAT;
        if (!eat(&c, ':')) return bad(&c, "expected ':' after a key");
        skip_ws(&c);
        if (strcmp(key, "descr") == 0) {
            if (h->have_descr) return bad(&c, "duplicate key 'descr'");
            if (parse_str(&c, h->descr, sizeof h->descr) != FM_OK) {
                fm_error_prefix("%s: 'descr' must be a simple dtype string (structured dtypes are not supported)", name);
                return FM_ERR_FORMAT;
            }
            h->have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (h->have_order) return bad(&c, "duplicate key 'fortran_order'");
            if ((size_t)(c.end - c.s) >= 4 && memcmp(c.s, "True", 4) == 0) {
                h->fortran = true;
                c.s += 4;
            } else if ((size_t)(c.end - c.s) >= 5 && memcmp(c.s, "False", 5) == 0) {
                h->fortran = false;
                c.s += 5;
            } else {
                return bad(&c, "'fortran_order' must be True or False");
            }
            h->have_order = true;
        } else if (strcmp(key, "shape") == 0) {
            if (h->have_shape) return bad(&c, "duplicate key 'shape'");
            if (!eat(&c, '(')) return bad(&c, "'shape' must be a tuple");
            h->ndim = 0;
            for (;;) {
                if (eat(&c, ')')) break;
                skip_ws(&c);
                if (c.s >= c.end || *c.s < '0' || *c.s > '9') return bad(&c, "expected a non-negative integer in 'shape'");
                int64_t v = 0;
                while (c.s < c.end && *c.s >= '0' && *c.s <= '9') {
                    if (v > (INT64_MAX - 9) / 10) return bad(&c, "dimension too large in 'shape'");
                    v = v * 10 + (*c.s++ - '0');
                }
                if (c.s < c.end && *c.s == 'L') c.s++; /* Python 2 longs */
                if (h->ndim >= FM_MAX_DIMS) {
                    return fm_set_error(FM_ERR_UNSUPPORTED, "%s: .npy array has more than %d dimensions", name,
                                        FM_MAX_DIMS);
                }
                h->shape[h->ndim++] = v;
                if (eat(&c, ')')) break;
                if (!eat(&c, ',')) return bad(&c, "expected ',' or ')' in 'shape'");
            }
            h->have_shape = true;
        } else {
            return fm_set_error(FM_ERR_FORMAT, "%s: malformed .npy header: unexpected key '%s'", name, key);
        }
        if (eat(&c, '}')) break;
        if (!eat(&c, ',')) return bad(&c, "expected ',' or '}' after a value");
    }
    skip_ws(&c);
    if (c.s != c.end) return bad(&c, "unexpected text after '}'");
    if (!h->have_descr || !h->have_order || !h->have_shape)
        return fm_set_error(FM_ERR_FORMAT, "%s: malformed .npy header: missing key '%s'", name,
                            !h->have_descr ? "descr" : !h->have_order ? "fortran_order" : "shape");
    return FM_OK;
}

/* descr -> dtype, element size, and whether the data is big-endian */
static fm_status parse_descr(const char *d, const char *name, fm_dtype *dt, size_t *esize, bool *big) {
    size_t len = strlen(d);
    if (len < 3) return fm_set_error(FM_ERR_FORMAT, "%s: malformed .npy dtype '%s'", name, d);
    char order = d[0];
    if (order != '<' && order != '>' && order != '|' && order != '=')
        return fm_set_error(FM_ERR_FORMAT, "%s: malformed .npy dtype '%s' (bad byte-order mark)", name, d);
    const char *t = d + 1;
    static const struct { const char *code; fm_dtype dt; size_t size; } table[] = {
        {"f4", FM_F32, 4}, {"f8", FM_F64, 8}, {"f2", FM_F16, 2}, {"i4", FM_I32, 4},
        {"i8", FM_I64, 8}, {"u1", FM_U8, 1},  {"i1", FM_I8, 1},  {"b1", FM_BOOL, 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(t, table[i].code) == 0) {
            *dt = table[i].dt;
            *esize = table[i].size;
            *big = order == '>' && table[i].size > 1;
            return FM_OK;
        }
    }
    return fm_set_error(FM_ERR_UNSUPPORTED,
                        "%s: .npy dtype '%s' is not supported (supported: f4 f8 f2 i4 i8 u1 i1 b1)", name, d);
}

fm_tensor *fm_npy_parse(const unsigned char *p, size_t n, const char *name) {
    if (n < 10 || memcmp(p, "\x93NUMPY", 6) != 0) {
        if (n < 10 && n >= 6 && memcmp(p, "\x93NUMPY", 6) == 0)
            fm_set_error(FM_ERR_FORMAT, "%s: .npy file truncated in its preamble (%zu bytes)", name, n);
        else
            fm_set_error(FM_ERR_FORMAT, "%s: not a .npy file (missing the \\x93NUMPY magic)", name);
        return NULL;
    }
    int major = p[6];
    size_t hlen, hstart;
    if (major == 1) {
        hlen = fm_rd_le16(p + 8);
        hstart = 10;
    } else if (major == 2 || major == 3) {
        if (n < 12) {
            fm_set_error(FM_ERR_FORMAT, "%s: .npy file truncated in its preamble (%zu bytes)", name, n);
            return NULL;
        }
        hlen = fm_rd_le32(p + 8);
        hstart = 12;
    } else {
        fm_set_error(FM_ERR_UNSUPPORTED, "%s: .npy format version %d.%d is not supported (1, 2 and 3 are)", name, major,
                     p[7]);
        return NULL;
    }
    if (hlen > n - hstart) {
        fm_set_error(FM_ERR_FORMAT, "%s: .npy file truncated: header declares %zu bytes, only %zu present", name, hlen,
                     n - hstart);
        return NULL;
    }
    npy_header h;
    if (parse_header((const char *)p + hstart, hlen, name, &h) != FM_OK) return NULL;
    fm_dtype dt = FM_F32;
    size_t esize = 1;
    bool big = false;
    if (parse_descr(h.descr, name, &dt, &esize, &big) != FM_OK) return NULL;
    size_t count = 1, need;
    for (int i = 0; i < h.ndim; i++) {
        if (!fm_mul_ok(count, (size_t)h.shape[i], &count)) {
            fm_set_error(FM_ERR_FORMAT, "%s: .npy shape overflows (dimension %d is %lld)", name, i, (long long)h.shape[i]);
            return NULL;
        }
    }
    size_t avail = n - hstart - hlen;
    char sb[200];
    if (!fm_mul_ok(count, esize, &need) || need > avail) {
        fm_set_error(FM_ERR_FORMAT, "%s: .npy file truncated: shape %s of %s needs %s%zu data bytes, file has %zu", name,
                     fm_shape_str(h.ndim, h.shape, sb, sizeof sb), h.descr,
                     fm_mul_ok(count, esize, &need) ? "" : "more than ", fm_mul_ok(count, esize, &need) ? need : SIZE_MAX,
                     avail);
        return NULL;
    }
    if (need != avail) {
        fm_set_error(FM_ERR_FORMAT, "%s: .npy file has %zu bytes after its data (shape %s of %s needs exactly %zu)", name,
                     avail - need, fm_shape_str(h.ndim, h.shape, sb, sizeof sb), h.descr, need);
        return NULL;
    }
    fm_tensor *t = fm_tensor_empty(h.ndim, h.shape, dt, FM_CPU);
    if (!t) {
        fm_error_prefix("%s", name);
        return NULL;
    }
    const unsigned char *src = p + hstart + hlen;
    unsigned char *dst = fm_tensor_data(t);
    if (!h.fortran || h.ndim < 2) {
        memcpy(dst, src, need);
    } else {
        /* Column-major on disk: element (i0..ik) sits at sum(i_j * fstride_j) with
         * fstride_0 = 1. Walk the output row-major with an odometer. */
        int64_t fstride[FM_MAX_DIMS], idx[FM_MAX_DIMS] = {0};
        int64_t s = 1;
        for (int i = 0; i < h.ndim; i++) {
            fstride[i] = s;
            s *= h.shape[i];
        }
        int64_t off = 0;
        for (size_t e = 0; e < count; e++) {
            memcpy(dst + e * esize, src + (size_t)off * esize, esize);
            for (int d = h.ndim - 1; d >= 0; d--) {
                if (++idx[d] < h.shape[d]) {
                    off += fstride[d];
                    break;
                }
                off -= fstride[d] * (idx[d] - 1);
                idx[d] = 0;
            }
        }
    }
    if (big) {
        for (size_t e = 0; e < count; e++) {
            unsigned char *q = dst + e * esize;
            for (size_t a = 0, b = esize - 1; a < b; a++, b--) {
                unsigned char tmp = q[a];
                q[a] = q[b];
                q[b] = tmp;
            }
        }
    }
    if (dt == FM_BOOL) /* keep the 0/1 invariant other code relies on */
        for (size_t e = 0; e < count; e++) dst[e] = dst[e] != 0;
    return t;
}

fm_tensor *fm_npy_read_mem(const void *data, size_t n, const char *name) {
    if (!name) name = "(memory)";
    if (!data && n) {
        fm_set_error(FM_ERR_INVALID, "%s: NULL data", name);
        return NULL;
    }
    return fm_npy_parse(data, n, name);
}

fm_tensor *fm_npy_read(const char *path) {
    unsigned char *buf;
    size_t n;
    if (fm_data_read_file(path, &buf, &n) != FM_OK) return NULL;
    fm_tensor *t = fm_npy_parse(buf, n, path);
    free(buf);
    return t;
}

fm_status fm_npy_write(const char *path, const fm_tensor *t) {
    if (!path || !t) return fm_set_error(FM_ERR_INVALID, "npy_write: NULL path or tensor");
    if (t->storage->device.type != FM_DEV_CPU)
        return fm_set_error(FM_ERR_INVALID, "npy_write: %s: tensor must be on the CPU", path);
    const char *descr;
    switch (t->dtype) {
    case FM_F32: descr = "<f4"; break;
    case FM_F64: descr = "<f8"; break;
    case FM_F16: descr = "<f2"; break;
    case FM_I32: descr = "<i4"; break;
    case FM_I64: descr = "<i8"; break;
    case FM_U8: descr = "|u1"; break;
    case FM_I8: descr = "|i1"; break;
    case FM_BOOL: descr = "|b1"; break;
    default: return fm_set_error(FM_ERR_UNSUPPORTED, "npy_write: %s: dtype %s has no .npy equivalent", path, fm_dtype_name(t->dtype));
    }
    char hdr[512];
    int len = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < t->ndim; i++)
        len += snprintf(hdr + len, sizeof hdr - (size_t)len, "%lld%s", (long long)t->shape[i],
                        t->ndim == 1 ? "," : i + 1 < t->ndim ? ", " : "");
    len += snprintf(hdr + len, sizeof hdr - (size_t)len, "), }");
    /* pad with spaces and a newline so the data starts 64-byte aligned, as numpy does */
    int total = 10 + len + 1;
    int pad = (64 - total % 64) % 64;
    memset(hdr + len, ' ', (size_t)pad);
    len += pad;
    hdr[len++] = '\n';
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(len & 0xff), (unsigned char)(len >> 8)};
    size_t nbytes = fm_tensor_nbytes(t);
    void *tmpbuf = NULL;
    const void *data;
    if (fm_tensor_is_contiguous(t)) {
        data = fm_tensor_data(t);
    } else {
        tmpbuf = malloc(nbytes ? nbytes : 1);
        if (!tmpbuf) return fm_set_error(FM_ERR_OOM, "npy_write: %s: out of memory", path);
        if (fm_tensor_copy_to_host(t, tmpbuf, t->dtype) != FM_OK) {
            free(tmpbuf);
            return fm_last_status();
        }
        data = tmpbuf;
    }
    /* the library's one atomic write: temporary name, fsync, rename, directory fsync */
    fm_io_chunk ch[3] = {{pre, 10}, {hdr, (size_t)len}, {data, nbytes}};
    fm_status st = fm_atomic_write(path, 3, ch);
    free(tmpbuf);
    return st;
}
