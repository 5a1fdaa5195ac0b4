/* `fathom plan`: will a job fit, on which GPU, and what will it cost.
 * Thin by design: it parses options into the fm_plan_* structs, calls the
 * library and prints. All arithmetic lives in src/plan/. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"    /* fm_cli_error */
#include "fathom/plan.h" /* the planner */

#define PRECISION_CHOICES "fp32, bf16, fp16, int8, int4, fp8"

static void usage(FILE *f) {
    fputs("usage: fathom plan MODEL [job options] [output options]\n"
          "\n"
          "MODEL (exactly one):\n"
          "  --preset NAME          a known model (see --list-presets): gpt2-124m, llama-2-7b, llama-3-70b, ...\n"
          "  --params N             a parameter count: 7B, 124M, 1.5e9 (shape estimated)\n"
          "  --arch gpt|llama|bert --layers N --hidden N --heads N [--kv-heads N] [--ffn N] --vocab N [--max-seq N]\n"
          "  --model PATH           a safetensors file, a Hugging Face config.json (llama, mistral, mixtral,\n"
          "                         qwen2, gemma, gpt2, bert; no weights needed) or a directory holding\n"
          "                         either; a fathom model directory (headers only are read)\n"
          "  --model MODEL.onnx|GRAPH_DIR   an inference graph (an ONNX file, imported as `fathom import`\n"
          "                         does, or a graph directory): one inference by fathom's graph runner on the\n"
          "                         meta device: weights, inputs, the run's peak, FLOPs and bytes; takes --batch,\n"
          "                         --dim NAME=SIZE (repeatable: the other dynamic dims) and --json\n"
          "  --model RECIPE         a fathom recipe (.ini or a built-in name): the peak memory of its\n"
          "                         `fathom train` run on this CPU; takes --batch (default: the recipe's),\n"
          "                         --precision fp32|bf16|fp16, --checkpointing none|blocks|selective\n"
          "                         (\"full\" = blocks), --grad-accum N, --no-eval, --json, --explain; a GPT\n"
          "                         recipe also --ranks N [--tensor-parallel T] [--zero 1]: one rank of\n"
          "                         `mpirun -np N fathom train` (its part of the batch, split and state)\n"
          "\n"
          "Job:\n"
          "  --task inference|finetune|train|lora|qlora      (default inference)\n"
          "  --precision fp32|bf16|fp16|int8|int4|fp8        (default bf16; fp8 on GPUs with fp8 tensor cores)\n"
          "  --batch N              micro-batch per GPU (default 1)\n"
          "  --seq N                sequence length (default min(2048, model context))\n"
          "  --optimizer adamw|sgd|adam8bit                  (default adamw)\n"
          "  --checkpointing none|selective|full             (default none)\n"
          "  --zero 0|1|2|3         ZeRO stage (default 0)\n"
          "  --tensor-parallel N    (default 1; must divide the attention heads)\n"
          "  --pipeline-parallel N  pipeline stages for training (default 1)\n"
          "  --micro-batches N      micro-batches per step (default 1; 4 x stages with a pipeline)\n"
          "  --virtual-stages V     interleaved pipeline: V model chunks per stage (default 1: plain 1F1B)\n"
          "  --sequence-parallel    split norm/dropout activations across the tensor-parallel group\n"
          "  --expert-parallel N    spread a mixture of experts' experts over N GPUs (all-to-all)\n"
          "  --gpus N               GPUs to use (default: as many as needed)\n"
          "  --tokens D             training tokens (train defaults to 20 x params); for inference, output tokens\n"
          "  --requests-per-second R --output-tokens N       plan serving for R requests/s\n"
          "  --lora-rank N          (default 16)\n"
          "  --attention flash|eager                         (default flash: no s^2 scores kept)\n"
          "  --kv-cache-dtype auto|fp8|int8                 inference KV cache in 8 bits (default auto: 16)\n"
          "  --decode-kv-reads grouped|per-query-head       how often a decode step reads a grouped-query\n"
          "                         model's KV heads: once (default) or once per query head (engines\n"
          "                         without a GQA decode kernel, e.g. TensorRT-LLM before 0.8)\n"
          "  --no-master-weights    16-bit training without an fp32 master copy\n"
          "  --optimizer-in-backward  free each gradient right after its update\n"
          "  --offload-optimizer    keep optimizer state in CPU memory (paged/offloaded optimizers)\n"
          "  --chunked-loss         compute the loss over vocabulary chunks (no full fp32 logits)\n"
          "  --fused-loss           a fused cross-entropy kernel: 16-bit logits and gradient only\n"
          "  --no-dropout           the model trains without dropout: no dropout masks kept\n"
          "  --mfu F                model FLOPs utilization (default: the GPU's figure in the database,\n"
          "                         per precision; qlora 3/4 of it)\n"
          "  --decode-efficiency F  fraction of bandwidth decoding reaches (default 0.80)\n"
          "  --context-gib F        CUDA context + framework per GPU (default 1.0)\n"
          "  --headroom F           caching-allocator reserve over allocated (default 0.10)\n"
          "\n"
          "GPUs and prices:\n"
          "  --gpu NAME[,NAME...]   only these GPUs (\"4090\", \"h100 sxm\")\n"
          "  --pricing on-demand|spot|reserved              ranking prices (default on-demand)\n"
          "  --budget USD           the fastest recommendation must cost at most this\n"
          "  --gpu-db FILE          GPU database (default $FATHOM_GPU_DB or data/gpus.json)\n"
          "\n"
          "Output:\n"
          "  --json                 one JSON object\n"
          "  --explain              every formula with its numbers, then the plan\n"
          "  --list-presets, --list-gpus, --help\n",
          f);
}

