/* CUDA-event timing behind the profiler's device tracks (src/backend/cuda/cuda_profile.cu).
 * While the profiler is on (fm_profiler_start), the kernel trampoline and the copy functions bracket
 * their work with begin/end; each pair becomes one span on the device's track
 * ("cuda:0 kernels") at the device-side start time. Only .cu files include this. */
#ifndef FATHOM_CUDA_PROFILE_H
#define FATHOM_CUDA_PROFILE_H
#include <cuda_runtime.h>

/* Records the start event on stream s of device dev. Returns 1 when a span is
 * open (the caller must then call fm_cuda_prof_end, whatever happens), 0 when
 * not (profiler off, events unavailable). */
extern "C" int fm_cuda_prof_begin(int dev, cudaStream_t s);
/* Records the end event on s, waits for it and writes the span: name ("matmul",
 * "memcpy h2d"), category ("gpu kernel", "gpu memcpy"), bytes (copies; 0: none). */
extern "C" void fm_cuda_prof_end(int dev, cudaStream_t s, const char *name, const char *category, double bytes);
#endif
