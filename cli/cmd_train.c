/* `fathom train RECIPE`: one set of flags and one output contract for every recipe.
 * A classifier recipe (src/recipe) and a GPT recipe ([model] type = gpt, src/gpt) each
 * name a model, its data and its loss; both trainers run the same optimizer step
 * (fathom/train_step.h). Here: parse the flags once, hand them to the recipe's trainer,
 * and report the same way for both: human text on stderr (nothing with --quiet),
 * JSON on stdout only with --json (the same keys for every kind of model, null where
 * one does not apply), and a last line that says where the model is. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dirent.h>
#include <jansson.h>

#include "commands.h"
#include "device_arg.h"
#include "core/parallel.h" /* fm_set_num_threads for --threads */
#include "fathom/dist.h" /* mpirun -np N fathom train: data parallel */
#include "fathom/gpt.h"
#include "fathom/recipe.h"

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: fathom train RECIPE [--steps N | --epochs N] [--batch N] [--lr X] [--seed N] [--threads N]\n"
            "                    [--device cpu|cuda|cuda:N|check] [--precision fp32|bf16|fp16]\n"
            "                    [--checkpointing none|blocks|selective] [--grad-accum N]\n"
            "                    [--memory-limit SIZE] [--memory-mode grow|preallocate] [--memory-preallocate X]\n"
            "                    [--out DIR] [--resume [DIR] | --overwrite] [--stop-after N] [--no-eval] [--json] [--quiet]\n"
            "                    [--profile FILE] [--logdir DIR] [--hist-every N] [--corpus FILE] [--sample N]\n"
            "                    [--zero 0|1] [--bucket-size SIZE] [--dist-timeout SECONDS] [--tensor-parallel T]\n"
            "       mpirun -np N fathom train RECIPE [flags]     (data parallel over N processes)\n\n"
            "Trains the model a recipe describes: a classifier (fashion-mlp, fashion-cnn) or a GPT (kjv-gpt).\n"
            "RECIPE is a built-in name (see `fathom recipes`) or a path to an .ini file. Every flag applies\n"
            "to every recipe unless marked.\n\n"
            "  --steps N          train N optimizer steps in all (the schedule spans them)\n"
            "  --epochs N         train N passes over the training data (GPT: over its tokens)\n"
            "  --batch N          samples per optimizer step (GPT: token windows)\n"
            "  --lr X             peak learning rate (GPT: min_lr keeps its ratio to it)\n"
            "  --seed N           seed of the weights, the data order and dropout\n"
            "  --threads N        compute threads (default: all cores)\n"
            "  --device D         where to train: cpu (default), cuda, cuda:N, or check (the checked test\n"
            "                     device, docs/DEVICES.md); checkpoints are device-independent\n"
            "  --precision P      autocast the forward pass to bf16 or fp16 (fp16 adds dynamic loss scaling);\n"
            "                     master weights and the optimizer stay fp32 (default fp32)\n"
            "  --checkpointing C  recompute activations in backward: blocks or selective (GPT recipes),\n"
            "                     blocks (conv nets: each block ends in a pooling layer)\n"
            "  --grad-accum N     cut each batch into N micro-batches, one optimizer step\n"
            "  --memory-limit SIZE  fail allocations past SIZE (2G, 512M; also FATHOM_MEMORY_LIMIT);\n"
            "                     refused before training when weights + gradients + optimizer state do not fit\n"
            "  --memory-mode M    grow (default) or preallocate (reserve an arena up front)\n"
            "  --memory-preallocate X  with preallocate: a size (1G) or a fraction of the limit (0.5)\n"
            "  --out DIR          where the model goes (default runs/<recipe>; with --resume DIR: DIR)\n"
            "  --resume [DIR]     continue from the newest complete checkpoint in DIR (default: --out), bit for bit\n"
            "  --overwrite        train afresh into an --out that holds an earlier run, replacing it (without\n"
            "                     it such a directory is refused, so that a repeated command loses no model)\n"
            "  --stop-after N     stop after step N with a checkpoint, as an interruption would (also --max-steps)\n"
            "  --no-eval          no evaluation (classifier: the test set at the end; GPT: validation)\n"
            "  --json             print one JSON object with the results on stdout\n"
            "  --quiet            no progress output\n"
            "  --profile FILE     write a Chrome trace (open in ui.perfetto.dev, or: fathom profile FILE)\n"
            "  --logdir DIR       write TensorBoard event files (or: fathom plot DIR -o curves.svg)\n"
            "  --hist-every N     with --logdir: weight and gradient histograms every N epochs (GPT: steps)\n"
            "  --corpus FILE      GPT recipes: train on this text file instead of the recipe's corpus\n"
            "  --sample N         GPT recipes: print N sampled tokens at each validation\n"
            "Under mpirun (docs/DISTRIBUTED.md): every rank trains on its part of each batch (--batch is the\n"
            "whole batch; it must split evenly over the ranks); rank 0 logs and saves.\n"
            "  --zero 1           shard the optimizer state over the ranks (ZeRO-1; needs 2 or more ranks)\n"
            "  --bucket-size SIZE gradients all-reduced in buckets of SIZE (default 25M)\n"
            "  --dist-timeout S   a collective that waits more than S seconds for a rank ends the job (default 300)\n"
            "  --tensor-parallel T  GPT recipes: split each model over T ranks (Megatron: heads, MLP columns and\n"
            "                     vocabulary), data parallel across the N/T groups; T divides N and the model's\n"
            "                     heads, key/value heads, MLP width and vocabulary; fp32, bf16 or fp16 on\n"
            "                     the CPU\n");
}

