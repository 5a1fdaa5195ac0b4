/* A training run's memory from fathom's own training code, run on a device.
 *
 * Why not a formula or a replay: the peak is one moment of the step, and what
 * is alive then depends on every op's saved tensors, the backward walk's
 * order, gradient sums, checkpointing and autocast casts. Running the real
 * code gets all of that right by construction; on the meta device (src/backend/
 * meta) it allocates nothing and takes about as long as the Python-free graph
 * bookkeeping, so the planner can run a step of a model it could not hold.
 *
 * What is copied here is only the trainers' setup, in the order they do it
 * (src/recipe/train.c train_setup/step_init/recipe_loss, src/gpt/gpt_train.c
 * gpt_setup/gpt_step/evaluate/save_ckpt): which model, optimizer and loss,
 * the memory tags, when optimizer state is made and when the batch is freed.
 * Everything below that (modules, ops, autograd, optimizer, train step) is the
 * library's own code. tests/test_plan_fathom.c checks the result against the
 * real trainers, tests/test_meta_device.c the meta device against the CPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/meta/meta_memory.h"
#include "core/memory_internal.h"
#include "dispatch/dispatch.h"
#include "fathom/autograd.h"
#include "fathom/nn.h"
#include "fathom/optim.h"
#include "fathom/train_step.h"
#include "dist/dist_internal.h" /* dist_plan_group: a rank's collectives in a planned run */
#include "gpt/gpt_internal.h"
#include "fathom/graph.h"
#include "plan/plan_step.h"
#include "profile/op_cost.h" /* what a planned inference's kernels compute and move */

void plan_step_defaults(plan_step_opts *o) {
    memset(o, 0, sizeof *o);
    o->dev = FM_CPU;
    o->batch = 1;
    o->precision = FM_F32;
    o->grad_accum = 1;
    o->steps = 2;
}

/* ---------------- watching the device ---------------- */

typedef struct watch {
    fm_device dev;
    size_t base, base_cat[FM_MEM_CAT_COUNT], seen_peak;
    char *where;
    size_t where_cap;
    plan_sb *log;
    int step;
    const char *stage; /* what the step is in: "forward" (backward kernels are told apart), "optimizer", ... */
    bool count;        /* sum the kernels' FLOPs and bytes (an inference graph's run) */
    double flops, bytes;
} watch;

static void watch_stage(watch *w, int step, const char *stage) {
    w->step = step;
    w->stage = stage;
}

static void after_kernel(fm_dispatch_event *ev, void *user) {
    watch *w = user;
    fm_memory_stats s;
    if (w->count) w->flops += fm_op_flops(ev->call), w->bytes += fm_op_bytes(ev->call);
    if (fm_memory_stats_get(w->dev, &s) != FM_OK) return;
    char phase[48];
    snprintf(phase, sizeof phase, "step %d %s", w->step, fm_in_backward ? "backward" : w->stage ? w->stage : "forward");
    if (w->step == 0) snprintf(phase, sizeof phase, "%s", w->stage ? w->stage : "");
    if (w->log) {
        char b1[32], b2[32];
        plan_sb_printf(w->log, "  %-19s %-28s live %10s  peak %10s\n", phase, fm_op_get_info(ev->call->op)->name,
                       fm_format_bytes(s.allocated - w->base, b1, sizeof b1),
                       fm_format_bytes(s.allocated_peak - w->base, b2, sizeof b2));
    }
    if (s.allocated_peak <= w->seen_peak) return;
    w->seen_peak = s.allocated_peak;
    snprintf(w->where, w->where_cap, "%s %s", phase, fm_op_get_info(ev->call->op)->name);
}

static void watch_begin(watch *w, const plan_step_opts *o, plan_step_mem *out) {
    memset(w, 0, sizeof *w);
    w->dev = o->dev;
    w->log = o->log;
    fm_device dev = o->dev;
    w->where = out->peak_at;
    w->where_cap = sizeof out->peak_at;
    fm_memory_stats s;
    if (fm_memory_stats_get(dev, &s) == FM_OK) {
        w->base = s.allocated;
        memcpy(w->base_cat, s.by_category, sizeof w->base_cat);
    }
}

