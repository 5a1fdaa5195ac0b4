/* The data loader: batches of a dataset in a seeded order, prepared by worker
 * threads into a ring of preallocated batch buffers.
 *
 * Batch b of an epoch always goes to ring slot b % nslots, and a worker may
 * start batch b only once the consumer has handed back the slot's previous
 * batch (b - nslots). So the ring bounds the prefetch, batches come out in
 * order whichever worker finishes first, and after warm-up no step allocates.
 * Everything random (the permutation, crop offsets, flips) is a pure function
 * of (seed, epoch, sample index) through Philox, so batches are bitwise
 * identical for any worker count and for a loader restored from a saved state.
 *
 * Workers must not slow the training step they overlap with. On a machine
 * whose cores the step already uses (the common case on a CPU), a worker that
 * preempts a compute thread stalls the whole parallel region, which costs far
 * more than the worker's own work (docs/EFFICIENCY.md measures it). So:
 *  - workers run at the lowest priority (SCHED_IDLE on Linux): they take only
 *    cycles no compute thread wants, the gaps between and inside steps, and the
 *    ring lets them bank those gaps several batches ahead;
 *  - a batch is cut into chunks of samples that anyone may claim, so a consumer
 *    that arrives at a batch the starved workers have not finished fills the
 *    rest itself at its own priority, and waits at most for the chunks a worker
 *    is in the middle of;
 *  - per sample, crop, flip and normalize are one pass from the source to the
 *    batch buffer (no staging copy). */
#include "data/data_internal.h"
#include "fathom/profile.h" /* data spans on per-worker tracks */

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Philox counter high words: separate streams for the permutation and for the
 * per-sample transforms, away from the global generator's (which uses 0). */
#define STREAM_PERM 0x5045524dull  /* "PERM" */
#define STREAM_AUG 0x41554721ull   /* "AUG!" */

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD };

typedef struct slot {
    fm_tensor *x, *y; /* full-batch buffers; shape[0] is set to the batch's size */
    int64_t batch;
    int64_t first; /* the batch's row this slot's row 0 is (a shard's part of the batch) */
    int state;
    /* SLOT_FILLING: chunks [0, next_chunk) are claimed, done of them finished */
    int nchunks, next_chunk, done;
} slot;