typedef struct train_args {
    const char *recipe, *out, *resume_dir, *profile, *logdir, *corpus, *device_str;
    bool resume, json, quiet, no_eval, overwrite;
    long long epochs, steps, batch, seed, threads, stop_after, hist_every, sample;
    double lr;
    fm_efficiency_opts eo;
    fm_device device;
    long long zero, tensor_parallel;
    size_t bucket_bytes;
    double dist_timeout;
    fm_dist *dist; /* the MPI world (a world of one without mpirun) */
} train_args;

/* Every flag, for parsing and for "did you mean". */
static const char *const k_flags[] = {
    "--steps", "--epochs", "--batch", "--lr", "--seed", "--threads", "--device", "--precision", "--checkpointing",
    "--grad-accum", "--memory-limit", "--memory-mode", "--memory-preallocate", "--out", "--resume", "--stop-after",
    "--max-steps", "--no-eval", "--json", "--quiet", "--profile", "--logdir", "--hist-every", "--corpus", "--sample",
    "--zero", "--bucket-size", "--dist-timeout", "--tensor-parallel", "--overwrite", "--help"};
#define N_FLAGS (int)(sizeof k_flags / sizeof k_flags[0])
static bool takes_value(const char *f) {
    return strcmp(f, "--no-eval") && strcmp(f, "--json") && strcmp(f, "--quiet") && strcmp(f, "--help") &&
           strcmp(f, "--resume") && strcmp(f, "--overwrite");
}

/* A positive finite number; says which of "not a number" or "out of range" it is. */
static bool parse_lr(const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end) { fm_cli_error("train: --lr needs a number, got '%s' (not a number)", v); return false; }
    if (!isfinite(x) || !(x > 0)) { fm_cli_error("train: --lr needs a positive finite number, got '%s'", v); return false; }
    *out = x;
    return true;
}

/* the efficiency flags, each through the library's parser; 0 ok, 2 usage error, 1 not one of them */
static int efficiency_flag(const char *a, const char *v, fm_efficiency_opts *eo) {
    if (!strcmp(a, "--precision")) {
        if (fm_precision_parse(v, &eo->precision)) { fm_cli_error("train: --precision %s: expected fp32, bf16 or fp16", v); return 2; }
        eo->loss_scaling = eo->precision == FM_F16;
    } else if (!strcmp(a, "--checkpointing")) {
        if (fm_checkpointing_parse(v, &eo->checkpointing)) { fm_cli_error("train: --checkpointing: %s", fm_last_error()); return 2; }
    } else if (!strcmp(a, "--grad-accum")) {
        long long n;
        if (!fm_cli_parse_int_range("train", a, v, 1, 1 << 20, &n)) return 2;
        eo->grad_accum = (int)n;
    } else if (!strcmp(a, "--memory-limit")) {
        if (fm_parse_size(v, &eo->memory_limit) || eo->memory_limit == 0) {
            fm_cli_error("train: --memory-limit needs a size such as 2G or 512M, got '%s'", v);
            return 2;
        }
    } else if (!strcmp(a, "--memory-mode")) {
        if (fm_memory_mode_parse(v, &eo->memory_mode)) { fm_cli_error("train: --memory-mode: %s", fm_last_error()); return 2; }
    } else if (!strcmp(a, "--memory-preallocate")) {
        char *end = NULL;
        double f = strtod(v, &end);
        if (end != v && *end == 0) { /* a bare number is a fraction; sizes carry a unit */
            if (!(f > 0 && f <= 1)) {
                fm_cli_error("train: --memory-preallocate %s: a fraction must be in (0, 1]; give a size with a unit (1G, 512M)", v);
                return 2;
            }
            eo->prealloc_fraction = f;
        } else if (fm_parse_size(v, &eo->prealloc_bytes) || eo->prealloc_bytes == 0) {
            fm_cli_error("train: --memory-preallocate needs a size (1G) or a fraction in (0, 1], got '%s'", v);
            return 2;
        }
    } else {
        return 1;
    }
    return 0;
}

