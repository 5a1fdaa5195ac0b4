/* INI text in memory for libinih, with the check inih lacks.
 *
 * inih reads a line into a fixed buffer (INI_MAX_LINE: 200 bytes in Debian's
 * build) and hands the rest of a longer line back as the next line, or, when
 * the rest starts with a space, as a continuation of the value. A recipe line
 * of more than 199 characters was therefore cut silently: the value before the
 * cut was kept, and the rest changed the next key or the model. This reader
 * gives inih one line at a time and stops at a line that does not fit, so the
 * caller can name the line and the limit. */
#include <stdlib.h>
#include <string.h>

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

char *fm_read_text_file(const char *path, size_t max, fm_status *st, const char **why) {
    *why = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) { *st = FM_ERR_IO; *why = "cannot open"; return NULL; }
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); *st = FM_ERR_IO; *why = "cannot read"; return NULL; }
    if ((size_t)n > max) { fclose(f); *st = FM_ERR_FORMAT; *why = "too large"; return NULL; }
    char *buf = malloc((size_t)n + 1);
    if (!buf) { fclose(f); *st = FM_ERR_OOM; *why = "out of host memory"; return NULL; }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    if (memchr(buf, 0, got)) { free(buf); *st = FM_ERR_FORMAT; *why = "not a text file"; return NULL; }
    *st = FM_OK;
    return buf;
}
