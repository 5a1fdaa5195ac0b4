/* Tensor core: creation, views and their bounds, dtype conversion, printing,
 * the RNG's independence from thread count, the caching allocator, errors. */
#include <stdlib.h>

#include "core/parallel.h"
#include "fathom/memory.h"
#include "fathom/ops.h"
#include "fathom/tensor.h"
#include "test_util.h"

static void test_create(void) {
    int64_t s[2] = {2, 3};
    fm_tensor *z = fm_tensor_zeros(2, s, FM_F32, FM_CPU), *o = fm_tensor_ones(2, s, FM_I64, FM_CPU);
    fm_tensor *f = fm_tensor_full(2, s, 2.5, FM_BF16, FM_CPU), *a = fm_tensor_arange(0, 1, 0.25, FM_F64);
    CHECK(z && fm_tensor_get(z, 5) == 0 && o && fm_tensor_get(o, 4) == 1 && f && fm_tensor_get(f, 0) == 2.5);
    CHECK(a && a->shape[0] == 4 && fm_tensor_get(a, 3) == 0.75);
    float buf[6] = {1, 2, 3, 4, 5, 6};
    fm_tensor *w = fm_tensor_from_buffer(buf, 2, s, FM_F32, NULL, NULL);
    CHECK(w && fm_tensor_data(w) == buf && fm_tensor_get(w, 4) == 5);
    buf[4] = 50;
    CHECK(fm_tensor_get(w, 4) == 50); /* no copy */
    CHECK(fm_tensor_arange(0, 1, 0, FM_F32) == NULL);
    CHECK_ERR_CONTAINS("step must be non-zero");
    int64_t bad[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, neg[1] = {-2};
    CHECK(fm_tensor_zeros(9, bad, FM_F32, FM_CPU) == NULL);
    CHECK_ERR_CONTAINS("supports 0 to 8");
    CHECK(fm_tensor_zeros(1, neg, FM_F32, FM_CPU) == NULL);
    CHECK_ERR_CONTAINS("negative size");
    /* no elements, but the first contiguous stride (2^80) would overflow: refused */
    int64_t zero_huge[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
    CHECK(fm_tensor_empty(3, zero_huge, FM_F32, FM_CPU) == NULL);
    CHECK_ERR_CONTAINS("too large");
    int64_t zero_ok[3] = {0, 1 << 20, 1 << 20}; /* strides 2^40 and 2^20: fine */
    fm_tensor *zt = fm_tensor_empty(3, zero_ok, FM_F32, FM_CPU);
    CHECK(zt && fm_tensor_numel(zt) == 0 && zt->strides[0] == (int64_t)1 << 40);
    fm_tensor_release(zt);
    fm_tensor_release_n(5, z, o, f, a, w);
}

static void test_views(void) {
    fm_tensor *a = fm_tensor_arange(0, 24, 1, FM_F32);
    int64_t s3[3] = {2, 3, 4};
    fm_tensor *v = fm_reshape(a, 3, s3);
    CHECK(v && v->storage == a->storage && fm_tensor_get(v, 23) == 23);
    fm_tensor *p = fm_permute(v, (int[]){2, 0, 1}); /* [4,2,3] */
    CHECK(p && p->shape[0] == 4 && !fm_tensor_is_contiguous(p) && p->storage == a->storage);
    CHECK(fm_tensor_get(p, 1) == 4); /* p[0,0,1] = v[0,1,0] */
    /* reshape of a permuted tensor must copy; view must refuse */
    int64_t s2[2] = {8, 3};
    fm_tensor *r = fm_reshape(p, 2, s2);
    CHECK(r && r->storage != a->storage && fm_tensor_get(r, 1) == 4);
    CHECK(fm_view(p, 2, s2) == NULL);
    CHECK_ERR_CONTAINS("use fm_reshape");
    /* reshape of a sliced-but-still-viewable tensor does not copy */
    fm_tensor *n = fm_narrow(v, 0, 1, 1); /* [1,3,4] */
    int64_t s12[1] = {12};
    fm_tensor *nv = fm_view(n, 1, s12);
    CHECK(nv && nv->storage == a->storage && fm_tensor_get(nv, 0) == 12);
    fm_tensor *sl = fm_slice(v, 2, 1, 4, 2); /* [2,3,2]: cols 1,3 */
    CHECK(sl && sl->shape[2] == 2 && fm_tensor_get(sl, 1) == 3 && fm_tensor_get(sl, 2) == 5);
    fm_tensor *sel = fm_select(v, 1, -1); /* [2,4] = v[:,2,:] */
    CHECK(sel && sel->ndim == 2 && fm_tensor_get(sel, 0) == 8 && fm_tensor_get(sel, 4) == 20);
    fm_tensor *u = fm_unsqueeze(sel, 1), *sq = u ? fm_squeeze(u, 1) : NULL;
    CHECK(u && u->ndim == 3 && u->shape[1] == 1 && sq && sq->ndim == 2);
    int64_t se[3] = {5, 2, 4};
    fm_tensor *e = fm_expand(sel, 3, se);
    CHECK(e && e->strides[0] == 0 && fm_tensor_get(e, 8 * 4 + 4) == 20);
    int64_t bad_e[2] = {3, 4};
    CHECK(fm_expand(sel, 2, bad_e) == NULL);
    CHECK_ERR_CONTAINS("cannot be expanded");
    fm_tensor *fl = fm_flatten(v, 1, 2);
    CHECK(fl && fl->ndim == 2 && fl->shape[1] == 12);
    fm_tensor *c = fm_contiguous(p);
    CHECK(c && fm_tensor_is_contiguous(c) && fm_tensor_get(c, 1) == 4);
    /* views past their storage are refused */
    int64_t big[1] = {25}, st1[1] = {1};
    CHECK(fm_as_strided(a, 1, big, st1, 0) == NULL);
    CHECK_ERR_CONTAINS("storage holds 24 elements");
    int64_t ok[1] = {6}, st4[1] = {4};
    fm_tensor *col = fm_as_strided(a, 1, ok, st4, 1);
    CHECK(col && fm_tensor_get(col, 5) == 21);
    CHECK(fm_narrow(v, 2, 3, 2) == NULL);
    CHECK_ERR_CONTAINS("outside dimension 2");
    CHECK(fm_select(v, 0, 2) == NULL);
    CHECK_ERR_CONTAINS("out of range");
    CHECK(fm_permute(v, (int[]){0, 0, 1}) == NULL);
    CHECK_ERR_CONTAINS("appears twice");
    CHECK(fm_transpose(v, 0, 3) == NULL);
    CHECK_ERR_CONTAINS("axis 3 is out of range");
    int64_t s5[1] = {5};
    CHECK(fm_reshape(v, 1, s5) == NULL);
    CHECK_ERR_CONTAINS("cannot view a tensor of shape [2, 3, 4]");
    /* sizes whose product overflows int64 (a fuzzed ONNX Reshape target): refused, no overflow */
    int64_t huge[3] = {(int64_t)1 << 40, (int64_t)1 << 40, -1};
    CHECK(fm_reshape(v, 3, huge) == NULL);
    CHECK_ERR_CONTAINS("cannot view a tensor of shape [2, 3, 4]");
    fm_tensor_release_n(16, a, v, p, r, n, nv, sl, sel, u, sq, e, fl, c, col, NULL, NULL);
}

static void test_print(void) {
    int64_t s[2] = {2, 3};
    fm_tensor *t = fm_tensor_from_data((float[]){1, 2.5f, -3, 4, 5, 6}, 2, s, FM_F32);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(fm_tensor_print(t, f) == FM_OK);
    fclose(f);
    CHECK(buf && strstr(buf, "2.5") && strstr(buf, "shape=[2, 3]") && strstr(buf, "dtype=f32"));
    free(buf);
    fm_tensor_release(t);
}

static void test_rng_threads(void) {
    int64_t n[1] = {100003};
    fm_rng r1, r2;
    fm_set_num_threads(1);
    fm_rng_init(&r1, 42);
    fm_tensor *a = fm_tensor_randn(1, n, FM_F32, &r1);
    fm_set_num_threads(2);
    fm_rng_init(&r2, 42);
    fm_tensor *b = fm_tensor_randn(1, n, FM_F32, &r2);
    fm_tensor *d = fm_sub(a, b), *ad = d ? fm_abs(d) : NULL, *m = ad ? fm_amax(ad, 0, NULL, false) : NULL;
    CHECK(m && fm_tensor_item(m) == 0);
    fm_tensor *mu = fm_mean(a, 0, NULL, false), *sd = fm_std(a, 0, NULL, 1, false);
    CHECK(mu && fabs(fm_tensor_item(mu)) < 0.02);
    CHECK(sd && fabs(fm_tensor_item(sd) - 1) < 0.02);
    CHECK(r1.offset == r2.offset && r1.offset > 0);
    fm_tensor *u = fm_tensor_rand(1, n, FM_F64, &r1), *umin = fm_amin(u, 0, NULL, false), *umax = fm_amax(u, 0, NULL, false);
    CHECK(fm_tensor_item(umin) >= 0 && fm_tensor_item(umax) < 1);
    fm_tensor_release_n(10, a, b, d, ad, m, mu, sd, u, umin, umax);
}

static void test_allocator(void) {
    int64_t n[1] = {1 << 20};
    fm_tensor *t = fm_tensor_empty(1, n, FM_F32, FM_CPU);
    fm_tensor_release(t);
    fm_memory_stats s0, s1;
    fm_memory_stats_get(FM_CPU, &s0);
    for (int i = 0; i < 10; i++) { t = fm_tensor_empty(1, n, FM_F32, FM_CPU); fm_tensor_release(t); }
    fm_memory_stats_get(FM_CPU, &s1);
    CHECK(s1.n_system_allocs == s0.n_system_allocs); /* reused from the cache */
    CHECK(s1.n_cache_hits >= s0.n_cache_hits + 10);
    /* a limit fails cleanly with the numbers, then lifting it works again */
    fm_memory_empty_cache(FM_CPU);
    fm_memory_set_limit(FM_CPU, 1 << 20);
    int64_t huge[1] = {1 << 22};
    CHECK(fm_tensor_empty(1, huge, FM_F32, FM_CPU) == NULL);
    CHECK_ERR_CONTAINS("out of memory on cpu: requested 16.00 MiB");
    CHECK(fm_last_status() == FM_ERR_OOM);
    fm_memory_set_limit(FM_CPU, 0);
    t = fm_tensor_empty(1, huge, FM_F32, FM_CPU);
    CHECK(t != NULL);
    fm_tensor_release(t);
    size_t sz;
    CHECK(fm_parse_size("2G", &sz) == FM_OK && sz == 2ull << 30);
    CHECK(fm_parse_size("1.5GiB", &sz) == FM_OK && sz == 3ull << 29);
    CHECK(fm_parse_size("12x", &sz) != FM_OK);
}

static void test_f16_exhaustive(void) {
    /* every f16 value survives f16 -> f32 -> f16, and the SIMD bulk path agrees */
    static uint16_t h[65536], h2[65536];
    static float f[65536];
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    fm_convert_f16_to_f32(h, f, 65536);
    fm_convert_f32_to_f16(f, h2, 65536);
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        bool nan = (h[i] & 0x7c00) == 0x7c00 && (h[i] & 0x3ff);
        if (nan) { bad += !((h2[i] & 0x7c00) == 0x7c00 && (h2[i] & 0x3ff)); continue; }
        bad += h2[i] != h[i];
        bad += f[i] != fm_f16_to_f32(h[i]) && f[i] == f[i];
        bad += fm_f32_to_f16(f[i]) != h[i];
    }
    CHECK_MSG(bad == 0, "%d f16 round-trip mismatches", bad);
    CHECK(fm_f32_to_bf16(1.00390625f) == 0x3f80); /* tie to even */
    CHECK(fm_f32_to_bf16(1.01171875f) == 0x3f82);
}

int main(void) {
    test_create();
    test_views();
    test_print();
    test_rng_threads();
    test_allocator();
    test_f16_exhaustive();
    fm_parallel_shutdown();
    TEST_DONE();
}