/* One valued flag; false: a usage error was printed. */
static bool value_flag(train_args *a, const char *f, const char *v) {
    int e = efficiency_flag(f, v, &a->eo);
    if (e != 1) return e == 0;
#define INT_FLAG(name, lo, hi, dst) if (!strcmp(f, name)) return fm_cli_parse_int_range("train", f, v, lo, hi, &a->dst);
    INT_FLAG("--steps", 1, INT64_MAX, steps)
    INT_FLAG("--epochs", 1, INT_MAX, epochs)
    INT_FLAG("--batch", 1, INT_MAX, batch)
    INT_FLAG("--seed", 0, INT64_MAX, seed)
    INT_FLAG("--threads", 1, 256, threads) /* the pool's MAX_THREADS */
    INT_FLAG("--stop-after", 1, INT64_MAX, stop_after)
    INT_FLAG("--max-steps", 1, INT64_MAX, stop_after)
    INT_FLAG("--hist-every", 1, INT_MAX, hist_every)
    INT_FLAG("--sample", 0, INT_MAX, sample)
    INT_FLAG("--zero", 0, 1, zero)
    INT_FLAG("--tensor-parallel", 1, 4096, tensor_parallel)
#undef INT_FLAG
    if (!strcmp(f, "--lr")) return parse_lr(v, &a->lr);
    if (!strcmp(f, "--bucket-size")) {
        if (fm_parse_size(v, &a->bucket_bytes) || a->bucket_bytes < 4) {
            fm_cli_error("train: --bucket-size needs a size such as 25M or 1M, got '%s'", v);
            return false;
        }
        return true;
    }
    if (!strcmp(f, "--dist-timeout")) {
        char *end;
        double x = strtod(v, &end);
        if (end == v || *end || !isfinite(x) || !(x > 0)) {
            fm_cli_error("train: --dist-timeout needs a positive number of seconds, got '%s'", v);
            return false;
        }
        a->dist_timeout = x;
        return true;
    }
    if (!strcmp(f, "--device")) {
        a->device_str = v;
        if (fm_device_parse(v, &a->device)) { fm_cli_error("train: --device: %s", fm_last_error()); return false; }
        return true;
    }
    const char **dst = !strcmp(f, "--out") ? &a->out : !strcmp(f, "--profile") ? &a->profile
                     : !strcmp(f, "--logdir") ? &a->logdir : !strcmp(f, "--corpus") ? &a->corpus : NULL;
    if (!dst || !*v) { fm_cli_error("train: %s needs a value", f); return false; }
    *dst = v;
    return true;
}

/* 0: parsed; 2: usage error (printed); -1: --help was printed. */
static int parse_args(int argc, char **argv, train_args *a) {
    memset(a, 0, sizeof *a);
    a->epochs = a->steps = a->batch = a->seed = a->threads = a->stop_after = a->sample = -1;
    a->lr = -1;
    a->eo = fm_efficiency_defaults();
    a->device = FM_CPU;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) { train_usage(stdout); return -1; }
        if (arg[0] != '-' || !arg[1]) {
            if (a->recipe) { fm_cli_error("train: more than one recipe given ('%s' and '%s')", a->recipe, arg); return 2; }
            a->recipe = arg;
            continue;
        }
        char name[64];
        const char *eq = strchr(arg, '=');
        snprintf(name, sizeof name, "%.*s", (int)(eq ? eq - arg : (long)strlen(arg)), arg);
        int k = 0;
        while (k < N_FLAGS && strcmp(name, k_flags[k])) k++;
        if (k == N_FLAGS) { fm_cli_unknown_option("train", arg, k_flags, N_FLAGS); return 2; }
        if (!strcmp(name, "--resume")) { /* --resume [DIR]: a value unless the next word is an option */
            a->resume = true;
            if (eq) a->resume_dir = eq + 1;
            else if (i + 1 < argc && argv[i + 1][0] != '-') a->resume_dir = argv[++i];
            continue;
        }
        if (!takes_value(name)) {
            if (eq) { fm_cli_error("train: %s takes no value", name); return 2; }
            if (!strcmp(name, "--json")) a->json = true;
            else if (!strcmp(name, "--quiet")) a->quiet = true;
            else if (!strcmp(name, "--overwrite")) a->overwrite = true;
            else a->no_eval = true;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) { fm_cli_error("train: %s needs a value", name); return 2; }
        if (!value_flag(a, name, v)) return 2;
    }
    if (!a->recipe) { fm_cli_error("train: no recipe given"); return 2; }
    if (a->steps > 0 && a->epochs > 0) { fm_cli_error("train: give --steps or --epochs, not both"); return 2; }
    if (a->overwrite && a->resume) {
        fm_cli_error("train: --resume continues the run in its directory and --overwrite replaces it: give one");
        return 2;
    }
    if (a->hist_every > 0 && !a->logdir) {
        fm_cli_error("train: --hist-every writes to the TensorBoard logs: give --logdir DIR too");
        return 2;
    }
    return 0;
}

/* What every trainer reports; NAN / -1 where it does not apply. */
typedef struct train_report {
    const char *recipe, *kind, *out;
    char model_path[PATH_MAX + 32];
    double train_loss, val_loss, test_loss, test_accuracy;
    int64_t steps, epochs, batch, num_params, skipped_steps;
    double train_seconds, samples_per_second, tokens_per_second, data_wait_seconds, loss_scale;
    size_t peak_memory_bytes;
    const char *memory_json, *memory_text;
    fm_dist_report dist;
} train_report;

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }
static json_t *int_or_null(int64_t v) { return v >= 0 ? json_integer(v) : json_null(); }
static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

