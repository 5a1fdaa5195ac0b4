/* The backend registry: one constructor per device type, and the backend it
 * built, cached once it exists. Core never names a backend: each registers
 * itself (src/dispatch/backends.c.in lists the ones built). */
#include "core/backend.h"

#include <stdio.h>

static fm_backend_get_fn g_get[FM_DEV_COUNT];
static const fm_backend *g_built[FM_DEV_COUNT];
static fm_backend_count_fn g_count[FM_DEV_COUNT];

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

void fm_backend_register_count(fm_device_type type, fm_backend_count_fn count) {
    if ((unsigned)type < FM_DEV_COUNT) __atomic_store_n(&g_count[type], count, __ATOMIC_RELEASE);
}

int fm_device_count(fm_device_type type, const char **reason) {
    static const char *const not_built[FM_DEV_COUNT] = {
        [FM_DEV_CUDA] = "this build has no CUDA backend (built without the CUDA toolkit, or with -DFATHOM_CUDA=OFF)",
    };
    if ((unsigned)type >= FM_DEV_COUNT) { if (reason) *reason = "no such device type"; return 0; }
    fm_backend_count_fn count = __atomic_load_n(&g_count[type], __ATOMIC_ACQUIRE);
    if (!count) {
        if (reason) *reason = not_built[type] ? not_built[type] : "this build has no backend for this device type";
        return 0;
    }
    const char *why = "";
    int n = count(&why);
    if (reason) *reason = n > 0 ? "" : why;
    return n > 0 ? n : 0;
}

fm_status fm_device_validate(fm_device d) {
    char dn[32];
    const char *why = NULL;
    int n = fm_device_count(d.type, &why);
    fm_device_name(d, dn, sizeof dn);
    if (n <= 0) return fm_set_error(FM_ERR_UNSUPPORTED, "device %s is not usable: %s", dn, why);
    if (d.index < 0 || d.index >= n) {
        char last[32];
        fm_device_name((fm_device){d.type, n - 1}, last, sizeof last);
        return fm_set_error(FM_ERR_INVALID, "device %s does not exist: this machine has %d such device%s (up to %s)", dn, n,
                            n == 1 ? "" : "s", last);
    }
    return FM_OK;
}
