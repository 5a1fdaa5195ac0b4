/* INI text in memory for libinih, with the check inih lacks.
 *
 * inih reads a line into a fixed buffer (INI_MAX_LINE: 200 bytes in Debian's
 * build) and hands the rest of a longer line back as the next line, or, when
 * the rest starts with a space, as a continuation of the value. A recipe line
 * of more than 199 characters was therefore cut silently: the value before the
 * cut was kept, and the rest changed the next key or the model. This reader
 * gives inih one line at a time and stops at a line that does not fit, so the
 * caller can name the line and the limit. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io_internal.h"

char *fm_ini_text_reader(char *str, int num, void *stream) {
    fm_ini_text *t = stream;
    if (t->long_line || !t->text[t->pos]) return NULL;
    int i = 0;
    t->line++;
    while (t->text[t->pos]) {
        char ch = t->text[t->pos++];
        if (ch == '\n') {
            if (i < num - 1) str[i++] = ch; /* a line that fills the buffer exactly still fits */
            break;
        }
        if (i == num - 1) { /* no room for this character: the line is too long */
            t->long_line = t->line;
            t->max_len = num - 1;
            return NULL;
        }
        str[i++] = ch;
    }
    str[i] = 0;
    return str;
}

static char *read_whole(const char *path, size_t max, size_t *len, fm_status *st, const char **why, bool text) {
    *why = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) { *st = FM_ERR_IO; *why = "cannot open"; return NULL; }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        int e = errno;
        fclose(f);
        errno = e;
        *st = FM_ERR_IO;
        *why = "cannot read";
        return NULL;
    }
    if (S_ISDIR(sb.st_mode)) {
        fclose(f);
        errno = EISDIR;
        *st = FM_ERR_IO;
        *why = "is a directory";
        return NULL;
    }
    if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > max) {
        fclose(f);
        *st = FM_ERR_FORMAT;
        *why = "too large";
        return NULL;
    }
    /* Read to the end rather than trust a size: a pipe or /proc file has none, and
     * a file can change between a stat and the read. The size, where there is one,
     * only sizes the first buffer. One byte past max tells a file that is too large. */
    size_t cap = S_ISREG(sb.st_mode) && sb.st_size >= 0 ? (size_t)sb.st_size + 2 : 1 << 16;
    if (cap > max + 2) cap = max + 2;
    size_t n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1 || n > max) break; /* the end (or an error), or past the limit */
        size_t grown = cap - 1 > max / 2 ? max + 2 : 2 * cap;
        char *b = realloc(buf, grown);
        if (!b) { free(buf); buf = NULL; }
        else { buf = b; cap = grown; }
    }
    bool bad = ferror(f);
    int err = errno;
    fclose(f);
    if (!buf) { *st = FM_ERR_OOM; *why = "out of host memory"; return NULL; }
    if (bad) { free(buf); errno = err; *st = FM_ERR_IO; *why = "cannot read"; return NULL; }
    if (n > max) { free(buf); *st = FM_ERR_FORMAT; *why = "too large"; return NULL; }
    buf[n] = 0;
    if (text && memchr(buf, 0, n)) { free(buf); *st = FM_ERR_FORMAT; *why = "not a text file: it holds a NUL byte"; return NULL; }
    if (len) *len = n;
    *st = FM_OK;
    return buf;
}

char *fm_read_text_file(const char *path, size_t max, size_t *len, fm_status *st, const char **why) {
    return read_whole(path, max, len, st, why, true);
}

char *fm_read_file(const char *path, size_t max, size_t *len, fm_status *st, const char **why) {
    return read_whole(path, max, len, st, why, false);
}
