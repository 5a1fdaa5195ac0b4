/* Thread-local error state behind fathom/error.h. */
#include "fathom/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[2048];
static _Thread_local fm_status g_status;

const char *fm_last_error(void) { return g_msg; }
fm_status fm_last_status(void) { return g_status; }
void fm_clear_error(void) { g_msg[0] = 0; g_status = FM_OK; }

fm_status fm_set_error(fm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    g_status = st;
    return st;
}

void fm_error_prefix(const char *fmt, ...) {
    char pre[512], old[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    /* assemble by hand: a truncated message is fine, a format warning is not */
    size_t lp = strlen(pre), lo = strlen(old), cap = sizeof g_msg - 1, pos = 0;
    if (lp > cap) lp = cap;
    memcpy(g_msg, pre, lp);
    pos = lp;
    if (pos + 2 <= cap) { g_msg[pos++] = ':'; g_msg[pos++] = ' '; }
    if (lo > cap - pos) lo = cap - pos;
    memcpy(g_msg + pos, old, lo);
    g_msg[pos + lo] = 0;
}

const char *fm_status_name(fm_status st) {
    switch (st) {
    case FM_OK: return "ok";
    case FM_ERR_INVALID: return "invalid argument";
    case FM_ERR_OOM: return "out of memory";
    case FM_ERR_IO: return "i/o error";
    case FM_ERR_FORMAT: return "malformed input";
    case FM_ERR_UNSUPPORTED: return "unsupported";
    case FM_ERR_STATE: return "invalid state";
    case FM_ERR_INTERNAL: return "internal error";
    }
    return "unknown";
}