/* Data parallel: what the communication cost, per rank (null for one process). */
static json_t *dist_json(const train_report *r) {
    const fm_dist_report *d = &r->dist;
    if (d->world_size < 2) return json_null();
    json_t *j = json_object();
    /* n: the ranks a gradient is averaged over (tensor parallel: the data-parallel groups) */
    const double n = d->world_size / (d->tensor_parallel > 1 ? d->tensor_parallel : 1), steps = d->steps > 0 ? (double)d->steps : 1;
    json_object_set_new(j, "zero", json_integer(d->zero));
    json_object_set_new(j, "buckets", json_integer(d->buckets));
    json_object_set_new(j, "steps", json_integer(d->steps));
    json_object_set_new(j, "comm_seconds", json_real(d->comm_seconds));
    json_object_set_new(j, "exposed_comm_seconds", json_real(d->exposed_seconds));
    json_object_set_new(j, "overlapped_fraction", json_real(d->overlapped_fraction));
    json_object_set_new(j, "comm_fraction_of_training", num_or_null(r->train_seconds > 0 ? d->comm_seconds / r->train_seconds : NAN));
    json_object_set_new(j, "gradient_bytes", json_integer(d->grad_bytes));
    json_object_set_new(j, "bytes_sent_per_step", json_real((double)d->bytes_sent / steps));
    /* a ring all-reduce (or a reduce-scatter + all-gather) moves 2(N-1)/N of the gradients */
    json_object_set_new(j, "ring_bytes_per_step", json_real(2 * (n - 1) / n * (double)d->grad_bytes));
    json_object_set_new(j, "optimizer_state_bytes_per_rank", json_integer(d->optimizer_state_bytes));
    json_object_set_new(j, "tensor_parallel", json_integer(d->tensor_parallel > 1 ? d->tensor_parallel : 1));
    if (d->tensor_parallel > 1) {
        const double ts = d->tp_steps > 0 ? (double)d->tp_steps : 1;
        json_object_set_new(j, "tp_comm_seconds", json_real(d->tp_comm_seconds));
        json_object_set_new(j, "tp_comm_fraction_of_training", num_or_null(r->train_seconds > 0 ? d->tp_comm_seconds / r->train_seconds : NAN));
        json_object_set_new(j, "tp_bytes_sent_per_step", json_real((double)d->tp_bytes_sent / ts));
        json_object_set_new(j, "tp_formula_bytes_per_step", json_real((double)d->tp_formula_bytes));
    }
    return j;
}

static void print_json(const train_args *a, const train_report *r) {
    char dev[32];
    json_t *j = json_object();
    json_object_set_new(j, "recipe", json_string(r->recipe));
    json_object_set_new(j, "kind", json_string(r->kind));
    json_object_set_new(j, "device", json_string(fm_device_name(a->device, dev, sizeof dev)));
    json_object_set_new(j, "precision", json_string(fm_precision_name(a->eo.precision)));
    json_object_set_new(j, "checkpointing", json_string(fm_checkpointing_name(a->eo.checkpointing)));
    json_object_set_new(j, "grad_accum", json_integer(a->eo.grad_accum));
    json_object_set_new(j, "batch", int_or_null(r->batch));
    json_object_set_new(j, "epochs", int_or_null(r->epochs));
    json_object_set_new(j, "steps", int_or_null(r->steps));
    json_object_set_new(j, "num_params", int_or_null(r->num_params));
    json_object_set_new(j, "train_loss", num_or_null(r->train_loss));
    json_object_set_new(j, "val_loss", num_or_null(r->val_loss));
    json_object_set_new(j, "test_loss", num_or_null(r->test_loss));
    json_object_set_new(j, "test_accuracy", num_or_null(r->test_accuracy));
    json_object_set_new(j, "train_seconds", num_or_null(r->train_seconds));
    json_object_set_new(j, "samples_per_second", num_or_null(r->samples_per_second));
    json_object_set_new(j, "tokens_per_second", num_or_null(r->tokens_per_second));
    json_object_set_new(j, "data_wait_seconds", num_or_null(r->data_wait_seconds));
    json_object_set_new(j, "loss_scale", num_or_null(r->loss_scale));
    json_object_set_new(j, "skipped_steps", int_or_null(r->skipped_steps));
    json_object_set_new(j, "peak_memory_bytes", json_integer((json_int_t)r->peak_memory_bytes));
    json_t *mem = r->memory_json && r->memory_json[0] ? json_loads(r->memory_json, 0, NULL) : NULL;
    json_object_set_new(j, "memory", mem ? mem : json_null());
    json_object_set_new(j, "out", str_or_null(r->out));
    json_object_set_new(j, "model_path", r->model_path[0] ? json_string(r->model_path) : json_null());
    json_object_set_new(j, "world_size", json_integer(r->dist.world_size));
    json_object_set_new(j, "dist", dist_json(r));
    json_object_set_new(j, "nccl", json_boolean(fm_dist_uses_nccl(a->dist))); /* gradients all-reduced on the GPU */
    json_object_set_new(j, "trace", str_or_null(a->profile));
    json_object_set_new(j, "logdir", str_or_null(a->logdir));
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (s) printf("%s\n", s);
    free(s);
    json_decref(j);
}

