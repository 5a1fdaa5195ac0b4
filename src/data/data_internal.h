/* Helpers shared by the readers in src/data: whole-file reads, gzip inflation,
 * overflow-checked size arithmetic. Parsers work on bytes in memory so the file
 * and in-memory entry points (and the fuzz test) run exactly the same code. */
#ifndef FATHOM_DATA_INTERNAL_H
#define FATHOM_DATA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fathom/data.h"

/* Reads a whole file into a malloc'd buffer (one extra NUL byte after the end,
 * not counted in *n). FM_ERR_IO with the path and strerror on failure. */
fm_status fm_data_read_file(const char *path, unsigned char **out, size_t *n);

/* True if the bytes start with the gzip magic. */
bool fm_data_is_gzip(const unsigned char *p, size_t n);
/* Inflates a gzip stream into a malloc'd buffer; `limit` caps the output so a
 * corrupt or hostile size cannot exhaust memory. FM_ERR_FORMAT names `name`. */
fm_status fm_data_gunzip(const unsigned char *p, size_t n, const char *name, size_t limit,
                         unsigned char **out, size_t *out_n);

/* a * b and a + b in size_t; false on overflow. */
static inline bool fm_mul_ok(size_t a, size_t b, size_t *r) {
    if (a && b > SIZE_MAX / a) return false;
    *r = a * b;
    return true;
}
static inline bool fm_add_ok(size_t a, size_t b, size_t *r) {
    if (b > SIZE_MAX - a) return false;
    *r = a + b;
    return true;
}
static inline uint32_t fm_rd_be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint16_t fm_rd_le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t fm_rd_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The reader that turns a .npy member held in memory into a tensor (npy.c),
 * shared with the .npz reader. */
fm_tensor *fm_npy_parse(const unsigned char *p, size_t n, const char *name);

#endif
