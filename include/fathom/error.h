/* fathom/error.h: how every library call reports failure.
 *
 * Calls return a status (or NULL for calls that return an object) and leave a
 * human-readable message in thread-local storage, read with fm_last_error().
 * The library never aborts or exits on user input. */
#ifndef FATHOM_ERROR_H
#define FATHOM_ERROR_H
#include "fathom/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fm_status {
    FM_OK = 0,
    FM_ERR_INVALID = 1,     /* bad argument: wrong shape, axis, dtype, value */
    FM_ERR_OOM = 2,         /* allocation failed or memory limit reached */
    FM_ERR_IO = 3,          /* file could not be read or written */
    FM_ERR_FORMAT = 4,      /* file or text parsed but its content is malformed */
    FM_ERR_UNSUPPORTED = 5, /* valid request this build/device cannot do */
    FM_ERR_STATE = 6,       /* call not valid in the current state (e.g. freed graph) */
    FM_ERR_INTERNAL = 7     /* a bug in fathom: please report it */
} fm_status;

/* Message of the most recent failure on this thread ("" if none). */
FM_API const char *fm_last_error(void);
/* Status of the most recent failure on this thread (FM_OK if none). */
FM_API fm_status fm_last_status(void);
/* Clear the thread's error. */
FM_API void fm_clear_error(void);
/* Record a failure; returns `st` so callers can `return fm_set_error(...)`. */
FM_API fm_status fm_set_error(fm_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Prefix the current message with context ("loading ckpt.safetensors: ..."). */
FM_API void fm_error_prefix(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
FM_API const char *fm_status_name(fm_status st);

#ifdef __cplusplus
}
#endif
#endif