static void print_text(const train_args *a, const train_report *r) {
    if (a->quiet) return;
    fprintf(stderr, "done: %lld steps", (long long)r->steps);
    if (r->epochs >= 0) fprintf(stderr, " (%lld epochs)", (long long)r->epochs);
    fprintf(stderr, " in %.1f s, %.0f samples/s", r->train_seconds, r->samples_per_second);
    if (isfinite(r->tokens_per_second)) fprintf(stderr, ", %.0f tokens/s", r->tokens_per_second);
    if (a->eo.loss_scaling) fprintf(stderr, ", loss scale %g, %lld steps skipped", r->loss_scale, (long long)r->skipped_steps);
    if (isfinite(r->test_accuracy)) fprintf(stderr, ", test accuracy %.2f%%", 100 * r->test_accuracy);
    if (isfinite(r->val_loss)) fprintf(stderr, ", val loss %.4f", r->val_loss);
    fprintf(stderr, "\n");
    if (!a->json && r->memory_text && r->memory_text[0]) fprintf(stderr, "%s\n", r->memory_text);
    const fm_dist_report *d = &r->dist;
    if (fm_dist_uses_nccl(a->dist)) fprintf(stderr, "collectives: NCCL on the GPU of each rank\n");
    const int n_dp = d->world_size / (d->tensor_parallel > 1 ? d->tensor_parallel : 1);
    if (n_dp > 1) {
        const double n = n_dp, steps = d->steps > 0 ? (double)d->steps : 1;
        fprintf(stderr, "data parallel: %d ranks%s, %d bucket%s; communication %.2f s (%.1f%% of training), %.0f%% of it "
                "overlapped with backward; %.2f MB sent per rank per step (ring: 2(N-1)/N x %.2f MB of gradients = %.2f MB); "
                "optimizer state %.2f MB per rank\n",
                n_dp, d->zero ? " with ZeRO-1" : "", d->buckets, d->buckets == 1 ? "" : "s", d->comm_seconds,
                r->train_seconds > 0 ? 100 * d->comm_seconds / r->train_seconds : 0.0, 100 * d->overlapped_fraction,
                (double)d->bytes_sent / steps / 1e6, (double)d->grad_bytes / 1e6,
                2 * (n - 1) / n * (double)d->grad_bytes / 1e6, (double)d->optimizer_state_bytes / 1e6);
    }
    if (d->tensor_parallel > 1)
        fprintf(stderr, "tensor parallel: groups of %d ranks; their collectives %.2f s (%.1f%% of training); %.3f MB sent per "
                "rank per step (formula: %.3f MB)\n", d->tensor_parallel, d->tp_comm_seconds,
                r->train_seconds > 0 ? 100 * d->tp_comm_seconds / r->train_seconds : 0.0,
                (double)d->tp_bytes_sent / (d->tp_steps > 0 ? (double)d->tp_steps : 1) / 1e6, (double)d->tp_formula_bytes / 1e6);
    if (a->profile) fprintf(stderr, "trace: %s (open in ui.perfetto.dev, or: fathom profile %s)\n", a->profile, a->profile);
    if (a->logdir) fprintf(stderr, "logs: %s (TensorBoard event files; or: fathom plot %s -o curves.svg)\n", a->logdir, a->logdir);
    if (r->model_path[0])
        fprintf(stderr, "model saved to %s (%s %s)\n", r->model_path,
                !strcmp(r->kind, "gpt") ? "fathom generate" : "fathom eval / fathom predict", r->out);
}

/* Data parallel: the whole batch must split evenly over the ranks (a usage error on every rank alike). */
static bool batch_splits(const train_args *a, int64_t batch) {
    const int tp = a->tensor_parallel > 1 ? (int)a->tensor_parallel : 1, n = (a->dist ? fm_dist_size(a->dist) : 1) / tp;
    if (n < 2 || batch % n == 0) return true;
    if (fm_dist_rank(a->dist) == 0)
        fm_cli_error("train: the batch (%lld) does not split evenly over %d %s: give --batch a multiple of %d (it is the "
                     "whole batch over all ranks)", (long long)batch, n, tp > 1 ? "data-parallel groups" : "ranks", n);
    return false;
}

/* --tensor-parallel T: what must hold before any data is read (usage errors; rank 0 says
 * them). The vocabulary of a char tokenizer is known only from the corpus: checked then. */
static bool tp_fits(const train_args *a, const fm_gpt_train_opts *o) {
    const int T = (int)a->tensor_parallel, world = a->dist ? fm_dist_size(a->dist) : 1;
    const bool say = !a->dist || fm_dist_rank(a->dist) == 0;
    if (T <= 1) return true;
    fm_gpt_config c = o->model;
    c.vocab_size = o->tokenizer == FM_TOK_BPE ? o->tokenizer_vocab : o->tokenizer == FM_TOK_BYTE ? 256 : T;
    const char *why = NULL;
    char msg[512];
    if (world % T) {
        snprintf(msg, sizeof msg, "--tensor-parallel %d needs a world of a multiple of %d ranks (world size = tensor "
                 "parallel x data parallel), got %d: start the job with mpirun -np %d (or %d, ...)", T, T, world, T, 2 * T);
        why = msg;
    } else if (fm_gpt_tp_check(&c, T)) {
        why = fm_last_error();
    } else if (a->zero && world / T < 2) {
        snprintf(msg, sizeof msg, "--zero 1 with --tensor-parallel %d shards the optimizer state over the data-parallel "
                 "ranks (world / %d = %d here): start the job with mpirun -np %d (or more), or drop --zero", T, T,
                 world / T, 2 * T);
        why = msg;
    }
    if (why && say) fm_cli_error("train: %s", why);
    return !why;
}

/* A fresh run into a directory that holds an earlier one: refused unless --overwrite
 * (fm_cli_out_guard, cli/out_dir.c). */
static int out_guard(const train_args *a, const char *out) {
    return a->resume || a->overwrite ? 0 : fm_cli_out_guard("train", out, true);
}

