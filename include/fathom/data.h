/* fathom/data.h: reading data sets from files and feeding them to training.
 *
 * Three layers:
 *   - readers turn a file (idx, CSV, raw text, .npy/.npz, PNG) into tensors; each
 *     validates the file before trusting it and fails with FM_ERR_FORMAT (or
 *     FM_ERR_IO) and a message naming the file and what is wrong;
 *   - a dataset is a pair of in-memory tensors X [N, ...] and y [N] (refcounted);
 *   - a data loader cuts a dataset into batches: seeded shuffling, drop_last,
 *     transforms, and worker threads that prepare the next batches while the
 *     current one trains. Order and content depend only on (seed, epoch), never
 *     on the number of workers or thread timing, and the position can be saved
 *     and restored for bit-exact resume. */
#ifndef FATHOM_DATA_H
#define FATHOM_DATA_H
#include "fathom/export.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fathom/error.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Readers. Every returned tensor is a new, contiguous CPU tensor.
 * ====================================================================== */

/* idx (LeCun's MNIST format), gzip-compressed or raw (detected by magic).
 * Element types u8, i8, i16 (returned as I32), i32, f32, f64; the tensor has the
 * file's dtype and shape. */
FM_API fm_tensor *fm_idx_read(const char *path);
/* Same, from bytes in memory (gzip or raw); `name` is used in error messages. */
FM_API fm_tensor *fm_idx_read_mem(const void *data, size_t n, const char *name);
/* Images: a u8 idx3 file [N, H, W] -> F32 [N, 1, H, W] scaled to [0, 1]. */
FM_API fm_tensor *fm_idx_read_images(const char *path);
/* Labels: a u8/i8/i32 idx1 file [N] -> I64 [N]. */
FM_API fm_tensor *fm_idx_read_labels(const char *path);

/* CSV of numeric columns. Features become F32 [rows, cols] (the label column
 * removed); the label column, if chosen, becomes I64 [rows] (values must be
 * integers) or F32 [rows] with label_float. Empty lines are skipped. */
#define FM_CSV_NO_LABEL INT_MIN
typedef enum fm_csv_header {
    FM_CSV_HEADER_AUTO = 0, /* first row is a header if any field in it is not a number */
    FM_CSV_HEADER_YES = 1,
    FM_CSV_HEADER_NO = 2
} fm_csv_header;
typedef struct fm_csv_options {
    char delimiter;         /* ',' by default */
    fm_csv_header header;
    const char *label_name; /* label column by header name (needs a header); NULL: use label_index */
    int label_index;        /* label column by index, negative counts from the end (-1: last);
                               FM_CSV_NO_LABEL: no label column */
    bool label_float;       /* labels as F32 instead of I64 */
} fm_csv_options;
FM_API void fm_csv_options_init(fm_csv_options *o); /* ',', AUTO, no label */
/* *x gets the features; *y the labels (NULL when there is no label column; y may
 * be NULL when no label column is chosen). Both new references. */
FM_API fm_status fm_csv_read(const char *path, const fm_csv_options *opt, fm_tensor **x, fm_tensor **y);
FM_API fm_status fm_csv_read_mem(const char *text, size_t n, const char *name, const fm_csv_options *opt,
                          fm_tensor **x, fm_tensor **y);

/* Raw text: the file's bytes as a 1-D tensor of tokens, dtype FM_U8 or FM_I64. */
FM_API fm_tensor *fm_text_read(const char *path, fm_dtype dt);

/* numpy .npy, format versions 1, 2 and 3. dtypes <f4 <f8 <f2 <i4 <i8 |u1 |i1 |b1
 * (big-endian '>' variants are byte-swapped); fortran_order True is converted to
 * row-major. */
FM_API fm_tensor *fm_npy_read(const char *path);
FM_API fm_tensor *fm_npy_read_mem(const void *data, size_t n, const char *name);
/* Writes a .npy (version 1) of any CPU tensor with an npy dtype (not BF16). */
FM_API fm_status fm_npy_write(const char *path, const fm_tensor *t);

/* numpy .npz: a zip archive of .npy members, stored or deflated. The archive is
 * read and its directory validated at open; members are decoded on demand. */
