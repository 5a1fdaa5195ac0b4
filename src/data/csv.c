/* CSV reader for numeric tables: one sample per row, features to F32, an
 * optional label column (by header name or index) to I64 or F32. Quoted fields
 * are accepted (header names often are); every row must have the same number
 * of fields, and a bad field is reported with file:line and column. */
#include "data/data_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void fm_csv_options_init(fm_csv_options *o) {
    memset(o, 0, sizeof *o);
    o->delimiter = ',';
    o->header = FM_CSV_HEADER_AUTO;
    o->label_name = NULL;
    o->label_index = FM_CSV_NO_LABEL;
    o->label_float = false;
}

#define CSV_FIELD_MAX 255

typedef struct field {
    const char *s; /* raw text, quotes removed */
    size_t n;
} field;

/* Splits one line [s, e) into fields. Returns the count, or -1 on a quoting error. */
static int split_line(const char *s, const char *e, char delim, field **fields, int *cap) {
    int nf = 0;
    const char *p = s;
    for (;;) {
        if (nf == *cap) {
            int ncap = *cap ? *cap * 2 : 16;
            field *nfld = realloc(*fields, (size_t)ncap * sizeof *nfld);
            if (!nfld) return -2;
            *fields = nfld;
            *cap = ncap;
        }
        while (p < e && (*p == ' ' || *p == '\t') && *p != delim) p++;
        field *f = &(*fields)[nf++];
        if (p < e && *p == '"') {
            const char *q = ++p;
            while (q < e && *q != '"') q++;
            if (q >= e) return -1;
            f->s = p;
            f->n = (size_t)(q - p);
            p = q + 1;
            while (p < e && (*p == ' ' || *p == '\t') && *p != delim) p++;
            if (p < e && *p != delim) return -1;
        } else {
            const char *q = p;
            while (q < e && *q != delim) q++;
            const char *t = q;
            while (t > p && (t[-1] == ' ' || t[-1] == '\t')) t--;
            f->s = p;
            f->n = (size_t)(t - p);
            p = q;
        }
        if (p >= e) break;
        p++; /* the delimiter */
    }
    return nf;
}

static bool parse_num(const field *f, double *out) {
    char tmp[CSV_FIELD_MAX + 1];
    if (f->n == 0 || f->n > CSV_FIELD_MAX) return false;
    memcpy(tmp, f->s, f->n);
    tmp[f->n] = 0;
    char *end;
    *out = strtod(tmp, &end);
    return end == tmp + f->n;
}

