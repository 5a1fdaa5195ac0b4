/* In-memory datasets (X [N, ...], y [N]) and the Fashion-MNIST / idx helpers
 * that build them from files. */
#include "data/data_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fm_dataset {
    int refcount;
    fm_tensor *x, *y;
};

fm_dataset *fm_dataset_from_tensors(fm_tensor *x, fm_tensor *y) {
    char s1[160], s2[160];
    if (!x) {
        fm_set_error(FM_ERR_INVALID, "dataset: X is NULL");
        return NULL;
    }
    if (x->ndim < 1) {
        fm_set_error(FM_ERR_INVALID, "dataset: X must have a sample dimension, got a scalar");
        return NULL;
    }
    if (x->storage->device.type != FM_DEV_CPU || (y && y->storage->device.type != FM_DEV_CPU)) {
        fm_set_error(FM_ERR_INVALID, "dataset: X and y must be CPU tensors (batches are moved to the device by the caller)");
        return NULL;
    }
    if (y && (y->ndim != 1 || y->shape[0] != x->shape[0])) {
        fm_set_error(FM_ERR_INVALID, "dataset: y shape %s does not match X shape %s (expected [%lld])",
                     fm_shape_str(y->ndim, y->shape, s2, sizeof s2), fm_shape_str(x->ndim, x->shape, s1, sizeof s1),
                     (long long)x->shape[0]);
        return NULL;
    }
    fm_dataset *d = calloc(1, sizeof *d);
    if (!d) {
        fm_set_error(FM_ERR_OOM, "dataset: out of memory");
        return NULL;
    }
    d->refcount = 1;
    d->x = fm_contiguous(x);
    d->y = y ? fm_contiguous(y) : NULL;
    if (!d->x || (y && !d->y)) {
        fm_dataset_release(d);
        return NULL;
    }
    return d;
}

fm_dataset *fm_dataset_retain(fm_dataset *d) {
    if (d) __atomic_add_fetch(&d->refcount, 1, __ATOMIC_RELAXED);
    return d;
}

void fm_dataset_release(fm_dataset *d) {
    if (!d || __atomic_sub_fetch(&d->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    fm_tensor_release(d->x);
    fm_tensor_release(d->y);
    free(d);
}

int64_t fm_dataset_size(const fm_dataset *d) { return d ? d->x->shape[0] : 0; }
fm_tensor *fm_dataset_x(const fm_dataset *d) { return d ? d->x : NULL; }
fm_tensor *fm_dataset_y(const fm_dataset *d) { return d ? d->y : NULL; }

fm_dataset *fm_dataset_slice(fm_dataset *d, int64_t start, int64_t count) {
    if (!d) {
        fm_set_error(FM_ERR_INVALID, "dataset_slice: NULL dataset");
        return NULL;
    }
    int64_t n = d->x->shape[0];
    if (start < 0 || count < 0 || start > n || count > n - start) {
        fm_set_error(FM_ERR_INVALID, "dataset_slice: rows [%lld, %lld + %lld) are outside the %lld samples",
                     (long long)start, (long long)start, (long long)count, (long long)n);
        return NULL;
    }
    fm_tensor *x = fm_narrow(d->x, 0, start, count);
    fm_tensor *y = d->y ? fm_narrow(d->y, 0, start, count) : NULL;
    fm_dataset *out = (x && (!d->y || y)) ? fm_dataset_from_tensors(x, y) : NULL;
    fm_tensor_release(x);
    fm_tensor_release(y);
    return out;
}

int64_t fm_dataset_num_classes(const fm_dataset *d) {
    if (!d || !d->y) return 0;
    fm_dtype dt = d->y->dtype;
    if (dt != FM_I64 && dt != FM_I32 && dt != FM_U8 && dt != FM_I8) return 0;
    int64_t mx = -1, n = d->y->shape[0];
    for (int64_t i = 0; i < n; i++) {
        int64_t v = (int64_t)fm_tensor_get(d->y, i);
        if (v > mx) mx = v;
    }
    return mx + 1;
}

fm_dataset *fm_dataset_idx(const char *images_path, const char *labels_path) {
    fm_tensor *x = fm_idx_read_images(images_path);
    if (!x) return NULL;
    fm_tensor *y = NULL;
    if (labels_path) {
        y = fm_idx_read_labels(labels_path);
        if (!y) {
            fm_tensor_release(x);
            return NULL;
        }
        if (y->shape[0] != x->shape[0]) {
            fm_set_error(FM_ERR_FORMAT, "%s has %lld labels but %s has %lld images", labels_path,
                         (long long)y->shape[0], images_path, (long long)x->shape[0]);
            fm_tensor_release_n(2, x, y);
            return NULL;
        }
    }
    fm_dataset *d = fm_dataset_from_tensors(x, y);
    fm_tensor_release(x);
    fm_tensor_release(y);
    return d;
}

/* dir/base.gz, or dir/base uncompressed; NULL (with the install hint) if neither exists */
static char *find_file(const char *dir, const char *base) {
    size_t n = strlen(dir) + strlen(base) + 8;
    char *p = malloc(n);
    if (!p) {
        fm_set_error(FM_ERR_OOM, "out of memory");
        return NULL;
    }
    snprintf(p, n, "%s/%s.gz", dir, base);
    if (access(p, R_OK) == 0) return p;
    snprintf(p, n, "%s/%s", dir, base);
    if (access(p, R_OK) == 0) return p;
    fm_set_error(FM_ERR_IO,
                 "Fashion-MNIST not found: %s/%s.gz is missing (install the data set with "
                 "`apt-get install dataset-fashion-mnist`, or pass --data DIR naming a directory with the idx files)",
                 dir, base);
    free(p);
    return NULL;
}

fm_dataset *fm_dataset_fashion_mnist(const char *dir, fm_data_split split) {
    if (!dir) dir = FM_FASHION_MNIST_DIR;
    if (split != FM_SPLIT_TRAIN && split != FM_SPLIT_TEST) {
        fm_set_error(FM_ERR_INVALID, "fashion_mnist: split must be FM_SPLIT_TRAIN or FM_SPLIT_TEST");
        return NULL;
    }
    const char *pre = split == FM_SPLIT_TRAIN ? "train" : "t10k";
    char ib[64], lb[64];
    snprintf(ib, sizeof ib, "%s-images-idx3-ubyte", pre);
    snprintf(lb, sizeof lb, "%s-labels-idx1-ubyte", pre);
    char *ip = find_file(dir, ib);
    char *lp = ip ? find_file(dir, lb) : NULL;
    fm_dataset *d = NULL;
    if (ip && lp) {
        d = fm_dataset_idx(ip, lp);
        if (d) {
            fm_tensor *x = d->x;
            if (x->shape[2] != 28 || x->shape[3] != 28) {
                fm_set_error(FM_ERR_FORMAT, "%s: images are %lldx%lld, Fashion-MNIST's are 28x28", ip,
                             (long long)x->shape[2], (long long)x->shape[3]);
                fm_dataset_release(d);
                d = NULL;
            }
        }
    }
    free(ip);
    free(lp);
    return d;
}
