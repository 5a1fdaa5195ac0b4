/* What the CPU caching allocator (memory.c) shares with other allocators. */
#ifndef FATHOM_MEMORY_INTERNAL_H
#define FATHOM_MEMORY_INTERNAL_H
#include <stddef.h>

/* The bytes a grow-mode block for an n-byte request holds (what `allocated`
 * counts): 64 B granularity up to 4 KiB, eighths of the power of two above.
 * The meta device counts with it so its figures are the CPU run's. */
size_t fm_cpu_block_size(size_t n);
#endif
