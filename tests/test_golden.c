/* Golden tests against PyTorch: tools/make_fixtures.py writes the inputs,
 * parameters, outputs, loss and gradients of two small composites (an MLP with
 * layer norm, one causal attention block) into tests/fixtures/, one .bin file
 * per composite and dtype; this test rebuilds the same computations from
 * fathom ops and compares, with tolerances per dtype. The fixture reader validates the file (magic, version, counts,
 * sizes against the file length) before using any of it, and is itself tested
 * on corrupted copies. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "core/parallel.h" /* fm_parallel_shutdown, so valgrind sees no live threads */
#include "fathom/autograd.h"
#include "fathom/ops.h"

#define FX_MAX_TENSORS 256
#define FX_MAX_BYTES (64u << 20)

typedef struct fixture {
    int n;
    char *names[FX_MAX_TENSORS];
    fm_tensor *t[FX_MAX_TENSORS];
} fixture;

static void fixture_free(fixture *f) {
    for (int i = 0; i < f->n; i++) {
        free(f->names[i]);
        fm_tensor_release(f->t[i]);
    }
    f->n = 0;
}

/* Reads little-endian integers from a bounded buffer; any read past the end fails. */
typedef struct reader { const unsigned char *p; size_t n, pos; } reader;
static int rd_bytes(reader *r, void *dst, size_t n) {
    if (n > r->n - r->pos) return 0;
    memcpy(dst, r->p + r->pos, n);
    r->pos += n;
    return 1;
}
static int rd_u32(reader *r, uint32_t *v) {
    unsigned char b[4];
    if (!rd_bytes(r, b, 4)) return 0;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return 1;
}
static int rd_i64(reader *r, int64_t *v) {
    uint32_t lo, hi;
    if (!rd_u32(r, &lo) || !rd_u32(r, &hi)) return 0;
    *v = (int64_t)((uint64_t)hi << 32 | lo);
    return 1;
}

/* Parses a fixture held in memory; `what` names it in errors. */
static fm_status fixture_parse(const unsigned char *buf, size_t len, const char *what, fixture *f) {
    reader r = {buf, len, 0};
    uint32_t version, count;
    memset(f, 0, sizeof *f);
    if (len < 4 || memcmp(buf, "FMFX", 4) != 0)
        return fm_set_error(FM_ERR_FORMAT, "%s: bad magic (not a fathom fixture; regenerate with tools/make_fixtures.py)", what);
    r.pos = 4;
    if (!rd_u32(&r, &version) || !rd_u32(&r, &count))
        return fm_set_error(FM_ERR_FORMAT, "%s: truncated header", what);
    if (version != 1) return fm_set_error(FM_ERR_FORMAT, "%s: unsupported version %u (expected 1)", what, version);
    if (count > FX_MAX_TENSORS)
        return fm_set_error(FM_ERR_FORMAT, "%s: %u tensors is more than the limit %d", what, count, FX_MAX_TENSORS);
    for (uint32_t i = 0; i < count; i++) {
        uint32_t nlen, dt, ndim;
        int64_t shape[FM_MAX_DIMS];
        char name[256];
        if (!rd_u32(&r, &nlen)) goto trunc;
        if (nlen == 0 || nlen >= sizeof name) {
            fixture_free(f);
            return fm_set_error(FM_ERR_FORMAT, "%s: tensor %u has a bad name length %u", what, i, nlen);
        }
        if (!rd_bytes(&r, name, nlen)) goto trunc;
        name[nlen] = 0;
        if (!rd_u32(&r, &dt) || !rd_u32(&r, &ndim)) goto trunc;
        if (dt != FM_F32 && dt != FM_F64 && dt != FM_I64) {
            fixture_free(f);
            return fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' has unknown dtype code %u", what, name, dt);
        }
        if (ndim > FM_MAX_DIMS) {
            fixture_free(f);
            return fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' has %u dims (max %d)", what, name, ndim, FM_MAX_DIMS);
        }
        uint64_t numel = 1;
        for (uint32_t d = 0; d < ndim; d++) {
            if (!rd_i64(&r, &shape[d])) goto trunc;
            if (shape[d] < 0 || shape[d] > (int64_t)FX_MAX_BYTES) {
                fixture_free(f);
                return fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' has a bad dimension %lld", what, name,
                                    (long long)shape[d]);
            }
            numel *= (uint64_t)shape[d];
            if (numel > FX_MAX_BYTES) {
                fixture_free(f);
                return fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' is implausibly large", what, name);
            }
        }
        size_t nbytes = (size_t)numel * fm_dtype_size((fm_dtype)dt);
        if (nbytes > r.n - r.pos) goto trunc;
        fm_tensor *t = fm_tensor_from_data(r.p + r.pos, (int)ndim, shape, (fm_dtype)dt);
        if (!t) {
            fixture_free(f);
            return fm_last_status();
        }
        r.pos += nbytes;
        f->names[f->n] = strdup(name);
        f->t[f->n++] = t;
    }
    if (r.pos != r.n) {
        fixture_free(f);
        return fm_set_error(FM_ERR_FORMAT, "%s: %zu unexpected bytes after the last tensor", what, r.n - r.pos);
    }
    return FM_OK;
