/* fathom/dist.h: training over many processes (data parallel over MPI, ZeRO-1).
 *
 * The processes are started and wired by MPI (`mpirun -np N prog`, a hostfile for
 * several machines). fm_dist_init joins the MPI world when the program was started
 * by an MPI launcher, and otherwise makes a world of one process without touching
 * MPI, so a program written for N ranks runs unchanged on one.
 *
 * Collectives are non-blocking MPI point-to-point exchanges polled against a
 * deadline (fm_dist_set_timeout): a rank that died or hangs makes the others fail
 * with an error naming the rank they got nothing from, instead of waiting forever.
 * Averages sum the ranks' values in rank order (in double), so the result does not
 * depend on timing or on how a buffer is split into buckets or shards. */
#ifndef FATHOM_DIST_H
#define FATHOM_DIST_H
#include <stddef.h>
#include <stdint.h>

#include "fathom/export.h"
#include "fathom/io.h" /* fm_kv_list: shard metadata */
#include "fathom/optim.h"
#include "fathom/tensor.h"
#include "fathom/train_step.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fm_dist fm_dist;

/* Joins the MPI world when launched by mpirun/mpiexec/srun (or FATHOM_DIST=mpi),
 * else a world of one. Fails (FM_ERR_UNSUPPORTED) when launched by MPI but this
 * build has no MPI. Timeout: FATHOM_DIST_TIMEOUT seconds if set, else 300. */
FM_API fm_status fm_dist_init(fm_dist **out);
/* Ends MPI (if fm_dist_init started it) and frees d. */
FM_API void fm_dist_finalize(fm_dist *d);
/* Ends every process of the job (MPI_Abort) with exit code `code`: for a rank that
 * cannot go on while others wait in a collective. Exits this process without MPI. */
FM_API void fm_dist_abort(fm_dist *d, int code);

FM_API int fm_dist_rank(const fm_dist *d);
FM_API int fm_dist_size(const fm_dist *d);
/* Rank among the processes on this machine (picks the GPU of a rank). */
FM_API int fm_dist_local_rank(const fm_dist *d);
/* Processes of this job on this machine (they share its cores). */
FM_API int fm_dist_local_size(const fm_dist *d);
/* Whether collectives go through MPI (false for a world of one without MPI). */
FM_API bool fm_dist_uses_mpi(const fm_dist *d);
/* Whether this build has MPI. */
FM_API bool fm_dist_mpi_built(void);
FM_API fm_status fm_dist_set_timeout(fm_dist *d, double seconds);
FM_API double fm_dist_timeout(const fm_dist *d);

/* Blocking collectives (each waits against the timeout). Every rank calls the
 * same collectives in the same order with the same sizes. */
/* buf[0..n) = average over ranks of buf[0..n). */
FM_API fm_status fm_dist_allreduce_avg_f32(fm_dist *d, float *buf, int64_t n);
/* buf[0..n) = sum over ranks, in double (losses, norms, token counts). */
FM_API fm_status fm_dist_allreduce_sum_f64(fm_dist *d, double *buf, int64_t n);
/* in: size*shard values on every rank; out: this rank's shard of their average
 * (average = false: the sum). */
FM_API fm_status fm_dist_reduce_scatter_f32(fm_dist *d, const float *in, float *out, int64_t shard, bool average);
/* shard values from every rank -> out[size*shard] in rank order. */
FM_API fm_status fm_dist_allgather_f32(fm_dist *d, const float *in, float *out, int64_t shard);
/* buf[0..bytes) = root's buf[0..bytes), any data (MPI_Ibcast, polled against the timeout).
 * Not a barrier: the root may return before the others have received. */
FM_API fm_status fm_dist_broadcast(fm_dist *d, void *buf, size_t bytes, int root);
/* The seed of rank `rank`'s dropout generator, made from the job's seed: `seed` itself on
 * rank 0 (so one process draws what it always drew), a different one on every other rank.
 * The trainers give it the data-parallel rank, so data-parallel ranks draw different
 * masks and the ranks of a tensor-parallel group (one data-parallel rank) the same. */
FM_API uint64_t fm_dist_rank_seed(uint64_t seed, int rank);
/* Checks that every rank passes the same value (a hash of the configuration);
 * the error names `what` and the ranks that differ from rank 0. */
FM_API fm_status fm_dist_check_same(fm_dist *d, uint64_t value, const char *what);
/* FNV-1a over bytes, chained from h (start with 0). */
FM_API uint64_t fm_dist_hash(uint64_t h, const void *data, size_t n);

/* ---- collectives on tensors of any device ----
 * Contiguous f32 tensors (a broadcast takes any dtype), all on the device given to
 * fm_dist_use_device (or the CPU). CPU tensors go through MPI as above; CUDA tensors
 * through NCCL on the GPU (sums in NCCL's order: equal to the MPI path to rounding);
 * tensors of any other device (the check device) through host copies and MPI, the
 * same bits as on the CPU. */
