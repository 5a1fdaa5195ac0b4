/* The CPU caching allocator: exact statistics in grow mode, the preallocated
 * arena (best fit, splitting with limits, coalescing, no system allocations
 * while it suffices), the hard limit with its error message, empty_cache, and the
 * per-category accounting behind the memory report. */
#include "core/parallel.h"
#include "fathom/fathom.h"
#include "fathom/memory.h"
#include "test_util.h"

static fm_memory_stats stats(void) {
    fm_memory_stats s;
    fm_memory_stats_get(FM_CPU, &s);
    return s;
}

static fm_tensor *bytes(int64_t n) { return fm_tensor_empty(1, &n, FM_U8, FM_CPU); }

static void test_grow(void) {
    fm_memory_empty_cache(FM_CPU);
    fm_memory_stats s0 = stats();
    CHECK(s0.mode == FM_MEMORY_GROW);
    fm_tensor *a = bytes(1000), *b = bytes(100000);
    fm_memory_stats s1 = stats();
    CHECK(s1.allocated - s0.allocated == 1024 + 106496); /* 64 B classes below 4 KiB, eighths above */
    CHECK(s1.requested - s0.requested == 101000);
    CHECK(s1.n_system_allocs - s0.n_system_allocs == 2);
    CHECK(s1.reserved - s0.reserved == 1024 + 106496 + 2 * 64); /* + headers */
    CHECK(s1.active == s1.allocated && s1.allocated_peak >= s1.allocated);
    fm_tensor_release(b);
    fm_tensor *c = bytes(99000); /* same class: reused */
    fm_memory_stats s2 = stats();
    CHECK(s2.n_system_allocs == s1.n_system_allocs);
    CHECK(s2.n_cache_hits == s1.n_cache_hits + 1);
    CHECK(s2.requested - s0.requested == 1000 + 99000);
    fm_tensor_release_n(2, a, c);
    fm_memory_stats s3 = stats();
    CHECK(s3.allocated == s0.allocated && s3.requested == s0.requested);
    CHECK(s3.reserved > s0.reserved); /* cached */
    fm_memory_empty_cache(FM_CPU);
    fm_memory_stats s4 = stats();
    CHECK(s4.reserved == s0.reserved);
    CHECK(s4.n_system_frees - s3.n_system_frees == 2);
}

static void test_limit(void) {
    fm_memory_empty_cache(FM_CPU);
    fm_memory_stats s0 = stats();
    CHECK(fm_memory_set_limit(FM_CPU, s0.reserved + (1 << 20)) == FM_OK);
    fm_tensor *ok = bytes(512 << 10);
    CHECK(ok != NULL);
    fm_tensor *big = bytes(4 << 20);
    CHECK(big == NULL);
    CHECK_ERR_CONTAINS("requested 4.00 MiB");
    CHECK_ERR_CONTAINS("allocated");
    CHECK_ERR_CONTAINS("reserved");
    CHECK_ERR_CONTAINS("limit 1.");
    CHECK_ERR_CONTAINS("--checkpointing");
    CHECK_ERR_CONTAINS("--precision bf16");
    CHECK(fm_last_status() == FM_ERR_OOM);
    CHECK(stats().n_ooms == s0.n_ooms + 1);
    fm_tensor_release(ok);
    /* the failure left the allocator usable and the stats consistent */
    CHECK(stats().allocated == s0.allocated);
    CHECK(fm_memory_set_limit(FM_CPU, 0) == FM_OK);
    big = bytes(4 << 20);
    CHECK(big != NULL);
    fm_tensor_release(big);
    fm_memory_empty_cache(FM_CPU);
}

