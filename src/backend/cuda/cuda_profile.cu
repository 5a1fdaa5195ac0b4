/* Device-side times for the profiler: every kernel (and host/device copy) run
 * while the profiler is on (fm_profiler_start) is bracketed by two CUDA events, and its span goes on
 * the device's own track at the time the GPU started it.
 *
 * Event times are relative, so each device keeps an anchor: an event recorded on
 * an idle stream and waited for, whose host time (profiler clock) is taken as it
 * completes. A span starts at anchor_host + elapsed(anchor, start). The anchor
 * is renewed for every new trace and every 10 s (cudaEventElapsedTime returns
 * float milliseconds, whose resolution coarsens as the distance grows).
 *
 * The profiler already synchronizes after each op (fm_dispatch), so waiting for
 * the end event costs nothing extra; one mutex keeps begin/end pairs of
 * different host threads from interleaving on the shared events. */
#include <pthread.h>
#include <stdio.h>

#include "backend/cuda/cuda_profile.h"
#include "fathom/fathom.h"  /* FM_MAX_CUDA_DEVICES */
#include "fathom/profile.h"

#define REANCHOR_US 10e6

typedef struct prof_dev {
    int ready;
    cudaEvent_t anchor, start, end;
    uint64_t session;
    double anchor_us;
} prof_dev;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static prof_dev g_prof[FM_MAX_CUDA_DEVICES];

extern "C" int fm_cuda_prof_begin(int dev, cudaStream_t s) {
    if (!fm_profiler_enabled() || dev < 0 || dev >= FM_MAX_CUDA_DEVICES) return 0;
    pthread_mutex_lock(&g_mu);
    prof_dev *p = &g_prof[dev];
    if (!p->ready) {
        if (cudaEventCreate(&p->anchor) != cudaSuccess || cudaEventCreate(&p->start) != cudaSuccess ||
            cudaEventCreate(&p->end) != cudaSuccess) {
            cudaGetLastError(); /* no device timing; the host spans still stand */
            pthread_mutex_unlock(&g_mu);
            return 0;
        }
        p->ready = 1;
    }
    uint64_t session = fm_profiler_session();
    if (p->session != session || fm_profiler_now_us() - p->anchor_us > REANCHOR_US) {
        if (cudaStreamSynchronize(s) != cudaSuccess || cudaEventRecord(p->anchor, s) != cudaSuccess ||
            cudaEventSynchronize(p->anchor) != cudaSuccess) {
            cudaGetLastError();
            pthread_mutex_unlock(&g_mu);
            return 0;
        }
        p->anchor_us = fm_profiler_now_us();
        p->session = session;
    }
    if (cudaEventRecord(p->start, s) != cudaSuccess) {
        cudaGetLastError();
        pthread_mutex_unlock(&g_mu);
        return 0;
    }
    return 1; /* g_mu stays held until fm_cuda_prof_end */
}

extern "C" void fm_cuda_prof_end(int dev, cudaStream_t s, const char *name, const char *category, double bytes) {
    prof_dev *p = &g_prof[dev];
    float t0 = 0, dur = 0;
    if (cudaEventRecord(p->end, s) == cudaSuccess && cudaEventSynchronize(p->end) == cudaSuccess &&
        cudaEventElapsedTime(&t0, p->anchor, p->start) == cudaSuccess &&
        cudaEventElapsedTime(&dur, p->start, p->end) == cudaSuccess) {
        char args[128], track[32];
        if (bytes > 0) snprintf(args, sizeof args, "{\"device\":\"cuda:%d\",\"bytes\":%.0f}", dev, bytes);
        else snprintf(args, sizeof args, "{\"device\":\"cuda:%d\"}", dev);
        snprintf(track, sizeof track, "cuda:%d kernels", dev);
        fm_profile_device_span(dev, track, name, category, p->anchor_us + (double)t0 * 1e3, (double)dur * 1e3, args);
    } else {
        cudaGetLastError(); /* a failed launch is reported by its own check, not here */
    }
    pthread_mutex_unlock(&g_mu);
}
