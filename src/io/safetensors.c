/* safetensors reading and writing (https://github.com/huggingface/safetensors format).
 *
 * Layout: u64 little-endian header length N, N bytes of JSON
 *   {"__metadata__": {str: str}, "name": {"dtype": "F32", "shape": [..],
 *    "data_offsets": [begin, end]}, ...}
 * then the data buffer; offsets are relative to its start. A file is trusted
 * only after every check passes: header length within the file, valid JSON
 * without duplicate names, known dtypes, shapes whose byte size equals the
 * offset span, offsets in bounds, and the buffer covered exactly once (no
 * overlaps, no holes). The host is little-endian (x86-64, aarch64), as is the
 * format, so tensor bytes are copied as they are. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "fathom/autograd.h" /* device tensors are copied to the host untracked */
#include "fathom/io.h"

/* ---------------- metadata lists ---------------- */

fm_status fm_kv_set(fm_kv_list *l, const char *key, const char *value) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->items[i].key, key)) {
            char *v = strdup(value);
            if (!v) return fm_set_error(FM_ERR_OOM, "out of host memory");
            free(l->items[i].value);
            l->items[i].value = v;
            return FM_OK;
        }
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        fm_kv *it = realloc(l->items, (size_t)cap * sizeof *it);
        if (!it) return fm_set_error(FM_ERR_OOM, "out of host memory");
        l->items = it;
        l->cap = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) { free(k); free(v); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
    l->items[l->n].key = k;
    l->items[l->n].value = v;
    l->n++;
    return FM_OK;
}

const char *fm_kv_get(const fm_kv_list *l, const char *key) {
    for (int i = 0; l && i < l->n; i++)
        if (!strcmp(l->items[i].key, key)) return l->items[i].value;
    return NULL;
}

void fm_kv_free(fm_kv_list *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) { free(l->items[i].key); free(l->items[i].value); }
    free(l->items);
    memset(l, 0, sizeof *l);
}

/* ---------------- dtypes ---------------- */

static const struct { fm_dtype dt; const char *name; } st_dtypes[] = {
    {FM_F32, "F32"}, {FM_F64, "F64"}, {FM_F16, "F16"}, {FM_BF16, "BF16"}, {FM_I8, "I8"},
    {FM_U8, "U8"}, {FM_I32, "I32"}, {FM_I64, "I64"}, {FM_BOOL, "BOOL"}};

static const char *st_dtype_name(fm_dtype dt) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].dt == dt) return st_dtypes[i].name;
    return NULL;
}

static int st_dtype_parse(const char *s, fm_dtype *dt) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (!strcmp(st_dtypes[i].name, s)) { *dt = st_dtypes[i].dt; return 1; }
    return 0;
}

/* ---------------- writing ---------------- */

fm_status fm_safetensors_save(const char *path, const fm_named_list *tensors, const fm_kv_list *meta) {
    int n = tensors->n;
    fm_tensor **contig = calloc((size_t)n + 1, sizeof *contig);
    fm_io_chunk *chunks = calloc((size_t)n + 2, sizeof *chunks);
    json_t *hdr = json_object();
    char *js = NULL, *padded = NULL;
    fm_status st = FM_OK;
    if (!contig || !chunks || !hdr) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); goto done; }
    if (meta && meta->n) {
        json_t *m = json_object();
        for (int i = 0; i < meta->n; i++) json_object_set_new(m, meta->items[i].key, json_string(meta->items[i].value));
        json_object_set_new(hdr, "__metadata__", m);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        fm_tensor *t = tensors->items[i].tensor;
        const char *dn = st_dtype_name(t->dtype);
        if (!dn) {
            st = fm_set_error(FM_ERR_INVALID, "safetensors: tensor '%s' has dtype %s, which safetensors cannot hold",
                              tensors->items[i].name, fm_dtype_name(t->dtype));
            goto done;
        }
        if (json_object_get(hdr, tensors->items[i].name) || !strcmp(tensors->items[i].name, "__metadata__") ||
            !tensors->items[i].name[0]) {
            st = fm_set_error(FM_ERR_INVALID, "safetensors: tensor name '%s' is empty, reserved or used twice",
                              tensors->items[i].name);
            goto done;
        }
        /* a host copy of a device tensor (the file does not depend on the device) */
        bool prev = fm_set_grad_enabled(false);
        contig[i] = fm_tensor_to(t, FM_CPU);
        fm_tensor *c = contig[i] ? fm_contiguous(contig[i]) : NULL;
        fm_set_grad_enabled(prev);
        fm_tensor_release(contig[i]);
        contig[i] = c;
        if (!contig[i]) { st = fm_last_status(); goto done; }
        size_t nb = fm_tensor_nbytes(contig[i]);
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + nb)));
        json_object_set_new(e, "dtype", json_string(dn));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(hdr, tensors->items[i].name, e);
        chunks[i + 2].data = fm_tensor_data(contig[i]);
        chunks[i + 2].n = nb;
        off += nb;
    }
    js = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!js) { st = fm_set_error(FM_ERR_OOM, "safetensors: cannot encode the header"); goto done; }
    /* pad with spaces so the data starts 8-byte aligned (the format allows it) */
    size_t len = strlen(js), plen = (len + 7) & ~(size_t)7;
    padded = malloc(plen);
    if (!padded) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); goto done; }
    memcpy(padded, js, len);
    memset(padded + len, ' ', plen - len);
    unsigned char lenbuf[8];
    for (int b = 0; b < 8; b++) lenbuf[b] = (unsigned char)((uint64_t)plen >> (8 * b));
    chunks[0].data = lenbuf;
    chunks[0].n = 8;
    chunks[1].data = padded;
    chunks[1].n = plen;
    st = fm_atomic_write(path, n + 2, chunks);