/* Whole numbers only: "12", not "12.5", "-3", "1e3" or "lots". */
static int parse_int(const char *opt, const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s) { fm_cli_error("%s needs a value", opt); return 0; }
    const char *p = s;
    if (*p == '+') p++;
    if (*s == '-') {
        fm_cli_error("%s %s: must not be negative (%lld..%lld)", opt, s, lo, hi);
        return 0;
    }
    if (!isdigit((unsigned char)*p)) {
        fm_cli_error("%s \"%s\": not a whole number", opt, s);
        return 0;
    }
    errno = 0;
    char *end = NULL;
    long long v = strtoll(p, &end, 10);
    if (*end) {
        fm_cli_error("%s \"%s\": not a whole number", opt, s);
        return 0;
    }
    if (errno == ERANGE || v > hi) {
        fm_cli_error("%s %s: too large (at most %lld)", opt, s, hi);
        return 0;
    }
    if (v < lo) {
        fm_cli_error("%s %s: must be at least %lld", opt, s, lo);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_real(const char *opt, const char *s, double lo, double hi, double *out) {
    if (!s || !*s) { fm_cli_error("%s needs a value", opt); return 0; }
    errno = 0;
    char *end = NULL;
    double v = strtod(s, &end);
    if (*end || end == s || errno == ERANGE || v != v) {
        fm_cli_error("%s \"%s\": not a number", opt, s);
        return 0;
    }
    if (v < lo || v > hi) {
        fm_cli_error("%s %s: out of range (%g..%g)", opt, s, lo, hi);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_enum(const char *opt, const char *s, int v, const char *choices) {
    if (v < 0) fm_cli_error("%s \"%s\": expected one of %s", opt, s ? s : "", choices);
    return v;
}

static void list_presets(void) {
    for (int i = 0; i < fm_plan_preset_count(); i++) {
        fm_plan_model m;
        if (fm_plan_model_preset(fm_plan_preset_name(i), &m) == FM_OK)
            printf("%-16s %10.4g B params\n", m.name, (double)m.params / 1e9);
    }
}

static const char *const known_opts[] = {
    "--preset", "--params", "--arch", "--layers", "--hidden", "--heads", "--kv-heads", "--ffn", "--vocab", "--max-seq",
    "--model", "--task", "--precision", "--batch", "--seq", "--optimizer", "--checkpointing", "--zero",
    "--tensor-parallel", "--pipeline-parallel", "--micro-batches", "--virtual-stages", "--expert-parallel", "--sequence-parallel",
    "--gpus", "--tokens", "--requests-per-second", "--output-tokens", "--lora-rank",
    "--attention", "--kv-cache-dtype", "--decode-kv-reads", "--no-master-weights", "--optimizer-in-backward", "--offload-optimizer", "--chunked-loss",
    "--fused-loss", "--no-dropout", "--mfu", "--decode-efficiency", "--context-gib", "--headroom", "--gpu", "--pricing", "--budget", "--gpu-db",
    "--json", "--explain", "--list-presets", "--list-gpus", "--help", "--grad-accum", "--no-eval", "--ranks", "--dim",
};

/* Options a recipe plan (fathom's own CPU run) takes; the others describe GPU jobs. */
static int recipe_option(const char *opt) {
    static const char *const ok[] = {"--model", "--batch", "--precision", "--checkpointing", "--grad-accum",
                                     "--no-eval", "--json", "--explain", "--task", "--ranks", "--tensor-parallel",
                                     "--zero"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(opt, ok[i])) return 1;
    return 0;
}

/* Options a graph plan (one inference of an ONNX file or graph directory) takes. */
static int graph_option(const char *opt) {
    static const char *const ok[] = {"--model", "--batch", "--dim", "--json"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(opt, ok[i])) return 1;
    return 0;
}

/* Levenshtein distance for "did you mean" on misspelt options. */
static int distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            d[i][j] = c;
        }
    return d[n][m];
}

static void unknown_option(const char *opt) {
    const char *best = NULL;
    int bd = 1 << 30;
    for (size_t i = 0; i < sizeof known_opts / sizeof known_opts[0]; i++) {
        int dd = distance(opt, known_opts[i]);
        if (dd < bd) { bd = dd; best = known_opts[i]; }
    }
    if (best && bd <= 4) fm_cli_error("unknown option %s (did you mean %s?); see fathom plan --help", opt, best);
    else fm_cli_error("unknown option %s; see fathom plan --help", opt);
}

static int takes_value(const char *opt) {
    static const char *const flags[] = {"--no-master-weights", "--optimizer-in-backward", "--offload-optimizer", "--sequence-parallel",
                                        "--chunked-loss", "--fused-loss", "--no-dropout", "--no-eval", "--json", "--explain", "--list-presets", "--list-gpus",
                                        "--help", "-h"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(opt, flags[i])) return 0;
    return 1;
}

/* Everything the command line said. */
typedef struct plan_args {
    fm_plan_job job;
    const char *preset, *params, *arch, *model_path, *gpu, *db_path;
    long long layers, hidden, heads, kv_heads, ffn, vocab, max_seq;
    int json, explain, list_p, list_g, dims_given, help;
    /* recipe plans: what was given explicitly (their defaults differ from GPU plans') */
    int batch_given, precision_given, no_eval;
    long long grad_accum, ranks;
    const char *ckpt_text, *foreign;
    const char *dims[FM_PLAN_GRAPH_MAX_DIMS]; /* graph plans: --dim NAME=SIZE */
    int n_dims;
    const char *graph_foreign; /* the first option a graph plan does not take */
} plan_args;

/* One option with its value (NULL for flags). Returns 0 to go on, else the exit code. */
static int apply_option(plan_args *a, const char *opt, const char *val) {
    fm_plan_job *job = &a->job;
    long long v = 0;
    double d = 0;
#define INT_OPT(name, lo, hi, dst) else if (!strcmp(opt, name)) { if (!parse_int(opt, val, lo, hi, &v)) return 2; dst = v; }
#define REAL_OPT(name, lo, hi, dst) else if (!strcmp(opt, name)) { if (!parse_real(opt, val, lo, hi, &d)) return 2; dst = d; }
#define ENUM_OPT(name, parse, choices, dst, type) \
    else if (!strcmp(opt, name)) { int e = parse_enum(opt, val, parse(val), choices); if (e < 0) return 2; dst = (type)e; }
    if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) a->help = 1;
    else if (!strcmp(opt, "--preset")) a->preset = val;
    else if (!strcmp(opt, "--params")) a->params = val;
    else if (!strcmp(opt, "--arch")) a->arch = val;
    else if (!strcmp(opt, "--model")) a->model_path = val;
    else if (!strcmp(opt, "--gpu")) a->gpu = val;
    else if (!strcmp(opt, "--gpu-db")) a->db_path = val;
    else if (!strcmp(opt, "--json")) a->json = 1;
    else if (!strcmp(opt, "--explain")) a->explain = 1;
    else if (!strcmp(opt, "--list-presets")) a->list_p = 1;
    else if (!strcmp(opt, "--list-gpus")) a->list_g = 1;
    else if (!strcmp(opt, "--no-master-weights")) job->master_weights = 0;
    else if (!strcmp(opt, "--optimizer-in-backward")) job->optimizer_in_backward = 1;
    else if (!strcmp(opt, "--offload-optimizer")) job->offload_optimizer = 1;
    else if (!strcmp(opt, "--chunked-loss")) job->chunked_loss = 1;
    else if (!strcmp(opt, "--fused-loss")) job->fused_loss = 1;
    else if (!strcmp(opt, "--no-dropout")) job->no_dropout = 1;
    else if (!strcmp(opt, "--sequence-parallel")) job->sequence_parallel = 1;
    else if (!strcmp(opt, "--no-eval")) a->no_eval = 1;
    else if (!strcmp(opt, "--dim")) {
        if (a->n_dims >= FM_PLAN_GRAPH_MAX_DIMS) { fm_cli_error("--dim: at most %d", FM_PLAN_GRAPH_MAX_DIMS); return 2; }
        a->dims[a->n_dims++] = val;
    }
    INT_OPT("--grad-accum", 1, 1000000, a->grad_accum)
    INT_OPT("--ranks", 1, 65536, a->ranks)
    INT_OPT("--layers", 1, 10000, a->layers)
    INT_OPT("--hidden", 1, 1000000, a->hidden)
    INT_OPT("--heads", 1, 100000, a->heads)
    INT_OPT("--kv-heads", 1, 100000, a->kv_heads)
    INT_OPT("--ffn", 1, 10000000, a->ffn)
    INT_OPT("--vocab", 1, 100000000, a->vocab)
    INT_OPT("--max-seq", 1, 100000000, a->max_seq)
    INT_OPT("--batch", 1, 1000000, job->batch)
    INT_OPT("--seq", 1, 10000000, job->seq)
    INT_OPT("--zero", 0, 3, job->zero)
    INT_OPT("--tensor-parallel", 1, 1024, job->tensor_parallel)
    INT_OPT("--pipeline-parallel", 1, 1024, job->pipeline_parallel)
    INT_OPT("--micro-batches", 1, 100000, job->micro_batches)
    INT_OPT("--virtual-stages", 1, 1024, job->virtual_stages)
    INT_OPT("--expert-parallel", 1, 4096, job->expert_parallel)
    INT_OPT("--gpus", 1, 65536, job->gpus)
    INT_OPT("--output-tokens", 1, 10000000, job->output_tokens)
    INT_OPT("--lora-rank", 1, 1000000, job->lora_rank)
    REAL_OPT("--requests-per-second", 1e-9, 1e9, job->requests_per_second)
    REAL_OPT("--mfu", 1e-6, 1, job->mfu)
    REAL_OPT("--decode-efficiency", 1e-6, 1, job->decode_efficiency)
    REAL_OPT("--context-gib", 0, 1024, job->context_gib)
    REAL_OPT("--headroom", 0, 10, job->headroom)
    REAL_OPT("--budget", 1e-9, 1e12, job->budget_usd)
    ENUM_OPT("--task", fm_plan_task_parse, "inference, finetune, train, lora, qlora", job->task, fm_plan_task)
    ENUM_OPT("--precision", fm_plan_precision_parse, PRECISION_CHOICES, job->precision, fm_plan_precision)
    ENUM_OPT("--optimizer", fm_plan_optimizer_parse, "adamw, sgd, adam8bit", job->optimizer, fm_plan_optimizer)
    ENUM_OPT("--pricing", fm_plan_pricing_parse, "on-demand, spot, reserved", job->pricing, fm_plan_pricing)
    else if (!strcmp(opt, "--tokens")) {
        if (fm_plan_parse_count(val, &job->tokens)) { fm_cli_error("--tokens: %s", fm_last_error()); return 2; }
    } else if (!strcmp(opt, "--checkpointing")) {
        if (!strcmp(val, "blocks")) job->checkpointing = FM_PLAN_CKPT_FULL;
        else {
            int e = parse_enum(opt, val, fm_plan_ckpt_parse(val), "none, selective, full");
            if (e < 0) return 2;
            job->checkpointing = (fm_plan_ckpt)e;
        }
    } else if (!strcmp(opt, "--kv-cache-dtype")) {
        /* vLLM's names: auto keeps the activations' 16 bits */
        if (!strcmp(val, "auto")) job->kv_cache_8bit = 0;
        else if (!strcmp(val, "fp8") || !strcmp(val, "int8")) job->kv_cache_8bit = val[0] == 'f' ? 1 : 2;
        else { fm_cli_error("--kv-cache-dtype \"%s\": expected auto, fp8 or int8", val); return 2; }
    } else if (!strcmp(opt, "--decode-kv-reads")) {
        if (!strcmp(val, "grouped")) job->kv_read_per_query_head = 0;
        else if (!strcmp(val, "per-query-head")) job->kv_read_per_query_head = 1;
        else { fm_cli_error("--decode-kv-reads \"%s\": expected grouped or per-query-head", val); return 2; }
    } else if (!strcmp(opt, "--attention")) {
        if (!strcmp(val, "flash")) job->flash_attention = 1;
        else if (!strcmp(val, "eager")) job->flash_attention = 0;
        else { fm_cli_error("--attention \"%s\": expected flash or eager", val); return 2; }
    }
#undef INT_OPT
#undef REAL_OPT
#undef ENUM_OPT
    return 0;
}