static int run_classifier(const train_args *a, const char *path, train_report *rep) {
    if (a->corpus || a->sample >= 0 || a->tensor_parallel > 1) {
        fm_cli_error("train: %s applies to GPT recipes only; %s is a classifier recipe",
                     a->corpus ? "--corpus" : a->sample >= 0 ? "--sample" : "--tensor-parallel (splitting attention heads, "
                     "MLP columns and the vocabulary over ranks)", a->recipe);
        return 2;
    }
    fm_train_options o;
    fm_train_options_init(&o);
    o.epochs = a->epochs > 0 ? (int)a->epochs : 0;
    o.steps = a->steps > 0 ? a->steps : 0;
    o.batch_size = a->batch > 0 ? a->batch : 0;
    o.lr = a->lr > 0 ? a->lr : 0;
    o.seed = a->seed;
    o.threads = a->threads > 0 ? (int)a->threads : 0;
    o.max_steps = a->stop_after > 0 ? a->stop_after : 0;
    o.skip_eval = a->no_eval;
    o.hist_every = (int)a->hist_every;
    o.profile_path = a->profile;
    o.logdir = a->logdir;
    o.eff = a->eo;
    o.log = a->quiet ? NULL : stderr;
    o.dist = a->dist;
    o.zero = (int)a->zero;
    o.bucket_bytes = a->bucket_bytes;
    fm_recipe r;
    if (fm_recipe_load(path, &r) != FM_OK) { fm_cli_error("%s", fm_last_error()); return 1; }
    /* bad flag combinations are usage errors, before any data is read */
    fm_efficiency_opts ev = o.eff; /* --checkpointing blocks on a conv net: per block (its pooling layers) */
    if (ev.checkpointing == FM_CKPT_BLOCKS && fm_recipe_num_blocks(&r) > 0) ev.checkpointing = FM_CKPT_NONE;
    if (fm_efficiency_validate(&ev, false, (int)(o.batch_size > 0 ? o.batch_size : r.batch_size))) {
        fm_cli_error("train: %s%s", fm_last_error(), o.batch_size > 0 ? "" : " (the recipe's batch; set another with --batch)");
        fm_recipe_free(&r);
        return 2;
    }
    if (!batch_splits(a, o.batch_size > 0 ? o.batch_size : r.batch_size)) { fm_recipe_free(&r); return 2; }
    static char outbuf[PATH_MAX];
    const char *out = a->out ? a->out : a->resume_dir;
    if (!out) { snprintf(outbuf, sizeof outbuf, "runs/%s", r.name); out = outbuf; }
    if (a->resume && !a->resume_dir) o.resume_dir = out; /* bare --resume: the --out directory */
    else o.resume_dir = a->resume_dir;
    o.out_dir = out;
    if (out_guard(a, out)) { fm_recipe_free(&r); return 1; }
    fm_train_result res;
    fm_status st = fm_train(&r, &o, &res);
    rep->batch = o.batch_size > 0 ? o.batch_size : r.batch_size;
    fm_recipe_free(&r);
    if (st != FM_OK) { fm_cli_error("%s", fm_last_error()); fm_train_result_free(&res); return 1; }
    rep->kind = "classifier";
    rep->out = out;
    snprintf(rep->model_path, sizeof rep->model_path, "%s", res.model_path);
    rep->train_loss = res.final_loss;
    rep->test_loss = res.test_accuracy >= 0 ? res.test_loss : NAN;
    rep->test_accuracy = res.test_accuracy >= 0 ? res.test_accuracy : NAN;
    rep->steps = res.steps;
    rep->epochs = res.epochs;
    rep->num_params = res.num_params;
    rep->train_seconds = res.train_seconds;
    rep->samples_per_second = res.samples_per_second;
    rep->data_wait_seconds = res.data_wait_seconds;
    rep->loss_scale = res.loss_scale;
    rep->skipped_steps = res.skipped_steps;
    rep->peak_memory_bytes = res.peak_memory_bytes;
    rep->dist = res.dist;
    static char mj[1024], mt[1024];
    memcpy(mj, res.memory_report_json, sizeof mj);
    memcpy(mt, res.memory_report_text, sizeof mt);
    rep->memory_json = mj;
    rep->memory_text = mt;
    fm_train_result_free(&res);
    return 0;
}

/* The GPT trainer resumes in place: --resume DIR is its --out. */
static int gpt_options(const train_args *a, const char *out, fm_gpt_train_opts *o) {
    if (a->resume_dir && a->out && strcmp(a->resume_dir, a->out)) {
        fm_cli_error("train: GPT recipes resume in place: --resume %s and --out %s must name the same directory", a->resume_dir,
                     a->out);
        return 2;
    }
    o->out_dir = out;
    if (a->corpus) o->corpus = a->corpus;
    if (a->steps > 0) o->steps = a->steps;
    if (a->epochs > 0) o->epochs = (int)a->epochs;
    if (a->stop_after > 0) o->stop_after = a->stop_after;
    if (a->sample >= 0) o->sample_tokens = (int)a->sample;
    if (a->seed >= 0) o->seed = (uint64_t)a->seed;
    if (a->batch > 0) o->batch_size = (int)a->batch;
    if (a->lr > 0) { o->min_lr *= a->lr / o->lr; o->lr = a->lr; }
    o->resume = a->resume;
    o->no_eval = a->no_eval;
    o->quiet = a->quiet;
    o->eff = a->eo;
    o->profile_path = a->profile;
    o->logdir = a->logdir;
    o->hist_every = a->hist_every > 0 ? a->hist_every : 0;
    o->dist = a->dist;
    o->zero = (int)a->zero;
    o->bucket_bytes = a->bucket_bytes;
    o->tensor_parallel = (int)a->tensor_parallel;
    if (!tp_fits(a, o) || !batch_splits(a, o->batch_size)) return 2;
    /* the recipe's batch size is known only now */
    if (fm_efficiency_validate(&o->eff, true, o->batch_size)) {
        fm_cli_error("train: %s (%d is the recipe's batch_size; set another with --batch)", fm_last_error(), o->batch_size);
        return 2;
    }
    return 0;
}