typedef struct fm_npz fm_npz;
FM_API fm_npz *fm_npz_open(const char *path);
FM_API fm_npz *fm_npz_open_mem(const void *data, size_t n, const char *name); /* copies the bytes */
FM_API int fm_npz_count(const fm_npz *z);
/* Member name without the ".npy" suffix ("x" for "x.npy"); NULL if i is out of range. */
FM_API const char *fm_npz_name(const fm_npz *z, int i);
/* Decodes member `name` (with or without ".npy"); FM_ERR_INVALID if absent. */
FM_API fm_tensor *fm_npz_get(fm_npz *z, const char *name);
FM_API void fm_npz_close(fm_npz *z);

/* PNG (libpng): 8-bit gray or RGB (palette expanded, 16-bit stripped, alpha
 * dropped) -> F32 [C, H, W] in [0, 1], C = 1 or 3. FM_ERR_UNSUPPORTED in a build
 * without libpng. No resizing: callers check the size they need. */
FM_API fm_tensor *fm_png_read(const char *path);
/* Writes a U8 [H, W] / [C, H, W] (C = 1 or 3) or F32 in [0, 1] tensor as PNG. */
FM_API fm_status fm_png_write(const char *path, const fm_tensor *t);
FM_API bool fm_png_available(void);

/* Any single input for prediction, by content: idx (raw or gzip) or .npy (u8
 * arrays of either are scaled to [0, 1] F32, as the data sets are), or PNG. */
FM_API fm_tensor *fm_data_read(const char *path);

/* ======================================================================
 * Datasets: X [N, ...] and optional y [N], CPU, contiguous.
 * ====================================================================== */
typedef struct fm_dataset fm_dataset;

/* Retains x and y (y may be NULL); copies to contiguous if needed. */
FM_API fm_dataset *fm_dataset_from_tensors(fm_tensor *x, fm_tensor *y);
FM_API fm_dataset *fm_dataset_retain(fm_dataset *d);
FM_API void fm_dataset_release(fm_dataset *d);
FM_API int64_t fm_dataset_size(const fm_dataset *d);
FM_API fm_tensor *fm_dataset_x(const fm_dataset *d); /* borrowed */
FM_API fm_tensor *fm_dataset_y(const fm_dataset *d); /* borrowed; NULL if unlabeled */
/* Rows [start, start + count) as a new dataset sharing memory (e.g. a validation split). */
FM_API fm_dataset *fm_dataset_slice(fm_dataset *d, int64_t start, int64_t count);
/* Number of classes: max label + 1 (0 if unlabeled or labels not integer). */
FM_API int64_t fm_dataset_num_classes(const fm_dataset *d);

typedef enum fm_data_split { FM_SPLIT_TRAIN = 0, FM_SPLIT_TEST = 1 } fm_data_split;

#define FM_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
/* Fashion-MNIST from `dir` (NULL: FM_FASHION_MNIST_DIR, files
 * {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]): X F32 [N, 1, 28, 28] in
 * [0, 1], y I64 [N]. A missing file fails with FM_ERR_IO and says how to install
 * the data set. Also reads MNIST, which has the same file names. */
FM_API fm_dataset *fm_dataset_fashion_mnist(const char *dir, fm_data_split split);
/* Any idx image + label pair. */
FM_API fm_dataset *fm_dataset_idx(const char *images_path, const char *labels_path);

/* ======================================================================
 * Transforms, applied per sample by the loader's workers to X of shape
 * [N, C, H, W] (or [N, H, W], one channel; normalize also accepts [N, D], one
 * channel). Order: random crop, horizontal flip, normalize. Randomness comes
 * from Philox keyed by (seed, epoch, sample index), so it does not depend on
 * the number of workers. X must be F32 when any transform is enabled.
 * ====================================================================== */
#define FM_DATA_MAX_CHANNELS 16
typedef struct fm_transforms {
    int normalize_channels;            /* 0: off; 1: one mean/std for all channels; else = C */
    float mean[FM_DATA_MAX_CHANNELS];
    float std[FM_DATA_MAX_CHANNELS];
    int crop_padding;                  /* > 0: zero-pad by this much, crop back to H x W at random */
    bool hflip;                        /* flip left-right with probability 1/2 */
} fm_transforms;

/* ======================================================================
 * Data loader.
 * ====================================================================== */