trunc:
    fixture_free(f);
    return fm_set_error(FM_ERR_FORMAT, "%s: truncated at byte %zu of %zu (file cut short?)", what, r.pos, r.n);
}

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fm_set_error(FM_ERR_IO, "cannot open %s (run tools/make_fixtures.py?)", path);
        return NULL;
    }
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= FX_MAX_BYTES) { free(buf); fclose(fp); fm_set_error(FM_ERR_FORMAT, "%s: too large", path); return NULL; }
            cap = cap ? cap * 2 : 65536;
            unsigned char *nb = realloc(buf, cap);
            if (!nb) { free(buf); fclose(fp); fm_set_error(FM_ERR_OOM, "%s: out of memory", path); return NULL; }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0) break;
    }
    fclose(fp);
    *len = n;
    return buf;
}

static fm_status fixture_load(const char *name, fixture *f) {
    const char *root = getenv("FATHOM_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/%s", root ? root : ".", name);
    size_t len = 0;
    unsigned char *buf = read_file(path, &len);
    if (!buf) return fm_last_status();
    fm_status st = fixture_parse(buf, len, path, f);
    free(buf);
    return st;
}

/* Every tensor the test asks for must be in the file: a missing one (a reference
 * output or gradient included) is a failed check, never a comparison left out. */
static fm_tensor *fx_get(const fixture *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->names[i], name) == 0) return f->t[i];
    CHECK_MSG(0, "the fixture has no tensor '%s' (regenerate it with tools/make_fixtures.py)", name);
    return NULL;
}

/* max|a - b| / max(max|b|, 1e-30): relative to the tensor's scale, so tiny
 * entries of a large gradient are not held to an impossible standard. */
static void check_close(const char *what, const fm_tensor *a, const fm_tensor *ref, double tol) {
    CHECK_MSG(a != NULL, "%s: missing (%s)", what, fm_last_error());
    CHECK_MSG(ref != NULL, "%s: no reference tensor", what);
    if (!a || !ref) return;
    int64_t n = fm_tensor_numel(ref);
    CHECK_MSG(fm_tensor_numel(a) == n && a->ndim == ref->ndim, "%s: shape differs", what);
    if (fm_tensor_numel(a) != n) return;
    double maxd = 0, maxr = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fm_tensor_get(a, i), y = fm_tensor_get(ref, i);
        double d = fabs(x - y);
        if (!(d <= maxd)) maxd = d;
        if (fabs(y) > maxr) maxr = fabs(y);
    }
    double err = maxd / (maxr > 1e-30 ? maxr : 1e-30);
    CHECK_MSG(err <= tol, "%s: relative error %.3g > %.3g (max |diff| %.3g, max |ref| %.3g)", what, err, tol, maxd, maxr);
}

/* Marks every float tensor of the fixture (the inputs and parameters) as requiring grad. */
static void require_grads(fixture *f, const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        fm_tensor *t = fx_get(f, names[i]);
        if (t) fm_tensor_requires_grad_(t, true);
    }
}

