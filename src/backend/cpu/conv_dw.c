/* The depthwise conv kernel (conv_dw_loops.h): its portable build (one float
 * per "vector", the FATHOM_ISA=scalar reference) and the runner that picks the
 * widest build the CPU and FATHOM_ISA allow and splits the planes over the pool. */
#include <math.h>
#include <string.h>

#include "backend/cpu/conv_dw.h"
#include "backend/cpu/conv_shared.h"
#include "core/cpu_features.h"
#include "core/parallel.h"

#define V float
#define VL 1
#define VSET1(v) (v)
#define VLOADU(p) (*(p))
#define VSTOREU(p, v) (*(p) = (v))
#define VSTOREN(p, v, n) ((void)(p), (void)(v), (void)(n)) /* one lane: never partial */
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VMAX(a, b) ((a) > (b) ? (a) : (b))
#define VMIN(a, b) ((a) < (b) ? (a) : (b))
#define SFX(name) name##_scalar
#include "backend/cpu/conv_dw_loops.h"

typedef struct dw_job {
    const fm_conv_dw *d;
    float *ws;
    int64_t *off;
    int64_t per; /* scratch floats per thread */
    void (*planes)(const fm_conv_dw *, int64_t, int64_t, float *, int64_t *);
} dw_job;

static void dw_task(void *ctx, int64_t b, int64_t e, int tid) {
    const dw_job *j = ctx;
    j->planes(j->d, b, e, j->ws + tid * j->per, j->off + tid * j->d->kh * j->d->kw);
}

fm_status fm_conv_dw_run(const fm_conv_dw *d) {
    dw_job j = {d, NULL, NULL, fm_conv_dw_scratch_floats(d->H, d->W, d->ph, d->pw, d->sw, d->kw), dw_planes_scalar};
    if (fm_cpu_use_avx512()) j.planes = fm_conv_dw_planes_avx512;
    else if (fm_cpu_use_avx2()) j.planes = fm_conv_dw_planes_avx2;
    const int nt = fm_num_threads() < 1 ? 1 : fm_num_threads();
    fm_tensor *ws = scratch(nt * j.per, FM_F32), *off = ws ? scratch(nt * d->kh * d->kw, FM_I64) : NULL;
    if (!off) {
        fm_tensor_release(ws);
        return fm_last_status();
    }
    j.ws = fm_tensor_data(ws), j.off = fm_tensor_data(off);
    const int64_t planes = d->N * d->O;
    fm_parallel_for(planes, grain_for(planes, d->Ho * d->Wo * d->kh * d->kw), dw_task, &j);
    fm_tensor_release_n(2, ws, off);
    return FM_OK;
}
