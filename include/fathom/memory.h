/* fathom/memory.h: allocators and memory statistics.
 *
 * Every device has one allocator behind the same interface. The CPU one is a
 * caching allocator: freed blocks go back to size-class free lists and are
 * reused, so a steady-state training step makes no system allocations. */
#ifndef FATHOM_MEMORY_H
#define FATHOM_MEMORY_H
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
} fm_memory_stats;

typedef enum fm_memory_mode { FM_MEMORY_GROW = 0, FM_MEMORY_PREALLOCATE = 1 } fm_memory_mode;

typedef struct fm_allocator {
    const char *name;
    void *(*alloc)(struct fm_allocator *a, size_t n);
    void (*free)(struct fm_allocator *a, void *p, size_t n);
    fm_status (*get_stats)(struct fm_allocator *a, fm_memory_stats *out);
    void (*reset_peak)(struct fm_allocator *a);
    void (*empty_cache)(struct fm_allocator *a);
    fm_status (*set_limit)(struct fm_allocator *a, size_t limit_bytes);
    void *impl;
} fm_allocator;

fm_status fm_memory_stats_get(fm_device dev, fm_memory_stats *out);
void fm_memory_reset_peak(fm_device dev);
void fm_memory_empty_cache(fm_device dev);
/* 0 removes the limit. Exceeding it fails the allocation with FM_ERR_OOM and a
 * message showing requested, allocated, reserved and the limit. */
fm_status fm_memory_set_limit(fm_device dev, size_t limit_bytes);
/* Parses "2G", "512M", "1.5GiB", "1073741824". */
fm_status fm_parse_size(const char *s, size_t *out);
/* Human-readable size into buf ("1.50 GiB"). */
const char *fm_format_bytes(size_t n, char *buf, size_t len);
fm_allocator *fm_cpu_allocator(void);

#ifdef __cplusplus
}
#endif
#endif
