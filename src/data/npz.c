/* numpy .npz reader: a zip archive whose members are .npy files, stored or
 * deflated (zlib raw inflate). Sizes come from the central directory (numpy
 * writes zip64 local headers with placeholder sizes); every offset and size is
 * checked against the archive before use, and each member's CRC-32 is verified. */
#include "data/data_internal.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define SIG_CEN 0x02014b50u
#define SIG_LOCAL 0x04034b50u

typedef struct npz_entry {
    char *name; /* without ".npy" */
    int method;
    uint64_t csize, usize, data_off;
    uint32_t crc;
} npz_entry;

struct fm_npz {
    unsigned char *buf;
    size_t n;
    char *path;
    int count;
    npz_entry *entries;
};

static uint64_t rd_le64(const unsigned char *p) { return (uint64_t)fm_rd_le32(p) | (uint64_t)fm_rd_le32(p + 4) << 32; }

void fm_npz_close(fm_npz *z) {
    if (!z) return;
    for (int i = 0; i < z->count; i++) free(z->entries[i].name);
    free(z->entries);
    free(z->buf);
    free(z->path);
    free(z);
}

static fm_npz *fail(fm_npz *z, fm_status st, const char *fmt, const char *a, const char *b) {
    fm_set_error(st, fmt, a, b);
    fm_npz_close(z);
    return NULL;
}