done:
    if (contig)
        for (int i = 0; i < n; i++) fm_tensor_release(contig[i]);
    free(contig);
    free(chunks);
    free(js);
    free(padded);
    json_decref(hdr);
    return st;
}

/* ---------------- reading ---------------- */

typedef struct st_entry {
    const char *name;
    fm_dtype dtype;
    int ndim;
    int64_t shape[FM_MAX_DIMS];
    uint64_t begin, end;
} st_entry;

typedef struct st_file {
    unsigned char *bytes;
    size_t size;
    const unsigned char *data; /* start of the data buffer */
    json_t *hdr;
    int n;
    st_entry *e;
} st_file;

static void st_close(st_file *f) {
    free(f->bytes);
    free(f->e);
    json_decref(f->hdr);
    memset(f, 0, sizeof *f);
}

static int cmp_begin(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static fm_status bad(const char *path, const char *fmt, const char *what) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, what);
    return fm_set_error(FM_ERR_FORMAT, "%s: not a valid safetensors file: %s", path, msg);
}

/* Reads the whole file into f->bytes. */
static fm_status st_read_file(const char *path, st_file *f) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return fm_set_error(FM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(fp);
        return fm_set_error(FM_ERR_IO, "%s is not a regular file (a directory?): expected a .safetensors file", path);
    }
    if (fseek(fp, 0, SEEK_END) != 0) { fclose(fp); return fm_set_error(FM_ERR_IO, "cannot seek %s", path); }
    long sz = ftell(fp);
    rewind(fp);
    if (sz < 0) { fclose(fp); return fm_set_error(FM_ERR_IO, "cannot size %s", path); }
    f->size = (size_t)sz;
    f->bytes = malloc(f->size ? f->size : 1);
    if (!f->bytes) { fclose(fp); return fm_set_error(FM_ERR_OOM, "out of host memory reading %s", path); }
    size_t got = fread(f->bytes, 1, f->size, fp);
    fclose(fp);
    if (got != f->size) return fm_set_error(FM_ERR_IO, "cannot read %s", path);
    return FM_OK;
}

/* The 8-byte length and the JSON header; sets f->hdr and f->data, and *dlen (data bytes). */
static fm_status st_parse_header(const char *path, st_file *f, uint64_t *dlen) {
    char tmp[256];
    if (f->size < 8) {
        snprintf(tmp, sizeof tmp, "%zu bytes, shorter than the 8-byte header length (truncated?)", f->size);
        return bad(path, "%s", tmp);
    }
    uint64_t hlen = 0;
    for (int b = 7; b >= 0; b--) hlen = (hlen << 8) | f->bytes[b];
    if (hlen > f->size - 8) {
        snprintf(tmp, sizeof tmp, "header length %llu exceeds the file size %zu (truncated?)", (unsigned long long)hlen,
                 f->size);
        return bad(path, "%s", tmp);
    }
    json_error_t jerr;
    f->hdr = json_loadb((const char *)f->bytes + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->hdr || !json_is_object(f->hdr)) {
        snprintf(tmp, sizeof tmp, "header is not a JSON object (%s)", f->hdr ? "wrong type" : jerr.text);
        return bad(path, "%s", tmp);
    }
    f->data = f->bytes + 8 + hlen;
    *dlen = f->size - 8 - hlen;
    return FM_OK;
}