static int run_gpt(const train_args *a, const char *path, train_report *rep) {
    fm_gpt_recipe rec; /* src/gpt/gpt_recipe.c: the parser `fathom summary` uses too */
    if (fm_gpt_recipe_load(path, &rec)) { fm_cli_error("%s", fm_last_error()); return 2; }
    fm_gpt_train_opts o = rec.opts;
    static char def_out[PATH_MAX];
    const char *base = strrchr(a->recipe, '/') ? strrchr(a->recipe, '/') + 1 : a->recipe;
    snprintf(def_out, sizeof def_out, "runs/%.*s", (int)(strstr(base, ".ini") ? strstr(base, ".ini") - base : (long)strlen(base)), base);
    const char *out = a->out ? a->out : a->resume_dir ? a->resume_dir : def_out;
    int rc = gpt_options(a, out, &o);
    if (!rc) rc = out_guard(a, out);
    if (rc) { fm_gpt_recipe_free(&rec); return rc; }
    if (a->threads > 0) fm_set_num_threads((int)a->threads);
    fm_gpt_train_result r;
    fm_status st = fm_gpt_train_ex(&o, &r);
    fm_gpt_recipe_free(&rec);
    if (st) { fm_cli_error("%s", fm_last_error()); return 1; }
    rep->kind = "gpt";
    rep->out = out;
    snprintf(rep->model_path, sizeof rep->model_path, "%s/model.safetensors", out);
    rep->train_loss = r.train_loss;
    rep->val_loss = r.val_loss;
    rep->steps = r.steps;
    rep->batch = o.batch_size;
    rep->num_params = r.num_params;
    rep->train_seconds = r.train_seconds;
    rep->tokens_per_second = r.tokens_per_second;
    rep->samples_per_second = r.tokens_per_second / o.model.block_size;
    rep->data_wait_seconds = r.data_seconds;
    rep->loss_scale = r.loss_scale;
    rep->skipped_steps = r.skipped_steps;
    rep->peak_memory_bytes = r.peak_memory_bytes;
    rep->dist = r.dist;
    static char mj[1024], mt[1024];
    memcpy(mj, r.memory_report_json, sizeof mj);
    memcpy(mt, r.memory_report_text, sizeof mt);
    rep->memory_json = mj;
    rep->memory_text = mt;
    return 0;
}

/* A recipe that is not there: a usage error, with the nearest built-in name. */
static int missing_recipe(const char *name, const char *path, bool builtin) {
    if (!builtin) { fm_cli_error("cannot open recipe %s: %s", path, strerror(errno)); return 2; }
    char dir[PATH_MAX], names[64][64];
    const char *ptrs[64];
    int n = 0;
    DIR *d = opendir(fm_recipe_dir(dir, sizeof dir));
    for (struct dirent *e; d && n < 64 && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l > 4 && l < 64 && !strcmp(e->d_name + l - 4, ".ini")) {
            snprintf(names[n], sizeof names[n], "%.*s", (int)(l - 4), e->d_name);
            ptrs[n] = names[n];
            n++;
        }
    }
    if (d) closedir(d);
    const char *near = fm_cli_suggest(name, ptrs, n);
    if (near) fm_cli_error("no built-in recipe named '%s' (did you mean '%s'? `fathom recipes` lists them)", name, near);
    else fm_cli_error("no built-in recipe named '%s' (looked for %s; `fathom recipes` lists them)", name, path);
    return 2;
}

static uint64_t hash_str(const char *s) { return s ? fm_dist_hash(1, s, strlen(s)) : 0; }

static uint64_t hash_file(const char *path) {
    FILE *f = fopen(path, "rb");
    uint64_t h = 0;
    char buf[8192];
    size_t n;
    while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) h = fm_dist_hash(h, buf, n);
    if (f) fclose(f);
    return h;
}

/* Every rank must train the same thing: the recipe's text and each resolved flag are
 * compared across the ranks before any work, and a difference is named. 0 or 2. */