/* The trainer's fm_memory_reset_peak: from here on the kernels are watched. */
static void watch_reset(watch *w, plan_step_mem *out) {
    fm_memory_reset_peak(w->dev);
    fm_memory_stats s;
    if (fm_memory_stats_get(w->dev, &s) == FM_OK) {
        out->resident = s.allocated - w->base;
        w->seen_peak = s.allocated_peak;
    }
    snprintf(out->peak_at, sizeof out->peak_at, "before the first step");
    if (w->log) {
        char b[32];
        plan_sb_printf(w->log, "  before the first step (model, optimizer state, batch): live %s\n",
                       fm_format_bytes(out->resident, b, sizeof b));
    }
    fm_dispatch_set_hook(NULL, after_kernel, w);
}

static void watch_end(watch *w, plan_step_mem *out) {
    fm_dispatch_set_hook(NULL, NULL, NULL);
    fm_memory_stats s;
    if (fm_memory_stats_get(w->dev, &s) != FM_OK) return;
    out->peak = s.allocated_peak - w->base;
    for (int i = 0; i < FM_MEM_CAT_COUNT; i++)
        out->peak_cat[i] = s.by_category_peak[i] > w->base_cat[i] ? s.by_category_peak[i] - w->base_cat[i] : 0;
    if (w->dev.type != FM_DEV_META) return;
    size_t at[FM_MEM_CAT_COUNT];
    fm_meta_peak_breakdown(at);
    for (int i = 0; i < FM_MEM_CAT_COUNT; i++) out->at_peak_cat[i] = at[i] > w->base_cat[i] ? at[i] - w->base_cat[i] : 0;
}

static void watch_final(watch *w, plan_step_mem *out) {
    fm_memory_stats s;
    if (fm_memory_stats_get(w->dev, &s) == FM_OK) out->end = s.allocated > w->base ? s.allocated - w->base : 0;
}

/* as the allocator counts the tensor's block */
static size_t bytes_of(const fm_tensor *t) { return t ? fm_cpu_block_size((size_t)fm_tensor_numel(t) * fm_dtype_size(t->dtype)) : 0; }

static fm_status check_opts(const plan_step_opts *o) {
    if (o->batch < 1 || o->grad_accum < 1 || o->steps < 1 || o->batch % o->grad_accum)
        return fm_set_error(FM_ERR_INVALID, "plan step: batch (%lld), grad_accum (%d) and steps (%d) must be >= 1, and "
                            "grad_accum must divide the batch", (long long)o->batch, o->grad_accum, o->steps);
    return fm_device_validate(o->dev);
}

static fm_efficiency_opts eff_of(const plan_step_opts *o) {
    fm_efficiency_opts eo = fm_efficiency_defaults();
    eo.device = o->dev;
    eo.precision = o->precision;
    eo.grad_accum = o->grad_accum;
    eo.checkpointing = o->checkpointing;
    eo.loss_scaling = o->precision == FM_F16;
    return eo;
}

/* ---------------- layer-list recipes (src/recipe/train.c) ---------------- */

typedef struct seq_run {
    const fm_recipe *r;
    fm_module *model;
    bool blocks;
} seq_run;

/* recipe_loss */
static fm_tensor *seq_loss(void *ctx, fm_tensor *x, fm_tensor *y) {
    seq_run *u = ctx;
    fm_tensor *logits = u->blocks ? fm_module_forward_blocks(u->model, x) : fm_module_forward(u->model, x);
    fm_tensor *loss = logits ? fm_cross_entropy(logits, y, -100, u->r->label_smoothing, FM_REDUCE_MEAN) : NULL;
    fm_tensor_release(logits);
    return loss;
}