static fm_status st_parse_metadata(const char *path, json_t *val, fm_kv_list *meta) {
    if (!json_is_object(val)) return bad(path, "%s", "__metadata__ is not an object");
    const char *mk;
    json_t *mv;
    json_object_foreach(val, mk, mv) {
        if (!json_is_string(mv)) return bad(path, "metadata value of '%s' is not a string", mk);
        fm_status st;
        if (meta && (st = fm_kv_set(meta, mk, json_string_value(mv))) != FM_OK) return st;
    }
    return FM_OK;
}

/* One tensor's header entry: dtype, shape, and offsets inside the dlen data bytes. */
static fm_status st_parse_entry(const char *path, const char *key, json_t *val, uint64_t dlen, st_entry *e) {
    char tmp[256];
    e->name = key;
    if (!key[0]) return bad(path, "%s", "a tensor has an empty name");
    json_t *dt = json_object_get(val, "dtype"), *sh = json_object_get(val, "shape"),
           *of = json_object_get(val, "data_offsets");
    if (!json_is_object(val) || !json_is_string(dt) || !json_is_array(sh) || !json_is_array(of) ||
        json_array_size(of) != 2)
        return bad(path, "tensor '%s' needs dtype, shape and data_offsets [begin, end]", key);
    if (!st_dtype_parse(json_string_value(dt), &e->dtype)) {
        snprintf(tmp, sizeof tmp, "tensor '%s' has unsupported dtype '%s'", key, json_string_value(dt));
        return bad(path, "%s", tmp);
    }
    if (json_array_size(sh) > FM_MAX_DIMS) return bad(path, "tensor '%s' has too many dims", key);
    e->ndim = (int)json_array_size(sh);
    uint64_t numel = 1;
    for (int d = 0; d < e->ndim; d++) {
        json_t *x = json_array_get(sh, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > ((json_int_t)1 << 40))
            return bad(path, "tensor '%s' has an invalid shape", key);
        e->shape[d] = json_integer_value(x);
        numel *= (uint64_t)e->shape[d];
        if (numel > ((uint64_t)1 << 48)) return bad(path, "tensor '%s' has an invalid shape", key);
    }
    json_t *b = json_array_get(of, 0), *en = json_array_get(of, 1);
    if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b))
        return bad(path, "tensor '%s' has invalid data_offsets", key);
    e->begin = (uint64_t)json_integer_value(b);
    e->end = (uint64_t)json_integer_value(en);
    if (e->end > dlen) {
        snprintf(tmp, sizeof tmp, "tensor '%s' data_offsets [%llu, %llu] run past the %llu data bytes (truncated?)",
                 key, (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)dlen);
        return bad(path, "%s", tmp);
    }
    if (e->end - e->begin != numel * fm_dtype_size(e->dtype)) {
        char s1[96];
        snprintf(tmp, sizeof tmp, "tensor '%s' of dtype %s and shape %s needs %llu bytes but its offsets span %llu",
                 key, json_string_value(dt), fm_shape_str(e->ndim, e->shape, s1, sizeof s1),
                 (unsigned long long)(numel * fm_dtype_size(e->dtype)), (unsigned long long)(e->end - e->begin));
        return bad(path, "%s", tmp);
    }
    return FM_OK;
}

/* The data buffer must be covered exactly once: sorted spans abut. */
static fm_status st_check_coverage(const char *path, const st_file *f, uint64_t dlen) {
    char tmp[256];
    st_entry *sorted = malloc(((size_t)f->n + 1) * sizeof *sorted);
    if (!sorted) return fm_set_error(FM_ERR_OOM, "out of host memory");
    memcpy(sorted, f->e, (size_t)f->n * sizeof *sorted);
    qsort(sorted, (size_t)f->n, sizeof *sorted, cmp_begin);
    uint64_t pos = 0;
    fm_status st = FM_OK;
    for (int i = 0; i < f->n && st == FM_OK; i++) {
        if (sorted[i].begin < pos) {
            snprintf(tmp, sizeof tmp, "tensors '%s' and '%s' overlap", sorted[i - 1].name, sorted[i].name);
            st = bad(path, "%s", tmp);
        } else if (sorted[i].begin > pos) {
            st = bad(path, "there is a hole in the data before tensor '%s'", sorted[i].name);
        }
        pos = sorted[i].end;
    }
    if (st == FM_OK && pos != dlen) {
        snprintf(tmp, sizeof tmp, "%llu data bytes but the tensors cover %llu", (unsigned long long)dlen,
                 (unsigned long long)pos);
        st = bad(path, "%s", tmp);
    }
    free(sorted);
    return st;
}

