/* TensorBoard event files, written and read without TensorFlow or protobuf.
 *
 * A file is a sequence of TFRecords: uint64 length, masked CRC-32C of those 8
 * bytes, the payload, masked CRC-32C of the payload (all little-endian). Each
 * payload is a serialized tensorflow.Event; the handful of fields used here are
 * encoded by hand (field numbers from tensorflow/core/util/event.proto and
 * framework/summary.proto):
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; HistogramProto histo = 5; }
 *   HistogramProto { double min = 1, max = 2, num = 3, sum = 4, sum_squares = 5;
 *                    repeated double bucket_limit = 6 [packed]; repeated double bucket = 7 [packed]; } */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "fathom/nn.h" /* fm_named_list */
#include "fathom/observe.h"

/* ---- CRC-32C ---- */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1; /* reflected Castagnoli */
        crc_table[i] = c;
    }
}

uint32_t fm_crc32c_extend(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint32_t fm_crc32c(const void *data, size_t n) { return fm_crc32c_extend(0, data, n); }

/* TFRecord masks the CRC so that a CRC stored inside CRC'd data does not cancel out. */
uint32_t fm_tfrecord_mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---- protobuf encoding ---- */

typedef struct pbuf { unsigned char *p; size_t n, cap; bool oom; } pbuf;

static void pb_put(pbuf *b, const void *d, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n) nc *= 2;
        unsigned char *np = realloc(b->p, nc);
        if (!np) { b->oom = true; return; }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void pb_varint(pbuf *b, uint64_t v) {
    unsigned char t[10];
    int n = 0;
    do { t[n] = (unsigned char)(v & 0x7f); v >>= 7; if (v) t[n] |= 0x80; n++; } while (v);
    pb_put(b, t, (size_t)n);
}
static void pb_le(pbuf *b, uint64_t v, int bytes) {
    unsigned char t[8];
    for (int i = 0; i < bytes; i++) t[i] = (unsigned char)(v >> (8 * i));
    pb_put(b, t, (size_t)bytes);
}
static void pb_key(pbuf *b, int field, int wire) { pb_varint(b, ((uint64_t)field << 3) | (uint64_t)wire); }
static void pb_double(pbuf *b, int field, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    pb_key(b, field, 1);
    pb_le(b, u, 8);
}
static void pb_float(pbuf *b, int field, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    pb_key(b, field, 5);
    pb_le(b, u, 4);
}
static void pb_bytes(pbuf *b, int field, const void *d, size_t n) {
    pb_key(b, field, 2);
    pb_varint(b, n);
    pb_put(b, d, n);
}
static void pb_packed_doubles(pbuf *b, int field, const double *v, int n) {
    pb_key(b, field, 2);
    pb_varint(b, (uint64_t)n * 8);
    for (int i = 0; i < n; i++) {
        uint64_t u;
        memcpy(&u, &v[i], 8);
        pb_le(b, u, 8);
    }
}

/* ---- writer ---- */

struct fm_tb_writer {
    FILE *f;
    char *path;
    fm_status err; /* first write error */
};

static double wall_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec + tv.tv_usec * 1e-6;
}

static fm_status write_record(fm_tb_writer *w, const pbuf *payload) {
    if (payload->oom) return fm_set_error(FM_ERR_OOM, "tensorboard: out of memory encoding an event");
    if (w->err) return fm_set_error(w->err, "tensorboard: an earlier write to '%s' failed", w->path);
    unsigned char head[12];
    uint64_t len = payload->n;
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)(len >> (8 * i));
    uint32_t c = fm_tfrecord_mask_crc(fm_crc32c(head, 8));
    for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(c >> (8 * i));
    uint32_t d = fm_tfrecord_mask_crc(fm_crc32c(payload->p, payload->n));
    unsigned char tail[4];
    for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(d >> (8 * i));
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(payload->p, 1, payload->n, w->f) != payload->n ||
        fwrite(tail, 1, 4, w->f) != 4 || fflush(w->f) != 0) {
        w->err = FM_ERR_IO;
        return fm_set_error(FM_ERR_IO, "tensorboard: writing '%s' failed (%s)", w->path, strerror(errno));
    }
    return FM_OK;
}