static void compare_grads(fixture *f, const char *tag, const char *const *names, int n, double tol) {
    for (int i = 0; i < n; i++) {
        char gname[128], what[160];
        snprintf(gname, sizeof gname, "grad.%s", names[i]);
        snprintf(what, sizeof what, "%s %s", tag, gname);
        fm_tensor *t = fx_get(f, names[i]);
        check_close(what, t ? t->grad : NULL, fx_get(f, gname), tol);
    }
}

static void test_mlp(const char *file, double tol) {
    fixture f;
    fm_status st = fixture_load(file, &f);
    CHECK_MSG(st == FM_OK, "%s", fm_last_error());
    if (st != FM_OK) return;
    static const char *const params[] = {"x", "w1", "b1", "ln_w", "ln_b", "w2", "b2"};
    require_grads(&f, params, 7);
    fm_tensor *h1 = fm_linear(fx_get(&f, "x"), fx_get(&f, "w1"), fx_get(&f, "b1"));
    fm_tensor *h2 = h1 ? fm_layer_norm(h1, 1, fx_get(&f, "ln_w"), fx_get(&f, "ln_b"), 1e-5) : NULL;
    fm_tensor *h3 = h2 ? fm_gelu(h2) : NULL;
    fm_tensor *logits = h3 ? fm_linear(h3, fx_get(&f, "w2"), fx_get(&f, "b2")) : NULL;
    fm_tensor *loss = logits ? fm_cross_entropy(logits, fx_get(&f, "target"), -100, 0.0, FM_REDUCE_MEAN) : NULL;
    CHECK_MSG(loss != NULL, "%s: forward failed: %s", file, fm_last_error());
    if (loss) {
        char what[128];
        snprintf(what, sizeof what, "%s logits", file);
        check_close(what, logits, fx_get(&f, "logits"), tol);
        snprintf(what, sizeof what, "%s loss", file);
        check_close(what, loss, fx_get(&f, "loss"), tol);
        st = fm_backward(loss, NULL, false);
        CHECK_MSG(st == FM_OK, "%s: backward failed: %s", file, fm_last_error());
        if (st == FM_OK) compare_grads(&f, file, params, 7, tol);
    }
    fm_tensor_release_n(5, h1, h2, h3, logits, loss);
    fixture_free(&f);
}

static void test_attention_block(const char *file, double tol) {
    fixture f;
    fm_status st = fixture_load(file, &f);
    CHECK_MSG(st == FM_OK, "%s", fm_last_error());
    if (st != FM_OK) return;
    static const char *const params[] = {"x", "ln_w", "ln_b", "w_qkv", "b_qkv", "w_o", "b_o"};
    require_grads(&f, params, 7);
    fm_tensor *x = fx_get(&f, "x");
    const int64_t B = x ? x->shape[0] : 0, T = x ? x->shape[1] : 0, C = x ? x->shape[2] : 0, NH = 4;
    enum { MAXT = 24 };
    fm_tensor *tmp[MAXT] = {0}; /* every intermediate, released at the end */
    int nt = 0;
#define KEEP(e) (nt < MAXT ? (tmp[nt++] = (e)) : NULL)
    fm_tensor *h = x ? KEEP(fm_layer_norm(x, 1, fx_get(&f, "ln_w"), fx_get(&f, "ln_b"), 1e-5)) : NULL;
    fm_tensor *qkv = h ? KEEP(fm_linear(h, fx_get(&f, "w_qkv"), fx_get(&f, "b_qkv"))) : NULL;
    fm_tensor *parts[3] = {NULL, NULL, NULL}, *heads[3] = {NULL, NULL, NULL};
    if (qkv && fm_split(qkv, 2, 3, (int64_t[]){C, C, C}, parts) == FM_OK) {
        for (int i = 0; i < 3; i++) {
            KEEP(parts[i]);
            fm_tensor *r = KEEP(fm_reshape(parts[i], 4, (int64_t[]){B, T, NH, C / NH}));
            heads[i] = r ? KEEP(fm_transpose(r, 1, 2)) : NULL; /* [B, NH, T, C/NH], a strided view */
        }
    }
    fm_tensor *y = heads[0] && heads[1] && heads[2]
                       ? KEEP(fm_scaled_dot_product_attention(heads[0], heads[1], heads[2], true, 0)) : NULL;
    fm_tensor *yt = y ? KEEP(fm_transpose(y, 1, 2)) : NULL;
    fm_tensor *yr = yt ? KEEP(fm_reshape(yt, 3, (int64_t[]){B, T, C})) : NULL;
    fm_tensor *o = yr ? KEEP(fm_linear(yr, fx_get(&f, "w_o"), fx_get(&f, "b_o"))) : NULL;
    fm_tensor *out = o ? KEEP(fm_add(o, x)) : NULL;
    fm_tensor *sq = out ? KEEP(fm_mul(out, out)) : NULL;
    fm_tensor *loss = sq ? KEEP(fm_sum(sq, 0, NULL, false)) : NULL;
#undef KEEP
    CHECK_MSG(loss != NULL, "%s: forward failed: %s", file, fm_last_error());
    if (loss) {
        char what[128];
        snprintf(what, sizeof what, "%s out", file);
        check_close(what, out, fx_get(&f, "out"), tol);
        snprintf(what, sizeof what, "%s loss", file);
        check_close(what, loss, fx_get(&f, "loss"), tol);
        st = fm_backward(loss, NULL, false);
        CHECK_MSG(st == FM_OK, "%s: backward failed: %s", file, fm_last_error());
        if (st == FM_OK) compare_grads(&f, file, params, 7, tol);
    }
    for (int i = 0; i < nt; i++) fm_tensor_release(tmp[i]);
    fixture_free(&f);
}

