/* Shared by the libFuzzer harnesses (tests/fuzz/fuzz_*.c, built with
 * -DFATHOM_FUZZ=ON; run with tools/fuzz.sh). Parsers that take a path get the
 * input through a per-process temporary file. */
#ifndef FATHOM_FUZZ_UTIL_H
#define FATHOM_FUZZ_UTIL_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fathom/error.h"

/* The directory for scratch files: $FATHOM_FUZZ_DIR (tools/fuzz.sh makes one
 * and removes it), else /tmp. */
static inline const char *fuzz_dir(void) {
    const char *d = getenv("FATHOM_FUZZ_DIR");
    return d && *d ? d : "/tmp";
}

/* Writes the input to <fuzz_dir>/fathom_fuzz_<pid><suffix>; returns the path (static). */
static inline const char *fuzz_file(const uint8_t *data, size_t size, const char *suffix) {
    static char path[512];
    snprintf(path, sizeof path, "%s/fathom_fuzz_%ld%s", fuzz_dir(), (long)getpid(), suffix);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    return path;
}

/* The input as a NUL-terminated string (malloc'd). */
static inline char *fuzz_text(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}
#endif
