/* fathom/memory.h: allocators and memory statistics.
 *
 * Every device has one allocator behind the same interface. The CPU one is a
 * caching allocator: freed blocks go back to size-class free lists and are
 * reused, so a steady-state training step makes no system allocations. */
#ifndef FATHOM_MEMORY_H
#define FATHOM_MEMORY_H
#include "fathom/export.h"
#include <stddef.h>
#include <stdint.h>
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fm_memory_stats {
    size_t allocated, allocated_peak; /* bytes handed to tensors (rounded sizes) */
    size_t requested, requested_peak; /* bytes asked for */
    size_t reserved, reserved_peak;   /* bytes obtained from the system (incl. cached) */
    size_t active, active_peak;       /* blocks in use (same as allocated for CPU) */
    uint64_t n_allocs, n_system_allocs, n_system_frees, n_cache_hits, n_ooms;
    size_t limit;                     /* 0 = none */
    /* added by the efficiency work (CPU allocator; other devices leave them 0) */
    int mode;                         /* fm_memory_mode */
    size_t arena_bytes;               /* preallocate: size of the up-front reserve */
    size_t arena_free_bytes;          /* of which not in use */
    uint64_t n_splits, n_merges;      /* arena block splits and coalescings */
    size_t by_category[8], by_category_peak[8]; /* bytes in use per fm_mem_category */
} fm_memory_stats;

typedef enum fm_memory_mode { FM_MEMORY_GROW = 0, FM_MEMORY_PREALLOCATE = 1 } fm_memory_mode;

/* What a block of memory is for: the allocator attributes each allocation to the
 * category set on the calling thread when it was made, and keeps current and
 * peak bytes per category (fm_memory_stats.by_category*). */
typedef enum fm_mem_category {
    FM_MEM_OTHER = 0, FM_MEM_WEIGHTS, FM_MEM_GRADIENTS, FM_MEM_OPTIMIZER, FM_MEM_ACTIVATIONS, FM_MEM_CAT_COUNT
} fm_mem_category;
/* Sets the calling thread's category; returns the previous one (restore it with
 * fm_memory_tag_pop). Allocations on worker threads count as FM_MEM_OTHER. */
FM_API fm_mem_category fm_memory_tag_push(fm_mem_category c);
FM_API void fm_memory_tag_pop(fm_mem_category previous);
FM_API const char *fm_mem_category_name(fm_mem_category c);
/* Moves a storage's bytes to another category (autograd hands a freshly computed
 * gradient to a parameter without copying it). A no-op for other allocators. */
struct fm_storage;
FM_API void fm_memory_retag(struct fm_storage *s, fm_mem_category c);

/* Allocator configuration, as TensorFlow's memory options:
 *   grow (default): obtain memory as needed and cache freed blocks by size class;
 *   preallocate: reserve prealloc_bytes (or prealloc_fraction of the limit, or of
 *   physical memory without a limit) up front as one arena; allocations are carved
 *   from it best-fit, split when the remainder is >= 512 B (requests <= 1 MiB) or
 *   > 1 MiB (larger ones), and freed blocks coalesce with free neighbours. A
 *   request the arena cannot hold falls back to the system (counted in
 *   n_system_allocs) unless the limit forbids it.
 * limit: 0 = none. Environment: FATHOM_MEMORY_LIMIT=2G, FATHOM_MEMORY_MODE=grow|preallocate,
 * FATHOM_MEMORY_PREALLOCATE=0.5|2G (read at the first allocation). */
typedef struct fm_memory_config {
    fm_memory_mode mode;
    size_t prealloc_bytes;    /* preallocate: bytes (wins over the fraction) */
    double prealloc_fraction; /* preallocate: (0, 1] */
    size_t limit;
} fm_memory_config;
/* Fails (FM_ERR_STATE) if switching modes while arena blocks are in use, and
 * (FM_ERR_OOM) if the reserve cannot be obtained or exceeds the limit. */
FM_API fm_status fm_memory_configure(fm_device dev, const fm_memory_config *cfg);
/* "grow" | "preallocate" */
FM_API fm_status fm_memory_mode_parse(const char *s, fm_memory_mode *out);

/* Peak memory by category for the end-of-run report (fathom train prints it and
 * adds it to --json). Categories the caller never tagged are 0. */
typedef struct fm_memory_report {
    size_t peak_allocated, peak_reserved;
    size_t peak[FM_MEM_CAT_COUNT];
    uint64_t n_system_allocs, n_ooms;
} fm_memory_report;
FM_API fm_status fm_memory_report_get(fm_device dev, fm_memory_report *out);
/* One line per category into buf ("memory: peak 12.0 MiB allocated ..."). */
FM_API const char *fm_memory_report_format(const fm_memory_report *r, char *buf, size_t len);
/* A JSON object {"peak_allocated": ..., "weights": ..., ...} into buf. */
FM_API const char *fm_memory_report_json(const fm_memory_report *r, char *buf, size_t len);

typedef struct fm_allocator {
    const char *name;
    void *(*alloc)(struct fm_allocator *a, size_t n);
    void (*free)(struct fm_allocator *a, void *p, size_t n);
    fm_status (*get_stats)(struct fm_allocator *a, fm_memory_stats *out);
    void (*reset_peak)(struct fm_allocator *a);
    void (*empty_cache)(struct fm_allocator *a);
    fm_status (*set_limit)(struct fm_allocator *a, size_t limit_bytes);
    void *impl;
    /* optional: moves a live block to another category (fm_memory_retag) */
    void (*retag)(struct fm_allocator *a, void *p, fm_mem_category c);
} fm_allocator;

FM_API fm_status fm_memory_stats_get(fm_device dev, fm_memory_stats *out);
FM_API void fm_memory_reset_peak(fm_device dev);
FM_API void fm_memory_empty_cache(fm_device dev);
/* 0 removes the limit. Exceeding it fails the allocation with FM_ERR_OOM and a
 * message showing requested, allocated, reserved and the limit. */
FM_API fm_status fm_memory_set_limit(fm_device dev, size_t limit_bytes);
/* Parses "2G", "512M", "1.5GiB", "1073741824". */
FM_API fm_status fm_parse_size(const char *s, size_t *out);
/* Human-readable size into buf ("1.50 GiB"). */
FM_API const char *fm_format_bytes(size_t n, char *buf, size_t len);
FM_API fm_allocator *fm_cpu_allocator(void);

#ifdef __cplusplus
}
#endif
#endif
