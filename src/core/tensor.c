/* Tensors and storage: creation, lifetime, geometry, host element access.
 * The differentiable view functions (fm_reshape, fm_permute, ...) are in
 * src/ops/views.c; this file provides the raw geometry they build on. What
 * needs a kernel (filled tensors, reading a device tensor, printing) is in
 * src/ops/fill.c and src/ops/to_host.c. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/dtype_internal.h"
#include "core/tensor_internal.h"
#include "fathom/memory.h"

/* ---------------- devices ---------------- */

static const char *const k_dev_names[FM_DEV_COUNT] = {"cpu", "cuda", "check", "meta"};

const char *fm_device_name(fm_device d, char *buf, size_t n) {
    if (d.type == FM_DEV_CPU) snprintf(buf, n, "cpu");
    else if ((unsigned)d.type < FM_DEV_COUNT) snprintf(buf, n, "%s:%d", k_dev_names[d.type], d.index);
    else snprintf(buf, n, "device-type-%d:%d", (int)d.type, d.index);
    return buf;
}

bool fm_device_eq(fm_device a, fm_device b) { return a.type == b.type && (a.type == FM_DEV_CPU || a.index == b.index); }

/* "cpu", "cuda", "cuda:N", "check", "check:N", "meta" (the planner's; not named in the
 * error, since the commands that take --device refuse it) (N a decimal index below 64).
 * Whether the device exists is not asked here (see fm_device_validate). */
fm_status fm_device_parse(const char *s, fm_device *out) {
    if (!s || !out) return fm_set_error(FM_ERR_INVALID, "device: NULL argument");
    if (!strcmp(s, "cpu")) { *out = FM_CPU; return FM_OK; }
    for (int t = FM_DEV_CPU + 1; t < FM_DEV_COUNT; t++) {
        size_t n = strlen(k_dev_names[t]);
        if (strncmp(s, k_dev_names[t], n)) continue;
        if (s[n] == 0) { *out = (fm_device){(fm_device_type)t, 0}; return FM_OK; }
        if (s[n] != ':' || s[n + 1] < '0' || s[n + 1] > '9') break;
        char *end;
        long idx = strtol(s + n + 1, &end, 10);
        if (*end == 0 && idx >= 0 && idx < 64) { *out = (fm_device){(fm_device_type)t, (int)idx}; return FM_OK; }
        break;
    }
    return fm_set_error(FM_ERR_INVALID, "unknown device '%s' (expected cpu, cuda, cuda:N, check or check:N)", s);
}

/* ---------------- storage ---------------- */

static fm_allocator *allocator_for(fm_device dev) {
    if (dev.type == FM_DEV_CPU) return fm_cpu_allocator();
    const fm_backend *b = fm_backend_get(dev.type);
    return b && b->allocator ? b->allocator(dev.index) : NULL;
}

static _Thread_local fm_storage_slot *tl_slots;
static _Thread_local int tl_n_slots;

fm_storage_slot *fm_storage_slots_set(fm_storage_slot *slots, int n, int *prev_n) {
    fm_storage_slot *prev = tl_slots;
    if (prev_n) *prev_n = tl_n_slots;
    tl_slots = n > 0 ? slots : NULL;
    tl_n_slots = n > 0 ? n : 0;
    return prev;
}

static fm_storage *take_slot(size_t nbytes, fm_device dev) {
    for (int i = 0; i < tl_n_slots; i++) {
        fm_storage_slot *sl = &tl_slots[i];
        if (sl->taken || sl->nbytes != nbytes || !fm_device_eq(sl->dev, dev)) continue;
        fm_storage *s = calloc(1, sizeof *s);
        if (!s) return NULL; /* the caller allocates as usual */
        s->data = sl->data;
        s->refcount = 1;
        s->nbytes = nbytes;
        s->device = dev;
        s->deleter = sl->deleter;
        s->deleter_ctx = sl->ctx;
        sl->taken = true;
        __atomic_store_n(sl->live, 1, __ATOMIC_RELEASE);
        return s;
    }
    return NULL;
}

