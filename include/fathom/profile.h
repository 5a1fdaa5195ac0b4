/* fathom/profile.h: the profiler. Records spans (ops in forward and backward,
 * optimizer steps, data loading, anything wrapped in a range) and a memory
 * counter, and streams them to a Chrome trace-event JSON file, which Perfetto and
 * chrome://tracing open. Events are flushed as they accumulate, so a run that
 * crashes still leaves a trace the tools can read (the JSON array format allows
 * the closing bracket to be missing). When not started, every hook is one
 * predictable branch.
 *
 * Tracks: one per thread (ops in forward and backward, step / data / optimizer
 * spans, loader workers), counters "memory" and "memory reserved", and with
 * CUDA one track per device ("cuda:0 kernels") of kernels and copies timed
 * with CUDA events. */
#ifndef FATHOM_PROFILE_H
#define FATHOM_PROFILE_H
#include "fathom/export.h"
#include <stdbool.h>
#include <stdint.h>
#include "fathom/error.h"

#ifdef __cplusplus
extern "C" {
#endif

FM_API fm_status fm_profiler_start(const char *trace_path);
/* Writes the remaining events and closes the file. Safe to call when not started. */
FM_API fm_status fm_profiler_stop(void);
FM_API bool fm_profiler_enabled(void);
/* Microseconds since the profiler started (monotonic). */
FM_API double fm_profiler_now_us(void);
/* A named span on the calling thread; category e.g. "optimizer", "data", "step". */
FM_API void fm_profile_push(const char *name, const char *category);
FM_API void fm_profile_pop(void);
/* A complete span with explicit start and duration (microseconds), with an
 * optional JSON object text for args (may be NULL). A span whose event would pass
 * 2 KiB (args of about that size) is dropped, never written cut. */
FM_API void fm_profile_span(const char *name, const char *category, double start_us, double dur_us, const char *args_json);
/* A counter track sample, e.g. ("memory", "allocated", bytes). */
FM_API void fm_profile_counter(const char *track, const char *series, double value);
/* Name the calling thread's track ("loader worker 1"). */
FM_API void fm_profile_thread_name(const char *name);
/* A span on a device's own track rather than the calling thread's: GPU kernels and
 * copies timed with CUDA events, at their device-side start (profiler clock, us).
 * track picks the track (0..63, e.g. the CUDA device index); track_name names it in
 * the trace the first time it is used. */
FM_API void fm_profile_device_span(int track, const char *track_name, const char *name, const char *category,
                            double start_us, double dur_us, const char *args_json);
/* Counts fm_profiler_start calls: what a device-side clock anchor compares against
 * to know it must re-anchor for a new trace (0: never started). */
FM_API uint64_t fm_profiler_session(void);

#ifdef __cplusplus
}
#endif
#endif