/* Event{wall_time, step, summary{value{...}}} around an encoded Summary.Value. */
static fm_status write_value_event(fm_tb_writer *w, int64_t step, const pbuf *value) {
    pbuf summary = {0}, ev = {0};
    pb_bytes(&summary, 1, value->p, value->n);
    pb_double(&ev, 1, wall_now());
    pb_key(&ev, 2, 0);
    pb_varint(&ev, (uint64_t)step);
    pb_bytes(&ev, 5, summary.p, summary.n);
    ev.oom |= summary.oom || value->oom;
    fm_status st = write_record(w, &ev);
    free(summary.p);
    free(ev.p);
    return st;
}

static fm_status mkdir_p(const char *dir) {
    char tmp[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof tmp) return fm_set_error(FM_ERR_INVALID, "tensorboard: bad log directory name");
    memcpy(tmp, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (tmp[i] != '/' && tmp[i] != 0) continue;
        char c = tmp[i];
        tmp[i] = 0;
        if (mkdir(tmp, 0777) != 0 && errno != EEXIST)
            return fm_set_error(FM_ERR_IO, "tensorboard: cannot create log directory '%s' (%s)", tmp, strerror(errno));
        tmp[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return fm_set_error(FM_ERR_IO, "tensorboard: log directory '%s' is not a directory", dir);
    return FM_OK;
}

fm_tb_writer *fm_tb_writer_open(const char *logdir) {
    if (!logdir || !*logdir) { fm_set_error(FM_ERR_INVALID, "tensorboard: no log directory given"); return NULL; }
    if (mkdir_p(logdir) != FM_OK) return NULL;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "localhost");
    host[sizeof host - 1] = 0;
    size_t plen = strlen(logdir) + strlen(host) + 80;
    char *path = malloc(plen);
    fm_tb_writer *w = calloc(1, sizeof *w);
    if (!path || !w) {
        free(path);
        free(w);
        fm_set_error(FM_ERR_OOM, "tensorboard: out of memory");
        return NULL;
    }
    /* Two writers opened in the same second by one process would collide; the
     * trailing counter (TensorBoard's own files use it the same way) keeps them apart. */
    static int counter = 0;
    int k = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
    snprintf(path, plen, "%s/events.out.tfevents.%010ld.%s.%d.%d", logdir, (long)wall_now(), host, (int)getpid(), k);
    w->path = path;
    w->f = fopen(path, "wb");
    if (!w->f) {
        fm_set_error(FM_ERR_IO, "tensorboard: cannot write to log directory '%s' (%s)", logdir, strerror(errno));
        free(path);
        free(w);
        return NULL;
    }
    pbuf ev = {0};
    pb_double(&ev, 1, wall_now());
    pb_bytes(&ev, 3, "brain.Event:2", 13);
    fm_status st = write_record(w, &ev);
    free(ev.p);
    if (st != FM_OK) {
        fclose(w->f);
        unlink(path);
        free(path);
        free(w);
        return NULL;
    }
    return w;
}

const char *fm_tb_writer_path(const fm_tb_writer *w) { return w ? w->path : NULL; }

fm_status fm_tb_add_scalar(fm_tb_writer *w, const char *tag, int64_t step, double value) {
    if (!w || !tag) return fm_set_error(FM_ERR_INVALID, "tensorboard: add_scalar needs a writer and a tag");
    pbuf v = {0};
    pb_bytes(&v, 1, tag, strlen(tag));
    pb_float(&v, 2, (float)value);
    fm_status st = write_value_event(w, step, &v);
    free(v.p);
    return st;
}

#define TB_BUCKETS 30

fm_status fm_tb_add_histogram(fm_tb_writer *w, const char *tag, int64_t step, const double *x, size_t n) {
    if (!w || !tag || (!x && n)) return fm_set_error(FM_ERR_INVALID, "tensorboard: add_histogram needs a writer, a tag and values");
    double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0, num = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) continue; /* TensorBoard cannot draw inf/NaN; they would stretch every bucket */
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        sum += x[i];
        sq += x[i] * x[i];
        num++;
    }
    if (num == 0) lo = hi = 0;
    double limit[TB_BUCKETS], count[TB_BUCKETS] = {0};
    int nb = hi > lo ? TB_BUCKETS : 1;
    double width = (hi - lo) / nb;
    for (int b = 0; b < nb; b++) limit[b] = b == nb - 1 ? hi : lo + width * (b + 1);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) continue;
        int b = nb == 1 ? 0 : (int)((x[i] - lo) / width);
        if (b >= nb) b = nb - 1;
        if (b < 0) b = 0;
        count[b]++;
    }
    pbuf h = {0}, v = {0};
    pb_double(&h, 1, lo);
    pb_double(&h, 2, hi);
    pb_double(&h, 3, num);
    pb_double(&h, 4, sum);
    pb_double(&h, 5, sq);
    pb_packed_doubles(&h, 6, limit, nb);
    pb_packed_doubles(&h, 7, count, nb);
    pb_bytes(&v, 1, tag, strlen(tag));
    pb_bytes(&v, 5, h.p, h.n);
    v.oom |= h.oom;
    fm_status st = write_value_event(w, step, &v);
    free(h.p);
    free(v.p);
    return st;
}