/* Takes ownership of buf. */
static fm_npz *npz_parse(unsigned char *buf, size_t n, const char *name) {
    fm_npz *z = calloc(1, sizeof *z);
    if (!z) {
        free(buf);
        fm_set_error(FM_ERR_OOM, "%s: out of memory", name);
        return NULL;
    }
    z->buf = buf;
    z->n = n;
    z->path = strdup(name);
    if (!z->path) return fail(z, FM_ERR_OOM, "%s: out of memory%s", name, "");
    if (n < 22) return fail(z, FM_ERR_FORMAT, "%s: not an .npz (zip) file: %s", name, "too short for a zip directory");
    /* the end-of-directory record sits in the last 22 + 65535 bytes */
    size_t eocd = SIZE_MAX;
    size_t lo = n > 22 + 65535 ? n - 22 - 65535 : 0;
    for (size_t i = n - 22 + 1; i-- > lo;) {
        if (fm_rd_le32(buf + i) == SIG_EOCD && i + 22 + fm_rd_le16(buf + i + 20) == n) {
            eocd = i;
            break;
        }
    }
    if (eocd == SIZE_MAX)
        return fail(z, FM_ERR_FORMAT, "%s: not an .npz (zip) file: %s", name, "no end-of-central-directory record (truncated?)");
    uint64_t nent = fm_rd_le16(buf + eocd + 10);
    uint64_t cdsize = fm_rd_le32(buf + eocd + 12);
    uint64_t cdoff = fm_rd_le32(buf + eocd + 16);
    if (fm_rd_le16(buf + eocd + 4) != 0 || fm_rd_le16(buf + eocd + 6) != 0)
        return fail(z, FM_ERR_UNSUPPORTED, "%s: %s", name, "multi-disk zip archives are not supported");
    if (nent == 0xFFFF || cdsize == 0xFFFFFFFFu || cdoff == 0xFFFFFFFFu) {
        if (eocd < 20 || fm_rd_le32(buf + eocd - 20) != SIG_LOC64)
            return fail(z, FM_ERR_FORMAT, "%s: corrupt zip: %s", name, "zip64 sizes without a zip64 locator");
        uint64_t off64 = rd_le64(buf + eocd - 20 + 8);
        if (off64 > n - 56 || n < 56 || fm_rd_le32(buf + off64) != SIG_EOCD64)
            return fail(z, FM_ERR_FORMAT, "%s: corrupt zip: %s", name, "bad zip64 end-of-directory record");
        nent = rd_le64(buf + off64 + 32);
        cdsize = rd_le64(buf + off64 + 40);
        cdoff = rd_le64(buf + off64 + 48);
    }
    if (cdoff > n || cdsize > n - cdoff)
        return fail(z, FM_ERR_FORMAT, "%s: corrupt zip: %s", name, "central directory lies outside the file");
    if (nent > cdsize / 46)
        return fail(z, FM_ERR_FORMAT, "%s: corrupt zip: %s", name, "more entries declared than the directory can hold");
    z->entries = calloc(nent ? nent : 1, sizeof *z->entries);
    if (!z->entries) return fail(z, FM_ERR_OOM, "%s: out of memory%s", name, "");
    size_t pos = cdoff, cdend = cdoff + cdsize;
    for (uint64_t k = 0; k < nent; k++) {
        if (cdend - pos < 46 || fm_rd_le32(buf + pos) != SIG_CEN)
            return fail(z, FM_ERR_FORMAT, "%s: corrupt zip: %s", name, "bad central directory entry");
        const unsigned char *c = buf + pos;
        unsigned flags = fm_rd_le16(c + 8), method = fm_rd_le16(c + 10);
        uint32_t crc = fm_rd_le32(c + 16);
        uint64_t csize = fm_rd_le32(c + 20), usize = fm_rd_le32(c + 24);
        size_t nlen = fm_rd_le16(c + 28), xlen = fm_rd_le16(c + 30), clen = fm_rd_le16(c + 32);
        uint64_t loff = fm_rd_le32(c + 42);
        if (cdend - pos - 46 < nlen + xlen + clen)
            return fail(z, FM_ERR_FORMAT, "%s: corrupt zip: %s", name, "central directory entry overruns the directory");
        char *ename = malloc(nlen + 1);
        if (!ename) return fail(z, FM_ERR_OOM, "%s: out of memory%s", name, "");
        memcpy(ename, c + 46, nlen);
        ename[nlen] = 0;
        npz_entry *e = &z->entries[z->count++];
        e->name = ename;
        if (strlen(ename) != nlen) return fail(z, FM_ERR_FORMAT, "%s: corrupt zip: %s", name, "NUL byte in a member name");
        /* zip64 extra field: the 0xFFFFFFFF fields, in order usize, csize, offset */
        const unsigned char *x = c + 46 + nlen, *xend = x + xlen;
        while (xend - x >= 4) {
            unsigned id = fm_rd_le16(x), sz = fm_rd_le16(x + 2);
            if ((size_t)(xend - x - 4) < sz) break;
            if (id == 0x0001) {
                const unsigned char *q = x + 4, *qend = q + sz;
                if (usize == 0xFFFFFFFFu) { if (qend - q < 8) break; usize = rd_le64(q); q += 8; }
                if (csize == 0xFFFFFFFFu) { if (qend - q < 8) break; csize = rd_le64(q); q += 8; }
                if (loff == 0xFFFFFFFFu) { if (qend - q < 8) break; loff = rd_le64(q); q += 8; }
            }
            x += 4 + sz;
        }
        if (nlen > 4 && strcmp(ename + nlen - 4, ".npy") == 0) ename[nlen - 4] = 0;
        if (flags & 1) return fail(z, FM_ERR_UNSUPPORTED, "%s: member '%s' is encrypted", name, ename);
        if (method != 0 && method != 8)
            return fail(z, FM_ERR_UNSUPPORTED, "%s: member '%s' uses a compression method other than stored or deflate",
                        name, ename);
        if (loff > n || n - loff < 30 || fm_rd_le32(buf + loff) != SIG_LOCAL)
            return fail(z, FM_ERR_FORMAT, "%s: corrupt zip: member '%s' has a bad local header offset", name, ename);
        uint64_t doff = loff + 30 + fm_rd_le16(buf + loff + 26) + fm_rd_le16(buf + loff + 28);
        if (doff > n || csize > n - doff)
            return fail(z, FM_ERR_FORMAT, "%s: truncated zip: member '%s' extends past the end of the file", name, ename);
        if (method == 0 && csize != usize)
            return fail(z, FM_ERR_FORMAT, "%s: corrupt zip: stored member '%s' has different sizes", name, ename);
        /* deflate cannot expand by more than ~1032x: a bigger claim is corruption */
        if (method == 8 && usize > csize * 1032 + 1024)
            return fail(z, FM_ERR_FORMAT, "%s: corrupt zip: member '%s' declares an impossible uncompressed size", name,
                        ename);
        e->method = (int)method;
        e->csize = csize;
        e->usize = usize;
        e->data_off = doff;
        e->crc = crc;
        pos += 46 + nlen + xlen + clen;
    }
    return z;
}