typedef struct fm_loader_options {
    int64_t batch_size;     /* default 64 */
    bool shuffle;           /* default false */
    uint64_t seed;          /* shuffling and transform randomness */
    bool drop_last;         /* drop a final partial batch */
    /* threads preparing batches; 0: prepared synchronously in next(). Workers run at
     * the lowest priority (Linux: SCHED_IDLE; FATHOM_LOADER_PRIORITY=low|normal for
     * nice 19 or the default): they use cycles the training step leaves idle, and
     * next() fills whatever part of a batch they have not reached itself. */
    int workers;
    int prefetch;           /* batches prepared ahead (ring size); 0: 2 * workers, at least 4 */
    fm_transforms transforms;
    /* Data parallel: shard_count > 1 makes this loader deliver only part shard_index of
     * every batch (rows [lo, hi) of the batch of batch_size the loader would otherwise
     * deliver: near-equal parts, the first ones one larger; fm_data_shard_rows). Every
     * shard's loader walks the same batches, so the position (fm_dataloader_state) is
     * the same on every rank and a checkpoint does not depend on the shard count.
     * 0 or 1: the whole batch. */
    int shard_index, shard_count;
} fm_loader_options;
/* Part `index` of `count` of a batch of `rows` rows: its first row and size. */
FM_API void fm_data_shard_rows(int64_t rows, int index, int count, int64_t *first, int64_t *size);
FM_API void fm_loader_options_init(fm_loader_options *o);

typedef struct fm_dataloader fm_dataloader;

typedef struct fm_batch {
    fm_tensor *x;   /* [B, ...] borrowed: valid until the next fm_dataloader_next/state_set/free */
    fm_tensor *y;   /* [B] borrowed, or NULL for an unlabeled data set */
    int64_t size;   /* B */
    int64_t epoch;  /* position of this batch */
    int64_t index;
} fm_batch;

/* Retains the dataset. Starts epoch 0, batch 0. */
FM_API fm_dataloader *fm_dataloader_create(fm_dataset *d, const fm_loader_options *opt);
/* Joins the workers (also mid-epoch) and frees everything. NULL is fine. */
FM_API void fm_dataloader_free(fm_dataloader *l);
FM_API int64_t fm_dataloader_num_batches(const fm_dataloader *l); /* per epoch */

/* The next batch, in order. At the end of an epoch it returns FM_OK with
 * out->x == NULL (once) and moves to batch 0 of the next epoch. The tensors in
 * the batch are reused for later batches: clone what must outlive the next call
 * (a tensor still referenced elsewhere at that point is detached, not overwritten). */
FM_API fm_status fm_dataloader_next(fm_dataloader *l, fm_batch *out);

/* Position for checkpoints: the next batch to be delivered. Restoring it makes
 * the loader deliver exactly the same subsequent batches. */
typedef struct fm_dataloader_state {
    uint64_t seed;
    int64_t epoch;
    int64_t batch;       /* index of the next batch within the epoch */
    int64_t num_samples; /* for validation on restore (0: not checked) */
    int64_t batch_size;  /* for validation on restore (0: not checked) */
} fm_dataloader_state;
FM_API fm_status fm_dataloader_state_get(const fm_dataloader *l, fm_dataloader_state *out);
/* FM_ERR_INVALID when num_samples/batch_size do not match this loader or the
 * batch is past the epoch's end. Adopts the state's seed. */
FM_API fm_status fm_dataloader_state_set(fm_dataloader *l, const fm_dataloader_state *s);
/* Shorthand: batch 0 of `epoch`. */
FM_API fm_status fm_dataloader_set_epoch(fm_dataloader *l, int64_t epoch);

/* Seconds the consumer has spent inside fm_dataloader_next waiting for data
 * (with workers = 0 this is the whole preparation time). */
FM_API double fm_dataloader_wait_seconds(const fm_dataloader *l);
/* How many times a batch buffer was still referenced when its slot came back and
 * had to be replaced by a fresh allocation (0 in a loop that releases its
 * tensors and graph before the next call). */
FM_API int64_t fm_dataloader_realloc_count(const fm_dataloader *l);
/* Samples prepared so far by the worker threads and by fm_dataloader_next itself
 * (which takes over whatever the workers have not reached when a batch is due). */
FM_API void fm_dataloader_fill_counts(fm_dataloader *l, int64_t *by_workers, int64_t *in_next);

/* The permutation of epoch `epoch` under `seed` (what the loader uses when
 * shuffling): perm[i] is the sample at position i. Exposed for tests and tools. */
FM_API void fm_data_permutation(uint64_t seed, int64_t epoch, int64_t n, int64_t *perm);

#ifdef __cplusplus
}
#endif
#endif