/* The steps, with the loader's batch (held throughout, as its slot buffer is). */
static fm_status seq_steps(seq_run *u, fm_train_step *ts, const plan_step_opts *o, watch *w, plan_step_mem *out) {
    int64_t xs[FM_MAX_DIMS + 1] = {o->batch};
    memcpy(xs + 1, u->r->input_shape, sizeof(int64_t) * (size_t)u->r->input_ndim);
    /* an embedding-first recipe takes I64 token ids (zeros are ids), any other f32 */
    fm_dtype xt = fm_recipe_token_vocab(u->r) > 0 ? FM_I64 : FM_F32;
    fm_tensor *x = fm_tensor_zeros(u->r->input_ndim + 1, xs, xt, o->dev);
    fm_tensor *y = x ? fm_tensor_zeros(1, (int64_t[]){o->batch}, FM_I64, o->dev) : NULL;
    fm_status st = y ? FM_OK : fm_last_status();
    out->batch = bytes_of(x) + bytes_of(y);
    if (st == FM_OK) watch_reset(w, out);
    for (int k = 0; k < o->steps && st == FM_OK; k++) {
        double lv;
        watch_stage(w, k + 1, "forward");
        if ((st = fm_train_step_backward(ts, x, y, &lv)) == FM_OK) {
            watch_stage(w, k + 1, "optimizer");
            st = fm_train_step_update(ts);
        }
    }
    watch_end(w, out);
    fm_tensor_release_n(2, x, y);
    return st;
}

fm_status plan_step_recipe(const fm_recipe *r, const plan_step_opts *o, plan_step_mem *out) {
    memset(out, 0, sizeof *out);
    fm_status st = check_opts(o);
    if (st) return st;
    watch w;
    watch_begin(&w, o, out);
    fm_efficiency_opts eo = eff_of(o);
    seq_run u = {r, NULL, o->checkpointing == FM_CKPT_BLOCKS};
    fm_rng init_rng, drop_rng;
    fm_rng_init(&init_rng, r->seed);
    fm_rng_init(&drop_rng, r->seed ^ 0x9e3779b97f4a7c15ull);
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_WEIGHTS);
    u.model = fm_recipe_build_model(r, &init_rng);
    fm_memory_tag_pop(mc);
    if (!u.model) return fm_last_status();
    fm_module_set_rng(u.model, &drop_rng);
    out->params = fm_module_num_params(u.model);
    fm_optim *opt = NULL;
    fm_named_list ps = {0};
    fm_tensor **params = NULL;
    if (o->dev.type != FM_DEV_CPU && (st = fm_module_to(u.model, o->dev))) goto done;
    if (!(opt = fm_optim_new(&r->optim)) || fm_optim_add_params(opt, u.model) != FM_OK ||
        fm_module_parameters(u.model, &ps) != FM_OK) { st = fm_last_status(); goto done; }
    if (!(params = calloc((size_t)ps.n + 1, sizeof *params))) { st = fm_set_error(FM_ERR_OOM, "out of host memory"); goto done; }
    for (int i = 0; i < ps.n; i++) params[i] = ps.items[i].tensor;
    fm_train_step ts;
    fm_train_step_init(&ts, &eo, opt, ps.n, params, seq_loss, &u);
    ts.scaler.quiet = true;
    ts.clip = r->clip_grad_norm;
    fm_module_train(u.model, true);
    st = seq_steps(&u, &ts, o, &w, out);
done:
    fm_dispatch_set_hook(NULL, NULL, NULL);
    free(params);
    fm_named_list_free(&ps);
    fm_optim_free(opt);
    fm_module_free(u.model);
    watch_final(&w, out);
    return st;
}

/* ---------------- GPT recipes (src/gpt/gpt_train.c) ---------------- */

typedef struct gpt_run {
    fm_gpt *m;
    fm_optim *opt;
    fm_tensor **params;
    fm_dist *tp, *dp;      /* stand-in groups (tensor parallel; data parallel under ZeRO-1) */
    fm_dist_trainer *dt;   /* ZeRO-1 */
} gpt_run;

/* gpt_loss */
static fm_tensor *gpt_loss(void *ctx, fm_tensor *x, fm_tensor *y) {
    gpt_run *u = ctx;
    fm_tensor *loss = NULL, *lg = fm_gpt_forward(u->m, x, y, &loss);
    fm_tensor_release(lg);
    return lg ? loss : NULL;
}

static fm_tensor *tokens(const plan_step_opts *o, int T) {
    return fm_tensor_zeros(2, (int64_t[]){o->batch, T}, FM_I64, o->dev);
}

