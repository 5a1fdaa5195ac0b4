/* ZeRO stage 1: the optimizer state sharded across ranks.
 *
 * The parameters are laid end to end in one flat index space of `total` values,
 * padded to N shards of `shard` values; rank r owns [r*shard, (r+1)*shard). The
 * sharded optimizer is an ordinary fm_optim over 1-D views of the owned parts of
 * the parameters (same names, same weight decay as the full optimizer), so its
 * state is ~1/N of the full one. A step: pack every gradient into the flat buffer,
 * reduce-scatter (average) it, give each view its part as .grad, clip with the
 * global norm (fm_optim_set_norm_reduce), update, and all-gather the parameters.
 *
 * The reduce-scatter adds the ranks' values in the same order as the data-parallel
 * all-reduce (src/dist/comm.c) and the updates are element-wise, so without
 * clipping the parameters are the same bits as plain data parallel; clipping sums
 * the squares in another order (rounding differences in the norm only). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"
#include "fathom/autograd.h"
#include "fathom/nn.h"
#include "fathom/ops.h"

/* Parameters on the meta device: the planner's run of one rank (a dist_plan_group), where
 * the state is made and the collectives are called as in a real step, but no value moves. */
static bool on_meta(const fm_tensor *t) { return fm_tensor_device(t).type == FM_DEV_META; }

typedef struct zero_view {
    int param;       /* index in the full list */
    int64_t lo, hi;  /* owned part of the parameter, in its own flat index */
    fm_tensor *view; /* 1-D view of that part (the sharded optimizer's parameter) */
} zero_view;

struct fm_zero {
    fm_dist *d;
    fm_optim *local;
    int n, nv;
    fm_tensor **params;
    char **names;      /* the full optimizer's parameter names */
    int64_t *off;      /* each parameter's start in the flat space */
    int64_t total, shard;
    float *flat;       /* size*shard */
    float *mine;       /* shard: averaged gradients, then this rank's parameters */
    zero_view *views;
};

static fm_status norm_reduce(double *ss, void *ctx) { return fm_dist_allreduce_sum_f64(ctx, ss, 1); }

static fm_status zero_views(fm_zero *z, const fm_optim *full) {
    int64_t a = (int64_t)z->d->rank * z->shard, b = a + z->shard;
    z->views = calloc((size_t)z->n, sizeof *z->views);
    if (!z->views) return fm_set_error(FM_ERR_OOM, "zero: out of memory");
    int group[64];
    double gwd[64];
    int ng = 0;
    for (int i = 0; i < z->n; i++) {
        int64_t lo = z->off[i], hi = lo + fm_tensor_numel(z->params[i]);
        if (hi <= a || lo >= b) continue;
        const char *name;
        double wd;
        fm_optim_param_at(full, i, &name, NULL, &wd);
        int g = 0;
        while (g < ng && gwd[g] != wd) g++;
        if (g == ng) {
            if (ng == 64 || (group[ng] = fm_optim_add_group(z->local, wd)) < 0) return fm_last_status();
            gwd[ng++] = wd;
        }
        zero_view *v = &z->views[z->nv];
        v->param = i;
        v->lo = (lo > a ? lo : a) - lo;
        v->hi = (hi < b ? hi : b) - lo;
        int64_t all = -1;
        fm_tensor *flat = fm_reshape(z->params[i], 1, &all);
        v->view = flat ? fm_slice(flat, 0, v->lo, v->hi, 1) : NULL;
        fm_tensor_release(flat);
        if (!v->view) return fm_last_status();
        z->nv++;
        if (fm_optim_add_param(z->local, group[g], name, v->view) != FM_OK) return fm_last_status();
    }
    return FM_OK;
}