fm_npz *fm_npz_open_mem(const void *data, size_t n, const char *name) {
    if (!name) name = "(memory)";
    if (!data && n) {
        fm_set_error(FM_ERR_INVALID, "%s: NULL data", name);
        return NULL;
    }
    unsigned char *buf = malloc(n ? n : 1);
    if (!buf) {
        fm_set_error(FM_ERR_OOM, "%s: out of memory", name);
        return NULL;
    }
    if (n) memcpy(buf, data, n);
    return npz_parse(buf, n, name);
}

fm_npz *fm_npz_open(const char *path) {
    unsigned char *buf;
    size_t n;
    if (fm_data_read_file(path, &buf, &n) != FM_OK) return NULL;
    return npz_parse(buf, n, path);
}

int fm_npz_count(const fm_npz *z) { return z ? z->count : 0; }

const char *fm_npz_name(const fm_npz *z, int i) { return z && i >= 0 && i < z->count ? z->entries[i].name : NULL; }

fm_tensor *fm_npz_get(fm_npz *z, const char *name) {
    if (!z || !name) {
        fm_set_error(FM_ERR_INVALID, "npz_get: NULL archive or name");
        return NULL;
    }
    size_t len = strlen(name);
    size_t cmp = len > 4 && strcmp(name + len - 4, ".npy") == 0 ? len - 4 : len;
    npz_entry *e = NULL;
    for (int i = 0; i < z->count; i++)
        if (strlen(z->entries[i].name) == cmp && memcmp(z->entries[i].name, name, cmp) == 0) e = &z->entries[i];
    if (!e) {
        fm_set_error(FM_ERR_INVALID, "%s: no member named '%.*s' (the archive has %d)", z->path, (int)cmp, name, z->count);
        return NULL;
    }
    char label[1024];
    snprintf(label, sizeof label, "%s[%s]", z->path, e->name);
    const unsigned char *src = z->buf + e->data_off;
    unsigned char *owned = NULL;
    if (e->method == 8) {
        owned = malloc(e->usize ? e->usize : 1);
        if (!owned) {
            fm_set_error(FM_ERR_OOM, "%s: cannot allocate %llu bytes", label, (unsigned long long)e->usize);
            return NULL;
        }
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        if (inflateInit2(&zs, -15) != Z_OK) {
            free(owned);
            fm_set_error(FM_ERR_INTERNAL, "%s: zlib inflateInit2 failed", label);
            return NULL;
        }
        uint64_t in_left = e->csize, out_done = 0;
        const unsigned char *in = src;
        int rc = Z_OK;
        while (rc == Z_OK) {
            if (zs.avail_in == 0 && in_left) {
                uInt ch = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
                zs.next_in = (Bytef *)in;
                zs.avail_in = ch;
                in += ch;
                in_left -= ch;
            }
            uint64_t room = e->usize - out_done;
            uInt och = room > (1u << 30) ? (1u << 30) : (uInt)room;
            zs.next_out = owned + out_done;
            zs.avail_out = och;
            rc = inflate(&zs, Z_NO_FLUSH);
            out_done += och - zs.avail_out;
            if (rc == Z_BUF_ERROR && (zs.avail_in == 0 && in_left == 0)) break;
            if (rc == Z_BUF_ERROR && out_done == e->usize) break;
            if (rc == Z_BUF_ERROR) rc = Z_OK;
        }
        inflateEnd(&zs);
        if (rc != Z_STREAM_END || out_done != e->usize) {
            free(owned);
            fm_set_error(FM_ERR_FORMAT, "%s: corrupt deflate data (%s)", label,
                         rc == Z_STREAM_END ? "size differs from the directory" : "stream ends early or is invalid");
            return NULL;
        }
        src = owned;
    }
    uLong crc = 0;
    uint64_t done = 0;
    while (done < e->usize) {
        uInt ch = e->usize - done > (1u << 30) ? (1u << 30) : (uInt)(e->usize - done);
        crc = crc32(crc, src + done, ch);
        done += ch;
    }
    if ((uint32_t)crc != e->crc) {
        free(owned);
        fm_set_error(FM_ERR_FORMAT, "%s: CRC-32 mismatch (member is corrupt)", label);
        return NULL;
    }
    fm_tensor *t = fm_npy_parse(src, (size_t)e->usize, label);
    free(owned);
    return t;
}