struct fm_dataloader {
    fm_dataset *ds;
    fm_loader_options opt;
    int64_t n, nb, bs;
    int64_t rows; /* rows a batch buffer holds: bs, or n when the batch is larger than the data set */
    int64_t sample_numel; /* elements of X per sample */
    size_t x_es, y_es;
    /* image geometry for the transforms: C planes of H x W (plane = H * W) */
    int64_t C, H, W, plane;
    bool any_transform;
    int64_t *perm;       /* permutation of the current epoch (NULL: identity) */
    int64_t epoch;
    int64_t next_deliver; /* batch index the consumer gets next; nb: end-of-epoch marker */
    int64_t next_claim;   /* batch index a worker fills next */
    int nslots;
    slot *slots;
    int held; /* slot the consumer holds, or -1 */
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_ready;
    bool stop;
    bool frozen; /* no new claims (quiesce) */
    int inflight; /* chunks being filled outside the lock */
    int64_t chunk; /* samples per chunk */
    int priority; /* of the workers: LOADER_PRIO_* */
    double wait_s;
    int64_t reallocs;
    int64_t filled_by_workers, filled_in_next; /* samples */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void fm_loader_options_init(fm_loader_options *o) {
    memset(o, 0, sizeof *o);
    o->batch_size = 64;
}

void fm_data_shard_rows(int64_t rows, int index, int count, int64_t *first, int64_t *size) {
    if (count < 1) count = 1;
    int64_t base = rows / count, extra = rows % count;
    *first = (int64_t)index * base + (index < extra ? index : extra);
    *size = base + (index < extra);
}

void fm_data_permutation(uint64_t seed, int64_t epoch, int64_t n, int64_t *perm) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    /* Fisher-Yates from the top; step i draws from Philox counter (epoch, i) */
    for (int64_t i = n - 1; i > 0; i--) {
        uint32_t r[4];
        fm_philox4x32(seed, STREAM_PERM << 32 | ((uint64_t)epoch & 0xffffffffu), (uint64_t)i, r);
        uint64_t v = (uint64_t)r[0] << 32 | r[1];
        int64_t j = (int64_t)(v % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* out[j] = (in[j] - m) / sd for j in [0, n): the division, not a multiply by 1/sd,
 * so the values are the ones a straightforward reading of "normalize" gives */
static void norm_copy(float *restrict out, const float *restrict in, int64_t n, float m, float sd) {
    for (int64_t j = 0; j < n; j++) out[j] = (in[j] - m) / sd;
}

/* out[j] = (in[-j] - m) / sd: the mirrored row (in points at its last element) */
static void norm_copy_rev(float *restrict out, const float *restrict in, int64_t n, float m, float sd) {
    for (int64_t j = 0; j < n; j++) out[j] = (in[-j] - m) / sd;
}

static void fill_value(float *out, int64_t n, float v) {
    for (int64_t j = 0; j < n; j++) out[j] = v;
}

/* Writes sample `idx` (src) to dst with crop, flip and normalize applied, in one
 * pass per output row. Output (i, j) is the padded source at (i + oy, j' + ox)
 * where j' = W-1-j when flipped (flip after crop), normalized per channel; the
 * padding normalizes like a zero pixel. */
static void transform_sample(const fm_dataloader *l, const float *src, float *dst, int64_t idx) {
    const fm_transforms *tf = &l->opt.transforms;
    uint32_t r[4] = {0, 0, 0, 0};
    if (tf->crop_padding > 0 || tf->hflip)
        fm_philox4x32(l->opt.seed, STREAM_AUG << 32 | ((uint64_t)l->epoch & 0xffffffffu), (uint64_t)idx, r);
    int64_t oy = 0, ox = 0;
    if (tf->crop_padding > 0) {
        int64_t p = tf->crop_padding, span = 2 * p + 1;
        oy = (int64_t)(((uint64_t)r[0] * (uint64_t)span) >> 32) - p;
        ox = (int64_t)(((uint64_t)r[1] * (uint64_t)span) >> 32) - p;
    }
    const bool flip = tf->hflip && (r[2] & 1), spatial = tf->crop_padding > 0 || flip;
    const int64_t H = l->H, W = l->W, plane = l->plane, nplanes = l->sample_numel / plane;
    /* columns of a cropped row that come from the image: [j0, j1) reads source j + ox */
    int64_t j0 = ox < 0 ? -ox : 0, j1 = ox > 0 ? W - ox : W;
    if (j1 < j0) j1 = j0;
    for (int64_t c = 0; c < nplanes; c++) {
        const float *s = src + c * plane;
        float *d = dst + c * plane;
        int k = tf->normalize_channels == 1 ? 0 : (int)c;
        float m = tf->normalize_channels > 0 ? tf->mean[k] : 0.0f, sd = tf->normalize_channels > 0 ? tf->std[k] : 1.0f;
        if (!spatial) {
            norm_copy(d, s, plane, m, sd);
            continue;
        }
        const float pad = (0.0f - m) / sd;
        for (int64_t i = 0; i < H; i++) {
            float *drow = d + i * W;
            int64_t si = i + oy;
            if (si < 0 || si >= H) {
                fill_value(drow, W, pad);
                continue;
            }
            const float *srow = s + si * W; /* cropped column j reads srow[j + ox] */
            if (!flip) {
                fill_value(drow, j0, pad);
                norm_copy(drow + j0, srow + j0 + ox, j1 - j0, m, sd);
                fill_value(drow + j1, W - j1, pad);
            } else { /* output j shows cropped column W-1-j: image columns land in [W - j1, W - j0) */
                fill_value(drow, W - j1, pad);
                if (j1 > j0) norm_copy_rev(drow + (W - j1), srow + j1 - 1 + ox, j1 - j0, m, sd);
                fill_value(drow + (W - j0), j0, pad);
            }
        }
    }
}

/* Sets slot s up for batch b of the current epoch: its size and chunk count.
 * Caller holds the lock. */
static void begin_batch(fm_dataloader *l, slot *s, int64_t b) {
    int64_t start = b * l->bs;
    int64_t size = l->n - start < l->bs ? l->n - start : l->bs;
    s->first = 0;
    if (l->opt.shard_count > 1) fm_data_shard_rows(size, l->opt.shard_index, l->opt.shard_count, &s->first, &size);
    s->x->shape[0] = size;
    if (s->y) s->y->shape[0] = size;
    s->batch = b;
    s->nchunks = (int)((size + l->chunk - 1) / l->chunk);
    s->next_chunk = 0;
    s->done = 0;
    s->state = s->nchunks ? SLOT_FILLING : SLOT_READY; /* a shard with no row of a short last batch */
    if (!s->nchunks) pthread_cond_broadcast(&l->cv_ready);
}

/* Fills chunk k of the batch in slot s. Reads only state that is frozen while
 * any chunk is in flight. */
static void fill_chunk(fm_dataloader *l, slot *s, int k) {
    int64_t start = s->batch * l->bs + s->first, size = s->x->shape[0];
    int64_t j0 = (int64_t)k * l->chunk, j1 = j0 + l->chunk < size ? j0 + l->chunk : size;
    const char *xs = fm_tensor_data(fm_dataset_x(l->ds));
    const char *ys = l->y_es ? fm_tensor_data(fm_dataset_y(l->ds)) : NULL;
    char *xd = fm_tensor_data(s->x);
    char *yd = s->y ? fm_tensor_data(s->y) : NULL;
    size_t row = (size_t)l->sample_numel * l->x_es;
    for (int64_t j = j0; j < j1; j++) {
        int64_t idx = l->perm ? l->perm[start + j] : start + j;
        if (j + 1 < j1 && row <= 16384) {
            /* shuffled samples sit at random places in a data set far larger than the
             * cache: start fetching the next one while this one is transformed */
            const char *nx = xs + (size_t)(l->perm ? l->perm[start + j + 1] : start + j + 1) * row;
            for (size_t o = 0; o < row; o += 64) __builtin_prefetch(nx + o, 0, 0);
        }
        if (l->any_transform)
            transform_sample(l, (const float *)(xs + (size_t)idx * row), (float *)(xd + (size_t)j * row), idx);
        else
            memcpy(xd + (size_t)j * row, xs + (size_t)idx * row, row);
        if (yd) memcpy(yd + (size_t)j * l->y_es, ys + (size_t)idx * l->y_es, l->y_es);
    }
}

/* Claims the next chunk of slot s, fills it without the lock and marks it done.
 * Caller holds the lock; it is held again on return. */
static void run_chunk(fm_dataloader *l, slot *s, bool by_worker, bool traced) {
    int k = s->next_chunk++;
    l->inflight++;
    pthread_mutex_unlock(&l->mu);
    if (traced) fm_profile_push("load batch", "data");
    fill_chunk(l, s, k);
    if (traced) fm_profile_pop();
    pthread_mutex_lock(&l->mu);
    l->inflight--;
    int64_t size = s->x->shape[0], j0 = (int64_t)k * l->chunk, got = j0 + l->chunk < size ? l->chunk : size - j0;
    *(by_worker ? &l->filled_by_workers : &l->filled_in_next) += got;
    if (++s->done == s->nchunks) s->state = SLOT_READY;
    if (s->state == SLOT_READY || (l->frozen && l->inflight == 0)) pthread_cond_broadcast(&l->cv_ready);
}

/* A worker's next piece of work: a chunk of the earliest batch being filled, or
 * the next batch if its slot is free. NULL: nothing to do. Caller holds the lock. */
static slot *find_work(fm_dataloader *l) {
    if (l->frozen) return NULL;
    slot *best = NULL;
    for (int i = 0; i < l->nslots; i++) {
        slot *s = &l->slots[i];
        if (s->state == SLOT_FILLING && s->next_chunk < s->nchunks && (!best || s->batch < best->batch)) best = s;
    }
    if (best) return best;
    int64_t b = l->next_claim;
    slot *s = b < l->nb ? &l->slots[b % l->nslots] : NULL;
    if (!s || s->state != SLOT_FREE) return NULL;
    begin_batch(l, s, b);
    l->next_claim++;
    return s->nchunks ? s : NULL; /* a shard's empty part of a short last batch is ready as begun */
}

enum { LOADER_PRIO_IDLE, LOADER_PRIO_LOW, LOADER_PRIO_NORMAL };

/* Names a new worker and lowers its priority (see the top of the file), from
 * the creating thread, so both hold before the worker first runs. Only ever
 * lowers, which needs no privilege; a failure just leaves the default. */
static void setup_worker(pthread_t th, int prio) {
#ifdef __linux__
    pthread_setname_np(th, "fm-loader"); /* for top, perf sched and debuggers */
    if (prio == LOADER_PRIO_IDLE) {
        struct sched_param sp;
        memset(&sp, 0, sizeof sp);
        pthread_setschedparam(th, SCHED_IDLE, &sp);
    }
    /* LOADER_PRIO_LOW: nice is per thread on Linux but set by the thread itself (worker_main) */
#else
    (void)th;
    (void)prio;
#endif
}

static void *worker_main(void *arg) {
    fm_dataloader *l = arg;
    bool named = false; /* the trace gets one track per worker, named once profiling is on */
#ifdef __linux__
    if (l->priority == LOADER_PRIO_LOW) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
#endif
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        slot *s = find_work(l);
        if (!s) {
            pthread_cond_wait(&l->cv_work, &l->mu);
            continue;
        }
        if (!named && fm_profiler_enabled()) {
            static int seq = 0;
            char nm[48];
            snprintf(nm, sizeof nm, "loader worker %d", __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED));
            fm_profile_thread_name(nm);
            named = true;
        }
        run_chunk(l, s, true, named);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static fm_status alloc_slot(fm_dataloader *l, slot *s) {
    fm_tensor *x = fm_dataset_x(l->ds), *y = fm_dataset_y(l->ds);
    int64_t shape[FM_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[0] = l->rows;
    fm_tensor *nx = fm_tensor_empty(x->ndim, shape, x->dtype, FM_CPU);
    fm_tensor *ny = y ? fm_tensor_empty(1, &l->rows, y->dtype, FM_CPU) : NULL;
    if (!nx || (y && !ny)) {
        fm_tensor_release(nx);
        fm_tensor_release(ny);
        fm_error_prefix("data loader: allocating a batch buffer");
        return fm_last_status();
    }
    fm_tensor_release(s->x);
    fm_tensor_release(s->y);
    s->x = nx;
    s->y = ny;
    return FM_OK;
}

/* Moves to batch `b` of `epoch`. Caller holds the lock, no batch is in flight,
 * and the consumer holds no slot. */
static void restart(fm_dataloader *l, int64_t epoch, int64_t b) {
    l->epoch = epoch;
    if (l->perm) fm_data_permutation(l->opt.seed, epoch, l->n, l->perm);
    for (int i = 0; i < l->nslots; i++) l->slots[i].state = SLOT_FREE;
    l->next_deliver = b;
    l->next_claim = b;
    l->frozen = false;
    pthread_cond_broadcast(&l->cv_work);
}

/* Stops claims and waits until no chunk is in flight. Caller holds the lock. */
static void quiesce(fm_dataloader *l) {
    l->frozen = true;
    while (l->inflight > 0) pthread_cond_wait(&l->cv_ready, &l->mu);
}

static fm_status validate(const fm_dataset *d, const fm_loader_options *o, int64_t *C, int64_t *H, int64_t *W,
                          int64_t *plane) {
    const fm_tensor *x = fm_dataset_x(d);
    const fm_transforms *tf = &o->transforms;
    char sb[160];
    if (o->batch_size <= 0)
        return fm_set_error(FM_ERR_INVALID, "data loader: batch size must be positive, got %lld", (long long)o->batch_size);
    if (o->workers < 0 || o->workers > 256)
        return fm_set_error(FM_ERR_INVALID, "data loader: workers must be 0 to 256, got %d", o->workers);
    if (o->shard_count < 0 || o->shard_index < 0 || (o->shard_count > 1 && o->shard_index >= o->shard_count))
        return fm_set_error(FM_ERR_INVALID, "data loader: shard %d of %d is not a shard (0 <= index < count)", o->shard_index,
                            o->shard_count);
    if (o->prefetch < 0 || o->prefetch > 1024)
        return fm_set_error(FM_ERR_INVALID, "data loader: prefetch must be 0 to 1024, got %d", o->prefetch);
    bool spatial = tf->crop_padding != 0 || tf->hflip;
    bool any = spatial || tf->normalize_channels != 0;
    *C = 1;
    *H = 1;
    *W = 1;
    int64_t numel = 1;
    for (int i = 1; i < x->ndim; i++) numel *= x->shape[i];
    *plane = numel;
    if (x->ndim == 4) {
        *C = x->shape[1];
        *H = x->shape[2];
        *W = x->shape[3];
        *plane = *H * *W;
    } else if (x->ndim == 3) {
        *H = x->shape[1];
        *W = x->shape[2];
    } else if (x->ndim > 4) {
        *C = x->shape[1];
        *plane = x->shape[1] ? numel / x->shape[1] : 0;
    }
    if (!any) return FM_OK;
    if (x->dtype != FM_F32)
        return fm_set_error(FM_ERR_INVALID, "data loader: transforms need F32 samples, X is %s", fm_dtype_name(x->dtype));
    if (spatial && x->ndim != 3 && x->ndim != 4)
        return fm_set_error(FM_ERR_INVALID, "data loader: crop and flip need X as [N, C, H, W] or [N, H, W], got %s",
                            fm_shape_str(x->ndim, x->shape, sb, sizeof sb));
    if (tf->crop_padding < 0 || tf->crop_padding > 1 << 20)
        return fm_set_error(FM_ERR_INVALID, "data loader: crop padding must be >= 0, got %d", tf->crop_padding);
    int nc = tf->normalize_channels;
    if (nc < 0 || nc > FM_DATA_MAX_CHANNELS || (nc > 1 && nc != *C))
        return fm_set_error(FM_ERR_INVALID, "data loader: normalize has %d channel values, X %s has %lld channels", nc,
                            fm_shape_str(x->ndim, x->shape, sb, sizeof sb), (long long)*C);
    for (int k = 0; k < nc; k++)
        if (!(tf->std[k] > 0) || tf->mean[k] != tf->mean[k])
            return fm_set_error(FM_ERR_INVALID, "data loader: normalize channel %d has std %g (must be > 0) and mean %g", k,
                                (double)tf->std[k], (double)tf->mean[k]);
    return FM_OK;
}

fm_dataloader *fm_dataloader_create(fm_dataset *d, const fm_loader_options *opt) {
    fm_loader_options def;
    if (!opt) {
        fm_loader_options_init(&def);
        opt = &def;
    }
    if (!d) {
        fm_set_error(FM_ERR_INVALID, "data loader: NULL dataset");
        return NULL;
    }
    int64_t C = 0, H = 0, W = 0, plane = 1;
    if (validate(d, opt, &C, &H, &W, &plane) != FM_OK) return NULL;
    int64_t n = fm_dataset_size(d);
    int64_t nb = n / opt->batch_size + (!opt->drop_last && n % opt->batch_size != 0); /* no n + bs - 1: it overflows */
    if (nb == 0) {
        fm_set_error(FM_ERR_INVALID, "data loader: %lld samples make no batch of %lld%s", (long long)n,
                     (long long)opt->batch_size, opt->drop_last ? " with drop_last" : "");
        return NULL;
    }
    fm_dataloader *l = calloc(1, sizeof *l);
    if (!l) {
        fm_set_error(FM_ERR_OOM, "data loader: out of memory");
        return NULL;
    }
    l->ds = fm_dataset_retain(d);
    l->opt = *opt;
    l->n = n;
    l->nb = nb;
    l->bs = opt->batch_size;
    l->rows = l->bs < n ? l->bs : n; /* a batch never holds more than the data set */
    l->C = C;
    l->H = H;
    l->W = W;
    l->plane = plane;
    const fm_transforms *tf = &opt->transforms;
    l->any_transform = tf->crop_padding > 0 || tf->hflip || tf->normalize_channels > 0;
    fm_tensor *x = fm_dataset_x(d), *y = fm_dataset_y(d);
    l->sample_numel = 1;
    for (int i = 1; i < x->ndim; i++) l->sample_numel *= x->shape[i];
    l->x_es = fm_dtype_size(x->dtype);
    l->y_es = y ? fm_dtype_size(y->dtype) : 0;
    l->held = -1;
    /* low-priority workers get their cycles in bursts: a deeper ring banks them */
    l->nslots = opt->workers == 0 ? 1 : (opt->prefetch > 0 ? opt->prefetch : 2 * opt->workers);
    if (opt->workers > 0 && opt->prefetch == 0 && l->nslots < 4) l->nslots = 4;
    if (opt->workers > 0 && l->nslots < 2) l->nslots = 2;
    /* about 8 chunks a batch: small enough that a consumer finishing a batch
     * itself never waits long for a worker's chunk, large enough to be cheap */
    l->chunk = (l->rows + 7) / 8;
    l->priority = LOADER_PRIO_IDLE;
    const char *pe = getenv("FATHOM_LOADER_PRIORITY");
    if (pe && !strcmp(pe, "normal")) l->priority = LOADER_PRIO_NORMAL;
    else if (pe && !strcmp(pe, "low")) l->priority = LOADER_PRIO_LOW;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_ready, NULL);
    l->slots = calloc((size_t)l->nslots, sizeof *l->slots);
    if (opt->shuffle) l->perm = malloc((size_t)(n ? n : 1) * sizeof *l->perm);
    if (!l->slots || (opt->shuffle && !l->perm)) {
        fm_set_error(FM_ERR_OOM, "data loader: out of memory");
        fm_dataloader_free(l);
        return NULL;
    }
    for (int i = 0; i < l->nslots; i++) {
        if (alloc_slot(l, &l->slots[i]) != FM_OK) {
            fm_dataloader_free(l);
            return NULL;
        }
    }
    restart(l, 0, 0);
    if (opt->workers > 0) {
        l->threads = calloc((size_t)opt->workers, sizeof *l->threads);
        if (!l->threads) {
            fm_set_error(FM_ERR_OOM, "data loader: out of memory");
            fm_dataloader_free(l);
            return NULL;
        }
        for (int i = 0; i < opt->workers; i++) {
            pthread_mutex_lock(&l->mu); /* the worker waits for its name and priority */
            int rc = pthread_create(&l->threads[i], NULL, worker_main, l);
            if (rc == 0) setup_worker(l->threads[i], l->priority);
            pthread_mutex_unlock(&l->mu);
            if (rc != 0) {
                fm_set_error(FM_ERR_OOM, "data loader: cannot start worker thread %d of %d", i + 1, opt->workers);
                fm_dataloader_free(l);
                return NULL;
            }
            l->nthreads++;
        }
    }
    return l;
}

void fm_dataloader_free(fm_dataloader *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nthreads; i++) pthread_join(l->threads[i], NULL);
    free(l->threads);
    if (l->slots)
        for (int i = 0; i < l->nslots; i++) {
            fm_tensor_release(l->slots[i].x);
            fm_tensor_release(l->slots[i].y);
        }
    free(l->slots);
    free(l->perm);
    pthread_cond_destroy(&l->cv_ready);
    pthread_cond_destroy(&l->cv_work);
    pthread_mutex_destroy(&l->mu);
    fm_dataset_release(l->ds);
    free(l);
}

int64_t fm_dataloader_num_batches(const fm_dataloader *l) { return l ? l->nb : 0; }

/* Gives the consumer's slot back. A buffer the caller still references (it kept
 * the batch tensor, or a graph saved it) is replaced rather than overwritten. */
static fm_status release_held(fm_dataloader *l) {
    if (l->held < 0) return FM_OK;
    slot *s = &l->slots[l->held];
    bool shared = s->x->refcount != 1 || s->x->storage->refcount != 1 ||
                  (s->y && (s->y->refcount != 1 || s->y->storage->refcount != 1));
    if (shared) {
        fm_status st = alloc_slot(l, s);
        if (st != FM_OK) return st;
        l->reallocs++;
    } else {
        /* restore the full-batch shape a short last batch may have left */
        s->x->shape[0] = l->rows;
        if (s->y) s->y->shape[0] = l->rows;
    }
    s->state = SLOT_FREE;
    l->held = -1;
    pthread_cond_broadcast(&l->cv_work);
    return FM_OK;
}

fm_status fm_dataloader_next(fm_dataloader *l, fm_batch *out) {
    if (!l || !out) return fm_set_error(FM_ERR_INVALID, "dataloader_next: NULL loader or batch");
    memset(out, 0, sizeof *out);
    double t0 = now_s();
    pthread_mutex_lock(&l->mu);
    fm_status st = release_held(l);
    if (st != FM_OK) {
        pthread_mutex_unlock(&l->mu);
        return st;
    }
    if (l->next_deliver >= l->nb) {
        /* every batch of this epoch was delivered, so none is in flight */
        out->epoch = l->epoch;
        out->index = l->nb;
        restart(l, l->epoch + 1, 0);
        pthread_mutex_unlock(&l->mu);
        l->wait_s += now_s() - t0;
        return FM_OK;
    }
    int64_t b = l->next_deliver;
    int si = (int)(b % l->nslots);
    slot *s = &l->slots[si];
    /* Whatever of batch b no worker has claimed yet (they are busy, or starved by
     * the compute threads) is prepared here rather than waited for; the content
     * is the same whoever fills it. Only chunks a worker is in the middle of are
     * waited for. */
    while (!(s->state == SLOT_READY && s->batch == b)) {
        if (s->state == SLOT_FREE && l->next_claim == b) {
            begin_batch(l, s, b);
            l->next_claim++;
            continue; /* a shard's empty part is ready as begun */
        }
        if (s->state == SLOT_FILLING && s->batch == b && s->next_chunk < s->nchunks) run_chunk(l, s, false, false);
        else pthread_cond_wait(&l->cv_ready, &l->mu);
    }
    s->state = SLOT_HELD;
    l->held = si;
    l->next_deliver++;
    out->x = s->x;
    out->y = s->y;
    out->size = s->x->shape[0];
    out->epoch = l->epoch;
    out->index = b;
    pthread_mutex_unlock(&l->mu);
    l->wait_s += now_s() - t0;
    return FM_OK;
}

fm_status fm_dataloader_state_get(const fm_dataloader *l, fm_dataloader_state *out) {
    if (!l || !out) return fm_set_error(FM_ERR_INVALID, "dataloader_state_get: NULL loader or state");
    out->seed = l->opt.seed;
    out->epoch = l->epoch;
    out->batch = l->next_deliver;
    out->num_samples = l->n;
    out->batch_size = l->bs;
    return FM_OK;
}

fm_status fm_dataloader_state_set(fm_dataloader *l, const fm_dataloader_state *s) {
    if (!l || !s) return fm_set_error(FM_ERR_INVALID, "dataloader_state_set: NULL loader or state");
    if (s->num_samples && s->num_samples != l->n)
        return fm_set_error(FM_ERR_INVALID, "data loader state is for %lld samples, this data set has %lld",
                            (long long)s->num_samples, (long long)l->n);
    if (s->batch_size && s->batch_size != l->bs)
        return fm_set_error(FM_ERR_INVALID, "data loader state is for batch size %lld, this loader uses %lld",
                            (long long)s->batch_size, (long long)l->bs);
    if (s->epoch < 0 || s->batch < 0 || s->batch > l->nb)
        return fm_set_error(FM_ERR_INVALID, "data loader state: epoch %lld batch %lld is out of range (%lld batches per epoch)",
                            (long long)s->epoch, (long long)s->batch, (long long)l->nb);
    pthread_mutex_lock(&l->mu);
    fm_status st = release_held(l);
    if (st == FM_OK) {
        quiesce(l);
        l->opt.seed = s->seed;
        restart(l, s->epoch, s->batch);
    }
    pthread_mutex_unlock(&l->mu);
    return st;
}

fm_status fm_dataloader_set_epoch(fm_dataloader *l, int64_t epoch) {
    if (!l) return fm_set_error(FM_ERR_INVALID, "dataloader_set_epoch: NULL loader");
    fm_dataloader_state s;
    fm_dataloader_state_get(l, &s);
    s.epoch = epoch;
    s.batch = 0;
    return fm_dataloader_state_set(l, &s);
}

double fm_dataloader_wait_seconds(const fm_dataloader *l) { return l ? l->wait_s : 0.0; }
int64_t fm_dataloader_realloc_count(const fm_dataloader *l) { return l ? l->reallocs : 0; }

void fm_dataloader_fill_counts(fm_dataloader *l, int64_t *by_workers, int64_t *in_next) {
    int64_t w = 0, c = 0;
    if (l) {
        pthread_mutex_lock(&l->mu);
        w = l->filled_by_workers;
        c = l->filled_in_next;
        pthread_mutex_unlock(&l->mu);
    }
    if (by_workers) *by_workers = w;
    if (in_next) *in_next = c;
}