fm_zero *fm_zero_new(fm_dist *d, fm_optim *full) {
    if (!d || !full) { fm_set_error(FM_ERR_INVALID, "zero: need a communicator and an optimizer"); return NULL; }
    if ((!d->mpi && !d->sim) || d->size < 2) {
        fm_set_error(FM_ERR_INVALID, "--zero 1 shards the optimizer state across MPI ranks: start the job with "
                     "mpirun -np N (N >= 2)%s", fm_dist_mpi_built() ? "" : " in a fathom built with MPI");
        return NULL;
    }
    fm_zero *z = calloc(1, sizeof *z);
    if (!z) { fm_set_error(FM_ERR_OOM, "zero: out of memory"); return NULL; }
    z->d = d;
    z->n = fm_optim_param_count(full);
    z->params = calloc((size_t)(z->n ? z->n : 1), sizeof *z->params);
    z->off = calloc((size_t)(z->n ? z->n : 1), sizeof *z->off);
    z->names = calloc((size_t)(z->n ? z->n : 1), sizeof *z->names);
    z->local = fm_optim_new(fm_optim_get_config(full));
    fm_status st = z->params && z->off && z->names && z->local ? FM_OK : fm_set_error(FM_ERR_OOM, "zero: out of memory");
    for (int i = 0; i < z->n && st == FM_OK; i++) {
        const char *name;
        fm_optim_param_at(full, i, &name, &z->params[i], NULL);
        if (!(z->names[i] = strdup(name))) st = fm_set_error(FM_ERR_OOM, "zero: out of memory");
        if (z->params[i]->dtype != FM_F32 || (fm_tensor_device(z->params[i]).type != FM_DEV_CPU && !on_meta(z->params[i])))
            st = fm_set_error(FM_ERR_UNSUPPORTED, "zero: parameter %d is not an f32 CPU tensor (ZeRO-1 here shards "
                              "f32 CPU parameters)", i);
        fm_tensor_retain(z->params[i]);
        z->off[i] = z->total;
        z->total += fm_tensor_numel(z->params[i]);
    }
    if (st == FM_OK) {
        z->shard = (z->total + d->size - 1) / d->size;
        z->flat = calloc((size_t)(z->shard * d->size + 1), sizeof(float));
        z->mine = calloc((size_t)(z->shard + 1), sizeof(float));
        if (!z->flat || !z->mine) st = fm_set_error(FM_ERR_OOM, "zero: out of memory for %lld values", (long long)z->total);
    }
    if (st == FM_OK) st = zero_views(z, full);
    if (st == FM_OK) {
        fm_optim_set_step(z->local, fm_optim_get_step(full));
        fm_optim_set_norm_reduce(z->local, norm_reduce, d);
    }
    if (st != FM_OK) { fm_zero_free(z); return NULL; }
    return z;
}

void fm_zero_free(fm_zero *z) {
    if (!z) return;
    fm_optim_free(z->local);
    for (int i = 0; i < z->nv; i++) fm_tensor_release(z->views[i].view);
    for (int i = 0; z->params && i < z->n; i++) fm_tensor_release(z->params[i]);
    for (int i = 0; z->names && i < z->n; i++) free(z->names[i]);
    free(z->names);
    free(z->views);
    free(z->params);
    free(z->off);
    if (!z->d->broken) { free(z->flat); free(z->mine); }
    free(z);
}

fm_optim *fm_zero_optim(fm_zero *z) { return z ? z->local : NULL; }

fm_status fm_zero_reduce_grads(fm_zero *z) {
    if (!z) return fm_set_error(FM_ERR_INVALID, "zero: NULL");
    memset(z->flat, 0, sizeof(float) * (size_t)(z->shard * z->d->size));
    for (int i = 0; i < z->n; i++) {
        fm_tensor *g = z->params[i]->grad;
        if (!g) continue;
        fm_tensor *c = fm_tensor_is_contiguous(g) ? fm_tensor_retain(g) : fm_contiguous(g);
        if (!c) return fm_last_status();
        if (c->dtype == FM_F32 && !on_meta(c)) memcpy(z->flat + z->off[i], fm_tensor_data(c), sizeof(float) * (size_t)fm_tensor_numel(c));
        fm_tensor_release(c);
        fm_tensor_zero_grad(z->params[i]); /* the full gradient is not needed past here */
    }
    if (fm_dist_reduce_scatter_f32(z->d, z->flat, z->mine, z->shard, true) != FM_OK) return fm_last_status();
    int64_t base = (int64_t)z->d->rank * z->shard;
    for (int k = 0; k < z->nv; k++) {
        zero_view *v = &z->views[k];
        int64_t len = v->hi - v->lo;
        if (on_meta(v->view)) continue; /* host buffers cannot be a meta tensor's gradient: no update to plan */
        fm_tensor *g = fm_tensor_from_buffer(z->mine + (z->off[v->param] + v->lo - base), 1, &len, FM_F32, NULL, NULL);
        if (!g) return fm_last_status();
        fm_tensor_release(v->view->grad);
        v->view->grad = g;
    }
    return FM_OK;
}

fm_status fm_zero_gather_params(fm_zero *z) {
    if (!z) return fm_set_error(FM_ERR_INVALID, "zero: NULL");
    int64_t base = (int64_t)z->d->rank * z->shard;
    memset(z->mine, 0, sizeof(float) * (size_t)z->shard);
    for (int k = 0; k < z->nv; k++) {
        zero_view *v = &z->views[k];
        if (!on_meta(v->view))
            memcpy(z->mine + (z->off[v->param] + v->lo - base), fm_tensor_data(v->view), sizeof(float) * (size_t)(v->hi - v->lo));
    }
    if (fm_dist_allgather_f32(z->d, z->mine, z->flat, z->shard) != FM_OK) return fm_last_status();
    for (int i = 0; i < z->n; i++)
        if (!on_meta(z->params[i])) memcpy(fm_tensor_data(z->params[i]), z->flat + z->off[i], sizeof(float) * (size_t)fm_tensor_numel(z->params[i]));
    return FM_OK;
}

fm_status fm_zero_step(fm_zero *z, double clip, double *norm) {
    fm_status st = fm_zero_reduce_grads(z);
    if (st == FM_OK && clip > 0) st = fm_optim_clip_grad_norm(z->local, clip, norm);
    if (st == FM_OK) st = fm_optim_step(z->local);
    fm_optim_zero_grad(z->local);
    if (st == FM_OK) st = fm_zero_gather_params(z);
    return st;
}

