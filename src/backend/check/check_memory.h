/* The checked test device's memory (check_memory.c): blocks carved from one
 * reserved address range, kept PROT_NONE except while the backend's copies or
 * a kernel call use them, so that any other host access faults and is named. */
#ifndef FATHOM_CHECK_MEMORY_H
#define FATHOM_CHECK_MEMORY_H
#include <stdbool.h>
#include <stddef.h>

#include "fathom/memory.h"

/* Devices check:0 .. check:FM_CHECK_DEVICES-1 (two, so that tests can mix devices). */
#define FM_CHECK_DEVICES 2

/* The allocator of device idx (0 <= idx < FM_CHECK_DEVICES); reserves the
 * address range and installs the fault handler on first use. NULL with the
 * error set when the reserve cannot be mapped. */
fm_allocator *fm_check_allocator(int idx);

/* Opens (read/write) the block holding p for the calling code; opens nest,
 * and the block closes again (PROT_NONE) when the last one is closed. Addresses
 * outside the check device's range are ignored (host tensors in a call). */
void fm_check_open(const void *p);
void fm_check_close(const void *p);

/* Kernel scope: a block allocated on this thread while inside one (a kernel's
 * own device temporaries) starts open, and is closed when the scope ends. */
void fm_check_kernel_enter(void);
void fm_check_kernel_leave(void);

/* What the check backend has done since the process started (check_backend.c), all
 * devices together: kernel calls and copies by direction, the asynchronous batch
 * uploads (fm_backend.copy_h2d_ahead) and the waits on them. Tests use these to
 * observe order and count host reads (tests/test_train_stage.c). */
typedef struct fm_check_counts {
    unsigned long long kernels, h2d, d2h, d2d, h2d_ahead, waits;
} fm_check_counts;
void fm_check_counts_get(fm_check_counts *out);
#endif
