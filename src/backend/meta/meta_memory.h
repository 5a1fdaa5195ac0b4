/* The meta device's allocator (meta_memory.c): accounting, no memory. */
#ifndef FATHOM_META_MEMORY_H
#define FATHOM_META_MEMORY_H
#include "fathom/memory.h"

fm_allocator *fm_meta_allocator(int idx);
#endif