/* The device this rank's collectives run on. CUDA: joins NCCL on that GPU (rank 0's
 * unique id broadcast over MPI); FM_ERR_UNSUPPORTED, saying why, in a build without
 * NCCL. Other devices need nothing. */
FM_API fm_status fm_dist_use_device(fm_dist *d, fm_device dev);
/* Whether this build has NCCL (FATHOM_NCCL: CUDA + MPI + the toolkit's NCCL). */
FM_API bool fm_dist_nccl_built(void);
/* Whether d's collectives on CUDA tensors go through NCCL (fm_dist_use_device). */
FM_API bool fm_dist_uses_nccl(const fm_dist *d);
FM_API fm_status fm_dist_allreduce_avg_tensor(fm_dist *d, fm_tensor *t);
/* The sum over the ranks, in place (the CPU's in rank order, in double: fm_dist_allreduce_sum_f32). */
FM_API fm_status fm_dist_allreduce_sum_tensor(fm_dist *d, fm_tensor *t);
/* in: size*shard values; out: shard values (average = false: the sum). */
FM_API fm_status fm_dist_reduce_scatter_tensor(fm_dist *d, const fm_tensor *in, fm_tensor *out, bool average);
/* in: shard values; out: size*shard in rank order. */
FM_API fm_status fm_dist_allgather_tensor(fm_dist *d, const fm_tensor *in, fm_tensor *out);
FM_API fm_status fm_dist_broadcast_tensor(fm_dist *d, fm_tensor *t, int root);

/* Totals since fm_dist_init (or the last reset). */
typedef struct fm_dist_stats {
    int64_t collectives;  /* collectives completed */
    int64_t bytes_sent;   /* payload bytes this rank sent */
    double wait_seconds;  /* time blocked waiting for collectives to finish */
} fm_dist_stats;
FM_API void fm_dist_stats_get(const fm_dist *d, fm_dist_stats *out);
FM_API void fm_dist_stats_reset(fm_dist *d);

/* ---- data parallel: gradient buckets all-reduced during backward ----
 * The parameters (f32, contiguous) are grouped into buckets of about bucket_bytes
 * (0: 25 MiB), last parameters first (their gradients come first in backward).
 * A post-accumulate hook on each parameter copies its gradient into its bucket;
 * the bucket's all-reduce starts once all its gradients are in, while backward
 * goes on. fm_ddp_sync waits for the rest and writes the averaged gradients back
 * into every parameter's .grad. */
typedef struct fm_ddp fm_ddp;
FM_API fm_ddp *fm_ddp_new(fm_dist *d, int n_params, fm_tensor *const *params, size_t bucket_bytes);
FM_API void fm_ddp_free(fm_ddp *p);
/* Copies rank 0's parameter values to every rank. */
FM_API fm_status fm_ddp_broadcast_params(fm_ddp *p);
/* After backward: finishes the all-reduces; every parameter then has the average
 * gradient (zeros where no rank produced one). */
FM_API fm_status fm_ddp_sync(fm_ddp *p);
/* false: backward passes leave gradients local (accumulation micro-steps); the
 * next fm_ddp_sync then reduces all of them. Default true. */
FM_API void fm_ddp_set_overlap(fm_ddp *p, bool on);
FM_API int fm_ddp_bucket_count(const fm_ddp *p);

typedef struct fm_ddp_stats {
    int64_t steps;            /* fm_ddp_sync calls */
    int64_t bytes_reduced;    /* gradient bytes all-reduced (sum over steps) */
    int64_t bytes_sent;       /* bytes this rank sent for them */
    double comm_seconds;      /* sum over buckets of start -> observed completion */
    double exposed_seconds;   /* time fm_ddp_sync spent waiting after backward */
    double overlapped_fraction; /* 1 - exposed / comm, clamped to [0, 1] */
} fm_ddp_stats;
FM_API void fm_ddp_stats_get(const fm_ddp *p, fm_ddp_stats *out);

/* ---- ZeRO stage 1: optimizer state sharded across ranks ----
 * Built from a full optimizer (its parameters, names, groups and settings; the
 * full optimizer then allocates no state if it is not stepped). Rank r owns a
 * contiguous 1/N of the parameters laid end to end; its optimizer
 * (fm_zero_optim: set its learning rate, read its step) holds state for that
 * part only. Needs an MPI world of 2 or more ranks; f32 CPU parameters. */
