/* The meta device's allocator (meta_memory.c): accounting, no memory. */
#ifndef FATHOM_META_MEMORY_H
#define FATHOM_META_MEMORY_H
#include "fathom/memory.h"

fm_allocator *fm_meta_allocator(int idx);
/* Bytes per category (fm_mem_category) at the moment of the peak since the last
 * fm_memory_reset_peak: the peak's breakdown, which per-category peaks (reached
 * at different moments) are not. */
void fm_meta_peak_breakdown(size_t out[FM_MEM_CAT_COUNT]);
#endif