int64_t fm_zero_state_bytes(fm_zero *z) {
    fm_named_list l;
    if (!z || fm_optim_state(z->local, &l) != FM_OK) return 0;
    int64_t b = 0;
    for (int i = 0; i < l.n; i++) b += (int64_t)l.items[i].tensor->storage->nbytes;
    fm_named_list_free(&l);
    return b;
}

/* The view (index in z->views) whose parameter's state this name is, and the slot suffix; -1 if none. */
static int view_of(fm_zero *z, const char *state_name, const char **suffix) {
    for (int k = 0; k < z->nv; k++) {
        const char *pn = z->names[z->views[k].param];
        size_t len = strlen(pn);
        if (!strncmp(state_name, pn, len) && state_name[len] == '.') { *suffix = state_name + len + 1; return k; }
    }
    return -1;
}

/* One state slot (suffix) of every parameter, gathered into full tensors appended to out. */
static fm_status gather_slot(fm_zero *z, const fm_named_list *local, const char *suffix, fm_named_list *out) {
    int64_t base = (int64_t)z->d->rank * z->shard;
    memset(z->mine, 0, sizeof(float) * (size_t)z->shard);
    for (int j = 0; j < local->n; j++) {
        const char *sfx;
        int k = view_of(z, local->items[j].name, &sfx);
        if (k < 0 || strcmp(sfx, suffix)) continue;
        zero_view *v = &z->views[k];
        if (!on_meta(local->items[j].tensor))
            memcpy(z->mine + (z->off[v->param] + v->lo - base), fm_tensor_data(local->items[j].tensor),
               sizeof(float) * (size_t)(v->hi - v->lo));
    }
    if (fm_dist_allgather_f32(z->d, z->mine, z->flat, z->shard) != FM_OK) return fm_last_status();
    for (int i = 0; i < z->n; i++) {
        fm_tensor *t = fm_tensor_empty_like(z->params[i]);
        if (!t) return fm_last_status();
        if (!on_meta(t)) memcpy(fm_tensor_data(t), z->flat + z->off[i], sizeof(float) * (size_t)fm_tensor_numel(t));
        char name[600];
        snprintf(name, sizeof name, "%s.%s", z->names[i], suffix);
        fm_status st = fm_named_list_push(out, name, t, false, true);
        fm_tensor_release(t);
        if (st != FM_OK) return st;
    }
    return FM_OK;
}

fm_status fm_zero_full_state(fm_zero *z, fm_named_list *out) {
    if (!z || !out) return fm_set_error(FM_ERR_INVALID, "zero full state: NULL argument");
    memset(out, 0, sizeof *out);
    out->owns_tensors = true;
    if (fm_optim_init_state(z->local) != FM_OK) return fm_last_status();
    fm_named_list local;
    if (fm_optim_state(z->local, &local) != FM_OK) return fm_last_status();
    static const char *adam[] = {"exp_avg", "exp_avg_sq"}, *sgd[] = {"momentum_buffer"};
    bool is_adam = fm_optim_get_config(z->local)->kind != FM_OPTIM_SGD;
    int slots = is_adam ? 2 : fm_optim_get_config(z->local)->momentum > 0 ? 1 : 0;
    fm_status st = FM_OK;
    for (int s = 0; s < slots && st == FM_OK; s++) st = gather_slot(z, &local, is_adam ? adam[s] : sgd[s], out);
    fm_named_list_free(&local);
    if (st != FM_OK) fm_named_list_free(out);
    return st;
}

fm_status fm_zero_load_full_state(fm_zero *z, const fm_named_list *full) {
    if (!z || !full) return fm_set_error(FM_ERR_INVALID, "zero load state: NULL argument");
    if (fm_optim_init_state(z->local) != FM_OK) return fm_last_status();
    fm_named_list local;
    if (fm_optim_state(z->local, &local) != FM_OK) return fm_last_status();
    fm_status st = FM_OK;
    for (int j = 0; j < local.n && st == FM_OK; j++) {
        const char *sfx;
        int k = view_of(z, local.items[j].name, &sfx);
        int f = fm_named_list_find(full, local.items[j].name);
        if (k < 0 || f < 0) { st = fm_set_error(FM_ERR_FORMAT, "optimizer state '%s' is missing", local.items[j].name); break; }
        zero_view *v = &z->views[k];
        fm_tensor *src = full->items[f].tensor;
        if (src->dtype != FM_F32 || fm_tensor_numel(src) != fm_tensor_numel(z->params[v->param]) || !fm_tensor_is_contiguous(src)) {
            st = fm_set_error(FM_ERR_FORMAT, "optimizer state '%s' does not match its parameter", local.items[j].name);
            break;
        }
        memcpy(fm_tensor_data(local.items[j].tensor), (const float *)fm_tensor_data(src) + v->lo,
               sizeof(float) * (size_t)(v->hi - v->lo));
    }
    fm_named_list_free(&local);
    return st;
}