fm_storage *fm_storage_new(size_t nbytes, fm_device dev) {
    if (tl_n_slots && nbytes) {
        fm_storage *s = take_slot(nbytes, dev);
        if (s) return s;
    }
    fm_allocator *a = allocator_for(dev);
    if (!a) {
        char dn[32];
        if (fm_device_validate(dev) == FM_OK) /* else it said why: not built, no device, index out of range */
            fm_set_error(FM_ERR_UNSUPPORTED, "no allocator for device %s (this build or machine has no such device)",
                         fm_device_name(dev, dn, sizeof dn));
        return NULL;
    }
    fm_storage *s = calloc(1, sizeof *s);
    if (!s) { fm_set_error(FM_ERR_OOM, "out of host memory for a storage header"); return NULL; }
    s->data = a->alloc(a, nbytes ? nbytes : 1);
    if (!s->data) { free(s); return NULL; } /* allocator set the error */
    s->refcount = 1;
    s->nbytes = nbytes;
    s->device = dev;
    s->alloc = a;
    return s;
}

void fm_storage_release(fm_storage *s) {
    if (!s) return;
    if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (s->alloc) s->alloc->free(s->alloc, s->data, s->nbytes ? s->nbytes : 1);
    else if (s->deleter) s->deleter(s->deleter_ctx, s->data);
    free(s);
}

/* ---------------- tensors ---------------- */

int64_t fm_tensor_numel(const fm_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
size_t fm_tensor_nbytes(const fm_tensor *t) { return (size_t)fm_tensor_numel(t) * fm_dtype_size(t->dtype); }
fm_device fm_tensor_device(const fm_tensor *t) { return t->storage->device; }
void *fm_tensor_data(const fm_tensor *t) { return (char *)t->storage->data + t->offset * (int64_t)fm_dtype_size(t->dtype); }

bool fm_tensor_is_contiguous(const fm_tensor *t) {
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

void fm_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) { strides[i] = s; s *= shape[i]; }
}

fm_status fm_check_shape(const char *op, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > FM_MAX_DIMS)
        return fm_set_error(FM_ERR_INVALID, "%s: %d dimensions requested; fathom supports 0 to %d", op, ndim, FM_MAX_DIMS);
    /* The product of the non-zero sizes bounds both the element count and every
     * contiguous stride: with a zero size in front, [0, 2^40, 2^40] has no elements
     * but its first stride is 2^80, so the zero must not end the check. */
    int64_t m = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return fm_set_error(FM_ERR_INVALID, "%s: negative size %" PRId64 " in dimension %d", op, shape[i], i);
        int64_t d = shape[i] ? shape[i] : 1;
        if (m > INT64_MAX / 16 / d)
            return fm_set_error(FM_ERR_INVALID, "%s: shape too large (the element count or a stride overflows)", op);
        m *= d;
    }
    return FM_OK;
}

fm_tensor *fm_tensor_alloc_header(void) {
    fm_tensor *t = calloc(1, sizeof *t);
    if (!t) { fm_set_error(FM_ERR_OOM, "out of host memory for a tensor header"); return NULL; }
    t->refcount = 1;
    return t;
}

fm_tensor *fm_tensor_empty(int ndim, const int64_t *shape, fm_dtype dt, fm_device dev) {
    if ((unsigned)dt >= FM_DTYPE_COUNT) { fm_set_error(FM_ERR_INVALID, "empty: invalid dtype %d", (int)dt); return NULL; }
    if (fm_check_shape("empty", ndim, shape) != FM_OK) return NULL;
    fm_tensor *t = fm_tensor_alloc_header();
    if (!t) return NULL;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    fm_contiguous_strides(ndim, t->shape, t->strides);
    t->dtype = dt;
    t->storage = fm_storage_new((size_t)fm_tensor_numel(t) * fm_dtype_size(dt), dev);
    if (!t->storage) { free(t); return NULL; }
    return t;
}

fm_tensor *fm_tensor_empty_like(const fm_tensor *t) { return fm_tensor_empty(t->ndim, t->shape, t->dtype, t->storage->device); }


