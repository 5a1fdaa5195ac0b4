/* io_internal.h: the library's crash-safe file machinery, shared by the trainers.
 *
 * Checkpoint directories (ckpt_dir.c). A checkpoint is one unit: every file of a
 * step (weights, optimizer state, scaler, RNG, data position, config) is written
 * into OUT/ckpt/step-<N>.tmp.<pid>/, a MANIFEST naming each file with its size
 * and CRC-32 is written last, and one rename makes the directory
 * OUT/ckpt/step-<N>. A crash at any instant leaves either the previous complete
 * checkpoints or the new one too; a directory without a valid MANIFEST never
 * has a step-<N> name. After the commit the files are also hard-linked to
 * OUT/<name> (what eval, predict and generate read), and all but the newest
 * `keep` checkpoints are removed.
 *
 * Fault injection (fault.c): FATHOM_FAULT=KIND:N[:ACTION] with KIND write or
 * rename and ACTION eio (default: the operation fails with an I/O error) or
 * kill (SIGKILL, as a power cut would). The N-th write (a file's data is half
 * written when it strikes) or rename of this process strikes; every file fathom
 * writes goes through fm_atomic_write, so every write point can be reached. */
#ifndef FATHOM_IO_INTERNAL_H
#define FATHOM_IO_INTERNAL_H
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "fathom/io.h"

/* ---- INI text (ini_text.c) ---- */
/* libinih's reader over text in memory, one line per call. A line longer than
 * inih's buffer stops the parse (NULL) with long_line set to its number and
 * max_len to the limit, where inih itself would cut it and parse the rest as
 * another line. Zero-initialize, set text, pass as ini_parse_stream's stream. */
typedef struct fm_ini_text {
    const char *text;
    size_t pos;
    int line, long_line, max_len;
} fm_ini_text;
char *fm_ini_text_reader(char *str, int num, void *stream);
/* A whole text file (at most max bytes, no NUL byte; a pipe or /proc file too),
 * NUL-terminated, for the caller to free, its length in *len (len may be NULL).
 * NULL when it cannot be had, with *st and *why: FM_ERR_IO "cannot open",
 * "is a directory" or "cannot read" (errno holds the reason: ENOENT, EISDIR,
 * ...), FM_ERR_FORMAT "too large" (more than max bytes) or "not a text file: it
 * holds a NUL byte", FM_ERR_OOM "out of host memory". Sets no fm error: the
 * caller words it (recipes, GPU databases and Hugging Face JSON files). */
char *fm_read_text_file(const char *path, size_t max, size_t *len, fm_status *st, const char **why);
/* The same for bytes that may hold NUL (a corpus, text to tokenize): no NUL check;
 * the buffer still ends with a NUL past *len. */
char *fm_read_file(const char *path, size_t max, size_t *len, fm_status *st, const char **why);

/* ---- fault injection ---- */
typedef enum { FM_FAULT_WRITE, FM_FAULT_RENAME } fm_fault_kind;
/* Counts one operation of `kind` on `path`; returns 0, or -1 with errno = EIO
 * when FATHOM_FAULT selects it (or does not return: the kill action). */
int fm_fault_point(fm_fault_kind kind, const char *path);
/* rename() behind a fault point. */
int fm_io_rename(const char *from, const char *to);
/* fsync of a directory (the names in it become durable); errors ignored, as
 * some file systems refuse it. */
void fm_fsync_dir(const char *dir);
/* fsync of the directory holding `path`. */
void fm_fsync_parent(const char *path);
/* renameat2(RENAME_EXCHANGE) behind a rename fault point: `a` and `b` (both
 * existing) swap names in one step. */
int fm_io_exchange(const char *a, const char *b);

/* ---- whole output directories and stale temporaries (dir_commit.c) ---- */
/* Removes a file, or a directory and everything under it (symlinks not followed). */
int fm_remove_tree(const char *path);
/* true when `dir` is a directory with no entries. */
bool fm_dir_is_empty(const char *dir);
/* Cleans what dead processes left while writing `path` (a file or a directory):
 * PATH.tmp.PID is removed, PATH.old.PID (an output moved aside by a commit that
 * died) is put back when PATH is missing and removed otherwise. Only those exact
 * names, only when process PID no longer exists; each is named on `log` (may be
 * NULL). Returns how many were handled. fm_atomic_write and fm_dir_begin call it. */