fm_status fm_tb_add_histogram_tensor(fm_tb_writer *w, const char *tag, int64_t step, const fm_tensor *t) {
    if (!t) return fm_set_error(FM_ERR_INVALID, "tensorboard: add_histogram_tensor: no tensor");
    int64_t n = fm_tensor_numel(t);
    double *buf = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!buf) return fm_set_error(FM_ERR_OOM, "tensorboard: out of memory for a %lld-element histogram", (long long)n);
    fm_status st = fm_tensor_copy_to_host(t, buf, FM_F64);
    if (st == FM_OK) st = fm_tb_add_histogram(w, tag, step, buf, (size_t)n);
    free(buf);
    return st;
}

fm_status fm_tb_add_histograms(fm_tb_writer *w, const char *prefix, const fm_named_list *l, bool grads, int64_t step) {
    if (!w || !l) return fm_set_error(FM_ERR_INVALID, "tensorboard: add_histograms needs a writer and a tensor list");
    for (int i = 0; i < l->n; i++) {
        const fm_tensor *t = grads ? l->items[i].tensor->grad : l->items[i].tensor;
        if (!t || l->items[i].is_buffer) continue;
        char tag[320];
        snprintf(tag, sizeof tag, "%s/%s", prefix ? prefix : (grads ? "grads" : "weights"), l->items[i].name);
        fm_status st = fm_tb_add_histogram_tensor(w, tag, step, t);
        if (st != FM_OK) return st;
    }
    return FM_OK;
}

fm_status fm_tb_writer_close(fm_tb_writer *w) {
    if (!w) return FM_OK;
    fm_status st = w->err;
    if (fclose(w->f) != 0 && st == FM_OK)
        st = fm_set_error(FM_ERR_IO, "tensorboard: closing '%s' failed (%s)", w->path, strerror(errno));
    else if (st != FM_OK)
        fm_set_error(st, "tensorboard: writing '%s' failed earlier", w->path);
    free(w->path);
    free(w);
    return st;
}

/* ---- reader ---- */

typedef struct pbreader { const unsigned char *p, *end; bool bad; } pbreader;

static uint64_t rd_varint(pbreader *r) {
    uint64_t v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (r->p >= r->end) { r->bad = true; return 0; }
        unsigned char c = *r->p++;
        v |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80)) return v;
    }
    r->bad = true;
    return 0;
}
static uint64_t rd_le(pbreader *r, int bytes) {
    if (r->end - r->p < bytes) { r->bad = true; r->p = r->end; return 0; }
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[i] << (8 * i);
    r->p += bytes;
    return v;
}
static double rd_double(pbreader *r) { uint64_t u = rd_le(r, 8); double d; memcpy(&d, &u, 8); return d; }
static float rd_float(pbreader *r) { uint32_t u = (uint32_t)rd_le(r, 4); float f; memcpy(&f, &u, 4); return f; }
/* A length-delimited field as a sub-reader. */
static pbreader rd_sub(pbreader *r) {
    uint64_t n = rd_varint(r);
    pbreader s = {r->p, r->p, false};
    if (r->bad || n > (uint64_t)(r->end - r->p)) { r->bad = true; s.bad = true; r->p = r->end; return s; }
    s.end = r->p + n;
    r->p += n;
    return s;
}
static void rd_skip(pbreader *r, int wire) {
    switch (wire) {
    case 0: rd_varint(r); break;
    case 1: rd_le(r, 8); break;
    case 2: rd_sub(r); break;
    case 5: rd_le(r, 4); break;
    default: r->bad = true;
    }
}

/* Repeated doubles, packed (wire 2) or one per key (wire 1). */
typedef struct dvec { double *v; int n, cap; } dvec;
static void dvec_push(dvec *d, double x, bool *oom) {
    if (d->n == d->cap) {
        int nc = d->cap ? d->cap * 2 : 32;
        double *nv = realloc(d->v, (size_t)nc * sizeof *nv);
        if (!nv) { *oom = true; return; }
        d->v = nv;
        d->cap = nc;
    }
    d->v[d->n++] = x;
}
static void rd_doubles(pbreader *r, int wire, dvec *d, bool *oom) {
    if (wire == 1) { dvec_push(d, rd_double(r), oom); return; }
    pbreader s = rd_sub(r);
    while (!s.bad && s.p < s.end) dvec_push(d, rd_double(&s), oom);
    if (s.bad) r->bad = true;
}