typedef struct fm_zero fm_zero;
FM_API fm_zero *fm_zero_new(fm_dist *d, fm_optim *full);
FM_API void fm_zero_free(fm_zero *z);
FM_API fm_optim *fm_zero_optim(fm_zero *z);
/* Reduce-scatters (averages) the parameters' gradients: this rank's part becomes
 * the sharded optimizer's gradients; the full .grad are dropped. */
FM_API fm_status fm_zero_reduce_grads(fm_zero *z);
/* All-gathers the updated parts into every rank's full parameters. */
FM_API fm_status fm_zero_gather_params(fm_zero *z);
/* reduce_grads, clip to `clip` (> 0; global norm into *norm), update, gather. */
FM_API fm_status fm_zero_step(fm_zero *z, double clip, double *norm);
/* Bytes of optimizer state this rank holds. */
FM_API int64_t fm_zero_state_bytes(fm_zero *z);
/* The full optimizer state, named as the full optimizer's fm_optim_state names it
 * (every rank gets it: what rank 0 writes to a checkpoint, independent of N). */
FM_API fm_status fm_zero_full_state(fm_zero *z, fm_named_list *out);
/* Takes this rank's part of a full state (from a checkpoint written at any N). */
FM_API fm_status fm_zero_load_full_state(fm_zero *z, const fm_named_list *full);
/* Sharded checkpoints: this rank writes its own part of the state as it is (no
 * collective) to path, a safetensors file with one [shard] tensor per state slot and
 * metadata naming the world size, the rank and the parameters' layout; *nonfinite (may
 * be NULL) says whether it holds NaN or inf. fm_zero_load_shard restores it exactly,
 * refusing a file of another rank, world size or model. fm_zero_state_from_shards
 * reads the `world` shard files of a checkpoint (paths[r]: rank r's) into the full
 * state named as `full`'s fm_optim_state names it: a checkpoint of N ranks resumed on
 * another number (then fm_zero_load_full_state, or into a full optimizer). */
FM_API fm_status fm_zero_save_shard(fm_zero *z, const char *path, bool *nonfinite);
/* What fm_zero_save_shard writes: the [shard] tensors (named by slot) and the metadata
 * (meta may be NULL); on the meta device, the tensors without values (the planner). */
FM_API fm_status fm_zero_shard_state(fm_zero *z, fm_named_list *out, fm_kv_list *meta, bool *nonfinite);
FM_API fm_status fm_zero_load_shard(fm_zero *z, const char *path);
FM_API fm_status fm_zero_state_from_shards(const char *const *paths, int world, const fm_optim *full, fm_named_list *out);

/* ---- the trainers' data-parallel layer (`mpirun -np N fathom train`) ----
 * Put around a trainer's fm_train_step (after fm_train_step_init): copies rank 0's
 * parameters to every rank, then, through the step's hooks, all-reduces the gradient
 * buckets during the last micro-batch's backward (zero = 0), or (zero = 1) reduce-
 * scatters the gradients after backward, steps a sharded optimizer and all-gathers the
 * parameters; for that it replaces ts->opt with the sharded optimizer (set the learning
 * rate there: fm_dist_trainer_optim). Hooks already on ts run after its own. The
 * trainer gives each rank a disjoint part of every batch (fm_data_shard_rows). */
typedef struct fm_dist_trainer fm_dist_trainer;
FM_API fm_dist_trainer *fm_dist_trainer_new(fm_dist *d, fm_train_step *ts, int zero, size_t bucket_bytes);
FM_API void fm_dist_trainer_free(fm_dist_trainer *t);
/* The optimizer that steps: the sharded one under ZeRO-1, else ts's. */
FM_API fm_optim *fm_dist_trainer_optim(fm_dist_trainer *t);
/* Before a step whose batch has global_rows rows, local_rows of them here: weights this
 * rank's loss so that the average of the ranks' gradients is the whole batch's mean
 * (1 when the batch splits evenly). */
FM_API void fm_dist_trainer_begin_step(fm_dist_trainer *t, int64_t local_rows, int64_t global_rows);
/* *loss (this rank's mean over local_rows) becomes the whole batch's mean, on every rank. */
FM_API fm_status fm_dist_trainer_reduce_loss(fm_dist_trainer *t, double *loss, int64_t local_rows, int64_t global_rows);
/* The full optimizer state, named as fm_optim_state names it (a collective under
 * ZeRO-1: every rank calls it; each gets the whole state). Free with fm_named_list_free. */
FM_API fm_status fm_dist_trainer_full_state(fm_dist_trainer *t, fm_named_list *out);
/* Takes this rank's part of a full state (ZeRO-1); without ZeRO, copies it into ts's. */
FM_API fm_status fm_dist_trainer_load_full_state(fm_dist_trainer *t, const fm_named_list *full);
/* ZeRO-1's sharder (NULL without ZeRO-1): for its sharded checkpoints (fm_zero_save_shard). */
FM_API fm_zero *fm_dist_trainer_zero(fm_dist_trainer *t);