/* gpt_setup from the model on: the trainer's own optimizer set-up, state made up front */
static fm_status gpt_build(gpt_run *u, const fm_gpt_train_opts *go, const plan_step_opts *o) {
    fm_rng init;
    fm_rng_init(&init, go->seed);
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_WEIGHTS);
    u->m = fm_gpt_new(&go->model, &init);
    fm_memory_tag_pop(mc);
    fm_status st;
    if (!u->m) return fm_last_status();
    if (o->tensor_parallel > 1) { /* built whole, then split (this rank: 0) */
        if (!(u->tp = dist_plan_group(o->tensor_parallel, 0))) return fm_last_status();
        if ((st = fm_gpt_set_tensor_parallel(u->m, u->tp))) return st;
    }
    if (o->dev.type != FM_DEV_CPU && (st = fm_gpt_to(u->m, o->dev))) return st;
    fm_rng_init(&u->m->own_rng, go->seed ^ 0xd50u);
    if ((st = fm_gpt_set_checkpointing(u->m, o->checkpointing))) return st;
    /* ZeRO-1: the shard's state, made in plan_step_gpt, as gpt_dist_init's trainer makes it */
    if ((st = gpt_adamw_setup(u->m, go, !o->zero, &u->opt, &u->params))) return st;
    if (u->tp) fm_optim_set_norm_reduce(u->opt, gpt_tp_norm_reduce, u->m); /* as the trainer */
    return FM_OK;
}

/* After the last step: evaluate()'s first batch (no tape, the training
 * precision, eval mode), then save_ckpt's Hugging Face tensors. */
static fm_status gpt_finish(gpt_run *u, const plan_step_opts *o) {
    bool prev = fm_set_grad_enabled(false);
    fm_gpt_train_mode(u->m, false);
    plan_step_opts ev = *o;
    if (o->eval_batch > 0) ev.batch = o->eval_batch;
    fm_tensor *x = tokens(&ev, u->m->cfg.block_size), *y = x ? tokens(&ev, u->m->cfg.block_size) : NULL, *loss = NULL;
    fm_dtype ac = fm_autocast_set(o->precision);
    fm_tensor *lg = y ? fm_gpt_forward(u->m, x, y, &loss) : NULL;
    fm_autocast_set(ac);
    fm_status st = lg ? FM_OK : fm_last_status();
    fm_tensor_release_n(4, x, y, lg, loss);
    fm_gpt_train_mode(u->m, true);
    fm_set_grad_enabled(prev);
    /* save_ckpt: ZeRO-1 and tensor parallel write each rank's shard as it is (save_ckpt_sharded:
     * ZeRO-1 packs its shard into a new buffer; tensor parallel's part of the model and state
     * are written from where they are), then the run's last checkpoint gathers the whole model
     * (tensor parallel) for its Hugging Face tensors; plain data parallel and one process write
     * the state as it is */
    fm_named_list hf, state = {0};
    fm_gpt *whole = NULL, *m = u->m;
    if (st == FM_OK && u->dt && fm_dist_trainer_zero(u->dt)) {
        st = fm_zero_shard_state(fm_dist_trainer_zero(u->dt), &state, NULL, NULL);
        fm_named_list_free(&state); /* written and freed before rank 0 writes the model */
        memset(&state, 0, sizeof state);
    }
    if (st == FM_OK && u->tp) {
        if (!(whole = fm_gpt_tp_gather_model(m))) st = fm_last_status();
        if (whole) m = whole;
    }
    if (st == FM_OK) {
        st = fm_gpt_hf_tensors(m, &hf);
        fm_named_list_free(&hf);
    }
    fm_named_list_free(&state);
    fm_gpt_free(whole);
    return st;
}