int fm_stale_sweep(const char *path, FILE *log);

typedef struct fm_dir_tx {
    char dir[PATH_MAX - 64]; /* the output */
    char tmp[PATH_MAX];      /* DIR.tmp.PID: written into; "" once committed or aborted */
} fm_dir_tx;
/* Starts writing directory `dir` whole: sweeps its stale temporaries, checks it
 * (an existing non-directory is refused; an existing non-empty directory unless
 * `replace`), creates DIR.tmp.PID. `what` starts the error messages. */
fm_status fm_dir_begin(fm_dir_tx *tx, const char *dir, bool replace, const char *what);
/* Makes the written DIR.tmp.PID the output in one atomic step (rename, or an
 * exchange with the existing DIR whose old tree is removed after). On failure
 * the temporary is removed and the previous DIR is untouched. */
fm_status fm_dir_commit(fm_dir_tx *tx);
/* Removes the temporary of a directory that will not be committed. */
void fm_dir_abort(fm_dir_tx *tx);

/* ---- checkpoint directories ---- */
#define FM_CKPT_KEEP_DEFAULT 2
#define FM_CKPT_MAX_FILES 4104 /* 8 of a trainer + ZeRO-1 shards of up to 4096 ranks */

typedef struct fm_ckpt_tx {
    char out_dir[PATH_MAX - 64];
    char tmp[PATH_MAX];   /* OUT/ckpt/step-N.tmp.PID: written into */
    char final[PATH_MAX]; /* OUT/ckpt/step-N */
    int64_t step;
} fm_ckpt_tx;

/* Starts the checkpoint of `step` in out_dir (creates the temporary directory). */
fm_status fm_ckpt_begin(fm_ckpt_tx *tx, const char *out_dir, int64_t step);
/* The path of file `name` inside the checkpoint being written. */
const char *fm_ckpt_path(const fm_ckpt_tx *tx, const char *name, char *buf, size_t n);
/* Commits the written files (names relative to the checkpoint): MANIFEST, one
 * directory rename, links to OUT/<name>, then keeps the newest `keep` (>= 1)
 * checkpoints. On failure the temporary directory is removed and the previous
 * checkpoints are untouched. */
fm_status fm_ckpt_commit(fm_ckpt_tx *tx, int n, const char *const *names, int keep, FILE *log);
/* Removes the temporary directory of a checkpoint that will not be committed. */
void fm_ckpt_abort(fm_ckpt_tx *tx);

typedef struct fm_ckpt_found {
    char dir[PATH_MAX]; /* where the files are; "" when nothing was found */
    int64_t step;       /* -1 for the old layout (files directly in OUT, no manifest) */
    bool legacy;
} fm_ckpt_found;
/* Finds the newest complete checkpoint in out_dir: OUT/ckpt/step-N whose
 * MANIFEST names N and whose files match their sizes and checksums. Incomplete
 * or damaged ones are skipped with a line on `log` each. Without OUT/ckpt, a
 * pre-manifest out_dir (model.safetensors + train_state.safetensors) is
 * returned as legacy. Nothing at all: f->dir is "". */
fm_status fm_ckpt_find(const char *out_dir, fm_ckpt_found *f, FILE *log);
/* Links the found checkpoint's files to OUT/NAME again: a crash after a commit
 * but before its links leaves OUT/ with an older checkpoint's files. */
fm_status fm_ckpt_relink(const char *out_dir, const fm_ckpt_found *f);
/* A diverged run: the loss of the step after checkpoint `step` exploded, so that
 * checkpoint holds the weights that gave it. When an earlier complete checkpoint
 * exists, OUT/ckpt/step-N becomes OUT/ckpt/step-N.diverged (out of resume's way;
 * one of that name from an earlier run is replaced), OUT/NAME are linked to the
 * newest complete one left, whose step is returned, and `moved` gets the new name.
 * Otherwise nothing moves and -1 is returned. */
int64_t fm_ckpt_set_aside(const char *out_dir, int64_t step, char *moved, size_t moved_n, FILE *log);
/* Removes OUT/NAME.tmp.PID and OUT/ckpt/NAME.tmp.PID left by processes that are gone
 * (each named on `log`). */
void fm_ckpt_clean_stale(const char *out_dir, FILE *log);
/* CRC-32 and size of a file. */
fm_status fm_file_crc32(const char *path, uint32_t *crc, int64_t *size);

#endif