typedef struct fm_dist_report {
    int world_size;           /* ranks in all (1: one process) */
    int zero;                 /* ZeRO stage (0 or 1) */
    int buckets;              /* gradient buckets (zero = 0) */
    int64_t steps;            /* optimizer steps with communication */
    double comm_seconds;      /* gradient communication: sum over buckets of start -> completion (ZeRO-1: the
                               * reduce-scatter and all-gather) */
    double exposed_seconds;   /* of it, the time the step waited after backward */
    double overlapped_fraction; /* 1 - exposed / comm */
    int64_t grad_bytes;       /* gradient bytes per step */
    int64_t bytes_sent;       /* bytes this rank sent, all steps */
    int64_t optimizer_state_bytes; /* the optimizer state this rank holds */
    /* tensor parallel (GPT trainer; 0: none): group size, training steps, and this rank's
     * bytes sent and time in the steps' tensor-parallel collectives */
    int tensor_parallel;
    int64_t tp_steps, tp_bytes_sent;
    double tp_comm_seconds;
    /* what a step should send: (4 n_layer + 2) all-reduces of the rank's activations
     * [B/DP, T, n_embd] (2 per block forward and backward, the embedding's forward and the
     * output's backward) at 2(TP-1)/TP each, plus the cross-entropy's row statistics and
     * the gradient norm */
    int64_t tp_formula_bytes;
} fm_dist_report;
FM_API void fm_dist_trainer_report(fm_dist_trainer *t, fm_dist_report *out);

/* ---- process groups and tensor parallelism (Megatron style) ----
 * fm_dist_split: a communicator over the ranks of d that pass the same color (>= 0),
 * ordered as in d (a collective on d; free with fm_dist_finalize before d). In a world
 * of one, a world of one. With world = TP x DP, rank r's tensor-parallel group is
 * color r / TP and its data-parallel group color r % TP. */
FM_API fm_status fm_dist_split(fm_dist *d, int color, fm_dist **out);
/* buf[0..n) = sum over ranks (rank order, in double). */
FM_API fm_status fm_dist_allreduce_sum_f32(fm_dist *d, float *buf, int64_t n);
/* Identity forward; backward all-reduces (sums) the gradient over tp. Put in front
 * of a column-parallel linear (each rank's gradient of its input is partial). */
FM_API fm_tensor *fm_tp_copy(fm_dist *tp, fm_tensor *x);
/* All-reduce (sum) over tp forward; identity backward. Put after a row-parallel
 * linear (each rank's output is a partial sum). f32 CPU tensors. */
FM_API fm_tensor *fm_tp_reduce(fm_dist *tp, fm_tensor *x);

/* Mean cross-entropy of vocabulary-parallel logits: logits [N, V/T] are this rank's
 * columns (vocabulary rows [vocab_start, vocab_start + V/T) of vocab_size), targets
 * [N] whole ids (-1: ignored). The row maxima are all-gathered and the sums of exp and
 * the target's logit all-reduced, so the logits are never gathered; every rank gets
 * the loss, and backward (softmax - one-hot on this rank's columns) communicates
 * nothing. As fm_cross_entropy(ignore -1, mean) on the whole logits, to rounding. */
FM_API fm_tensor *fm_tp_cross_entropy(fm_dist *tp, fm_tensor *logits, fm_tensor *targets, int64_t vocab_start,
                                      int64_t vocab_size);

/* How a parameter is split over the ranks of a tensor-parallel group: along dim, in
 * n_seg consecutive segments of seg[k] elements (a fused QKV weight: the query, key
 * and value rows), each cut into equal parts; rank r owns part r of every segment,
 * laid end to end. */
#define FM_TP_MAX_SEG 4
typedef struct fm_tp_split {
    int dim;
    int n_seg;
    int64_t seg[FM_TP_MAX_SEG];
} fm_tp_split;
/* Rank `rank`'s shard (a new contiguous tensor) of a full f32 CPU tensor split in parts. */
FM_API fm_tensor *fm_tp_shard(int parts, int rank, fm_tensor *full, const fm_tp_split *s);
/* The full tensor from every rank's shard (a collective on tp; every rank gets it). */
FM_API fm_tensor *fm_tp_gather(fm_dist *tp, fm_tensor *local, const fm_tp_split *s);
/* The full tensor from the `parts` shards held here (shards[r]: rank r's, as fm_tp_shard
 * makes them; f32 CPU tensors of one shape): no communication (a checkpoint's files). */
FM_API fm_tensor *fm_tp_unshard(int parts, fm_tensor *const *shards, const fm_tp_split *s);

#ifdef __cplusplus
}
#endif
#endif
