/* src/dist/dist_ckpt.c: checkpoint units that every rank writes into (sharded checkpoints),
 * for both trainers (the GPT trainer's ZeRO-1 and tensor-parallel units, the classifier
 * trainer's ZeRO-1 units), and the reading of ZeRO-1 shards on resume.
 *
 * A unit is the usual OUT/ckpt/step-N (io/io_internal.h: written into a temporary directory,
 * renamed whole, a MANIFEST naming every file with its size and CRC-32). Rank 0 opens it and
 * every rank learns its temporary directory (a shared file system, as for the rest of a
 * multi-machine run); every rank writes its own files there, as they are, with no gather;
 * one sum tells every rank whether every file was written and finite; only then does rank 0
 * write the MANIFEST and rename the unit into place. A failure on any rank aborts the unit on
 * every rank and leaves the previous checkpoints as they were. */
#ifndef FATHOM_DIST_CKPT_H
#define FATHOM_DIST_CKPT_H
#include <stdbool.h>
#include <stdio.h>

#include "fathom/dist.h"

/* Rank `rank` of `world`'s file of a kind: KIND-RRRRR-of-NNNNN.safetensors ("zero-shard":
 * ZeRO-1's optimizer shard; "tp-shard", "tp-zero": a tensor-parallel rank's part and its
 * ZeRO-1 shard). */
void dist_ckpt_file(char *buf, size_t n, const char *kind, int rank, int world);
/* The world size N of the unit's KIND-00000-of-N.safetensors, or 0 when it has none. */
int dist_ckpt_world(const char *dir, const char *kind);

/* What a rank writes into the unit's temporary directory tmp: its own file of each kind
 * (dist_ckpt_file) and, on rank 0, the files every rank has alike. Called on every rank, also
 * after rank 0 failed to open the unit (then tmp is NULL: write nothing, but take part in any
 * collective of its own, which every rank runs in the same order). Returns an error when a
 * file was not written; *nonfinite = true when values to be written hold NaN or inf. */
typedef fm_status (*dist_ckpt_write_fn)(void *ctx, const char *tmp, bool *nonfinite);

typedef struct dist_ckpt_unit {
    fm_dist *d;                /* every rank of it takes part */
    const char *out_dir;       /* OUT: the unit is OUT/ckpt/step-N */
    int64_t step;
    int n_common;              /* rank 0's files, in MANIFEST order */
    const char *const *common;
    int n_kinds;               /* every rank's files: one of each kind */
    const char *const *kinds;
    int keep;                  /* complete units kept (fm_ckpt_commit) */
    FILE *log;                 /* rank 0's "checkpoint ..." line, or NULL */
    dist_ckpt_write_fn write;
    void *ctx;
} dist_ckpt_unit;

/* Writes and commits the unit (above). On any rank's failure every rank returns an error
 * saying the previous checkpoints are unchanged; *poisoned: a rank found NaN or inf. */
fm_status dist_ckpt_save(const dist_ckpt_unit *u, bool *poisoned);

/* A unit's ZeRO-1 optimizer shards (zero-shard-R-of-N, written by `world` ranks) into this
 * run, rank `rank` of `now`: under ZeRO-1 over the same world size (dt's sharder), this rank's
 * own shard as it is (bit for bit); else every shard read into the whole state, named as
 * full's fm_optim_state names it, and taken as a whole checkpoint's: dt's part of it
 * (fm_dist_trainer_load_full_state), or, without dt (one process), copied into full's state. */
fm_status dist_ckpt_load_zero(const char *dir, int world, int rank, int now, fm_dist_trainer *dt, fm_optim *full);

#endif