static void decode_value(pbreader v, int64_t step, double wall, fm_tb_value_fn fn, void *ctx, bool *bad, bool *oom) {
    char tag[512] = "";
    double simple = NAN;
    bool has_simple = false, has_histo = false;
    fm_tb_histo h = {0};
    dvec lim = {0}, cnt = {0};
    while (!v.bad && v.p < v.end) {
        uint64_t key = rd_varint(&v);
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (field == 1 && wire == 2) {
            pbreader s = rd_sub(&v);
            size_t n = (size_t)(s.end - s.p);
            if (n >= sizeof tag) n = sizeof tag - 1;
            memcpy(tag, s.p, n);
            tag[n] = 0;
        } else if (field == 2 && wire == 5) {
            simple = rd_float(&v);
            has_simple = true;
        } else if (field == 5 && wire == 2) {
            pbreader s = rd_sub(&v);
            has_histo = true;
            while (!s.bad && s.p < s.end) {
                uint64_t k2 = rd_varint(&s);
                int f2 = (int)(k2 >> 3), w2 = (int)(k2 & 7);
                if (f2 >= 1 && f2 <= 5 && w2 == 1) {
                    double d = rd_double(&s);
                    if (f2 == 1) h.min = d;
                    else if (f2 == 2) h.max = d;
                    else if (f2 == 3) h.num = d;
                    else if (f2 == 4) h.sum = d;
                    else h.sum_squares = d;
                } else if (f2 == 6) rd_doubles(&s, w2, &lim, oom);
                else if (f2 == 7) rd_doubles(&s, w2, &cnt, oom);
                else rd_skip(&s, w2);
            }
            if (s.bad) v.bad = true;
        } else {
            rd_skip(&v, wire);
        }
    }
    if (v.bad) *bad = true;
    else if (has_histo) {
        h.n_buckets = lim.n < cnt.n ? lim.n : cnt.n;
        h.bucket_limit = lim.v;
        h.bucket = cnt.v;
        fn(ctx, tag, step, wall, h.num, &h);
    } else if (has_simple) {
        fn(ctx, tag, step, wall, simple, NULL);
    }
    free(lim.v);
    free(cnt.v);
}

static bool decode_event(const unsigned char *p, size_t n, fm_tb_value_fn fn, void *ctx, bool *oom) {
    pbreader r = {p, p + n, false};
    double wall = 0;
    int64_t step = 0;
    /* The summary may precede step/wall_time in a foreign writer's field order,
     * so remember where it is and decode it last. */
    pbreader summary = {NULL, NULL, false};
    bool has_summary = false, bad = false;
    while (!r.bad && r.p < r.end) {
        uint64_t key = rd_varint(&r);
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (field == 1 && wire == 1) wall = rd_double(&r);
        else if (field == 2 && wire == 0) step = (int64_t)rd_varint(&r);
        else if (field == 5 && wire == 2) { summary = rd_sub(&r); has_summary = true; }
        else rd_skip(&r, wire);
    }
    if (r.bad) return false;
    while (has_summary && !summary.bad && summary.p < summary.end) {
        uint64_t key = rd_varint(&summary);
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (field == 1 && wire == 2) decode_value(rd_sub(&summary), step, wall, fn, ctx, &bad, oom);
        else rd_skip(&summary, wire);
    }
    return !bad && !summary.bad;
}