static void test_preallocate(void) {
    fm_memory_empty_cache(FM_CPU);
    fm_memory_config cfg = {FM_MEMORY_PREALLOCATE, 8 << 20, 0, 0};
    CHECK_MSG(fm_memory_configure(FM_CPU, &cfg) == FM_OK, "%s", fm_last_error());
    fm_memory_stats s0 = stats();
    CHECK(s0.mode == FM_MEMORY_PREALLOCATE && s0.arena_bytes == (8u << 20));
    CHECK(s0.arena_free_bytes == (8u << 20) - 64);
    /* many sizes, freed in a scrambled order: no system allocation, and the arena
     * coalesces back to one free chunk */
    enum { N = 40 };
    fm_tensor *t[N];
    for (int i = 0; i < N; i++) t[i] = bytes(1000 + 37000 * (i % 7));
    fm_memory_stats s1 = stats();
    CHECK(s1.n_system_allocs == s0.n_system_allocs);
    CHECK(s1.n_splits - s0.n_splits == N);
    size_t want = 0;
    for (int i = 0; i < N; i++) want += ((size_t)(1000 + 37000 * (i % 7)) + 511) & ~(size_t)511;
    CHECK(s1.allocated - s0.allocated == want);
    for (int i = 0; i < N; i += 2) fm_tensor_release(t[i]);
    fm_tensor *mid = bytes(20000); /* best fit into a hole */
    CHECK(stats().n_system_allocs == s0.n_system_allocs);
    fm_tensor_release(mid);
    for (int i = 1; i < N; i += 2) fm_tensor_release(t[i]);
    fm_memory_stats s2 = stats();
    CHECK(s2.allocated == s0.allocated);
    CHECK(s2.arena_free_bytes == (8u << 20) - 64); /* fully coalesced */
    CHECK(s2.n_merges > 0);
    /* a remainder smaller than the split limit stays with the block: a request of
     * 1.5 MiB in a 2.4 MiB chunk would leave < 1 MiB (large pool) -> no split */
    fm_tensor *x = bytes(6 << 20);
    fm_memory_stats s3 = stats();
    size_t hole = s3.arena_free_bytes; /* 2 MiB - 64 - 64 */
    fm_tensor *y = bytes((int64_t)hole - (512 << 10));
    fm_memory_stats s4 = stats();
    CHECK(s4.arena_free_bytes == 0);
    CHECK(s4.allocated - s3.allocated == hole); /* counted at its true size */
    /* beyond the arena: falls back to the system */
    fm_tensor *z = bytes(1 << 20);
    CHECK(stats().n_system_allocs == s0.n_system_allocs + 1);
    /* reconfiguring with arena blocks in use is refused */
    fm_memory_config grow = {FM_MEMORY_GROW, 0, 0, 0};
    CHECK(fm_memory_configure(FM_CPU, &grow) == FM_ERR_STATE);
    CHECK_ERR_CONTAINS("in use");
    fm_tensor_release_n(3, x, y, z);
    CHECK(stats().allocated == s0.allocated);
    /* empty_cache keeps the reserve */
    fm_memory_empty_cache(FM_CPU);
    CHECK(stats().arena_bytes == (8u << 20));
    CHECK(fm_memory_configure(FM_CPU, &grow) == FM_OK);
    fm_memory_stats s5 = stats();
    CHECK(s5.mode == FM_MEMORY_GROW && s5.arena_bytes == 0);
    CHECK(s5.reserved < s4.reserved); /* the arena went back to the system */
    /* bad configurations */
    fm_memory_config bad = {FM_MEMORY_PREALLOCATE, 0, 0, 0};
    CHECK(fm_memory_configure(FM_CPU, &bad) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("fraction");
    fm_memory_config over = {FM_MEMORY_PREALLOCATE, 64 << 20, 0, 16 << 20};
    CHECK(fm_memory_configure(FM_CPU, &over) == FM_ERR_OOM);
    CHECK_ERR_CONTAINS("cannot preallocate");
    fm_memory_config frac = {FM_MEMORY_PREALLOCATE, 0, 0.25, s5.reserved + (64 << 20)};
    CHECK_MSG(fm_memory_configure(FM_CPU, &frac) == FM_OK, "%s", fm_last_error());
    CHECK(stats().arena_bytes >= (16u << 20) && stats().arena_bytes <= (17u << 20) + s5.reserved);
    CHECK(fm_memory_configure(FM_CPU, &grow) == FM_OK);
    fm_memory_mode m;
    CHECK(fm_memory_mode_parse("preallocate", &m) == FM_OK && m == FM_MEMORY_PREALLOCATE);
    CHECK(fm_memory_mode_parse("huge", &m) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("grow or preallocate");
}

static void test_categories(void) {
    fm_memory_reset_peak(FM_CPU);
    fm_memory_stats s0 = stats();
    fm_mem_category prev = fm_memory_tag_push(FM_MEM_WEIGHTS);
    fm_tensor *w = bytes(64 << 10);
    fm_memory_tag_pop(prev);
    prev = fm_memory_tag_push(FM_MEM_ACTIVATIONS);
    fm_tensor *a1 = bytes(256 << 10), *a2 = bytes(256 << 10);
    fm_memory_tag_pop(prev);
    fm_tensor_release_n(2, a1, a2);
    fm_memory_stats s1 = stats();
    CHECK(s1.by_category[FM_MEM_WEIGHTS] - s0.by_category[FM_MEM_WEIGHTS] == (64u << 10));
    CHECK(s1.by_category[FM_MEM_ACTIVATIONS] == s0.by_category[FM_MEM_ACTIVATIONS]);
    CHECK(s1.by_category_peak[FM_MEM_ACTIVATIONS] - s0.by_category[FM_MEM_ACTIVATIONS] == (512u << 10));
    fm_memory_report r;
    CHECK(fm_memory_report_get(FM_CPU, &r) == FM_OK);
    CHECK(r.peak[FM_MEM_ACTIVATIONS] == s1.by_category_peak[FM_MEM_ACTIVATIONS]);
    char buf[512];
    CHECK(strstr(fm_memory_report_format(&r, buf, sizeof buf), "activations 512.00 KiB") != NULL);
    CHECK(strstr(fm_memory_report_json(&r, buf, sizeof buf), "\"weights\": 65536") != NULL);
    CHECK(!strcmp(fm_mem_category_name(FM_MEM_OPTIMIZER), "optimizer_state"));
    fm_tensor_release(w);
    CHECK(stats().by_category[FM_MEM_WEIGHTS] == s0.by_category[FM_MEM_WEIGHTS]);
}

int main(void) {
    test_grow();
    test_limit();
    test_preallocate();
    test_categories();
    fm_parallel_shutdown();
    TEST_DONE();
}