static fm_status st_open(const char *path, st_file *f, fm_kv_list *meta) {
    memset(f, 0, sizeof *f);
    uint64_t dlen = 0;
    fm_status st = st_read_file(path, f);
    if (st == FM_OK) st = st_parse_header(path, f, &dlen);
    if (st == FM_OK) {
        f->e = calloc(json_object_size(f->hdr) + 1, sizeof *f->e);
        if (!f->e) st = fm_set_error(FM_ERR_OOM, "out of host memory");
    }
    if (st == FM_OK) {
        const char *key;
        json_t *val;
        json_object_foreach(f->hdr, key, val) {
            if (!strcmp(key, "__metadata__")) st = st_parse_metadata(path, val, meta);
            else if ((st = st_parse_entry(path, key, val, dlen, &f->e[f->n])) == FM_OK) f->n++;
            if (st) break;
        }
    }
    if (st == FM_OK) st = st_check_coverage(path, f, dlen);
    if (st) {
        st_close(f);
        if (meta) fm_kv_free(meta); /* nothing half-read reaches the caller */
    }
    return st;
}

static fm_tensor *entry_tensor(const st_file *f, const st_entry *e) {
    return fm_tensor_from_data(f->data + e->begin, e->ndim, e->shape, e->dtype);
}

fm_status fm_safetensors_load(const char *path, fm_named_list *out, fm_kv_list *meta) {
    memset(out, 0, sizeof *out);
    out->owns_tensors = true;
    st_file f;
    if (st_open(path, &f, meta) != FM_OK) return fm_last_status();
    fm_status st = FM_OK;
    for (int i = 0; i < f.n && st == FM_OK; i++) {
        fm_tensor *t = entry_tensor(&f, &f.e[i]);
        st = t ? fm_named_list_push(out, f.e[i].name, t, false, false) : fm_last_status();
        fm_tensor_release(t);
    }
    st_close(&f);
    if (st) fm_named_list_free(out);
    return st;
}

fm_status fm_safetensors_load_into(const char *path, const fm_named_list *into, fm_kv_list *meta) {
    st_file f;
    if (st_open(path, &f, meta) != FM_OK) return fm_last_status();
    fm_status st = FM_OK;
    int *idx = calloc((size_t)into->n + 1, sizeof *idx);
    if (!idx) { st_close(&f); return fm_set_error(FM_ERR_OOM, "out of host memory"); }
    char s1[96], s2[96];
    /* check everything first: a mismatched file must not leave a half-loaded model */
    for (int i = 0; i < into->n && st == FM_OK; i++) {
        const fm_named_tensor *it = &into->items[i];
        idx[i] = -1;
        for (int k = 0; k < f.n; k++)
            if (!strcmp(f.e[k].name, it->name)) { idx[i] = k; break; }
        if (idx[i] < 0) {
            st = fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' (shape %s) is missing from the file", path, it->name,
                              fm_shape_str(it->tensor->ndim, it->tensor->shape, s1, sizeof s1));
            break;
        }
        const st_entry *e = &f.e[idx[i]];
        bool same = e->ndim == it->tensor->ndim;
        for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == it->tensor->shape[d];
        if (!same)
            st = fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' has shape %s in the file but %s in the model", path,
                              it->name, fm_shape_str(e->ndim, e->shape, s1, sizeof s1),
                              fm_shape_str(it->tensor->ndim, it->tensor->shape, s2, sizeof s2));
        /* floats convert (F16/BF16/F64 files into F32 weights); integer data is
         * never reinterpreted as weights, nor weights as integers */
        else if (fm_dtype_is_float(e->dtype) != fm_dtype_is_float(it->tensor->dtype))
            st = fm_set_error(FM_ERR_FORMAT, "%s: tensor '%s' is %s in the file but the model expects %s (%s data): "
                              "wrong file, or a header whose dtype does not match its data", path, it->name,
                              fm_dtype_name(e->dtype), fm_dtype_name(it->tensor->dtype),
                              fm_dtype_is_float(it->tensor->dtype) ? "floating-point" : "integer");
    }
    for (int k = 0; k < f.n && st == FM_OK; k++)
        if (fm_named_list_find(into, f.e[k].name) < 0)
            st = fm_set_error(FM_ERR_FORMAT, "%s: the file has tensor '%s' (shape %s) that the model does not have",
                              path, f.e[k].name, fm_shape_str(f.e[k].ndim, f.e[k].shape, s1, sizeof s1));
    for (int i = 0; i < into->n && st == FM_OK; i++) {
        fm_tensor *src = entry_tensor(&f, &f.e[idx[i]]);
        st = src ? fm_copy_(into->items[i].tensor, src) : fm_last_status();
        fm_tensor_release(src);
    }
    free(idx);
    st_close(&f);
    return st;
}
