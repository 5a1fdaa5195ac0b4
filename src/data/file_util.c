/* Whole-file reads and gzip inflation for the data readers, plus the two small
 * readers that need nothing else: raw text and the content-sniffing
 * fm_data_read used by `fathom predict`. */
#include "data/data_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

fm_status fm_data_read_file(const char *path, unsigned char **out, size_t *n) {
    *out = NULL;
    *n = 0;
    if (!path) return fm_set_error(FM_ERR_INVALID, "no file name given");
    FILE *f = fopen(path, "rb");
    if (!f) return fm_set_error(FM_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return fm_set_error(FM_ERR_IO, "%s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    unsigned char *buf = malloc(size + 1);
    if (!buf) {
        fclose(f);
        return fm_set_error(FM_ERR_OOM, "%s: cannot allocate %zu bytes to read it", path, size);
    }
    size_t got = fread(buf, 1, size, f);
    int err = ferror(f);
    fclose(f);
    if (got != size || err) {
        free(buf);
        return fm_set_error(FM_ERR_IO, "%s: read %zu of %zu bytes", path, got, size);
    }
    buf[size] = 0;
    *out = buf;
    *n = size;
    return FM_OK;
}

bool fm_data_is_gzip(const unsigned char *p, size_t n) { return n >= 2 && p[0] == 0x1f && p[1] == 0x8b; }

fm_status fm_data_gunzip(const unsigned char *p, size_t n, const char *name, size_t limit,
                         unsigned char **out, size_t *out_n) {
    *out = NULL;
    *out_n = 0;
    if (n < 18) return fm_set_error(FM_ERR_FORMAT, "%s: gzip stream truncated (%zu bytes)", name, n);
    /* ISIZE (uncompressed size mod 2^32) is a hint for the first allocation only:
     * a corrupt trailer must not decide how much we allocate. */
    size_t cap = fm_rd_le32(p + n - 4);
    if (cap < 4096) cap = 4096;
    if (cap > limit) cap = limit;
    if (cap > (size_t)n * 1032 + 4096) cap = (size_t)n * 1032 + 4096; /* deflate expands at most ~1032x */
    unsigned char *buf = malloc(cap + 1);
    if (!buf) return fm_set_error(FM_ERR_OOM, "%s: cannot allocate %zu bytes to inflate", name, cap);
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 15 + 16) != Z_OK) {
        free(buf);
        return fm_set_error(FM_ERR_INTERNAL, "%s: zlib inflateInit2 failed", name);
    }
    size_t have = 0;
    size_t in_left = n;
    const unsigned char *in = p;
    int rc = Z_OK;
    for (;;) {
        if (have == cap) {
            if (cap >= limit) {
                inflateEnd(&zs);
                free(buf);
                return fm_set_error(FM_ERR_FORMAT, "%s: inflates to more than %zu bytes", name, limit);
            }
            size_t ncap = cap > limit / 2 ? limit : cap * 2;
            unsigned char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                inflateEnd(&zs);
                free(buf);
                return fm_set_error(FM_ERR_OOM, "%s: cannot allocate %zu bytes to inflate", name, ncap);
            }
            buf = nb;
            cap = ncap;
        }
        if (zs.avail_in == 0 && in_left) {
            uInt chunk = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
            zs.next_in = (Bytef *)in;
            zs.avail_in = chunk;
            in += chunk;
            in_left -= chunk;
        }
        size_t room = cap - have;
        uInt outchunk = room > (1u << 30) ? (1u << 30) : (uInt)room;
        zs.next_out = buf + have;
        zs.avail_out = outchunk;
        rc = inflate(&zs, Z_NO_FLUSH);
        have += outchunk - zs.avail_out;
        if (rc == Z_STREAM_END) break;
        if (rc == Z_BUF_ERROR && zs.avail_in == 0 && in_left == 0) {
            inflateEnd(&zs);
            free(buf);
            return fm_set_error(FM_ERR_FORMAT, "%s: gzip stream truncated (ends before its end marker)", name);
        }
        if (rc != Z_OK && rc != Z_BUF_ERROR) {
            const char *why = zs.msg ? zs.msg : "corrupt data";
            char msg[128];
            snprintf(msg, sizeof msg, "%s", why);
            inflateEnd(&zs);
            free(buf);
            return fm_set_error(FM_ERR_FORMAT, "%s: corrupt gzip stream (%s)", name, msg);
        }
    }
    inflateEnd(&zs);
    buf[have] = 0;
    *out = buf;
    *out_n = have;
    return FM_OK;
}

fm_tensor *fm_text_read(const char *path, fm_dtype dt) {
    if (dt != FM_U8 && dt != FM_I64) {
        fm_set_error(FM_ERR_INVALID, "text_read: token dtype must be u8 or i64, got %s", fm_dtype_name(dt));
        return NULL;
    }
    unsigned char *buf;
    size_t n;
    if (fm_data_read_file(path, &buf, &n) != FM_OK) return NULL;
    int64_t len = (int64_t)n;
    fm_tensor *t = fm_tensor_empty(1, &len, dt, FM_CPU);
    if (t) {
        if (dt == FM_U8) {
            memcpy(fm_tensor_data(t), buf, n);
        } else {
            int64_t *o = fm_tensor_data(t);
            for (size_t i = 0; i < n; i++) o[i] = buf[i];
        }
    } else {
        fm_error_prefix("%s", path);
    }
    free(buf);
    return t;
}

/* u8 images to F32 in [0, 1]: the scaling the data set readers use. Takes over t. */
static fm_tensor *u8_to_unit(fm_tensor *t) {
    fm_tensor *out = fm_tensor_empty(t->ndim, t->shape, FM_F32, FM_CPU);
    if (out) {
        const uint8_t *s = fm_tensor_data(t);
        float *d = fm_tensor_data(out);
        int64_t cnt = fm_tensor_numel(t);
        for (int64_t i = 0; i < cnt; i++) d[i] = (float)s[i] / 255.0f;
    }
    fm_tensor_release(t);
    return out;
}

fm_tensor *fm_data_read(const char *path) {
    unsigned char head[8] = {0};
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        fm_set_error(path ? FM_ERR_IO : FM_ERR_INVALID, "%s: cannot open (%s)", path ? path : "(null)",
                     path ? strerror(errno) : "no file name");
        return NULL;
    }
    size_t got = fread(head, 1, sizeof head, f);
    fclose(f);
    static const unsigned char png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (got == 8 && memcmp(head, png_magic, 8) == 0) return fm_png_read(path);
    if (got >= 6 && memcmp(head, "\x93NUMPY", 6) == 0) {
        fm_tensor *t = fm_npy_read(path);
        return t && t->dtype == FM_U8 ? u8_to_unit(t) : t; /* u8 pixels, as idx images */
    }
    if (got >= 4 && (fm_data_is_gzip(head, got) || (head[0] == 0 && head[1] == 0))) {
        fm_tensor *t = fm_idx_read(path);
        if (!t || t->dtype != FM_U8 || t->ndim < 2) return t;
        return u8_to_unit(t);
    }
    fm_set_error(FM_ERR_FORMAT, "%s: unrecognized input format (expected idx, gzip'd idx, .npy or PNG)", path);
    return NULL;
}
