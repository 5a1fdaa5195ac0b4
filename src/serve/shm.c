/* The system shared memory registry (shm.h). */
#include "serve/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve/repository.h"

#define MAX_REGIONS 128

typedef struct region {
    char name[FM_SERVE_NAME_MAX], key[128];
    int64_t offset, size;
    void *map;      /* the object from byte 0 to offset + size */
    size_t map_len;
} region;

struct fm_shm_registry {
    pthread_mutex_t mu;
    int n;
    region r[MAX_REGIONS];
};

fm_shm_registry *fm_shm_registry_new(void) {
    fm_shm_registry *r = calloc(1, sizeof *r);
    if (r) pthread_mutex_init(&r->mu, NULL);
    return r;
}

void fm_shm_registry_free(fm_shm_registry *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) munmap(r->r[i].map, r->r[i].map_len);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static region *find(fm_shm_registry *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->r[i].name, name)) return &r->r[i];
    return NULL;
}

static int fail(char *err, size_t errn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errn, fmt, ap);
    va_end(ap);
    return 400;
}

/* shm_open's names: "/" then 1-126 characters, none a '/' */
static bool valid_key(const char *key) {
    size_t n = strlen(key);
    return n >= 2 && n < 128 && key[0] == '/' && !strchr(key + 1, '/');
}

int fm_shm_register(fm_shm_registry *r, const char *name, const char *key, int64_t offset, int64_t byte_size, char *err,
                    size_t errn) {
    if (!fm_serve_valid_name(name)) return fail(err, errn, "invalid region name '%.80s'", name);
    if (!valid_key(key))
        return fail(err, errn, "key '%.80s' is not a POSIX shared memory name ('/' then 1-126 characters, no other '/')",
                    key);
    if (offset < 0 || byte_size < 1 || offset > (INT64_MAX >> 2) || byte_size > (INT64_MAX >> 2))
        return fail(err, errn, "region '%s': offset must be >= 0 and byte_size >= 1 (byte_size %lld)", name, (long long)byte_size);
    int fd = shm_open(key, O_RDWR, 0);
    if (fd < 0) return fail(err, errn, "key '%s': no shared memory object can be opened (%s); create it first", key, strerror(errno));
    struct stat st;
    size_t len = (size_t)(offset + byte_size);
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < len) {
        close(fd);
        return fail(err, errn, "key '%s' holds fewer bytes than offset + byte_size (%lld)", key, (long long)len);
    }
    void *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return fail(err, errn, "key '%s': mmap failed (%s)", key, strerror(errno));
    pthread_mutex_lock(&r->mu);
    int status = 0;
    if (find(r, name)) status = fail(err, errn, "region '%s' is already registered; unregister it first", name);
    else if (r->n == MAX_REGIONS) status = fail(err, errn, "too many regions (at most %d)", MAX_REGIONS);
    else {
        region *g = &r->r[r->n++];
        snprintf(g->name, sizeof g->name, "%s", name);
        snprintf(g->key, sizeof g->key, "%s", key);
        g->offset = offset, g->size = byte_size, g->map = map, g->map_len = len;
    }
    pthread_mutex_unlock(&r->mu);
    if (status) munmap(map, len);
    return status;
}

int fm_shm_unregister(fm_shm_registry *r, const char *name, char *err, size_t errn) {
    pthread_mutex_lock(&r->mu);
    int status = 0;
    region *g = name ? find(r, name) : NULL;
    if (name && !g) {
        status = fail(err, errn, "region '%.80s' is not registered", name);
    } else if (g) {
        munmap(g->map, g->map_len);
        *g = r->r[--r->n];
    } else {
        for (int i = 0; i < r->n; i++) munmap(r->r[i].map, r->r[i].map_len);
        r->n = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return status;
}

json_t *fm_shm_status(fm_shm_registry *r, const char *name) {
    json_t *a = json_array();
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        const region *g = &r->r[i];
        if (name && strcmp(name, g->name)) continue;
        json_array_append_new(a, json_pack("{s:s,s:s,s:I,s:I}", "name", g->name, "key", g->key, "offset", (json_int_t)g->offset,
                                           "byte_size", (json_int_t)g->size));
    }
    pthread_mutex_unlock(&r->mu);
    if (name && json_array_size(a) == 0) { json_decref(a); return NULL; }
    return a;
}

static int copy(fm_shm_registry *r, const char *name, int64_t offset, void *buf, size_t n, bool write, char *err, size_t errn) {
    if (!r) return fail(err, errn, "shared memory region '%.80s': shared memory is not available here", name);
    pthread_mutex_lock(&r->mu);
    region *g = find(r, name);
    int status = 0;
    if (!g) status = fail(err, errn, "shared memory region '%.80s' is not registered", name);
    else if (offset < 0 || (uint64_t)offset > (uint64_t)g->size || n > (uint64_t)(g->size - offset))
        status = fail(err, errn, "region '%s' holds %lld bytes: the offset and size asked for do not fit", g->name, (long long)g->size);
    else if (write) memcpy((char *)g->map + g->offset + offset, buf, n);
    else memcpy(buf, (const char *)g->map + g->offset + offset, n);
    pthread_mutex_unlock(&r->mu);
    return status;
}

int fm_shm_read(fm_shm_registry *r, const char *name, int64_t offset, void *dst, size_t n, char *err, size_t errn) {
    return copy(r, name, offset, dst, n, false, err, errn);
}

int fm_shm_write(fm_shm_registry *r, const char *name, int64_t offset, const void *src, size_t n, char *err, size_t errn) {
    return copy(r, name, offset, (void *)src, n, true, err, errn);
}