fm_status plan_step_gpt(const fm_gpt_train_opts *go, const plan_step_opts *o, plan_step_mem *out) {
    memset(out, 0, sizeof *out);
    fm_status st = check_opts(o);
    if (st) return st;
    watch w;
    watch_begin(&w, o, out);
    fm_efficiency_opts eo = eff_of(o);
    gpt_run u = {0};
    fm_train_step ts;
    if ((st = gpt_build(&u, go, o))) goto done;
    out->params = fm_gpt_num_params(u.m);
    fm_train_step_init(&ts, &eo, u.opt, u.m->params.n, u.params, gpt_loss, &u);
    ts.scaler.quiet = true;
    ts.clip = go->grad_clip;
    if (o->zero) { /* gpt_dist_init: the sharded optimizer over the data-parallel ranks, its state up front */
        const int T = o->tensor_parallel > 1 ? o->tensor_parallel : 1, dp = (o->ranks > T ? o->ranks : T) / T;
        if (!(u.dp = dist_plan_group(dp, 0)) || !(u.dt = fm_dist_trainer_new(u.dp, &ts, 1, 0))) { st = fm_last_status(); goto done; }
        fm_mem_category mc = fm_memory_tag_push(FM_MEM_OPTIMIZER);
        st = fm_optim_init_state(fm_dist_trainer_optim(u.dt));
        fm_memory_tag_pop(mc);
        if (st) goto done;
    }
    watch_reset(&w, out);
    const int T = u.m->cfg.block_size;
    for (int k = 0; k < o->steps && st == FM_OK; k++) {
        /* gpt_step: the batch is made for the step and freed before the update */
        fm_tensor *x = tokens(o, T), *y = x ? tokens(o, T) : NULL;
        double lv;
        out->batch = bytes_of(x) + bytes_of(y);
        watch_stage(&w, k + 1, "forward");
        st = y ? fm_train_step_backward(&ts, x, y, &lv) : fm_last_status();
        fm_tensor_release_n(2, x, y);
        watch_stage(&w, k + 1, "optimizer");
        if (st == FM_OK) st = fm_train_step_update(&ts);
    }
    watch_stage(&w, 0, "validation and checkpoint");
    if (st == FM_OK && o->finish) st = gpt_finish(&u, o);
    watch_end(&w, out);
done:
    fm_dispatch_set_hook(NULL, NULL, NULL);
    fm_dist_trainer_free(u.dt);
    free(u.params);
    fm_optim_free(u.opt);
    fm_gpt_free(u.m);
    fm_dist_finalize(u.tp);
    fm_dist_finalize(u.dp);
    watch_final(&w, out);
    return st;
}

/* ---------------- an inference graph (src/graph's runner) ---------------- */

fm_status plan_step_graph(fm_graph *g, const int64_t (*shapes)[FM_MAX_DIMS], const plan_step_opts *o, plan_step_mem *out,
                          double *flops, double *bytes, size_t *output_bytes) {
    memset(out, 0, sizeof *out);
    *flops = *bytes = 0;
    *output_bytes = 0;
    fm_status st = fm_device_validate(o->dev);
    if (st) return st;
    watch w;
    watch_begin(&w, o, out);
    fm_mem_category mc = fm_memory_tag_push(FM_MEM_WEIGHTS);
    st = fm_graph_to_device(g, o->dev);
    fm_memory_tag_pop(mc);
    const int n_in = fm_graph_num_inputs(g), n_out = fm_graph_num_outputs(g);
    fm_tensor **in = calloc((size_t)n_in + 1, sizeof *in), **outs = calloc((size_t)n_out + 1, sizeof *outs);
    if (!st && (!in || !outs)) st = fm_set_error(FM_ERR_OOM, "out of host memory");
    for (int i = 0; i < n_in && !st; i++) { /* zeros: ids that index any table */
        fm_graph_io io;
        if (!(st = fm_graph_input_info(g, i, &io)) && !(in[i] = fm_tensor_zeros(io.ndim, shapes[i], io.dtype, o->dev)))
            st = fm_last_status();
        out->batch += bytes_of(in[i]);
    }
    if (!st) {
        watch_reset(&w, out);
        watch_stage(&w, 0, "inference");
        w.count = true;
        const fm_graph_run_options ro = {.no_arena = true}; /* allocating per node, as every device but the CPU */
        st = fm_graph_run_ex(g, in, outs, &ro);
        watch_end(&w, out);
        *flops = w.flops, *bytes = w.bytes;
        for (int i = 0; i < n_out && !st; i++) *output_bytes += bytes_of(outs[i]);
    }
    fm_dispatch_set_hook(NULL, NULL, NULL);
    for (int i = 0; in && i < n_in; i++) fm_tensor_release(in[i]);
    for (int i = 0; outs && i < n_out; i++) fm_tensor_release(outs[i]);
    free(in), free(outs);
    watch_final(&w, out);
    return st;
}