static int parse_args(int argc, char **argv, plan_args *a) {
    memset(a, 0, sizeof *a);
    fm_plan_job_defaults(&a->job);
    a->grad_accum = 1;
    for (int i = 1; i < argc; i++) {
        char *opt = argv[i], *val = NULL;
        const char *given = argv[i]; /* the option as written ("--gpu" or "--gpu=h100"), outliving buf */
        char buf[64];
        if (strncmp(opt, "--", 2) && strcmp(opt, "-h")) {
            fm_cli_error("unexpected argument \"%s\" (options start with --; see fathom plan --help)", opt);
            return 2;
        }
        char *eq = strchr(opt, '=');
        if (eq && (size_t)(eq - opt) < sizeof buf) {
            memcpy(buf, opt, (size_t)(eq - opt));
            buf[eq - opt] = 0;
            opt = buf;
            val = eq + 1;
        }
        int known = 0;
        for (size_t k = 0; k < sizeof known_opts / sizeof known_opts[0]; k++) known |= !strcmp(opt, known_opts[k]);
        if (!known && strcmp(opt, "-h")) { unknown_option(opt); return 2; }
        if (takes_value(opt) && !val) {
            if (i + 1 >= argc) { fm_cli_error("%s needs a value", opt); return 2; }
            val = argv[++i];
        }
        if (!recipe_option(opt) && !a->foreign) a->foreign = given;
        if (!graph_option(opt) && !a->graph_foreign) a->graph_foreign = given;
        if (!strcmp(opt, "--task") && strcmp(val, "train") && !a->foreign) a->foreign = "--task";
        if (!strcmp(opt, "--batch")) a->batch_given = 1;
        if (!strcmp(opt, "--precision")) a->precision_given = 1;
        if (!strcmp(opt, "--checkpointing")) a->ckpt_text = val;
        int rc = apply_option(a, opt, val);
        if (rc) return rc;
        if (a->help) return 0;
        if (!strcmp(opt, "--layers") || !strcmp(opt, "--hidden") || !strcmp(opt, "--heads") ||
            !strcmp(opt, "--kv-heads") || !strcmp(opt, "--ffn") || !strcmp(opt, "--vocab") || !strcmp(opt, "--max-seq"))
            a->dims_given = 1;
    }
    return 0;
}

