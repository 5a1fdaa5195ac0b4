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

/* The first non-empty row: decides whether it is a header (FM_CSV_HEADER_AUTO: any
 * field that is not a number) and which column holds the label. */
static fm_status csv_first_row(const char *name, const fm_csv_options *opt, const field *fields, int nf,
                               bool want_label, bool *is_header, int *label_col) {
    *is_header = opt->header == FM_CSV_HEADER_YES;
    if (opt->header == FM_CSV_HEADER_AUTO) {
        for (int i = 0; i < nf; i++) {
            double v;
            if (!parse_num(&fields[i], &v)) *is_header = true;
        }
    }
    if (!want_label) return FM_OK;
    if (opt->label_name) {
        if (!*is_header)
            return fm_set_error(FM_ERR_INVALID, "%s: label column '%s' chosen by name, but the file has no header row",
                                name, opt->label_name);
        for (int i = 0; i < nf; i++)
            if (strlen(opt->label_name) == fields[i].n && memcmp(opt->label_name, fields[i].s, fields[i].n) == 0)
                *label_col = i;
        if (*label_col < 0)
            return fm_set_error(FM_ERR_INVALID, "%s: no column named '%s' in the header", name, opt->label_name);
        return FM_OK;
    }
    int li = opt->label_index < 0 ? nf + opt->label_index : opt->label_index;
    if (li < 0 || li >= nf)
        return fm_set_error(FM_ERR_INVALID, "%s: label column index %d is out of range (%d columns)", name,
                            opt->label_index, nf);
    *label_col = li;
    return FM_OK;
}

/* The values parsed so far, row after row (every row has the same field count). */
typedef struct csv_values { double *v; size_t n, cap; } csv_values;

/* Parses one data row's fields onto the end of `vals`; an integer label is checked. */
static fm_status csv_append_row(const char *name, long line, const fm_csv_options *opt, const field *fields, int nf,
                                int label_col, csv_values *vals) {
    if (vals->n + (size_t)nf > vals->cap) {
        size_t ncap = vals->cap ? vals->cap * 2 : 1024;
        while (ncap < vals->n + (size_t)nf) ncap *= 2;
        double *nv = realloc(vals->v, ncap * sizeof *nv);
        if (!nv) return fm_set_error(FM_ERR_OOM, "%s: out of memory", name);
        vals->v = nv;
        vals->cap = ncap;
    }
    double *row = vals->v + vals->n;
    for (int i = 0; i < nf; i++) {
        int shown = (int)(fields[i].n > 40 ? 40 : fields[i].n);
        if (!parse_num(&fields[i], &row[i]))
            return fm_set_error(FM_ERR_FORMAT, "%s:%ld: column %d: '%.*s' is not a number", name, line, i + 1, shown,
                                fields[i].s);
        if (i == label_col && !opt->label_float && (!(row[i] == floor(row[i])) || fabs(row[i]) > 9.0e15))
            return fm_set_error(FM_ERR_FORMAT,
                                "%s:%ld: label '%.*s' is not an integer (use label_float for regression targets)",
                                name, line, shown, fields[i].s);
    }
    vals->n += (size_t)nf;
    return FM_OK;
}

/* The parsed rows [rows, ncols] as features x [rows, ncols - 1 if labelled] (F32)
 * and labels y [rows] (I64, or F32 with label_float). */
static fm_status csv_to_tensors(const char *name, const fm_csv_options *opt, const double *vals, int64_t rows,
                                int ncols, int label_col, fm_tensor **x, fm_tensor **y) {
    int nfeat = ncols - (label_col >= 0 ? 1 : 0);
    int64_t xs[2] = {rows, nfeat};
    fm_tensor *tx = fm_tensor_empty(2, xs, FM_F32, FM_CPU);
    fm_tensor *ty = label_col >= 0 ? fm_tensor_empty(1, &rows, opt->label_float ? FM_F32 : FM_I64, FM_CPU) : NULL;
    if (!tx || (label_col >= 0 && !ty)) {
        fm_tensor_release(tx);
        fm_tensor_release(ty);
        fm_error_prefix("%s", name);
        return fm_last_status();
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
    return FM_OK;
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
    csv_values vals = {NULL, 0, 0};
    int64_t rows = 0;
    fm_status st = FM_OK;
    const char *p = text, *end = text + n;
    long line = 0;
    /* a UTF-8 byte-order mark is common in CSV exported by spreadsheets */
    if (n >= 3 && (unsigned char)p[0] == 0xEF && (unsigned char)p[1] == 0xBB && (unsigned char)p[2] == 0xBF) p += 3;
    while (p < end && st == FM_OK) {
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
        if (nf == -2) { st = fm_set_error(FM_ERR_OOM, "%s: out of memory", name); break; }
        if (nf == -1) { st = fm_set_error(FM_ERR_FORMAT, "%s:%ld: unbalanced quotes", name, line); break; }
        if (ncols < 0) {
            bool is_header;
            ncols = nf;
            st = csv_first_row(name, opt, fields, nf, want_label, &is_header, &label_col);
            if (st != FM_OK || is_header) continue;
        }
        if (nf != ncols) {
            st = fm_set_error(FM_ERR_FORMAT, "%s:%ld: %d fields, expected %d like the first row", name, line, nf, ncols);
            break;
        }
        st = csv_append_row(name, line, opt, fields, nf, label_col, &vals);
        if (st == FM_OK) rows++;
    }
    if (st == FM_OK && rows == 0) st = fm_set_error(FM_ERR_FORMAT, "%s: no data rows", name);
    if (st == FM_OK) st = csv_to_tensors(name, opt, vals.v, rows, ncols, label_col, x, y);
    free(fields);
    free(vals.v);
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
