/* Counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
 *
 * Element i of a draw at generator offset o uses counter (o + i/4) and lane i%4,
 * so a tensor's values depend only on (seed, offset) and never on how many
 * threads fill it. Each draw advances the offset past the counters it used. */
#include <math.h>

#include "fathom/tensor.h"

void fm_philox4x32(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32), c2 = (uint32_t)ctr_hi, c3 = (uint32_t)(ctr_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

static fm_rng g_rng = {0x5eed, 0};

void fm_rng_init(fm_rng *r, uint64_t seed) { r->seed = seed; r->offset = 0; }
fm_rng *fm_rng_global(void) { return &g_rng; }
void fm_manual_seed(uint64_t seed) { fm_rng_init(&g_rng, seed); }

typedef struct fill_ctx {
    fm_tensor *t;
    uint64_t seed, base;
    int normal;
    double a, b; /* uniform: lo, hi; normal: mean, std */
    float *f32;  /* direct destination when the tensor is contiguous f32 / f64 */
    double *f64;
} fill_ctx;

static inline double u01(uint32_t x) { return (x >> 8) * (1.0 / 16777216.0); }      /* [0,1), 24 bits */
static inline double u01_open(uint32_t x) { return ((x >> 8) + 0.5) * (1.0 / 16777216.0); } /* (0,1) */

static void fill_range(void *vctx, int64_t begin, int64_t end, int tid) {
    (void)tid;
    fill_ctx *c = vctx;
    /* Work in groups of 4 elements (one Philox block) aligned to the element index. */
    int64_t g0 = begin / 4, g1 = (end + 3) / 4;
    for (int64_t g = g0; g < g1; g++) {
        uint32_t r[4];
        fm_philox4x32(c->seed, 0, c->base + (uint64_t)g, r);
        double v[4];
        if (c->normal) { /* Box-Muller on two pairs */
            for (int k = 0; k < 4; k += 2) {
                double u1 = u01_open(r[k]), u2 = u01(r[k + 1]);
                double rad = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
                v[k] = c->a + c->b * rad * cos(th);
                v[k + 1] = c->a + c->b * rad * sin(th);
            }
        } else {
            for (int k = 0; k < 4; k++) v[k] = c->a + (c->b - c->a) * u01(r[k]);
        }
        for (int k = 0; k < 4; k++) {
            int64_t i = g * 4 + k;
            if (i < begin || i >= end) continue;
            if (c->f32) c->f32[i] = (float)v[k];
            else if (c->f64) c->f64[i] = v[k];
            else fm_tensor_set(c->t, i, v[k]);
        }
    }
}

static fm_status fill_random(fm_tensor *t, int normal, double a, double b, fm_rng *rng) {
    if (!t) return fm_set_error(FM_ERR_INVALID, "random fill: tensor is NULL");
    if (!fm_dtype_is_float(t->dtype))
        return fm_set_error(FM_ERR_INVALID, "random fill: dtype %s is not floating point", fm_dtype_name(t->dtype));
    if (t->storage->device.type != FM_DEV_CPU)
        return fm_set_error(FM_ERR_UNSUPPORTED, "random fill: only cpu tensors (draw on cpu, then fm_tensor_to)");
    if (!rng) rng = &g_rng;
    int64_t n = fm_tensor_numel(t);
    fill_ctx c = {t, rng->seed, rng->offset, normal, a, b, NULL, NULL};
    if (fm_tensor_is_contiguous(t) && t->dtype == FM_F32) c.f32 = fm_tensor_data(t);
    if (fm_tensor_is_contiguous(t) && t->dtype == FM_F64) c.f64 = fm_tensor_data(t);
    /* Serial: element values depend only on their index, so a parallel fill would give
     * the same numbers; initialization is not hot enough to need it. */
    fill_range(&c, 0, n, 0);
    rng->offset += (uint64_t)((n + 3) / 4);
    return FM_OK;
}

fm_status fm_tensor_uniform_(fm_tensor *t, double lo, double hi, fm_rng *rng) { return fill_random(t, 0, lo, hi, rng); }
fm_status fm_tensor_normal_(fm_tensor *t, double mean, double std, fm_rng *rng) { return fill_random(t, 1, mean, std, rng); }

fm_tensor *fm_tensor_rand(int ndim, const int64_t *shape, fm_dtype dt, fm_rng *rng) {
    fm_tensor *t = fm_tensor_empty(ndim, shape, dt, FM_CPU);
    if (t && fm_tensor_uniform_(t, 0, 1, rng) != FM_OK) { fm_tensor_release(t); return NULL; }
    return t;
}
fm_tensor *fm_tensor_randn(int ndim, const int64_t *shape, fm_dtype dt, fm_rng *rng) {
    fm_tensor *t = fm_tensor_empty(ndim, shape, dt, FM_CPU);
    if (t && fm_tensor_normal_(t, 0, 1, rng) != FM_OK) { fm_tensor_release(t); return NULL; }
    return t;
}
