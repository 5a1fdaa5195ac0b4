/* Triton's system shared memory extension: clients on the same host register a
 * POSIX shared memory object (shm_open's name, an offset and a size) under a region
 * name, then point inference inputs at it (read from it instead of the body) and
 * outputs into it (written there instead of the response). The server maps each
 * region while it is registered; every read and write is bounds-checked against
 * the registered size under the registry's lock, so unregistering never races a
 * request (a request copies its inputs out and its outputs in). */
#ifndef FATHOM_SERVE_SHM_H
#define FATHOM_SERVE_SHM_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fm_shm_registry fm_shm_registry;

fm_shm_registry *fm_shm_registry_new(void);
/* Unmaps every region. */
void fm_shm_registry_free(fm_shm_registry *r);
/* 0, or an HTTP status (400) with err: a bad name or key, a key no object has, an
 * object smaller than offset + byte_size, a name already registered. */
int fm_shm_register(fm_shm_registry *r, const char *name, const char *key, int64_t offset, int64_t byte_size, char *err,
                    size_t errn);
/* name NULL: every region. 0, or 400 when the named region is not registered. */
int fm_shm_unregister(fm_shm_registry *r, const char *name, char *err, size_t errn);
/* [{"name", "key", "offset", "byte_size"}] of every region (name NULL) or one; NULL
 * when the named one is not registered. */
json_t *fm_shm_status(fm_shm_registry *r, const char *name);
/* Copies n bytes at `offset` within region `name` out (read) or in (write). 0, or 400
 * when the region is unknown or [offset, offset + n) is not inside it. */
int fm_shm_read(fm_shm_registry *r, const char *name, int64_t offset, void *dst, size_t n, char *err, size_t errn);
int fm_shm_write(fm_shm_registry *r, const char *name, int64_t offset, const void *src, size_t n, char *err, size_t errn);
#endif