fm_tensor *fm_tensor_arange(double start, double end, double step, fm_dtype dt) {
    if (step == 0 || step != step || start != start || end != end) {
        fm_set_error(FM_ERR_INVALID, "arange: step must be non-zero and bounds finite (got start %g end %g step %g)", start, end, step);
        return NULL;
    }
    double cnt = ceil((end - start) / step);
    if (cnt < 0) cnt = 0;
    if (cnt > 1e12) { fm_set_error(FM_ERR_INVALID, "arange: %g elements is too many", cnt); return NULL; }
    int64_t n = (int64_t)cnt;
    fm_tensor *t = fm_tensor_empty(1, &n, dt, FM_CPU);
    if (!t) return NULL;
    for (int64_t i = 0; i < n; i++) fm_store_f64((char *)t->storage->data + i * (int64_t)fm_dtype_size(dt), dt, start + (double)i * step);
    return t;
}

fm_tensor *fm_tensor_from_data(const void *data, int ndim, const int64_t *shape, fm_dtype dt) {
    if (!data) { fm_set_error(FM_ERR_INVALID, "from_data: data is NULL"); return NULL; }
    fm_tensor *t = fm_tensor_empty(ndim, shape, dt, FM_CPU);
    if (t) memcpy(t->storage->data, data, fm_tensor_nbytes(t));
    return t;
}

fm_tensor *fm_tensor_from_buffer(void *data, int ndim, const int64_t *shape, fm_dtype dt,
                                 void (*deleter)(void *, void *), void *ctx) {
    if (!data) { fm_set_error(FM_ERR_INVALID, "from_buffer: data is NULL"); return NULL; }
    if ((unsigned)dt >= FM_DTYPE_COUNT) { fm_set_error(FM_ERR_INVALID, "from_buffer: invalid dtype"); return NULL; }
    if (fm_check_shape("from_buffer", ndim, shape) != FM_OK) return NULL;
    fm_tensor *t = fm_tensor_alloc_header();
    fm_storage *s = calloc(1, sizeof *s);
    if (!t || !s) { free(t); free(s); fm_set_error(FM_ERR_OOM, "out of host memory"); return NULL; }
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    fm_contiguous_strides(ndim, t->shape, t->strides);
    t->dtype = dt;
    s->refcount = 1;
    s->data = data;
    s->nbytes = (size_t)fm_tensor_numel(t) * fm_dtype_size(dt);
    s->device = FM_CPU;
    s->deleter = deleter;
    s->deleter_ctx = ctx;
    t->storage = s;
    return t;
}

/* Autograd's part of a release (src/autograd/node.c registers it). */
static void (*g_grad_fn_release)(fm_tensor *t);
void fm_tensor_set_grad_fn_release(void (*fn)(fm_tensor *t)) { __atomic_store_n(&g_grad_fn_release, fn, __ATOMIC_RELEASE); }

fm_tensor *fm_tensor_retain(fm_tensor *t) {
    if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
    return t;
}


void fm_tensor_release(fm_tensor *t) {
    if (!t) return;
    if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    fm_tensor_release(t->grad);
    if (t->grad_fn) __atomic_load_n(&g_grad_fn_release, __ATOMIC_ACQUIRE)(t); /* set: only autograd gives a tensor a grad_fn */
    for (fm_hook *h = t->hooks; h;) { fm_hook *n = h->next; free(h); h = n; }
    for (fm_post_hook *h = t->post_hooks; h;) { fm_post_hook *n = h->next; free(h); h = n; }
    free(t->name);
    fm_storage_release(t->storage);
    free(t);
}

void fm_tensor_release_n(int n, ...) {
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) fm_tensor_release(va_arg(ap, fm_tensor *));
    va_end(ap);
}

void fm_tensor_set_name(fm_tensor *t, const char *name) {
    free(t->name);
    t->name = name ? strdup(name) : NULL;
}

/* A new header over t's storage with the given geometry (no autograd). Bounds are
 * checked: a view can never reach past its storage. */