static int check_same_config(const train_args *a, const char *path) {
    const fm_efficiency_opts *e = &a->eo;
    char dev[32];
    fm_device_name(a->device, dev, sizeof dev);
#define NUM(x) fm_dist_hash(0, &(x), sizeof(x))
    const struct { const char *what; uint64_t h; } f[] = {
        {"the recipe file's contents", hash_file(path)}, {"the recipe name", hash_str(a->recipe)},
        {"--steps", NUM(a->steps)}, {"--epochs", NUM(a->epochs)}, {"--batch", NUM(a->batch)}, {"--lr", NUM(a->lr)},
        {"--seed", NUM(a->seed)}, {"--stop-after", NUM(a->stop_after)}, {"--no-eval", NUM(a->no_eval)},
        {"--resume", NUM(a->resume) ^ hash_str(a->resume_dir)}, {"--out", hash_str(a->out)},
        {"--corpus", hash_str(a->corpus)}, {"--device", hash_str(dev)}, {"--precision", NUM(e->precision)},
        {"--checkpointing", NUM(e->checkpointing)}, {"--grad-accum", NUM(e->grad_accum)},
        {"--memory-limit", NUM(e->memory_limit)}, {"--zero", NUM(a->zero)}, {"--bucket-size", NUM(a->bucket_bytes)},
        {"--dist-timeout", NUM(a->dist_timeout)}, {"--tensor-parallel", NUM(a->tensor_parallel)}};
#undef NUM
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (fm_dist_check_same(a->dist, f[i].h, f[i].what) != FM_OK) { /* every rank finds it: rank 0 says it */
            if (fm_dist_rank(a->dist) == 0) fm_cli_error("train: %s", fm_last_error());
            return 2;
        }
    return 0;
}

/* --device cuda under mpirun: each rank takes the GPU of its local rank (an explicit
 * cuda:N is kept as given) and the ranks' collectives on it go through NCCL (a world of
 * one too, where NCCL is built: the smoke test of tools/gpu-check.sh). After the ranks
 * agreed on the flags; a failure here is one rank's (1: the job ends). 0 or the exit code. */
static int dist_device(train_args *a) {
    if (a->device.type != FM_DEV_CUDA || !fm_dist_uses_mpi(a->dist)) return 0;
    if (fm_dist_size(a->dist) < 2 && !fm_dist_nccl_built()) return 0; /* alone: nothing to reduce */
    if (!strchr(a->device_str ? a->device_str : "", ':')) a->device.index = fm_dist_local_rank(a->dist);
    if (fm_cli_device_check("train", a->device_str, a->device)) return 1;
    a->eo.device = a->device;
    char dev[32];
    if (fm_dist_use_device(a->dist, a->device) != FM_OK) {
        fm_cli_error("train: rank %d: --device %s over MPI: %s", fm_dist_rank(a->dist),
                     fm_device_name(a->device, dev, sizeof dev), fm_last_error());
        return 1;
    }
    return 0;
}

/* Joins the MPI world (a world of one without mpirun) and checks the ranks agree; the
 * ranks other than 0 train silently. 0, or the exit code. */
static int dist_begin(train_args *a, const char *path) {
    if (fm_dist_init(&a->dist) != FM_OK) { fm_cli_error("train: %s", fm_last_error()); return 1; }
    if (a->dist_timeout > 0) fm_dist_set_timeout(a->dist, a->dist_timeout);
    int n = fm_dist_size(a->dist);
    if (a->zero && n < 2) {
        fm_cli_error("train: --zero 1 shards the optimizer state across MPI ranks: start the job with mpirun -np N "
                     "(N >= 2)%s; on one process it would change nothing", fm_dist_mpi_built() ? "" : " in a fathom built with MPI");
        return 2;
    }
    if (n < 2) return dist_device(a);
    /* the ranks on one machine share its cores: each takes its share unless told */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (a->threads <= 0 && !getenv("FATHOM_NUM_THREADS") && cores > 0) {
        a->threads = cores / fm_dist_local_size(a->dist);
        if (a->threads < 1) a->threads = 1;
    }
    int rc = check_same_config(a, path);
    if (rc == 0) rc = dist_device(a);
    if (rc == 0 && fm_dist_rank(a->dist) != 0) { /* rank 0 speaks for the job */
        a->quiet = true;
        a->json = false;
        a->logdir = a->profile = NULL;
        a->hist_every = 0;
    }
    return rc;
}

int fm_cmd_train(int argc, char **argv) {
    train_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc < 0) return 0;
    if (rc) { train_usage(stderr); return rc; }
    /* no silent fallback: why the device is not usable, before any work (index out of range: 2) */
    int drc = fm_cli_device_check("train", a.device_str, a.device);
    if (drc) return drc;
    a.eo.device = a.device;
    char path[PATH_MAX];
    bool builtin = fm_recipe_resolve(a.recipe, path, sizeof path);
    if (access(path, R_OK) != 0) return missing_recipe(a.recipe, path, builtin);
    train_report rep = {.recipe = a.recipe, .train_loss = NAN, .val_loss = NAN, .test_loss = NAN, .test_accuracy = NAN,
                        .tokens_per_second = NAN, .epochs = -1, .dist = {.world_size = 1}};
    if ((rc = dist_begin(&a, path)) == 0)
        rc = fm_gpt_recipe_is_gpt(path) ? run_gpt(&a, path, &rep) : run_classifier(&a, path, &rep);
    /* a rank that fails alone (1) would leave the others waiting in a collective: end the
     * job; usage errors (2) are found alike on every rank before any collective */
    if (rc == 1 && a.dist && fm_dist_size(a.dist) > 1) fm_dist_abort(a.dist, rc);
    if (rc == 0 && a.json) print_json(&a, &rep);
    if (rc == 0) print_text(&a, &rep);
    fm_dist_finalize(a.dist);
    return rc;
}
