/* Data layer: the idx/CSV/text/.npy/.npz/PNG readers (values and every kind of
 * malformed file), datasets, Fashion-MNIST, the loader (order, worker-count
 * independence, resume, buffer reuse, shutdown) and a fuzz pass over the
 * parsers. Fixtures are generated here into a temporary directory, except the
 * .npy/.npz files in tests/data, which real numpy wrote (make_npy_fixtures.py). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "fathom/autograd.h" /* a training-like step in the buffer-reuse test */
#include "fathom/data.h"
#include "fathom/memory.h" /* no allocations per batch */
#include "fathom/ops.h"
#include "fathom/tensor.h"
#include "test_util.h"

static char g_tmp[256];
static char g_fix[1024];

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_tmp, name);
    return buf[k];
}

static const char *fix_path(const char *name) {
    static char buf[1600];
    snprintf(buf, sizeof buf, "%s/%s", g_fix, name);
    return buf;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

static void write_gz(const char *path, const void *p, size_t n) {
    gzFile g = gzopen(path, "wb");
    if (!g) { perror(path); exit(2); }
    gzwrite(g, p, (unsigned)n);
    gzclose(g);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

/* idx bytes: header + data (already big-endian) */
static size_t make_idx(unsigned char *out, int type, int ndim, const uint32_t *dims, const void *data, size_t dbytes) {
    out[0] = 0; out[1] = 0; out[2] = (unsigned char)type; out[3] = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++) {
        out[4 + 4 * i] = (unsigned char)(dims[i] >> 24); out[5 + 4 * i] = (unsigned char)(dims[i] >> 16);
        out[6 + 4 * i] = (unsigned char)(dims[i] >> 8); out[7 + 4 * i] = (unsigned char)dims[i];
    }
    memcpy(out + 4 + 4 * ndim, data, dbytes);
    return 4 + 4 * (size_t)ndim + dbytes;
}

/* A small MNIST-like image file: 5 images of 3x4, pixel = (17 * (n*12 + i)) & 255 */
static size_t make_images(unsigned char *out) {
    unsigned char px[5 * 12];
    for (int i = 0; i < 60; i++) px[i] = (unsigned char)((17 * i) & 255);
    uint32_t d[3] = {5, 3, 4};
    return make_idx(out, 0x08, 3, d, px, sizeof px);
}

static void test_idx(void) {
    unsigned char buf[512];
    size_t n = make_images(buf);
    write_bytes(tmp_path("img.idx"), buf, n);
    write_gz(tmp_path("img.idx.gz"), buf, n);
    fm_tensor *raw = fm_idx_read(tmp_path("img.idx"));
    fm_tensor *gz = fm_idx_read(tmp_path("img.idx.gz"));
    CHECK(raw && gz && raw->dtype == FM_U8 && raw->ndim == 3 && raw->shape[0] == 5 && raw->shape[2] == 4);
    CHECK(raw && gz && memcmp(fm_tensor_data(raw), fm_tensor_data(gz), 60) == 0);
    CHECK(raw && fm_tensor_get(raw, 59) == ((17 * 59) & 255));
    fm_tensor *im = fm_idx_read_images(tmp_path("img.idx.gz"));
    CHECK(im && im->dtype == FM_F32 && im->ndim == 4 && im->shape[1] == 1 && im->shape[2] == 3);
    CHECK(im && ((float *)fm_tensor_data(im))[7] == (float)((17 * 7) & 255) / 255.0f);
    fm_tensor_release_n(3, raw, gz, im);

    /* labels: u8 -> i64 */
    unsigned char lab[5] = {9, 0, 3, 3, 1};
    uint32_t ld[1] = {5};
    n = make_idx(buf, 0x08, 1, ld, lab, 5);
    write_gz(tmp_path("lab.idx.gz"), buf, n);
    fm_tensor *y = fm_idx_read_labels(tmp_path("lab.idx.gz"));
    CHECK(y && y->dtype == FM_I64 && y->shape[0] == 5 && ((int64_t *)fm_tensor_data(y))[0] == 9);
    fm_tensor_release(y);

    /* other element types: i16 (widened), i32, f32, f64, big-endian */
    unsigned char d16[4] = {0xff, 0xfe, 0x01, 0x00};
    n = make_idx(buf, 0x0B, 1, (uint32_t[]){2}, d16, 4);
    fm_tensor *t = fm_idx_read_mem(buf, n, "i16");
    CHECK(t && t->dtype == FM_I32 && fm_tensor_get(t, 0) == -2 && fm_tensor_get(t, 1) == 256);
    fm_tensor_release(t);
    unsigned char df32[4] = {0x3f, 0xc0, 0, 0}; /* 1.5 */
    n = make_idx(buf, 0x0D, 1, (uint32_t[]){1}, df32, 4);
    t = fm_idx_read_mem(buf, n, "f32");
    CHECK(t && t->dtype == FM_F32 && fm_tensor_get(t, 0) == 1.5);
    fm_tensor_release(t);
    unsigned char df64[8] = {0xc0, 0x04, 0, 0, 0, 0, 0, 0}; /* -2.5 */
    n = make_idx(buf, 0x0E, 1, (uint32_t[]){1}, df64, 8);
    t = fm_idx_read_mem(buf, n, "f64");
    CHECK(t && t->dtype == FM_F64 && fm_tensor_get(t, 0) == -2.5);
    fm_tensor_release(t);
    unsigned char di32[4] = {0xff, 0xff, 0xff, 0xfd};
    n = make_idx(buf, 0x0C, 1, (uint32_t[]){1}, di32, 4);
    t = fm_idx_read_mem(buf, n, "i32");
    CHECK(t && t->dtype == FM_I32 && fm_tensor_get(t, 0) == -3);
    fm_tensor_release(t);

    /* malformed files: each names the file and the problem */
    n = make_images(buf);
    write_bytes(tmp_path("trunc.idx"), buf, n - 1);
    CHECK(fm_idx_read(tmp_path("trunc.idx")) == NULL && fm_last_status() == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("trunc.idx: idx file truncated");
    write_gz(tmp_path("trunc.idx.gz"), buf, n - 7);
    CHECK(fm_idx_read(tmp_path("trunc.idx.gz")) == NULL);
    CHECK_ERR_CONTAINS("needs 60 data bytes");
    write_bytes(tmp_path("hdr.idx"), buf, 9);
    CHECK(fm_idx_read(tmp_path("hdr.idx")) == NULL);
    CHECK_ERR_CONTAINS("truncated in its header");
    unsigned char bad[16];
    memcpy(bad, buf, 16);
    bad[0] = 0x42;
    CHECK(fm_idx_read_mem(bad, 16, "magic.idx") == NULL);
    CHECK_ERR_CONTAINS("magic.idx: not an idx file");
    memcpy(bad, buf, 16);
    bad[2] = 0x07;
    CHECK(fm_idx_read_mem(bad, 16, "type.idx") == NULL);
    CHECK_ERR_CONTAINS("unknown idx element type 0x07");
    /* declared sizes whose product overflows 64 bits, or just far exceeds the file */
    uint32_t huge[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    n = make_idx(buf, 0x0E, 4, huge, "", 0);
    CHECK(fm_idx_read_mem(buf, n, "huge.idx") == NULL && fm_last_status() == FM_ERR_FORMAT);
    /* a zero size with the others' product past int64 (found by tests/fuzz/fuzz_idx): the
     * data is empty, but the strides would overflow */
    uint32_t zero_huge[5] = {0x123500u, 0, 0x1bu, 0xfb020000u, 0x1b040506u};
    n = make_idx(buf, 0x08, 5, zero_huge, "", 0);
    CHECK(fm_idx_read_mem(buf, n, "zero_huge.idx") == NULL);
    CHECK_ERR_CONTAINS("idx dimensions overflow");
    uint32_t big[2] = {60000, 0xffffffu};
    n = make_idx(buf, 0x08, 2, big, "abc", 3);
    CHECK(fm_idx_read_mem(buf, n, "big.idx") == NULL);
    CHECK_ERR_CONTAINS("truncated");
    n = make_images(buf);
    buf[n] = 1;
    CHECK(fm_idx_read_mem(buf, n + 1, "extra.idx") == NULL);
    CHECK_ERR_CONTAINS("after its data");
    unsigned char garbage_gz[20] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6};
    CHECK(fm_idx_read_mem(garbage_gz, sizeof garbage_gz, "bad.gz") == NULL && fm_last_status() == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("bad.gz");
    CHECK(fm_idx_read(tmp_path("does-not-exist.idx")) == NULL && fm_last_status() == FM_ERR_IO);
    CHECK_ERR_CONTAINS("does-not-exist.idx: cannot open");
    /* wrong kind of file for images / labels */
    CHECK(fm_idx_read_images(tmp_path("lab.idx.gz")) == NULL);
    CHECK_ERR_CONTAINS("expected u8 images [N, H, W]");
    CHECK(fm_idx_read_labels(tmp_path("img.idx")) == NULL);
    CHECK_ERR_CONTAINS("expected integer labels");
}

static void test_csv(void) {
    fm_csv_options o;
    fm_csv_options_init(&o);
    const char *txt = "a,b,\"label\"\r\n1,2.5,3\n\n-1e-3, 4 ,0\n";
    fm_tensor *x = NULL, *y = NULL;
    o.label_name = "label";
    CHECK(fm_csv_read_mem(txt, strlen(txt), "t.csv", &o, &x, &y) == FM_OK);
    CHECK(x && y && x->ndim == 2 && x->shape[0] == 2 && x->shape[1] == 2 && y->dtype == FM_I64);
    CHECK(x && fm_tensor_get(x, 1) == 2.5 && (float)fm_tensor_get(x, 2) == -1e-3f && fm_tensor_get(x, 3) == 4);
    CHECK(y && fm_tensor_get(y, 0) == 3 && fm_tensor_get(y, 1) == 0);
    fm_tensor_release_n(2, x, y);
    /* label by index (first column), no header, float labels */
    const char *nh = "7,1,2\n8,3,4\n";
    fm_csv_options_init(&o);
    o.label_index = 0;
    o.label_float = true;
    CHECK(fm_csv_read_mem(nh, strlen(nh), "nh.csv", &o, &x, &y) == FM_OK);
    CHECK(x && y && x->shape[0] == 2 && x->shape[1] == 2 && y->dtype == FM_F32 && fm_tensor_get(y, 1) == 8 &&
          fm_tensor_get(x, 0) == 1);
    fm_tensor_release_n(2, x, y);
    /* last column, tab-separated, written to a file */
    write_bytes(tmp_path("t.tsv"), "x\ty\tz\n1\t2\t5\n", 12);
    fm_csv_options_init(&o);
    o.delimiter = '\t';
    o.label_index = -1;
    CHECK(fm_csv_read(tmp_path("t.tsv"), &o, &x, &y) == FM_OK);
    CHECK(x && y && x->shape[1] == 2 && fm_tensor_get(y, 0) == 5);
    fm_tensor_release_n(2, x, y);
    /* no label at all */
    fm_csv_options_init(&o);
    CHECK(fm_csv_read_mem(nh, strlen(nh), "nh.csv", &o, &x, NULL) == FM_OK && x && x->shape[1] == 3);
    fm_tensor_release(x);
    /* errors */
    const char *ragged = "1,2\n3\n";
    CHECK(fm_csv_read_mem(ragged, strlen(ragged), "r.csv", &o, &x, &y) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("r.csv:2: 1 fields, expected 2");
    const char *notnum = "a,b\n1,2\n3,x7\n";
    CHECK(fm_csv_read_mem(notnum, strlen(notnum), "n.csv", &o, &x, &y) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("n.csv:3: column 2: 'x7' is not a number");
    o.label_name = "c";
    CHECK(fm_csv_read_mem(notnum, strlen(notnum), "n.csv", &o, &x, &y) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("no column named 'c'");
    o.label_name = "b";
    const char *frac = "a,b\n1,2.5\n";
    CHECK(fm_csv_read_mem(frac, strlen(frac), "f.csv", &o, &x, &y) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("label '2.5' is not an integer");
    o.label_name = NULL;
    o.label_index = 5;
    CHECK(fm_csv_read_mem(nh, strlen(nh), "nh.csv", &o, &x, &y) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("out of range");
    fm_csv_options_init(&o);
    CHECK(fm_csv_read_mem("a,b\n", 4, "h.csv", &o, &x, &y) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("no data rows");
    CHECK(fm_csv_read_mem("\"a,1\n", 5, "q.csv", &o, &x, &y) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("q.csv:1: unbalanced quotes");
    CHECK(x == NULL && y == NULL);
}

static void test_text(void) {
    write_bytes(tmp_path("t.txt"), "hi\n\xff", 4);
    fm_tensor *a = fm_text_read(tmp_path("t.txt"), FM_U8), *b = fm_text_read(tmp_path("t.txt"), FM_I64);
    CHECK(a && b && a->shape[0] == 4 && fm_tensor_get(a, 3) == 255 && fm_tensor_get(b, 0) == 'h' &&
          b->dtype == FM_I64);
    fm_tensor_release_n(2, a, b);
    CHECK(fm_text_read(tmp_path("t.txt"), FM_F32) == NULL);
    CHECK_ERR_CONTAINS("u8 or i64");
}

static void test_npy(void) {
    /* files numpy wrote */
    const char *v[3] = {"f4_2x3.npy", "f4_2x3_v2.npy", "f4_2x3_v3.npy"};
    for (int k = 0; k < 3; k++) {
        fm_tensor *t = fm_npy_read(fix_path(v[k]));
        CHECK_MSG(t && t->dtype == FM_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3, "%s: %s", v[k],
                  fm_last_error());
        for (int i = 0; t && i < 6; i++) CHECK(fm_tensor_get(t, i) == 0.5 * i - 1);
        fm_tensor_release(t);
    }
    fm_tensor *t = fm_npy_read(fix_path("f4_be_2x3.npy"));
    CHECK(t && t->dtype == FM_F32 && fm_tensor_get(t, 5) == 1.5);
    fm_tensor_release(t);
    t = fm_npy_read(fix_path("f8_fortran_3x4.npy"));
    CHECK(t && t->dtype == FM_F64 && t->shape[0] == 3 && t->shape[1] == 4);
    for (int i = 0; t && i < 12; i++) CHECK(fm_tensor_get(t, i) == i / 4.0);
    fm_tensor_release(t);
    t = fm_npy_read(fix_path("f2_4.npy"));
    CHECK(t && t->dtype == FM_F16 && fm_tensor_get(t, 1) == -2 && fm_tensor_get(t, 2) == 65504);
    fm_tensor_release(t);
    t = fm_npy_read(fix_path("i4_5.npy"));
    CHECK(t && t->dtype == FM_I32 && fm_tensor_get(t, 0) == -3 && fm_tensor_get(t, 4) == 2147483647.0);
    fm_tensor_release(t);
    t = fm_npy_read(fix_path("i8_2x2.npy"));
    CHECK(t && t->dtype == FM_I64 && ((int64_t *)fm_tensor_data(t))[3] == (int64_t)1 << 62 &&
          ((int64_t *)fm_tensor_data(t))[0] == -((int64_t)1 << 40));
    fm_tensor_release(t);
    t = fm_npy_read(fix_path("u1_3.npy"));
    CHECK(t && t->dtype == FM_U8 && fm_tensor_get(t, 2) == 255);
    fm_tensor_release(t);
    t = fm_npy_read(fix_path("i1_3.npy"));
    CHECK(t && t->dtype == FM_I8 && fm_tensor_get(t, 0) == -128);
    fm_tensor_release(t);
    t = fm_npy_read(fix_path("b1_4.npy"));
    CHECK(t && t->dtype == FM_BOOL && fm_tensor_get(t, 0) == 1 && fm_tensor_get(t, 1) == 0);
    fm_tensor_release(t);
    t = fm_npy_read(fix_path("f4_scalar.npy"));
    CHECK(t && t->ndim == 0 && fm_tensor_item(t) == 3.25);
    fm_tensor_release(t);
    t = fm_npy_read(fix_path("f4_empty_0x3.npy"));
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 3);
    fm_tensor_release(t);
    CHECK(fm_npy_read(fix_path("u2_2.npy")) == NULL && fm_last_status() == FM_ERR_UNSUPPORTED);
    CHECK_ERR_CONTAINS("'<u2' is not supported");

    /* round trip through our writer, including a non-contiguous view */
    fm_tensor *a = fm_tensor_arange(0, 12, 1, FM_F64);
    int64_t s[2] = {3, 4};
    fm_tensor *r = fm_reshape(a, 2, s), *tr = fm_transpose(r, 0, 1);
    CHECK(fm_npy_write(tmp_path("rt.npy"), tr) == FM_OK);
    fm_tensor *back = fm_npy_read(tmp_path("rt.npy"));
    CHECK(back && back->shape[0] == 4 && back->shape[1] == 3 && fm_tensor_get(back, 1) == 4 && fm_tensor_get(back, 3) == 1);
    fm_tensor_release_n(4, a, r, tr, back);
    fm_dtype dts[7] = {FM_F32, FM_F16, FM_I32, FM_I64, FM_U8, FM_I8, FM_BOOL};
    for (int k = 0; k < 7; k++) {
        int64_t one = 5;
        fm_tensor *o = fm_tensor_ones(1, &one, dts[k], FM_CPU);
        CHECK(fm_npy_write(tmp_path("rt1.npy"), o) == FM_OK);
        fm_tensor *ob = fm_npy_read(tmp_path("rt1.npy"));
        CHECK_MSG(ob && ob->dtype == dts[k] && ob->shape[0] == 5 && fm_tensor_get(ob, 4) == 1, "%s", fm_dtype_name(dts[k]));
        fm_tensor_release_n(2, o, ob);
    }

    /* malformed */
    size_t n;
    unsigned char *good = read_bytes(fix_path("f4_2x3.npy"), &n);
    CHECK(fm_npy_read_mem(good, n - 1, "short.npy") == NULL);
    CHECK_ERR_CONTAINS("short.npy: .npy file truncated: shape [2, 3] of <f4 needs 24 data bytes, file has 23");
    CHECK(fm_npy_read_mem(good, 40, "hdr.npy") == NULL);
    CHECK_ERR_CONTAINS("header declares");
    CHECK(fm_npy_read_mem(good, 5, "tiny.npy") == NULL);
    CHECK_ERR_CONTAINS("not a .npy file");
    unsigned char *mut = malloc(n + 8);
    memcpy(mut, good, n);
    mut[6] = 9;
    CHECK(fm_npy_read_mem(mut, n, "ver.npy") == NULL && fm_last_status() == FM_ERR_UNSUPPORTED);
    CHECK_ERR_CONTAINS("version 9.0");
    memcpy(mut, good, n);
    char *sh = strstr((char *)mut + 10, "(2, 3)");
    CHECK(sh != NULL);
    if (sh) memcpy(sh, "(9, 3)", 6);
    CHECK(fm_npy_read_mem(mut, n, "shape.npy") == NULL);
    CHECK_ERR_CONTAINS("needs 108 data bytes, file has 24");
    memcpy(mut, good, n);
    char *ds = strstr((char *)mut + 10, "'<f4'");
    if (ds) memcpy(ds, "'<c8'", 5);
    CHECK(fm_npy_read_mem(mut, n, "c8.npy") == NULL);
    CHECK_ERR_CONTAINS("'<c8' is not supported");
    memcpy(mut, good, n);
    char *fo = strstr((char *)mut + 10, "False");
    if (fo) memcpy(fo, "Flase", 5);
    CHECK(fm_npy_read_mem(mut, n, "fo.npy") == NULL && fm_last_status() == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("'fortran_order' must be True or False");
    memcpy(mut, good, n);
    mut[n] = 0;
    CHECK(fm_npy_read_mem(mut, n + 1, "extra.npy") == NULL);
    CHECK_ERR_CONTAINS("after its data");
    /* a shape whose element count overflows */
    const char *hb = "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296), }";
    unsigned char hbuf[256] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    size_t hl = strlen(hb);
    hbuf[8] = (unsigned char)hl;
    memcpy(hbuf + 10, hb, hl);
    CHECK(fm_npy_read_mem(hbuf, 10 + hl, "ovf.npy") == NULL && fm_last_status() == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("overflows");
    free(mut);
    free(good);
}

static void check_xy(fm_npz *z, const char *what) {
    CHECK_MSG(z != NULL, "%s: %s", what, fm_last_error());
    if (!z) return;
    CHECK(fm_npz_count(z) == 2);
    CHECK(strcmp(fm_npz_name(z, 0), "x") == 0 && strcmp(fm_npz_name(z, 1), "y") == 0 && fm_npz_name(z, 2) == NULL);
    fm_tensor *x = fm_npz_get(z, "x"), *y = fm_npz_get(z, "y.npy");
    CHECK_MSG(x && x->dtype == FM_F32 && x->shape[0] == 3 && x->shape[1] == 4, "%s: %s", what, fm_last_error());
    for (int i = 0; x && i < 12; i++) CHECK((float)fm_tensor_get(x, i) == (float)i / 3.0f);
    CHECK(y && y->dtype == FM_I64 && fm_tensor_get(y, 0) == 2 && fm_tensor_get(y, 2) == 1);
    CHECK(fm_npz_get(z, "w") == NULL);
    CHECK_ERR_CONTAINS("no member named 'w'");
    fm_tensor_release_n(2, x, y);
}

static void test_npz(void) {
    fm_npz *z = fm_npz_open(fix_path("xy_stored.npz"));
    check_xy(z, "stored");
    fm_npz_close(z);
    z = fm_npz_open(fix_path("xy_deflated.npz"));
    check_xy(z, "deflated");
    fm_npz_close(z);
    size_t n;
    unsigned char *b = read_bytes(fix_path("xy_deflated.npz"), &n);
    CHECK(fm_npz_open_mem(b, n - 1, "cut.npz") == NULL && fm_last_status() == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("cut.npz: not an .npz (zip) file: no end-of-central-directory record");
    /* corrupt the deflated payload of the first member: decode or CRC must fail */
    unsigned char *m = malloc(n);
    memcpy(m, b, n);
    m[80] ^= 0x55;
    z = fm_npz_open_mem(m, n, "bad.npz");
    CHECK(z != NULL);
    fm_tensor *x = z ? fm_npz_get(z, "x") : NULL;
    CHECK(x == NULL && fm_last_status() == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("bad.npz[x]");
    fm_npz_close(z);
    free(m);
    free(b);
    CHECK(fm_npz_open(fix_path("f4_2x3.npy")) == NULL);
    CHECK_ERR_CONTAINS("not an .npz (zip) file");
}

static void test_png(void) {
    if (!fm_png_available()) {
        CHECK(fm_png_read(tmp_path("x.png")) == NULL && fm_last_status() == FM_ERR_UNSUPPORTED);
        return;
    }
    int64_t s[2] = {3, 5};
    fm_tensor *g = fm_tensor_empty(2, s, FM_U8, FM_CPU);
    for (int i = 0; i < 15; i++) ((uint8_t *)fm_tensor_data(g))[i] = (uint8_t)(i * 17);
    CHECK(fm_png_write(tmp_path("g.png"), g) == FM_OK);
    fm_tensor *r = fm_png_read(tmp_path("g.png"));
    CHECK(r && r->dtype == FM_F32 && r->ndim == 3 && r->shape[0] == 1 && r->shape[1] == 3 && r->shape[2] == 5);
    for (int i = 0; r && i < 15; i++) CHECK(((float *)fm_tensor_data(r))[i] == (float)(i * 17) / 255.0f);
    fm_tensor_release(r);
    int64_t s3[3] = {3, 2, 2};
    fm_tensor *c = fm_tensor_empty(3, s3, FM_U8, FM_CPU);
    for (int i = 0; i < 12; i++) ((uint8_t *)fm_tensor_data(c))[i] = (uint8_t)(i * 20);
    CHECK(fm_png_write(tmp_path("c.png"), c) == FM_OK);
    r = fm_data_read(tmp_path("c.png"));
    CHECK(r && r->shape[0] == 3 && r->shape[1] == 2 && ((float *)fm_tensor_data(r))[11] == 220.0f / 255.0f &&
          ((float *)fm_tensor_data(r))[4] == 80.0f / 255.0f);
    fm_tensor_release_n(3, g, c, r);
    /* truncated PNG */
    size_t n;
    unsigned char *b = read_bytes(tmp_path("g.png"), &n);
    write_bytes(tmp_path("cut.png"), b, n / 2);
    CHECK(fm_png_read(tmp_path("cut.png")) == NULL && fm_last_status() == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("cut.png");
    free(b);
    write_bytes(tmp_path("notpng.png"), "hello world", 11);
    CHECK(fm_png_read(tmp_path("notpng.png")) == NULL);
    CHECK_ERR_CONTAINS("notpng.png: not a readable PNG");
}

static void test_data_read(void) {
    fm_tensor *t = fm_data_read(fix_path("f4_2x3.npy"));
    CHECK(t && t->shape[1] == 3);
    fm_tensor_release(t);
    t = fm_data_read(tmp_path("img.idx.gz"));
    CHECK(t && t->dtype == FM_F32 && t->ndim == 3 && (float)fm_tensor_get(t, 1) == 17.0f / 255.0f);
    fm_tensor_release(t);
    CHECK(fm_data_read(tmp_path("t.txt")) == NULL);
    CHECK_ERR_CONTAINS("unrecognized input format");
}

static void test_dataset(void) {
    int64_t sx[2] = {6, 2}, sy[1] = {6}, sbad[1] = {5};
    fm_tensor *x = fm_tensor_arange(0, 12, 1, FM_F32), *xr = fm_reshape(x, 2, sx);
    fm_tensor *y = fm_tensor_arange(0, 6, 1, FM_I64), *yb = fm_tensor_zeros(1, sbad, FM_I64, FM_CPU);
    (void)sy;
    CHECK(fm_dataset_from_tensors(xr, yb) == NULL);
    CHECK_ERR_CONTAINS("does not match X shape [6, 2]");
    fm_dataset *d = fm_dataset_from_tensors(xr, y);
    CHECK(d && fm_dataset_size(d) == 6 && fm_dataset_num_classes(d) == 6);
    fm_dataset *s = d ? fm_dataset_slice(d, 2, 3) : NULL;
    CHECK(s && fm_dataset_size(s) == 3 && fm_tensor_get(fm_dataset_x(s), 0) == 4 && fm_tensor_get(fm_dataset_y(s), 2) == 4);
    CHECK(fm_dataset_slice(d, 4, 3) == NULL);
    CHECK_ERR_CONTAINS("outside the 6 samples");
    fm_dataset_release(s);
    fm_dataset_release(d);
    fm_tensor_release_n(4, x, xr, y, yb);

    /* the Fashion-MNIST helper: missing files say how to get them */
    CHECK(fm_dataset_fashion_mnist(g_tmp, FM_SPLIT_TRAIN) == NULL && fm_last_status() == FM_ERR_IO);
    CHECK_ERR_CONTAINS("apt-get install dataset-fashion-mnist");
    CHECK_ERR_CONTAINS("--data DIR");
    /* a fake directory with the right names */
    unsigned char buf[512];
    size_t n = make_images(buf);
    write_gz(tmp_path("t10k-images-idx3-ubyte.gz"), buf, n);
    unsigned char lab[5] = {1, 2, 3, 4, 5};
    n = make_idx(buf, 0x08, 1, (uint32_t[]){5}, lab, 5);
    write_bytes(tmp_path("t10k-labels-idx1-ubyte"), buf, n);
    CHECK(fm_dataset_fashion_mnist(g_tmp, FM_SPLIT_TEST) == NULL);
    CHECK_ERR_CONTAINS("Fashion-MNIST's are 28x28");
    n = make_idx(buf, 0x08, 1, (uint32_t[]){4}, lab, 4);
    write_bytes(tmp_path("t10k-labels-idx1-ubyte"), buf, n);
    CHECK(fm_dataset_idx(tmp_path("t10k-images-idx3-ubyte.gz"), tmp_path("t10k-labels-idx1-ubyte")) == NULL);
    CHECK_ERR_CONTAINS("has 4 labels but");

    if (access(FM_FASHION_MNIST_DIR "/t10k-images-idx3-ubyte.gz", R_OK) == 0) {
        fm_dataset *fm = fm_dataset_fashion_mnist(NULL, FM_SPLIT_TEST);
        CHECK_MSG(fm != NULL, "%s", fm_last_error());
        if (fm) {
            fm_tensor *fx = fm_dataset_x(fm), *fy = fm_dataset_y(fm);
            CHECK(fx->ndim == 4 && fx->shape[0] == 10000 && fx->shape[1] == 1 && fx->shape[2] == 28 && fx->dtype == FM_F32);
            CHECK(fy->dtype == FM_I64 && fm_dataset_num_classes(fm) == 10);
            int64_t counts[10] = {0};
            const int64_t *yl = fm_tensor_data(fy);
            for (int i = 0; i < 10000; i++)
                if (yl[i] >= 0 && yl[i] < 10) counts[yl[i]]++;
            for (int k = 0; k < 10; k++) CHECK(counts[k] == 1000);
            const float *px = fm_tensor_data(fx);
            float mn = 1, mx = 0;
            double sum = 0;
            for (int64_t i = 0; i < fm_tensor_numel(fx); i++) {
                if (px[i] < mn) mn = px[i];
                if (px[i] > mx) mx = px[i];
                sum += px[i];
            }
            CHECK(mn == 0 && mx == 1);
            CHECK_NEAR(sum / (double)fm_tensor_numel(fx), 0.2868, 0.01); /* the known test-set pixel mean */
            fm_dataset_release(fm);
        }
    } else {
        TEST_SKIP("test_data: %s is not installed (tools/setup-deps.sh installs it): the real data set check "
                  "did not run", FM_FASHION_MNIST_DIR);
    }
}

/* ---------------- loader ---------------- */

enum { LN = 37, LC = 2, LH = 5, LW = 6, LBS = 8 };

static fm_dataset *loader_dataset(void) {
    int64_t sx[4] = {LN, LC, LH, LW}, sy[1] = {LN};
    fm_tensor *x = fm_tensor_empty(4, sx, FM_F32, FM_CPU), *y = fm_tensor_empty(1, sy, FM_I64, FM_CPU);
    float *px = fm_tensor_data(x);
    for (int64_t i = 0; i < fm_tensor_numel(x); i++) px[i] = (float)(i % 251) * 0.25f + 1.0f; /* no zeros */
    for (int64_t i = 0; i < LN; i++) ((int64_t *)fm_tensor_data(y))[i] = i;
    fm_dataset *d = fm_dataset_from_tensors(x, y);
    fm_tensor_release_n(2, x, y);
    return d;
}

static void aug_options(fm_loader_options *o, int workers) {
    fm_loader_options_init(o);
    o->batch_size = LBS;
    o->shuffle = true;
    o->seed = 1234;
    o->workers = workers;
    o->transforms.crop_padding = 2;
    o->transforms.hflip = true;
    o->transforms.normalize_channels = 2;
    o->transforms.mean[0] = 0.5f;
    o->transforms.mean[1] = -1.0f;
    o->transforms.std[0] = 2.0f;
    o->transforms.std[1] = 0.3f;
}

/* All x bytes and labels of `epochs` epochs, in delivery order. */
static size_t collect(fm_dataloader *l, int epochs, unsigned char *out, size_t cap) {
    size_t pos = 0;
    for (int e = 0; e < epochs; e++) {
        fm_batch b;
        for (;;) {
            if (fm_dataloader_next(l, &b) != FM_OK) { CHECK(0); return pos; }
            if (!b.x) break;
            size_t xb = fm_tensor_nbytes(b.x), yb = fm_tensor_nbytes(b.y);
            if (pos + xb + yb > cap) { CHECK(0); return pos; }
            memcpy(out + pos, fm_tensor_data(b.x), xb);
            memcpy(out + pos + xb, fm_tensor_data(b.y), yb);
            pos += xb + yb;
        }
    }
    return pos;
}

static void test_loader_order(void) {
    fm_dataset *d = loader_dataset();
    fm_loader_options o;
    fm_loader_options_init(&o);
    o.batch_size = LBS;
    fm_dataloader *l = fm_dataloader_create(d, &o);
    CHECK(l && fm_dataloader_num_batches(l) == 5);
    /* no shuffle: sequential, last batch short, then the end marker, then epoch 1 */
    fm_batch b;
    int64_t seen = 0;
    for (int k = 0; k < 5; k++) {
        CHECK(fm_dataloader_next(l, &b) == FM_OK && b.x && b.index == k && b.epoch == 0);
        CHECK(b.size == (k < 4 ? 8 : 5) && b.x->shape[0] == b.size && b.y->shape[0] == b.size);
        for (int64_t j = 0; j < b.size; j++) CHECK(((int64_t *)fm_tensor_data(b.y))[j] == seen + j);
        CHECK(((float *)fm_tensor_data(b.x))[LC * LH * LW] == fm_tensor_get(fm_dataset_x(d), (seen + 1) * LC * LH * LW));
        seen += b.size;
    }
    CHECK(fm_dataloader_next(l, &b) == FM_OK && b.x == NULL && b.epoch == 0);
    CHECK(fm_dataloader_next(l, &b) == FM_OK && b.x && b.epoch == 1 && b.index == 0 && b.size == 8);
    fm_dataloader_free(l);

    /* drop_last and shuffle: each epoch is a permutation of a subset, epochs differ */
    o.drop_last = true;
    o.shuffle = true;
    o.seed = 7;
    o.workers = 2;
    l = fm_dataloader_create(d, &o);
    CHECK(l && fm_dataloader_num_batches(l) == 4);
    int64_t first[2][32];
    for (int e = 0; e < 2; e++) {
        int cnt[LN] = {0}, k = 0;
        while (fm_dataloader_next(l, &b) == FM_OK && b.x) {
            CHECK(b.size == 8);
            for (int j = 0; j < 8; j++) {
                int64_t v = ((int64_t *)fm_tensor_data(b.y))[j];
                if (v >= 0 && v < LN) cnt[v]++;
                first[e][k * 8 + j] = v;
            }
            k++;
        }
        CHECK(k == 4);
        int dup = 0;
        for (int i = 0; i < LN; i++) dup += cnt[i] > 1;
        CHECK(dup == 0);
    }
    CHECK(memcmp(first[0], first[1], sizeof first[0]) != 0);
    /* the permutation is the published one */
    int64_t perm[LN];
    fm_data_permutation(7, 1, LN, perm);
    CHECK(memcmp(perm, first[1], 32 * sizeof(int64_t)) == 0);
    fm_dataloader_free(l);

    /* bad options */
    o.batch_size = 0;
    CHECK(fm_dataloader_create(d, &o) == NULL);
    CHECK_ERR_CONTAINS("batch size must be positive");
    o.batch_size = 64;
    CHECK(fm_dataloader_create(d, &o) == NULL);
    CHECK_ERR_CONTAINS("37 samples make no batch of 64 with drop_last");
    /* a batch larger than the data set without drop_last is the whole set, whatever its size:
     * n + bs - 1 (the loader.c:397) and bs + 7 overflowed for a batch near 2^63, and
     * the batch buffers were sized for bs rows, not the 37 there are */
    for (int w = 0; w < 2; w++) {
        fm_loader_options_init(&o);
        o.workers = w;
        o.shuffle = true;
        o.batch_size = INT64_MAX;
        fm_dataloader *big = fm_dataloader_create(d, &o);
        CHECK(big && fm_dataloader_num_batches(big) == 1);
        fm_batch bb;
        int got = 0, rows_seen[LN] = {0};
        while (big && fm_dataloader_next(big, &bb) == FM_OK && bb.x) {
            CHECK(bb.size == LN && bb.x->shape[0] == LN);
            for (int j = 0; j < LN && bb.size == LN; j++) {
                int64_t v = ((int64_t *)fm_tensor_data(bb.y))[j];
                if (v >= 0 && v < LN) rows_seen[v]++;
            }
            got++;
        }
        CHECK(got == 1);
        for (int i = 0; i < LN; i++) CHECK(rows_seen[i] == 1);
        fm_dataloader_free(big);
    }
    fm_loader_options_init(&o);
    o.batch_size = LBS;
    aug_options(&o, 0);
    o.transforms.normalize_channels = 3;
    CHECK(fm_dataloader_create(d, &o) == NULL);
    CHECK_ERR_CONTAINS("normalize has 3 channel values");
    aug_options(&o, 0);
    o.transforms.std[1] = 0;
    CHECK(fm_dataloader_create(d, &o) == NULL);
    CHECK_ERR_CONTAINS("must be > 0");
    fm_dataset_release(d);
}

/* Data-parallel shards: every batch's parts, from one loader per shard (with and without
 * workers), are the whole loader's batch cut in order; a part may be empty (a last batch
 * of 1 over 6 shards); the position is the same for every shard. */
static void test_loader_shards(void) {
    fm_dataset *d = loader_dataset(); /* 37 samples: batches of 12 leave 1 */
    for (int workers = 0; workers <= 2; workers += 2) {
        fm_loader_options o;
        fm_loader_options_init(&o);
        o.batch_size = 12;
        o.shuffle = true;
        o.seed = 3;
        o.workers = workers;
        fm_dataloader *whole = fm_dataloader_create(d, &o), *part[6];
        for (int r = 0; r < 6; r++) {
            o.shard_index = r;
            o.shard_count = 6;
            part[r] = fm_dataloader_create(d, &o);
            CHECK(part[r] && fm_dataloader_num_batches(part[r]) == 4);
        }
        int empty = 0;
        for (int step = 0; step < 10 && whole; step++) { /* two epochs and their end markers */
            fm_batch w, b;
            CHECK(fm_dataloader_next(whole, &w) == FM_OK);
            int64_t at = 0;
            for (int r = 0; r < 6; r++) {
                if (!part[r] || fm_dataloader_next(part[r], &b) != FM_OK) { CHECK(0); continue; }
                CHECK((b.x == NULL) == (w.x == NULL) && b.epoch == w.epoch && b.index == w.index);
                if (!w.x || !b.x) continue;
                int64_t first, size;
                fm_data_shard_rows(w.size, r, 6, &first, &size);
                CHECK(first == at && b.size == size && b.x->shape[0] == size);
                empty += size == 0;
                const int64_t *wy = fm_tensor_data(w.y), *by = fm_tensor_data(b.y);
                for (int64_t j = 0; j < size; j++) CHECK(by[j] == wy[first + j]);
                int64_t row = LC * LH * LW;
                if (size) CHECK(memcmp(fm_tensor_data(b.x), (const float *)fm_tensor_data(w.x) + first * row,
                                       (size_t)(size * row) * sizeof(float)) == 0);
                at += size;
            }
            if (w.x) CHECK(at == w.size);
        }
        CHECK(empty == 10); /* the last batch (1 sample) leaves 5 shards empty, in each of 2 epochs */
        fm_dataloader_state s0, s5;
        CHECK(fm_dataloader_state_get(part[0], &s0) == FM_OK && fm_dataloader_state_get(part[5], &s5) == FM_OK);
        CHECK(s0.epoch == s5.epoch && s0.batch == s5.batch && s0.batch_size == 12 && s5.batch_size == 12);
        fm_dataloader_free(whole);
        for (int r = 0; r < 6; r++) fm_dataloader_free(part[r]);
    }
    fm_loader_options o;
    fm_loader_options_init(&o);
    o.shard_index = 2;
    o.shard_count = 2;
    CHECK(fm_dataloader_create(d, &o) == NULL);
    CHECK_ERR_CONTAINS("shard 2 of 2 is not a shard");
    fm_dataset_release(d);
}

static void test_loader_determinism(void) {
    fm_dataset *d = loader_dataset();
    size_t cap = (size_t)3 * LN * (LC * LH * LW * 4 + 8) + 64;
    unsigned char *ref = malloc(cap), *got = malloc(cap);
    int workers[4] = {0, 1, 3, 2};
    size_t nref = 0;
    for (int k = 0; k < 4; k++) {
        fm_loader_options o;
        aug_options(&o, workers[k]);
        if (k == 3) o.prefetch = 5;
        fm_dataloader *l = fm_dataloader_create(d, &o);
        CHECK(l != NULL);
        if (!l) continue;
        size_t n = collect(l, 3, k == 0 ? ref : got, cap);
        if (k == 0) nref = n;
        else CHECK_MSG(n == nref && memcmp(ref, got, n) == 0, "workers=%d differs from workers=0", workers[k]);
        CHECK(fm_dataloader_wait_seconds(l) >= 0);
        fm_dataloader_free(l);
    }
    CHECK(nref == (size_t)3 * LN * (LC * LH * LW * 4 + 8));

    /* resume: stop at epoch 1 batch 2, restore the state in a loader with another worker count */
    fm_loader_options o;
    aug_options(&o, 3);
    fm_dataloader *a = fm_dataloader_create(d, &o);
    fm_batch b;
    for (int k = 0; k < 6 + 2; k++) fm_dataloader_next(a, &b); /* 5 batches + end marker + 2 */
    fm_dataloader_state st;
    CHECK(fm_dataloader_state_get(a, &st) == FM_OK && st.epoch == 1 && st.batch == 2 && st.seed == 1234);
    size_t na = collect(a, 2, ref, cap); /* rest of epoch 1, all of epoch 2 */
    aug_options(&o, 0);
    o.seed = 99; /* the state's seed wins */
    fm_dataloader *r = fm_dataloader_create(d, &o);
    fm_dataloader_next(r, &b); /* move it somewhere else first */
    CHECK(fm_dataloader_state_set(r, &st) == FM_OK);
    size_t nr = collect(r, 2, got, cap);
    CHECK(na == nr && na > 0 && memcmp(ref, got, na) == 0);
    /* restoring into a mismatched loader is refused */
    fm_dataloader_state bad = st;
    bad.num_samples = 36;
    CHECK(fm_dataloader_state_set(r, &bad) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("state is for 36 samples, this data set has 37");
    bad = st;
    bad.batch = 6;
    CHECK(fm_dataloader_state_set(r, &bad) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("out of range");
    /* set_epoch then the first batch equals that epoch's first batch from a fresh run */
    CHECK(fm_dataloader_set_epoch(r, 2) == FM_OK);
    CHECK(fm_dataloader_next(r, &b) == FM_OK && b.epoch == 2 && b.index == 0);
    fm_dataloader_free(a);
    fm_dataloader_free(r);
    free(ref);
    free(got);
    fm_dataset_release(d);
}

/* Each transform against an independent reading of its definition. */
static void test_transforms(void) {
    fm_dataset *d = loader_dataset();
    const float *src = fm_tensor_data(fm_dataset_x(d));
    const int S = LC * LH * LW;
    fm_loader_options o;
    fm_loader_options_init(&o);
    o.batch_size = LN;
    o.seed = 5;
    /* normalize */
    o.transforms.normalize_channels = 2;
    o.transforms.mean[0] = 1; o.transforms.std[0] = 2;
    o.transforms.mean[1] = -3; o.transforms.std[1] = 0.5f;
    fm_dataloader *l = fm_dataloader_create(d, &o);
    fm_batch b;
    CHECK(l && fm_dataloader_next(l, &b) == FM_OK && b.x);
    int bad = 0;
    for (int i = 0; l && i < LN * S; i++) {
        int c = (i / (LH * LW)) % LC;
        float want = c == 0 ? (src[i] - 1) / 2 : (src[i] + 3) / 0.5f;
        bad += ((float *)fm_tensor_data(b.x))[i] != want;
    }
    CHECK(bad == 0);
    fm_dataloader_free(l);
    /* flip: each sample is itself or its mirror, and both happen */
    fm_loader_options_init(&o);
    o.batch_size = LN;
    o.seed = 5;
    o.transforms.hflip = true;
    l = fm_dataloader_create(d, &o);
    CHECK(l && fm_dataloader_next(l, &b) == FM_OK && b.x);
    int flipped = 0, kept = 0;
    for (int nidx = 0; l && nidx < LN; nidx++) {
        const float *s = src + nidx * S, *g = (const float *)fm_tensor_data(b.x) + nidx * S;
        bool same = memcmp(s, g, (size_t)S * 4) == 0, mir = true;
        for (int r = 0; r < LC * LH; r++)
            for (int j = 0; j < LW; j++) mir = mir && g[r * LW + j] == s[r * LW + (LW - 1 - j)];
        CHECK(same || mir);
        flipped += mir && !same;
        kept += same;
    }
    CHECK(flipped > 5 && kept > 5);
    fm_dataloader_free(l);
    /* crop: each sample is the image shifted by some (dy, dx) in [-2, 2], zeros outside */
    fm_loader_options_init(&o);
    o.batch_size = LN;
    o.seed = 5;
    o.transforms.crop_padding = 2;
    l = fm_dataloader_create(d, &o);
    CHECK(l && fm_dataloader_next(l, &b) == FM_OK && b.x);
    int shifts[5][5] = {{0}};
    for (int nidx = 0; l && nidx < LN; nidx++) {
        const float *s = src + nidx * S, *g = (const float *)fm_tensor_data(b.x) + nidx * S;
        int found = 0;
        for (int dy = -2; dy <= 2 && !found; dy++)
            for (int dx = -2; dx <= 2 && !found; dx++) {
                bool ok = true;
                for (int c = 0; c < LC && ok; c++)
                    for (int i = 0; i < LH && ok; i++)
                        for (int j = 0; j < LW && ok; j++) {
                            int si = i + dy, sj = j + dx;
                            float want = si >= 0 && si < LH && sj >= 0 && sj < LW ? s[c * LH * LW + si * LW + sj] : 0.0f;
                            ok = g[c * LH * LW + i * LW + j] == want;
                        }
                if (ok) { found = 1; shifts[dy + 2][dx + 2]++; }
            }
        CHECK_MSG(found, "sample %d is no shifted copy", nidx);
    }
    int distinct = 0;
    for (int i = 0; i < 25; i++) distinct += shifts[i / 5][i % 5] > 0;
    CHECK(distinct >= 8);
    fm_dataloader_free(l);
    /* transforms need F32 */
    int64_t su[4] = {4, 1, 2, 2};
    fm_tensor *xu = fm_tensor_zeros(4, su, FM_U8, FM_CPU);
    fm_dataset *du = fm_dataset_from_tensors(xu, NULL);
    CHECK(fm_dataloader_create(du, &o) == NULL);
    CHECK_ERR_CONTAINS("transforms need F32 samples, X is u8");
    /* without transforms any dtype works, and an unlabeled set gives y == NULL */
    fm_loader_options_init(&o);
    o.batch_size = 3;
    l = fm_dataloader_create(du, &o);
    CHECK(l && fm_dataloader_next(l, &b) == FM_OK && b.x && b.x->dtype == FM_U8 && b.y == NULL && b.size == 3);
    fm_dataloader_free(l);
    fm_dataset_release(du);
    fm_tensor_release(xu);
    fm_dataset_release(d);
}

/* crop + flip + normalize together (one pass per row in the loader) against the
 * definition: normalize(flip(crop(x))), the padding normalized like a zero pixel. */
static void test_transforms_combined(void) {
    fm_dataset *d = loader_dataset();
    const float *src = fm_tensor_data(fm_dataset_x(d));
    const int S = LC * LH * LW;
    fm_loader_options o;
    aug_options(&o, 0);
    o.batch_size = LN;
    o.shuffle = false;
    for (int pass = 0; pass < 2; pass++) {
        o.transforms.crop_padding = pass == 0 ? 2 : 7; /* 7 > W: some crops are all padding */
        fm_dataloader *l = fm_dataloader_create(d, &o);
        fm_batch b;
        CHECK(l && fm_dataloader_next(l, &b) == FM_OK && b.x);
        int n_flip = 0, n_found = 0, P = o.transforms.crop_padding;
        for (int nidx = 0; l && b.x && nidx < LN; nidx++) {
            const float *s = src + nidx * S, *g = (const float *)fm_tensor_data(b.x) + nidx * S;
            int found = 0;
            for (int fl = 0; fl < 2 && !found; fl++)
                for (int dy = -P; dy <= P && !found; dy++)
                    for (int dx = -P; dx <= P && !found; dx++) {
                        bool ok = true;
                        for (int c = 0; c < LC && ok; c++)
                            for (int i = 0; i < LH && ok; i++)
                                for (int j = 0; j < LW && ok; j++) {
                                    int jj = fl ? LW - 1 - j : j, si = i + dy, sj = jj + dx;
                                    float v = si >= 0 && si < LH && sj >= 0 && sj < LW ? s[c * LH * LW + si * LW + sj] : 0.0f;
                                    float want = (v - o.transforms.mean[c]) / o.transforms.std[c];
                                    ok = g[c * LH * LW + i * LW + j] == want;
                                }
                        if (ok) { found = 1; n_flip += fl; }
                    }
            n_found += found;
        }
        CHECK_MSG(n_found == LN, "padding %d: %d of %d samples are normalize(flip(crop(x)))", P, n_found, LN);
        CHECK(n_flip > 3 && n_flip < LN - 3);
        fm_dataloader_free(l);
    }
    fm_dataset_release(d);
}

#ifdef __linux__
#include <dirent.h>
/* CPU seconds used so far by the loader's worker threads (named "fm-loader");
 * other threads of the process (OpenBLAS spins its own for a while after it
 * starts) are not counted. -1 when /proc cannot be read. */
static double loader_threads_cpu(int *n_threads) {
    DIR *dir = opendir("/proc/self/task");
    if (!dir) return -1;
    double sum = 0;
    *n_threads = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.') continue;
        char p[300], comm[64] = "";
        unsigned long long run_ns = 0;
        snprintf(p, sizeof p, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(p, "r");
        if (f) { if (!fgets(comm, sizeof comm, f)) comm[0] = 0; fclose(f); }
        if (strncmp(comm, "fm-loader", 9)) continue;
        snprintf(p, sizeof p, "/proc/self/task/%s/schedstat", e->d_name);
        f = fopen(p, "r");
        if (f) { if (fscanf(f, "%llu", &run_ns) != 1) run_ns = 0; fclose(f); }
        sum += 1e-9 * (double)run_ns;
        (*n_threads)++;
    }
    closedir(dir);
    return sum;
}
#endif

/* Workers sleep when the ring is full (no spinning), and after warm-up batches
 * are prepared without a single allocation. */
static void test_loader_idle(void) {
    fm_dataset *d = loader_dataset();
    fm_loader_options o;
    aug_options(&o, 2);
    fm_dataloader *l = fm_dataloader_create(d, &o);
    fm_batch b;
    CHECK(l && fm_dataloader_next(l, &b) == FM_OK && b.x);
    for (int k = 0; l && k < 12; k++) fm_dataloader_next(l, &b); /* warm: every slot has been used */
    /* the workers prepare batches while the consumer sleeps (at SCHED_IDLE they run
     * on an idle core, which a loaded machine can delay: wait up to 5 s) */
    int64_t bw = 0, bn = 0;
    struct timespec tick = {0, 20 * 1000 * 1000};
    for (int t = 0; l && t < 250 && bw == 0; t++) {
        nanosleep(&tick, NULL);
        fm_dataloader_fill_counts(l, &bw, &bn);
    }
    CHECK_MSG(bw > 0 && bn >= 0, "filled by workers %lld, in next %lld", (long long)bw, (long long)bn);
#ifdef __linux__
    /* the consumer holds a batch and does something else: the workers fill the
     * ring, then block; they must not burn CPU while waiting for a slot */
    struct timespec nap = {0, 200 * 1000 * 1000};
    int nt0 = 0, nt1 = 0;
    double c0 = loader_threads_cpu(&nt0);
    nanosleep(&nap, NULL);
    double c1 = loader_threads_cpu(&nt1);
    CHECK_MSG(nt0 == 2 && nt1 == 2, "found %d loader threads by name, expected 2", nt1);
    CHECK_MSG(c0 >= 0 && c1 - c0 < 0.02, "loader workers used %.3f s of CPU in 0.2 s while nothing was asked of them", c1 - c0);
#endif
    fm_memory_stats m0, m1;
    fm_memory_stats_get(FM_CPU, &m0);
    int got = 0;
    for (int k = 0; l && k < 30; k++) got += fm_dataloader_next(l, &b) == FM_OK && b.x;
    fm_memory_stats_get(FM_CPU, &m1);
    CHECK(got > 20);
    CHECK_MSG(m1.n_system_allocs == m0.n_system_allocs && m1.n_cache_hits == m0.n_cache_hits,
              "batches allocated: %llu system allocations, %llu from the cache",
              (unsigned long long)(m1.n_system_allocs - m0.n_system_allocs), (unsigned long long)(m1.n_cache_hits - m0.n_cache_hits));
    fm_dataloader_free(l);
    /* without workers next() prepares exactly what it delivers */
    aug_options(&o, 0);
    l = fm_dataloader_create(d, &o);
    int64_t delivered = 0;
    for (int k = 0; l && k < 9; k++)
        if (fm_dataloader_next(l, &b) == FM_OK && b.x) delivered += b.size;
    fm_dataloader_fill_counts(l, &bw, &bn);
    CHECK_MSG(bw == 0 && bn == delivered && delivered == LN + 3 * LBS, "0 workers: %lld / %lld for %lld delivered",
              (long long)bw, (long long)bn, (long long)delivered);
    fm_dataloader_free(l);
    fm_dataset_release(d);
}

static void test_loader_buffers(void) {
    fm_dataset *d = loader_dataset();
    fm_loader_options o;
    aug_options(&o, 2);
    fm_dataloader *l = fm_dataloader_create(d, &o);
    fm_batch b;
    /* the ring is reused: after warm-up the same buffers come back */
    void *ptrs[16];
    for (int k = 0; k < 5; k++) {
        fm_dataloader_next(l, &b);
        ptrs[k] = b.x ? fm_tensor_data(b.x) : NULL;
    }
    fm_dataloader_next(l, &b); /* end marker */
    int reused = 0;
    for (int k = 0; k < 5; k++) {
        fm_dataloader_next(l, &b);
        bool found = false;
        for (int j = 0; j < 5; j++) found = found || (b.x && fm_tensor_data(b.x) == ptrs[j]);
        reused += found;
    }
    CHECK(reused == 5);
    /* a batch the caller keeps is not overwritten by later batches */
    fm_dataloader_next(l, &b); /* end marker of epoch 1 */
    CHECK(b.x == NULL);
    fm_dataloader_next(l, &b);
    CHECK(b.x != NULL);
    fm_tensor *kept = fm_tensor_retain(b.x);
    fm_tensor *copy = fm_clone(kept);
    for (int k = 0; k < 8; k++) fm_dataloader_next(l, &b);
    CHECK(kept && copy && memcmp(fm_tensor_data(kept), fm_tensor_data(copy), fm_tensor_nbytes(kept)) == 0);
    CHECK(fm_dataloader_realloc_count(l) == 1);
    fm_tensor_release_n(2, kept, copy);
    fm_dataloader_free(l);
    /* a training-like step (the batch enters a graph that is run backward and
     * released) gives every buffer back: nothing is reallocated */
    aug_options(&o, 1);
    l = fm_dataloader_create(d, &o);
    int64_t sw[2] = {LC * LH * LW, 3};
    fm_tensor *wt = fm_tensor_ones(2, sw, FM_F32, FM_CPU);
    wt->requires_grad = true;
    for (int k = 0; k < 12; k++) {
        if (fm_dataloader_next(l, &b) != FM_OK || !b.x) continue;
        fm_tensor *flat = fm_flatten(b.x, 1, 3);
        fm_tensor *h = flat ? fm_matmul(flat, wt) : NULL;
        fm_tensor *loss = h ? fm_sum(h, 0, NULL, false) : NULL;
        CHECK_MSG(loss && fm_backward(loss, NULL, false) == FM_OK, "%s", fm_last_error());
        fm_tensor_release_n(3, flat, h, loss);
    }
    CHECK(fm_dataloader_realloc_count(l) == 0);
    fm_tensor_release(wt);
    /* freeing mid-epoch joins the workers (valgrind/ASan check the rest) */
    fm_dataloader_free(l);
    for (int w = 0; w < 4; w++) {
        aug_options(&o, w);
        o.prefetch = w + 1;
        l = fm_dataloader_create(d, &o);
        fm_dataloader_next(l, &b);
        fm_dataloader_free(l);
    }
    l = fm_dataloader_create(d, &o); /* freed before any batch */
    fm_dataloader_free(l);
    fm_dataloader_free(NULL);
    fm_dataset_release(d);
}

/* ---------------- fuzz ---------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

typedef enum { FZ_IDX, FZ_NPY, FZ_NPZ, FZ_CSV } fz_kind;

static int g_fuzz_bad;

static void fuzz_one(fz_kind k, const unsigned char *p, size_t n) {
    fm_clear_error();
    bool ok;
    if (k == FZ_IDX) {
        fm_tensor *t = fm_idx_read_mem(p, n, "fuzz.idx");
        ok = t != NULL;
        fm_tensor_release(t);
    } else if (k == FZ_NPY) {
        fm_tensor *t = fm_npy_read_mem(p, n, "fuzz.npy");
        ok = t != NULL;
        fm_tensor_release(t);
    } else if (k == FZ_NPZ) {
        fm_npz *z = fm_npz_open_mem(p, n, "fuzz.npz");
        ok = z != NULL;
        for (int i = 0; z && i < fm_npz_count(z); i++) {
            fm_tensor *t = fm_npz_get(z, fm_npz_name(z, i));
            if (!t && (fm_last_status() == FM_OK || !fm_last_error()[0])) g_fuzz_bad++;
            fm_tensor_release(t);
        }
        fm_npz_close(z);
    } else {
        fm_csv_options o;
        fm_csv_options_init(&o);
        o.label_index = -1;
        fm_tensor *x = NULL, *y = NULL;
        ok = fm_csv_read_mem((const char *)p, n, "fuzz.csv", &o, &x, &y) == FM_OK;
        fm_tensor_release_n(2, x, y);
    }
    if (!ok) {
        fm_status st = fm_last_status();
        bool clean = (st == FM_ERR_FORMAT || st == FM_ERR_UNSUPPORTED || st == FM_ERR_INVALID) && fm_last_error()[0] &&
                     strstr(fm_last_error(), "fuzz.") != NULL;
        if (!clean && g_fuzz_bad++ < 5)
            fprintf(stderr, "fuzz: unclean error (%s): %s\n", fm_status_name(st), fm_last_error());
    }
}

static void fuzz_corpus(fz_kind k, const unsigned char *p, size_t n, int flips) {
    unsigned char *m = malloc(n + 16);
    for (size_t len = 0; len <= n; len++) { /* every truncation (malloc'd exactly, so ASan sees overreads) */
        unsigned char *c = malloc(len ? len : 1);
        memcpy(c, p, len);
        fuzz_one(k, c, len);
        free(c);
    }
    for (int it = 0; it < flips; it++) {
        memcpy(m, p, n);
        int nf = 1 + (int)(rnd() % 4);
        for (int f = 0; f < nf; f++) {
            size_t at = (size_t)(rnd() % n);
            switch (rnd() % 4) {
            case 0: m[at] ^= (unsigned char)(1u << (rnd() % 8)); break;
            case 1: m[at] = (unsigned char)rnd(); break;
            case 2: m[at] = 0xff; break;
            default: m[at] = (unsigned char)"0123456789(),'\"\n{}"[rnd() % 19]; break;
            }
        }
        size_t len = rnd() % 8 == 0 ? (size_t)(rnd() % (n + 1)) : n;
        unsigned char *c = malloc(len ? len : 1);
        memcpy(c, m, len);
        fuzz_one(k, c, len);
        free(c);
    }
    free(m);
}

static void test_fuzz(void) {
    double t0 = (double)clock() / CLOCKS_PER_SEC;
    unsigned char idx[512];
    size_t n = make_images(idx);
    fuzz_corpus(FZ_IDX, idx, n, 30000);
    /* gzip'd idx: flips hit the deflate stream, the CRC and the length trailer */
    write_gz(tmp_path("fz.idx.gz"), idx, n);
    size_t gn;
    unsigned char *gz = read_bytes(tmp_path("fz.idx.gz"), &gn);
    fuzz_corpus(FZ_IDX, gz, gn, 30000);
    free(gz);
    /* huge declared sizes in every dimension slot */
    for (int d = 0; d < 3; d++) {
        unsigned char h[64];
        memcpy(h, idx, 16);
        h[4 + 4 * d] = 0xff;
        h[5 + 4 * d] = 0xff;
        fuzz_one(FZ_IDX, h, 16);
    }
    const char *npys[] = {"f4_2x3.npy", "f8_fortran_3x4.npy", "f4_2x3_v2.npy", "b1_4.npy", "f4_scalar.npy"};
    for (int i = 0; i < 5; i++) {
        size_t pn;
        unsigned char *p = read_bytes(fix_path(npys[i]), &pn);
        fuzz_corpus(FZ_NPY, p, pn, 20000);
        free(p);
    }
    const char *npzs[] = {"xy_stored.npz", "xy_deflated.npz"};
    for (int i = 0; i < 2; i++) {
        size_t pn;
        unsigned char *p = read_bytes(fix_path(npzs[i]), &pn);
        fuzz_corpus(FZ_NPZ, p, pn, 30000);
        free(p);
    }
    const char *csv = "a,b,\"c\"\n1,2,3\n4.5,-6e2,7\n\n8,9,10\r\n";
    fuzz_corpus(FZ_CSV, (const unsigned char *)csv, strlen(csv), 30000);
    double dt = (double)clock() / CLOCKS_PER_SEC - t0;
    fprintf(stderr, "test_data: fuzz pass took %.2f s CPU\n", dt);
    CHECK_MSG(g_fuzz_bad == 0, "%d fuzz inputs ended without a clean error", g_fuzz_bad);
}

int main(int argc, char **argv) {
    const char *root = getenv("FATHOM_SOURCE_DIR");
    snprintf(g_fix, sizeof g_fix, "%s/tests/data", root ? root : ".");
    snprintf(g_tmp, sizeof g_tmp, "/tmp/fathom_test_data_XXXXXX");
    if (!mkdtemp(g_tmp)) { perror("mkdtemp"); return 2; }
    const char *only = argc > 1 ? argv[1] : NULL;
#define RUN(fn) do { if (!only || strcmp(only, #fn) == 0) fn(); } while (0)
    RUN(test_idx);
    RUN(test_csv);
    RUN(test_text);
    RUN(test_npy);
    RUN(test_npz);
    RUN(test_png);
    RUN(test_data_read);
    RUN(test_dataset);
    RUN(test_loader_order);
    RUN(test_loader_shards);
    RUN(test_loader_determinism);
    RUN(test_transforms);
    RUN(test_transforms_combined);
    RUN(test_loader_idle);
    RUN(test_loader_buffers);
    RUN(test_fuzz);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    TEST_DONE();
}