/* `--model MODEL.onnx|GRAPH_DIR`: one inference by fathom's graph runner on the meta device. */
static int plan_graph(const plan_args *a) {
    const char *foreign = a->graph_foreign;
    if (foreign) {
        fm_cli_error("%s does not apply to an inference graph: `fathom plan --model MODEL.onnx|GRAPH_DIR` runs one inference "
                     "and takes --batch, --dim NAME=SIZE and --json", foreign);
        return 2;
    }
    fm_plan_graph_opts o;
    fm_plan_graph_defaults(&o);
    if (a->batch_given) o.batch = a->job.batch;
    char names[FM_PLAN_GRAPH_MAX_DIMS][64];
    for (int k = 0; k < a->n_dims; k++) {
        const char *eq = strchr(a->dims[k], '=');
        char *end = NULL;
        long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
        if (!eq || eq == a->dims[k] || (size_t)(eq - a->dims[k]) >= sizeof names[0] || !end || end == eq + 1 || *end || v < 1 ||
            v >= (1LL << 31)) {
            fm_cli_error("--dim %s: expected NAME=SIZE with SIZE in [1, 2^31)", a->dims[k]);
            return 2;
        }
        memcpy(names[k], a->dims[k], (size_t)(eq - a->dims[k]));
        names[k][eq - a->dims[k]] = 0;
        o.dim_names[k] = names[k], o.dim_values[k] = v;
    }
    o.n_dims = a->n_dims;
    fm_plan_graph_run run;
    fm_status st = fm_plan_run_graph(a->model_path, &o, &run);
    if (st) {
        fm_cli_error("%s", fm_last_error());
        return st == FM_ERR_INVALID ? 2 : 1;
    }
    char *text = a->json ? fm_plan_graph_render_json(&run) : fm_plan_graph_render_text(&run);
    if (!text) { fm_cli_error("%s", fm_last_error()); return 1; }
    fputs(text, stdout);
    if (a->json) fputc('\n', stdout);
    free(text);
    return 0;
}