fm_status fm_tb_read_file(const char *path, fm_tb_value_fn fn, void *ctx, int64_t *n_records) {
    if (n_records) *n_records = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return fm_set_error(FM_ERR_IO, "tensorboard: cannot read '%s' (%s)", path, strerror(errno));
    fm_status st = FM_OK;
    unsigned char *buf = NULL;
    size_t cap = 0;
    int64_t count = 0;
    long off = 0;
    bool oom = false;
    for (;;) {
        unsigned char head[12];
        size_t got = fread(head, 1, 12, f);
        if (got < 12) break; /* end, or a torn header */
        uint64_t len = 0;
        for (int i = 0; i < 8; i++) len |= (uint64_t)head[i] << (8 * i);
        uint32_t c = 0;
        for (int i = 0; i < 4; i++) c |= (uint32_t)head[8 + i] << (8 * i);
        if (c != fm_tfrecord_mask_crc(fm_crc32c(head, 8))) {
            st = fm_set_error(FM_ERR_FORMAT, "tensorboard: '%s' is not a TFRecord event file (bad length checksum at byte %ld)", path, off);
            break;
        }
        if (len > (1u << 30)) {
            st = fm_set_error(FM_ERR_FORMAT, "tensorboard: '%s': implausible record length %llu at byte %ld", path,
                              (unsigned long long)len, off);
            break;
        }
        if (len + 4 > cap) {
            size_t nc = (size_t)len + 4;
            unsigned char *nb = realloc(buf, nc);
            if (!nb) { st = fm_set_error(FM_ERR_OOM, "tensorboard: out of memory reading '%s'", path); break; }
            buf = nb;
            cap = nc;
        }
        if (fread(buf, 1, (size_t)len + 4, f) < len + 4) break; /* torn last record: a writer still running or one that crashed */
        uint32_t d = 0;
        for (int i = 0; i < 4; i++) d |= (uint32_t)buf[len + i] << (8 * i);
        if (d != fm_tfrecord_mask_crc(fm_crc32c(buf, (size_t)len))) {
            st = fm_set_error(FM_ERR_FORMAT, "tensorboard: '%s': corrupt record at byte %ld (data checksum mismatch)", path, off);
            break;
        }
        if (!decode_event(buf, (size_t)len, fn, ctx, &oom)) {
            st = fm_set_error(FM_ERR_FORMAT, "tensorboard: '%s': record at byte %ld is not a valid Event", path, off);
            break;
        }
        if (oom) { st = fm_set_error(FM_ERR_OOM, "tensorboard: out of memory reading '%s'", path); break; }
        count++;
        off += (long)(len + 16);
    }
    free(buf);
    fclose(f);
    if (n_records) *n_records = count;
    return st;
}

/* ---- scalars of a log directory ---- */

typedef struct scalar_ctx { fm_tb_scalars *s; const char *prefix; bool oom; } scalar_ctx;

/* The series for tag in one of the two lists (scalars or histograms). */
static fm_tb_series *series_get(fm_tb_series **list, int *n, int *cap, const char *tag) {
    for (int i = 0; i < *n; i++)
        if (!strcmp((*list)[i].tag, tag)) return &(*list)[i];
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 8;
        fm_tb_series *ns = realloc(*list, (size_t)nc * sizeof *ns);
        if (!ns) return NULL;
        *list = ns;
        *cap = nc;
    }
    fm_tb_series *r = &(*list)[*n];
    memset(r, 0, sizeof *r);
    r->tag = strdup(tag);
    if (!r->tag) return NULL;
    (*n)++;
    return r;
}