fm_status fm_csv_read_mem(const char *text, size_t n, const char *name, const fm_csv_options *opt, fm_tensor **x,
                          fm_tensor **y) {
    if (!name) name = "(memory)";
    if (!x) return fm_set_error(FM_ERR_INVALID, "csv_read: x must not be NULL");
    *x = NULL;
    if (y) *y = NULL;
    if (!text && n) return fm_set_error(FM_ERR_INVALID, "%s: NULL text", name);
    fm_csv_options def;
    if (!opt) {
        fm_csv_options_init(&def);
        opt = &def;
    }
    char delim = opt->delimiter ? opt->delimiter : ',';
    if (delim == '"' || delim == '\n' || delim == '\r')
        return fm_set_error(FM_ERR_INVALID, "%s: invalid CSV delimiter", name);
    bool want_label = opt->label_name != NULL || opt->label_index != FM_CSV_NO_LABEL;
    if (want_label && !y)
        return fm_set_error(FM_ERR_INVALID, "%s: a label column was chosen but no output for labels was given", name);

    field *fields = NULL;
    int fcap = 0, ncols = -1, label_col = -1;
    double *vals = NULL;
    size_t nvals = 0, vcap = 0;
    int64_t rows = 0;
    fm_status st = FM_OK;
    const char *p = text, *end = text + n;
    long line = 0;
    /* a UTF-8 byte-order mark is common in CSV exported by spreadsheets */
    if (n >= 3 && (unsigned char)p[0] == 0xEF && (unsigned char)p[1] == 0xBB && (unsigned char)p[2] == 0xBF) p += 3;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        const char *ls = p;
        p = nl ? nl + 1 : end;
        line++;
        if (le > ls && le[-1] == '\r') le--;
        const char *t = ls;
        while (t < le && (*t == ' ' || *t == '\t')) t++;
        if (t == le) continue; /* empty line */
        int nf = split_line(ls, le, delim, &fields, &fcap);
        if (nf == -2) { st = fm_set_error(FM_ERR_OOM, "%s: out of memory", name); goto done; }
        if (nf == -1) { st = fm_set_error(FM_ERR_FORMAT, "%s:%ld: unbalanced quotes", name, line); goto done; }
        if (ncols < 0) {
            ncols = nf;
            bool is_header = opt->header == FM_CSV_HEADER_YES;
            if (opt->header == FM_CSV_HEADER_AUTO) {
                for (int i = 0; i < nf; i++) {
                    double v;
                    if (!parse_num(&fields[i], &v)) is_header = true;
                }
            }
            if (want_label) {
                if (opt->label_name) {
                    if (!is_header) {
                        st = fm_set_error(FM_ERR_INVALID, "%s: label column '%s' chosen by name, but the file has no header row",
                                          name, opt->label_name);
                        goto done;
                    }
                    for (int i = 0; i < nf; i++)
                        if (strlen(opt->label_name) == fields[i].n && memcmp(opt->label_name, fields[i].s, fields[i].n) == 0)
                            label_col = i;
                    if (label_col < 0) {
                        st = fm_set_error(FM_ERR_INVALID, "%s: no column named '%s' in the header", name, opt->label_name);
                        goto done;
                    }
                } else {
                    int li = opt->label_index < 0 ? nf + opt->label_index : opt->label_index;
                    if (li < 0 || li >= nf) {
                        st = fm_set_error(FM_ERR_INVALID, "%s: label column index %d is out of range (%d columns)", name,
                                          opt->label_index, nf);
                        goto done;
                    }
                    label_col = li;
                }
            }
            if (is_header) continue;
        }
        if (nf != ncols) {
            st = fm_set_error(FM_ERR_FORMAT, "%s:%ld: %d fields, expected %d like the first row", name, line, nf, ncols);
            goto done;
        }
        if (nvals + (size_t)nf > vcap) {
            size_t ncap = vcap ? vcap * 2 : 1024;
            while (ncap < nvals + (size_t)nf) ncap *= 2;
            double *nv = realloc(vals, ncap * sizeof *nv);
            if (!nv) { st = fm_set_error(FM_ERR_OOM, "%s: out of memory", name); goto done; }
            vals = nv;
            vcap = ncap;
        }
        for (int i = 0; i < nf; i++) {
            if (!parse_num(&fields[i], &vals[nvals + (size_t)i])) {
                st = fm_set_error(FM_ERR_FORMAT, "%s:%ld: column %d: '%.*s' is not a number", name, line, i + 1,
                                  (int)(fields[i].n > 40 ? 40 : fields[i].n), fields[i].s);
                goto done;
            }
            if (i == label_col && !opt->label_float) {
                double v = vals[nvals + (size_t)i];
                if (!(v == floor(v)) || fabs(v) > 9.0e15) {
                    st = fm_set_error(FM_ERR_FORMAT, "%s:%ld: label '%.*s' is not an integer (use label_float for regression targets)",
                                      name, line, (int)(fields[i].n > 40 ? 40 : fields[i].n), fields[i].s);
                    goto done;
                }
            }
        }
        nvals += (size_t)nf;
        rows++;
    }
    if (rows == 0) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: no data rows", name);
        goto done;
    }
    {
        int nfeat = ncols - (label_col >= 0 ? 1 : 0);
        int64_t xs[2] = {rows, nfeat};
        fm_tensor *tx = fm_tensor_empty(2, xs, FM_F32, FM_CPU);
        fm_tensor *ty = label_col >= 0 ? fm_tensor_empty(1, &rows, opt->label_float ? FM_F32 : FM_I64, FM_CPU) : NULL;
        if (!tx || (label_col >= 0 && !ty)) {
            fm_tensor_release(tx);
            fm_tensor_release(ty);
            fm_error_prefix("%s", name);
            st = fm_last_status();
            goto done;
        }
        float *xd = fm_tensor_data(tx);
        for (int64_t r = 0; r < rows; r++) {
            const double *row = vals + (size_t)r * (size_t)ncols;
            int k = 0;
            for (int c = 0; c < ncols; c++) {
                if (c == label_col) {
                    if (opt->label_float) ((float *)fm_tensor_data(ty))[r] = (float)row[c];
                    else ((int64_t *)fm_tensor_data(ty))[r] = (int64_t)row[c];
                } else {
                    xd[r * nfeat + k++] = (float)row[c];
                }
            }
        }
        *x = tx;
        if (y) *y = ty;
    }
done:
    free(fields);
    free(vals);
    return st;
}

fm_status fm_csv_read(const char *path, const fm_csv_options *opt, fm_tensor **x, fm_tensor **y) {
    if (x) *x = NULL;
    if (y) *y = NULL;
    unsigned char *buf;
    size_t n;
    fm_status st = fm_data_read_file(path, &buf, &n);
    if (st != FM_OK) return st;
    st = fm_csv_read_mem((const char *)buf, n, path, opt, x, y);
    free(buf);
    return st;
}