/* `--model RECIPE`: fathom's own CPU training run. */
static int plan_recipe(const plan_args *a) {
    if (a->foreign) {
        fm_cli_error("%s does not apply to a recipe: `fathom plan --model RECIPE` plans fathom's own CPU training run "
                     "and takes --batch, --precision, --checkpointing, --grad-accum, --no-eval, --json, --explain (and for a GPT "
                     "recipe --ranks, --tensor-parallel, --zero)",
                     a->foreign);
        return 2;
    }
    fm_plan_run_opts ro;
    fm_plan_run_defaults(&ro);
    if (a->batch_given) ro.batch = a->job.batch;
    if (a->precision_given) ro.precision = a->job.precision;
    if (a->ckpt_text) ro.checkpointing = !strcmp(a->ckpt_text, "none") ? 0 : !strcmp(a->ckpt_text, "selective") ? 2 : 1;
    ro.grad_accum = (int)a->grad_accum;
    ro.eval = !a->no_eval;
    ro.ranks = (int)a->ranks;
    ro.tensor_parallel = a->job.tensor_parallel;
    ro.zero = a->job.zero;
    fm_plan_run run;
    fm_status st = fm_plan_run_recipe(a->model_path, &ro, a->explain, &run);
    if (st) {
        fm_cli_error("%s", fm_last_error());
        return st == FM_ERR_INVALID ? 2 : 1;
    }
    char *text = a->json ? fm_plan_run_render_json(&run) : a->explain ? fm_plan_run_render_explain(&run)
                                                                      : fm_plan_run_render_text(&run);
    fm_plan_run_free(&run);
    if (!text) { fm_cli_error("%s", fm_last_error()); return 1; }
    fputs(text, stdout);
    if (a->json) fputc('\n', stdout);
    free(text);
    return 0;
}