static void on_scalar(void *vctx, const char *tag, int64_t step, double wall, double value, const fm_tb_histo *h) {
    scalar_ctx *c = vctx;
    if (c->oom) return;
    char full[1024];
    snprintf(full, sizeof full, "%s%s", c->prefix, tag);
    fm_tb_scalars *s = c->s;
    /* a histogram is listed by how many values it summarized */
    fm_tb_series *r = h ? series_get(&s->histograms, &s->n_histograms, &s->cap_histograms, full)
                        : series_get(&s->series, &s->n, &s->cap, full);
    if (h) value = h->num;
    if (!r) { c->oom = true; return; }
    if (r->n == r->cap) {
        int nc = r->cap ? r->cap * 2 : 64;
        int64_t *ns = realloc(r->step, (size_t)nc * sizeof *ns);
        if (ns) r->step = ns;
        double *nv = realloc(r->value, (size_t)nc * sizeof *nv);
        if (nv) r->value = nv;
        double *nw = realloc(r->wall_time, (size_t)nc * sizeof *nw);
        if (nw) r->wall_time = nw;
        if (!ns || !nv || !nw) { c->oom = true; return; }
        r->cap = nc;
    }
    r->step[r->n] = step;
    r->value[r->n] = value;
    r->wall_time[r->n] = wall;
    r->n++;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Event files under dir (depth <= 2) as "relative/path" strings. */
static fm_status list_event_files(const char *dir, const char *rel, int depth, char ***files, int *n, int *cap) {
    char path[4096];
    snprintf(path, sizeof path, "%s%s%s", dir, *rel ? "/" : "", rel);
    DIR *d = opendir(path);
    if (!d) return fm_set_error(FM_ERR_IO, "tensorboard: cannot read log directory '%s' (%s)", path, strerror(errno));
    struct dirent *e;
    fm_status st = FM_OK;
    while (st == FM_OK && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char relp[4096], full[8192];
        snprintf(relp, sizeof relp, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        snprintf(full, sizeof full, "%s/%s", dir, relp);
        struct stat sb;
        if (stat(full, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode)) {
            if (depth < 2) st = list_event_files(dir, relp, depth + 1, files, n, cap);
        } else if (strstr(e->d_name, "tfevents")) {
            if (*n == *cap) {
                int nc = *cap ? *cap * 2 : 16;
                char **nf = realloc(*files, (size_t)nc * sizeof *nf);
                if (!nf) { st = fm_set_error(FM_ERR_OOM, "tensorboard: out of memory"); break; }
                *files = nf;
                *cap = nc;
            }
            if (!((*files)[*n] = strdup(relp))) { st = fm_set_error(FM_ERR_OOM, "tensorboard: out of memory"); break; }
            (*n)++;
        }
    }
    closedir(d);
    return st;
}

static void sort_series(fm_tb_series *r) {
    /* insertion sort: series arrive almost always in step order already */
    for (int i = 1; i < r->n; i++) {
        int64_t s = r->step[i];
        double v = r->value[i], w = r->wall_time[i];
        int j = i - 1;
        while (j >= 0 && r->step[j] > s) {
            r->step[j + 1] = r->step[j];
            r->value[j + 1] = r->value[j];
            r->wall_time[j + 1] = r->wall_time[j];
            j--;
        }
        r->step[j + 1] = s;
        r->value[j + 1] = v;
        r->wall_time[j + 1] = w;
    }
}

fm_status fm_tb_read_scalars(const char *path, fm_tb_scalars *out) {
    memset(out, 0, sizeof *out);
    struct stat sb;
    if (!path || stat(path, &sb) != 0)
        return fm_set_error(FM_ERR_IO, "tensorboard: cannot read '%s' (%s)", path ? path : "(null)", strerror(errno));
    scalar_ctx c = {out, "", false};
    fm_status st = FM_OK;
    if (!S_ISDIR(sb.st_mode)) {
        st = fm_tb_read_file(path, on_scalar, &c, NULL);
    } else {
        char **files = NULL;
        int n = 0, cap = 0;
        st = list_event_files(path, "", 0, &files, &n, &cap);
        if (st == FM_OK && n == 0)
            st = fm_set_error(FM_ERR_IO, "tensorboard: no event files (events.out.tfevents.*) in '%s'", path);
        /* file names start with the creation time, so name order is age order within a directory */
        if (st == FM_OK) qsort(files, (size_t)n, sizeof *files, cmp_str);
        for (int i = 0; st == FM_OK && i < n; i++) {
            char full[8192], prefix[4096] = "";
            snprintf(full, sizeof full, "%s/%s", path, files[i]);
            const char *slash = strrchr(files[i], '/');
            if (slash) snprintf(prefix, sizeof prefix, "%.*s/", (int)(slash - files[i]), files[i]);
            c.prefix = prefix;
            st = fm_tb_read_file(full, on_scalar, &c, NULL);
        }
        for (int i = 0; i < n; i++) free(files[i]);
        free(files);
    }
    if (st == FM_OK && c.oom) st = fm_set_error(FM_ERR_OOM, "tensorboard: out of memory reading scalars");
    if (st != FM_OK) { fm_tb_scalars_free(out); return st; }
    for (int i = 0; i < out->n; i++) sort_series(&out->series[i]);
    for (int i = 0; i < out->n_histograms; i++) sort_series(&out->histograms[i]);
    return FM_OK;
}

const fm_tb_series *fm_tb_scalars_find(const fm_tb_scalars *s, const char *tag) {
    for (int i = 0; s && i < s->n; i++)
        if (!strcmp(s->series[i].tag, tag)) return &s->series[i];
    return NULL;
}

static void free_series(fm_tb_series *list, int n) {
    for (int i = 0; i < n; i++) {
        free(list[i].tag);
        free(list[i].step);
        free(list[i].value);
        free(list[i].wall_time);
    }
    free(list);
}

void fm_tb_scalars_free(fm_tb_scalars *s) {
    if (!s) return;
    free_series(s->series, s->n);
    free_series(s->histograms, s->n_histograms);
    memset(s, 0, sizeof *s);
}
