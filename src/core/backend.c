/* The backend registry: one constructor per device type, and the backend it
 * built, cached once it exists. Core never names a backend: each registers
 * itself (src/dispatch/backends.c.in lists the ones built). */
#include "core/backend.h"

static fm_backend_get_fn g_get[FM_DEV_COUNT];
static const fm_backend *g_built[FM_DEV_COUNT];

void fm_backend_register(fm_device_type type, fm_backend_get_fn get) {
    if ((unsigned)type < FM_DEV_COUNT) __atomic_store_n(&g_get[type], get, __ATOMIC_RELEASE);
}

const fm_backend *fm_backend_get(fm_device_type type) {
    if ((unsigned)type >= FM_DEV_COUNT) return NULL;
    const fm_backend *b = __atomic_load_n(&g_built[type], __ATOMIC_ACQUIRE);
    if (__builtin_expect(b != NULL, 1)) return b;
    /* First use, or a device that was absent (CUDA probes lazily, once per call
     * until a device is found); the constructor itself is thread-safe. */
    fm_backend_get_fn get = __atomic_load_n(&g_get[type], __ATOMIC_ACQUIRE);
    b = get ? get() : NULL;
    if (b) __atomic_store_n(&g_built[type], b, __ATOMIC_RELEASE);
    return b;
}