fm_tensor *fm_view_raw(const fm_tensor *t, int ndim, const int64_t *shape, const int64_t *strides, int64_t offset) {
    if (fm_check_shape("view", ndim, shape) != FM_OK) return NULL;
    int64_t lo = offset, hi = offset, numel = 1;
    for (int i = 0; i < ndim; i++) {
        numel *= shape[i];
        if (shape[i] == 0) continue;
        int64_t span = (shape[i] - 1) * strides[i];
        if (span < 0) lo += span; else hi += span;
    }
    int64_t cap = (int64_t)(t->storage->nbytes / fm_dtype_size(t->dtype));
    if (numel > 0 && (lo < 0 || hi >= cap)) {
        char sb[128];
        fm_set_error(FM_ERR_INVALID, "view: shape %s with offset %" PRId64 " reaches element %" PRId64
                     " but the storage holds %" PRId64 " elements",
                     fm_shape_str(ndim, shape, sb, sizeof sb), offset, lo < 0 ? lo : hi, cap);
        return NULL;
    }
    fm_tensor *v = fm_tensor_alloc_header();
    if (!v) return NULL;
    v->ndim = ndim;
    for (int i = 0; i < ndim; i++) { v->shape[i] = shape[i]; v->strides[i] = strides[i]; }
    v->offset = offset;
    v->dtype = t->dtype;
    v->storage = t->storage;
    __atomic_add_fetch(&t->storage->refcount, 1, __ATOMIC_RELAXED);
    return v;
}

fm_tensor *fm_alias(const fm_tensor *t) { return fm_view_raw(t, t->ndim, t->shape, t->strides, t->offset); }

fm_status fm_norm_axis(const char *op, int axis, int ndim, int *out) {
    int nd = ndim == 0 ? 1 : ndim;
    if (axis < -nd || axis >= nd)
        return fm_set_error(FM_ERR_INVALID, "%s: axis %d is out of range for a %d-dimensional tensor (valid: %d to %d)",
                            op, axis, ndim, -nd, nd - 1);
    *out = axis < 0 ? axis + nd : axis;
    return FM_OK;
}

/* ---------------- element access ---------------- */

int64_t fm_tensor_elem_offset(const fm_tensor *t, int64_t flat) {
    int64_t off = t->offset;
    for (int i = t->ndim - 1; i >= 0; i--) {
        int64_t idx = flat % t->shape[i];
        flat /= t->shape[i];
        off += idx * t->strides[i];
    }
    return off;
}

static fm_status check_host(const fm_tensor *t, const char *what) {
    if (!t) return fm_set_error(FM_ERR_INVALID, "%s: tensor is NULL", what);
    if (t->storage->device.type != FM_DEV_CPU)
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: tensor is on a device; copy it to the cpu first (fm_tensor_to)", what);
    return FM_OK;
}

double fm_tensor_get(const fm_tensor *t, int64_t flat) {
    if (check_host(t, "get") != FM_OK) return NAN;
    if (flat < 0 || flat >= fm_tensor_numel(t)) { fm_set_error(FM_ERR_INVALID, "get: index %" PRId64 " out of range", flat); return NAN; }
    size_t es = fm_dtype_size(t->dtype);
    return fm_load_f64((char *)t->storage->data + fm_tensor_elem_offset(t, flat) * (int64_t)es, t->dtype);
}

fm_status fm_tensor_set(fm_tensor *t, int64_t flat, double v) {
    fm_status st = check_host(t, "set");
    if (st) return st;
    if (flat < 0 || flat >= fm_tensor_numel(t)) return fm_set_error(FM_ERR_INVALID, "set: index %" PRId64 " out of range", flat);
    size_t es = fm_dtype_size(t->dtype);
    fm_store_f64((char *)t->storage->data + fm_tensor_elem_offset(t, flat) * (int64_t)es, t->dtype, v);
    return FM_OK;
}

/* ---------------- shape strings ---------------- */

const char *fm_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t pos = 0;
    pos += (size_t)snprintf(buf + pos, n - pos, "[");
    for (int i = 0; i < ndim && pos < n; i++)
        pos += (size_t)snprintf(buf + pos, n - pos, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (pos < n) snprintf(buf + pos, n - pos, "]");
    return buf;
}