static void list_gpus(const fm_plan_db *db) {
    printf("%-18s %6s %7s %8s %8s %9s  %s\n", "GPU", "GiB", "GB/s", "bf16 TF", "fp8 TF", "$/h od", "link");
    for (int i = 0; i < db->count; i++) {
        const fm_plan_gpu *g = &db->gpus[i];
        char price[32], fp8[32];
        if (g->price[0].usd_per_hour >= 0) snprintf(price, sizeof price, "%.2f", g->price[0].usd_per_hour);
        else snprintf(price, sizeof price, "unpriced");
        if (g->fp8_tflops >= 0) snprintf(fp8, sizeof fp8, "%.4g", g->fp8_tflops);
        else snprintf(fp8, sizeof fp8, "-");
        printf("%-18s %6.1f %7.0f %8.4g %8s %9s  %s\n", g->name, g->memory_gib, g->bandwidth_gbs, g->bf16_tflops, fp8,
               price, g->link);
    }
    printf("(%s)\n", db->path);
}

/* The model from --preset, --params, --arch + dimensions or --model. Returns
 * 0, or the exit code (2 bad usage, 1 a file that cannot be used). */
static int build_model(const plan_args *a, fm_plan_model *model) {
    int forms = (a->preset != NULL) + (a->params != NULL) + (a->arch != NULL) + (a->model_path != NULL);
    if (a->dims_given && !a->arch) {
        fm_cli_error("--layers/--hidden/--heads/--kv-heads/--ffn/--vocab/--max-seq describe an architecture: add --arch gpt|llama|bert");
        return 2;
    }
    if (forms != 1) {
        fm_cli_error(forms ? "give only one model: --preset, --params, --arch or --model"
                           : "no model given: use --preset NAME, --params N, --arch ... or --model PATH (see --help)");
        usage(stderr);
        return 2;
    }
    if (a->preset) {
        if (fm_plan_model_preset(a->preset, model)) { fm_cli_error("%s", fm_last_error()); return 2; }
    } else if (a->params) {
        double n = 0;
        if (fm_plan_parse_count(a->params, &n) || fm_plan_model_from_params(n, model)) {
            fm_cli_error("--params: %s", fm_last_error());
            return 2;
        }
    } else if (a->arch) {
        memset(model, 0, sizeof *model);
        if (!strcasecmp(a->arch, "gpt")) model->arch = FM_PLAN_ARCH_GPT;
        else if (!strcasecmp(a->arch, "llama")) model->arch = FM_PLAN_ARCH_LLAMA;
        else if (!strcasecmp(a->arch, "bert")) model->arch = FM_PLAN_ARCH_BERT;
        else { fm_cli_error("--arch \"%s\": expected gpt, llama or bert", a->arch); return 2; }
        if (!a->layers || !a->hidden || !a->heads || !a->vocab) {
            fm_cli_error("--arch %s needs --layers, --hidden, --heads and --vocab", a->arch);
            return 2;
        }
        model->layers = a->layers;
        model->hidden = a->hidden;
        model->heads = a->heads;
        model->kv_heads = a->kv_heads;
        model->ffn = a->ffn;
        model->vocab = a->vocab;
        model->max_seq = a->max_seq;
        model->tied_embeddings = model->arch == FM_PLAN_ARCH_GPT;
        if (fm_plan_model_from_dims(model)) { fm_cli_error("%s", fm_last_error()); return 2; }
    } else if (fm_plan_model_from_file(a->model_path, model)) {
        if (!strchr(a->model_path, '/') && !strchr(a->model_path, '.'))
            fm_cli_error("%s; nor is it a built-in recipe (`fathom recipes` lists them)", fm_last_error());
        else
            fm_cli_error("%s", fm_last_error());
        return 1; /* a missing or malformed file is a runtime failure, not bad usage */
    }
    return 0;
}

