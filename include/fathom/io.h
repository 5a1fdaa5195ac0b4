/* fathom/io.h: checkpoints and atomic file writes.
 *
 * Weights are stored as safetensors (an 8-byte little-endian header length, a
 * JSON header mapping names to dtype, shape and data_offsets, then the raw
 * bytes), so PyTorch, JAX and the HuggingFace tools read fathom's files and
 * fathom reads theirs. Loading validates everything before trusting it.
 *
 * Every file is written atomically: a temporary file in the same directory,
 * fsync, rename over the target, fsync of the directory. A crash or a full
 * disk leaves either the old file or the new one, never a mix. The trainers
 * commit a checkpoint's files together (src/io/io_internal.h, docs/RELIABILITY.md). */
#ifndef FATHOM_IO_H
#define FATHOM_IO_H
#include "fathom/export.h"
#include "fathom/nn.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A piece of a file to write. */
typedef struct fm_io_chunk { const void *data; size_t n; } fm_io_chunk;
/* Writes the chunks to `path` atomically. For tests, the environment variable
 * FATHOM_TEST_FAIL_WRITE_AFTER=N makes the write fail (as a full disk would)
 * once N bytes have been written; the target is then left untouched. */
FM_API fm_status fm_atomic_write(const char *path, int n, const fm_io_chunk *chunks);
/* Creates a directory (and its parents) if missing. */
FM_API fm_status fm_mkdir_p(const char *path);

/* A directory written as one unit (docs/RELIABILITY.md): the files go into a
 * temporary directory next to DIR (fm_dir_writer_path: DIR.tmp.<pid>), each with
 * fm_atomic_write, and fm_dir_writer_commit makes it DIR in one step (a rename,
 * or an atomic exchange with the existing DIR, whose old files are then removed).
 * A crash or an error at any instant leaves the old DIR or the complete new one.
 * begin sweeps what dead processes left next to DIR and refuses an existing
 * non-directory, and an existing non-empty directory unless `replace`; `what`
 * starts its error messages. NULL on error (fm_last_error). */
typedef struct fm_dir_writer fm_dir_writer;
FM_API fm_dir_writer *fm_dir_writer_begin(const char *dir, bool replace, const char *what);
/* The directory to write the files into (the temporary one). */
FM_API const char *fm_dir_writer_path(const fm_dir_writer *w);
/* Commits and frees `w`; on failure the temporary directory is removed and the
 * previous DIR is untouched. */
FM_API fm_status fm_dir_writer_commit(fm_dir_writer *w);
/* Removes the temporary directory and frees `w` (NULL is allowed). */
FM_API void fm_dir_writer_abort(fm_dir_writer *w);

/* Metadata: string key/value pairs stored in the header's "__metadata__". */
typedef struct fm_kv { char *key, *value; } fm_kv;
typedef struct fm_kv_list { int n, cap; fm_kv *items; } fm_kv_list;
FM_API fm_status fm_kv_set(fm_kv_list *l, const char *key, const char *value);
FM_API const char *fm_kv_get(const fm_kv_list *l, const char *key);
FM_API void fm_kv_free(fm_kv_list *l);

/* Writes the tensors (any dtype, CPU, any strides) with optional metadata. */
FM_API fm_status fm_safetensors_save(const char *path, const fm_named_list *tensors, const fm_kv_list *meta);
/* Reads every tensor into new tensors (out->owns_tensors); meta may be NULL. */
FM_API fm_status fm_safetensors_load(const char *path, fm_named_list *out, fm_kv_list *meta);
/* Loads into existing tensors (a module's state): every name in `into` must be
 * in the file with the same shape, and the file must hold no other tensors.
 * Dtypes are converted. Nothing is modified unless all checks pass. */
FM_API fm_status fm_safetensors_load_into(const char *path, const fm_named_list *into, fm_kv_list *meta);

#ifdef __cplusplus
}
#endif
#endif