/* The reader must refuse damaged files with a clear message, never read past the end. */
static void test_reader_validation(void) {
    const char *root = getenv("FATHOM_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/mlp_f32.bin", root ? root : ".");
    size_t len = 0;
    unsigned char *buf = read_file(path, &len);
    CHECK_MSG(buf != NULL, "%s", fm_last_error());
    if (!buf) return;
    fixture f;
    unsigned char *copy = malloc(len);
    memcpy(copy, buf, len);
    copy[0] = 'X';
    CHECK(fixture_parse(copy, len, "bad-magic", &f) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("bad magic");
    memcpy(copy, buf, len);
    copy[4] = 9;
    CHECK(fixture_parse(copy, len, "bad-version", &f) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("version 9");
    /* every cut-off point must be caught, wherever it falls */
    size_t cuts[] = {0, 3, 8, 11, 15, 20, 40, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        fm_status st = fixture_parse(buf, cuts[i], "cut", &f);
        CHECK_MSG(st == FM_ERR_FORMAT, "cut at %zu accepted", cuts[i]);
        if (st == FM_OK) fixture_free(&f);
    }
    CHECK_ERR_CONTAINS("truncated");
    /* a huge claimed dimension must not be trusted */
    memcpy(copy, buf, len);
    /* first tensor: name_len u32 at 12, name at 16 ("x"), dtype, ndim, then shape[0] */
    size_t shape0 = 16 + 1 + 8;
    memset(copy + shape0, 0x7f, 8);
    CHECK(fixture_parse(copy, len, "huge-dim", &f) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("dimension");
    free(copy);
    /* and the intact file parses */
    CHECK(fixture_parse(buf, len, "intact", &f) == FM_OK);
    /* a reference tensor missing from the file fails the comparison */
    fm_tensor *x = fx_get(&f, "x");
    CHECK(x != NULL);
    EXPECT_CHECK_FAILS(fx_get(&f, "no-such-tensor"));
    EXPECT_CHECK_FAILS(check_close("x vs a missing reference", x, NULL, 1e-4));
    EXPECT_CHECK_FAILS(check_close("x vs a missing reference", x, fx_get(&f, "grad.no-such-tensor"), 1e-4));
    fixture_free(&f);
    free(buf);
}

int main(void) {
    test_reader_validation();
    test_mlp("mlp_f32.bin", 1e-4);
    test_mlp("mlp_f64.bin", 1e-10);
    test_attention_block("attn_f32.bin", 1e-4);
    fm_parallel_shutdown();
    TEST_DONE();
}