int fm_cmd_plan(int argc, char **argv) {
    plan_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc;
    if (a.help) { usage(stdout); return 0; }
    if (a.list_p) { list_presets(); return 0; }
    if (a.json && a.explain) {
        fm_cli_error("--json and --explain both take over the output; choose one");
        return 2;
    }
    if (a.model_path && fm_plan_is_graph_model(a.model_path)) return plan_graph(&a);
    if (a.n_dims) {
        fm_cli_error("--dim applies to an inference graph (--model MODEL.onnx or a graph directory)");
        return 2;
    }
    if (a.model_path && fm_plan_is_recipe(a.model_path)) return plan_recipe(&a);
    if (a.no_eval || a.grad_accum != 1 || a.ranks) {
        fm_cli_error("%s applies to recipe plans only (--model RECIPE)", a.no_eval ? "--no-eval" : a.ranks ? "--ranks (GPU "
                     "plans take --gpus)" : "--grad-accum");
        return 2;
    }
    fm_plan_db *db = fm_plan_db_load(a.db_path);
    if (!db) { fm_cli_error("%s", fm_last_error()); return 1; }
    if (a.list_g) {
        list_gpus(db);
        fm_plan_db_free(db);
        return 0;
    }
    fm_plan_model model;
    fm_plan_result *res = NULL;
    rc = build_model(&a, &model);
    if (rc) goto out;
    rc = 2;
    if (fm_plan_job_check(&model, &a.job)) { fm_cli_error("%s", fm_last_error()); goto out; }
    res = fm_plan_compute(&model, &a.job, db, a.gpu);
    if (!res) { fm_cli_error("%s", fm_last_error()); goto out; }
    char *text = a.json ? fm_plan_render_json(res) : a.explain ? fm_plan_render_explain(res) : fm_plan_render_text(res);
    if (!text) { fm_cli_error("%s", fm_last_error()); rc = 1; goto out; }
    fputs(text, stdout);
    if (a.json) fputc('\n', stdout);
    free(text);
    if (a.explain) {
        char *plan = fm_plan_render_text(res);
        if (plan) printf("\n%s", plan);
        free(plan);
    }
    rc = 0;
out:
    fm_plan_result_free(res);
    fm_plan_db_free(db);
    return rc;
}
