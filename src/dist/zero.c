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
 * The parameters may be on any one device (f32). The step's flat buffers are tensors
 * there, so on a GPU the gradients are packed, reduce-scattered (NCCL), updated and
 * gathered without leaving it; on the CPU (and the meta device) they are host buffers
 * seen as CPU tensors. The checkpoint functions (state gathered or sharded, loaded back)
 * go through host copies of the state, made only when they are called.
 *
 * The reduce-scatter adds the ranks' values in the same order as the data-parallel
 * all-reduce (src/dist/comm.c) and the updates are element-wise, so without
 * clipping the parameters are the same bits as plain data parallel; clipping sums
 * the squares in another order (rounding differences in the norm only). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"
#include "fathom/autograd.h"
#include "fathom/io.h" /* shard files: safetensors */
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
    fm_device dev;     /* the parameters' device */
    bool host;         /* dev is the CPU or the meta device: flat_t and mine_t are flat and mine */
    float *flat;       /* size*shard host values (a GPU's: made by the checkpoint functions) */
    float *mine;       /* shard: averaged gradients, then this rank's parameters */
    fm_tensor *flat_t; /* the step's buffers on dev: size*shard and shard values */
    fm_tensor *mine_t;
    zero_view *views;
};

/* t's values (contiguous f32 on any device) into host memory; nothing on the meta device. */
static fm_status read_f32(const fm_tensor *t, float *dst) {
    if (on_meta(t)) return FM_OK;
    if (fm_tensor_device(t).type != FM_DEV_CPU) return fm_tensor_copy_to_host(t, dst, FM_F32);
    memcpy(dst, fm_tensor_data(t), sizeof(float) * (size_t)fm_tensor_numel(t));
    return FM_OK;
}

/* t (contiguous f32 on any device) = numel(t) host values; nothing on the meta device. */
static fm_status write_f32(fm_tensor *t, const float *src) {
    if (on_meta(t)) return FM_OK;
    if (fm_tensor_device(t).type != FM_DEV_CPU) return dist_from_host(t, src, FM_F32);
    memcpy(fm_tensor_data(t), src, sizeof(float) * (size_t)fm_tensor_numel(t));
    return FM_OK;
}

/* The host buffers the checkpoint functions gather and pack in (a GPU's, made at first use). */
static fm_status host_buffers(fm_zero *z) {
    if (!z->flat) z->flat = calloc((size_t)(z->shard * z->d->size + 1), sizeof(float));
    if (!z->mine) z->mine = calloc((size_t)(z->shard + 1), sizeof(float));
    if (!z->flat || !z->mine)
        return fm_set_error(FM_ERR_OOM, "zero: out of host memory for %lld optimizer-state values", (long long)z->total);
    return FM_OK;
}

/* t (contiguous, on buf's device) and buf's values [at, at + numel(t)) (buf 1-D): one copied into the other. */
static fm_status flat_copy(fm_tensor *buf, int64_t at, fm_tensor *t, bool into_buf) {
    int64_t n = fm_tensor_numel(t);
    fm_tensor *part = fm_slice(buf, 0, at, at + n, 1), *flat = part ? fm_view(t, 1, &n) : NULL;
    fm_status st = !flat ? fm_last_status() : into_buf ? fm_copy_(part, flat) : fm_copy_(flat, part);
    fm_tensor_release_n(2, part, flat);
    return st;
}

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
        fm_tensor_retain(z->params[i]);
        fm_device dev = fm_tensor_device(z->params[i]);
        if (i == 0) z->dev = dev;
        if (st == FM_OK && (z->params[i]->dtype != FM_F32 || !fm_tensor_is_contiguous(z->params[i]) || !fm_device_eq(dev, z->dev))) {
            char dn[32];
            st = fm_set_error(FM_ERR_UNSUPPORTED, "zero: parameter %d ('%s') is not a contiguous f32 tensor on %s like "
                              "parameter 0 (ZeRO-1 shards f32 parameters that are all on one device)", i, name,
                              fm_device_name(z->dev, dn, sizeof dn));
        }
        z->off[i] = z->total;
        z->total += fm_tensor_numel(z->params[i]);
    }
    if (st == FM_OK) {
        z->shard = (z->total + d->size - 1) / d->size;
        z->host = z->n == 0 || z->dev.type == FM_DEV_CPU || z->dev.type == FM_DEV_META;
        int64_t whole = z->shard * d->size;
        if (z->host) {
            st = host_buffers(z);
            if (st == FM_OK) z->flat_t = fm_tensor_from_buffer(z->flat, 1, &whole, FM_F32, NULL, NULL);
            if (st == FM_OK) z->mine_t = fm_tensor_from_buffer(z->mine, 1, &z->shard, FM_F32, NULL, NULL);
        } else {
            z->flat_t = fm_tensor_zeros(1, &whole, FM_F32, z->dev);
            z->mine_t = z->flat_t ? fm_tensor_zeros(1, &z->shard, FM_F32, z->dev) : NULL;
        }
        if (st == FM_OK && (!z->flat_t || !z->mine_t)) st = fm_last_status();
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
    fm_tensor_release_n(2, z->flat_t, z->mine_t);
    if (!z->d->broken) { free(z->flat); free(z->mine); }
    free(z);
}

fm_optim *fm_zero_optim(fm_zero *z) { return z ? z->local : NULL; }

fm_status fm_zero_reduce_grads(fm_zero *z) {
    if (!z) return fm_set_error(FM_ERR_INVALID, "zero: NULL");
    bool prev = fm_set_grad_enabled(false);
    fm_status st = z->host ? (memset(z->flat, 0, sizeof(float) * (size_t)(z->shard * z->d->size)), FM_OK) : fm_zero_(z->flat_t);
    for (int i = 0; i < z->n && st == FM_OK; i++) {
        fm_tensor *g = z->params[i]->grad;
        if (!g) continue;
        fm_tensor *c = fm_tensor_is_contiguous(g) ? fm_tensor_retain(g) : fm_contiguous(g);
        if (!c) st = fm_last_status();
        else if (!on_meta(c)) st = flat_copy(z->flat_t, z->off[i], c, true);
        fm_tensor_release(c);
        fm_tensor_zero_grad(z->params[i]); /* the full gradient is not needed past here */
    }
    fm_set_grad_enabled(prev);
    if (st != FM_OK || fm_dist_reduce_scatter_tensor(z->d, z->flat_t, z->mine_t, true) != FM_OK) return fm_last_status();
    int64_t base = (int64_t)z->d->rank * z->shard;
    for (int k = 0; k < z->nv; k++) {
        zero_view *v = &z->views[k];
        if (on_meta(v->view)) continue; /* the meta device's views get no gradient: no update to plan */
        int64_t at = z->off[v->param] + v->lo - base;
        fm_tensor *g = fm_slice(z->mine_t, 0, at, at + (v->hi - v->lo), 1);
        if (!g) return fm_last_status();
        fm_tensor_release(v->view->grad);
        v->view->grad = g;
    }
    return FM_OK;
}

fm_status fm_zero_gather_params(fm_zero *z) {
    if (!z) return fm_set_error(FM_ERR_INVALID, "zero: NULL");
    int64_t base = (int64_t)z->d->rank * z->shard;
    bool prev = fm_set_grad_enabled(false);
    fm_status st = z->host ? (memset(z->mine, 0, sizeof(float) * (size_t)z->shard), FM_OK) : fm_zero_(z->mine_t);
    for (int k = 0; k < z->nv && st == FM_OK; k++) {
        zero_view *v = &z->views[k];
        if (!on_meta(v->view)) st = flat_copy(z->mine_t, z->off[v->param] + v->lo - base, v->view, true);
    }
    if (st == FM_OK) st = fm_dist_allgather_tensor(z->d, z->mine_t, z->flat_t);
    for (int i = 0; i < z->n && st == FM_OK; i++)
        if (!on_meta(z->params[i])) st = flat_copy(z->flat_t, z->off[i], z->params[i], false);
    fm_set_grad_enabled(prev);
    return st;
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
    if (host_buffers(z)) return fm_last_status();
    int64_t base = (int64_t)z->d->rank * z->shard;
    memset(z->mine, 0, sizeof(float) * (size_t)z->shard);
    for (int j = 0; j < local->n; j++) {
        const char *sfx;
        int k = view_of(z, local->items[j].name, &sfx);
        if (k < 0 || strcmp(sfx, suffix)) continue;
        zero_view *v = &z->views[k];
        if (read_f32(local->items[j].tensor, z->mine + (z->off[v->param] + v->lo - base))) return fm_last_status();
    }
    if (fm_dist_allgather_f32(z->d, z->mine, z->flat, z->shard) != FM_OK) return fm_last_status();
    for (int i = 0; i < z->n; i++) {
        fm_tensor *t = fm_tensor_empty_like(z->params[i]);
        if (!t) return fm_last_status();
        fm_status st = write_f32(t, z->flat + z->off[i]);
        char name[600];
        snprintf(name, sizeof name, "%s.%s", z->names[i], suffix);
        if (st == FM_OK) st = fm_named_list_push(out, name, t, false, true);
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
        fm_tensor *h = fm_tensor_device(src).type == FM_DEV_CPU ? fm_tensor_retain(src) : fm_tensor_to(src, FM_CPU);
        st = h ? write_f32(local.items[j].tensor, (const float *)fm_tensor_data(h) + v->lo) : fm_last_status();
        fm_tensor_release(h);
    }
    fm_named_list_free(&local);
    return st;
}

/* ---- sharded checkpoints: each rank's part of the state as it is ----
 * A shard file holds, per state slot (exp_avg, exp_avg_sq; SGD: momentum_buffer), this
 * rank's range of the flat index space ([shard] values, zero past the end), and in its
 * metadata the world size, the rank, the flat size, the shard size and a hash of the
 * parameters' names and sizes (the layout the index space comes from). */

static int slot_names(const fm_optim *o, const char *const **names) {
    static const char *const adam[] = {"exp_avg", "exp_avg_sq"}, *const sgd[] = {"momentum_buffer"};
    const fm_optim_config *c = fm_optim_get_config(o);
    if (c->kind != FM_OPTIM_SGD) { *names = adam; return 2; }
    *names = sgd;
    return c->momentum > 0 ? 1 : 0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The layout of a full optimizer's parameters (names, sizes), and their total size. */
static uint64_t layout_of(const fm_optim *full, int64_t *total) {
    uint64_t h = 14695981039346656037ull;
    *total = 0;
    for (int i = 0, n = fm_optim_param_count(full); i < n; i++) {
        const char *name;
        fm_tensor *p;
        if (fm_optim_param_at(full, i, &name, &p, NULL) != FM_OK) continue;
        int64_t k = fm_tensor_numel(p);
        h = fnv(fnv(h, name, strlen(name) + 1), &k, sizeof k);
        *total += k;
    }
    return h;
}

static uint64_t layout_of_zero(const fm_zero *z) {
    uint64_t h = 14695981039346656037ull;
    for (int i = 0; i < z->n; i++) {
        int64_t k = fm_tensor_numel(z->params[i]);
        h = fnv(fnv(h, z->names[i], strlen(z->names[i]) + 1), &k, sizeof k);
    }
    return h;
}

/* This rank's values of one slot, packed into dst [shard] (zero where it owns nothing). */
static fm_status pack_slot(fm_zero *z, const fm_named_list *local, const char *suffix, float *dst) {
    int64_t base = (int64_t)z->d->rank * z->shard;
    memset(dst, 0, sizeof(float) * (size_t)z->shard);
    for (int j = 0; j < local->n; j++) {
        const char *sfx;
        int k = view_of(z, local->items[j].name, &sfx);
        if (k < 0 || strcmp(sfx, suffix)) continue;
        zero_view *v = &z->views[k];
        if (read_f32(local->items[j].tensor, dst + (z->off[v->param] + v->lo - base))) return fm_last_status();
    }
    return FM_OK;
}

static fm_status meta_i64(const fm_kv_list *meta, const char *key, const char *path, int64_t *out) {
    const char *s = fm_kv_get(meta, key);
    char *end = NULL;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || end == s || *end || v < 0)
        return fm_set_error(FM_ERR_FORMAT, "%s: not a ZeRO-1 optimizer shard (its metadata '%s' is %s)", path, key,
                            s ? "not a whole number" : "missing");
    *out = v;
    return FM_OK;
}

/* Reads a shard file's tensors and checks its metadata: written by `rank` of `world`,
 * for a flat space of `total` values laid out as `layout`. */
static fm_status read_shard(const char *path, int world, int rank, int64_t total, uint64_t layout, fm_named_list *l,
                            int64_t *shard) {
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    fm_status st = fm_safetensors_load(path, l, &meta);
    if (st) return st;
    int64_t w = 0, r = 0, t = 0;
    char want[32];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)layout);
    const char *lay = fm_kv_get(&meta, "zero_layout");
    if ((st = meta_i64(&meta, "zero_world_size", path, &w)) || (st = meta_i64(&meta, "zero_rank", path, &r)) ||
        (st = meta_i64(&meta, "zero_total", path, &t)) || (st = meta_i64(&meta, "zero_shard", path, shard))) {
    } else if (w != world || r != rank) {
        st = fm_set_error(FM_ERR_FORMAT, "%s holds the optimizer shard of rank %lld of %lld, not of rank %d of %d (a "
                          "shard file renamed or copied from another checkpoint?)", path, (long long)r, (long long)w,
                          rank, world);
    } else if (t != total || !lay || strcmp(lay, want)) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: the optimizer shard is of another model's parameters (%lld values, layout "
                          "%s; this model: %lld, %s)", path, (long long)t, lay ? lay : "missing", (long long)total, want);
    } else if (*shard * world < total || (*shard - 1) * world >= total + world) {
        st = fm_set_error(FM_ERR_FORMAT, "%s: shards of %lld values cannot split %lld over %d ranks", path,
                          (long long)*shard, (long long)total, world);
    }
    fm_kv_free(&meta);
    if (st) fm_named_list_free(l);
    return st;
}

/* One slot's [shard] tensor of a shard file, checked. */
static const float *shard_slot(const fm_named_list *l, const char *slot, int64_t shard, const char *path) {
    int k = fm_named_list_find(l, slot);
    fm_tensor *t = k >= 0 ? l->items[k].tensor : NULL;
    if (!t || t->dtype != FM_F32 || t->ndim != 1 || t->shape[0] != shard || !fm_tensor_is_contiguous(t)) {
        fm_set_error(FM_ERR_FORMAT, "%s: optimizer shard '%s' is %s (expected f32 [%lld])", path, slot,
                     t ? "of another shape or dtype" : "missing", (long long)shard);
        return NULL;
    }
    return fm_tensor_data(t);
}

fm_status fm_zero_shard_state(fm_zero *z, fm_named_list *out, fm_kv_list *meta, bool *nonfinite) {
    if (!z || !out) return fm_set_error(FM_ERR_INVALID, "zero shard state: NULL argument");
    memset(out, 0, sizeof *out);
    out->owns_tensors = true;
    if (nonfinite) *nonfinite = false;
    if (fm_optim_init_state(z->local) != FM_OK) return fm_last_status();
    fm_named_list local;
    if (fm_optim_state(z->local, &local) != FM_OK) return fm_last_status();
    const char *const *slots;
    int ns = slot_names(z->local, &slots);
    /* next to the parameters (the meta device: the planner's run of a rank) */
    const fm_device dev = z->n > 0 && on_meta(z->params[0]) ? fm_tensor_device(z->params[0]) : FM_CPU;
    fm_status st = FM_OK;
    for (int s = 0; s < ns && st == FM_OK; s++) {
        fm_tensor *t = fm_tensor_empty(1, &z->shard, FM_F32, dev);
        if (!t) { st = fm_last_status(); break; }
        if (dev.type == FM_DEV_CPU) {
            float *v = fm_tensor_data(t);
            if (pack_slot(z, &local, slots[s], v)) { fm_tensor_release(t); st = fm_last_status(); break; }
            for (int64_t i = 0; i < z->shard && nonfinite && !*nonfinite; i++)
                if (!isfinite(v[i])) *nonfinite = true;
        }
        st = fm_named_list_push(out, slots[s], t, false, true);
        fm_tensor_release(t);
    }
    fm_named_list_free(&local);
    char b[5][32];
    snprintf(b[0], sizeof b[0], "%d", z->d->size);
    snprintf(b[1], sizeof b[1], "%d", z->d->rank);
    snprintf(b[2], sizeof b[2], "%lld", (long long)z->total);
    snprintf(b[3], sizeof b[3], "%lld", (long long)z->shard);
    snprintf(b[4], sizeof b[4], "%016llx", (unsigned long long)layout_of_zero(z));
    static const char *const keys[] = {"zero_world_size", "zero_rank", "zero_total", "zero_shard", "zero_layout"};
    for (int i = 0; i < 5 && st == FM_OK && meta; i++) st = fm_kv_set(meta, keys[i], b[i]);
    if (st) fm_named_list_free(out);
    return st;
}

fm_status fm_zero_save_shard(fm_zero *z, const char *path, bool *nonfinite) {
    if (!z || !path) return fm_set_error(FM_ERR_INVALID, "zero save shard: NULL argument");
    fm_named_list out;
    fm_kv_list meta;
    memset(&meta, 0, sizeof meta);
    fm_status st = fm_zero_shard_state(z, &out, &meta, nonfinite);
    if (st == FM_OK) st = fm_safetensors_save(path, &out, &meta);
    fm_kv_free(&meta);
    fm_named_list_free(&out);
    return st;
}

fm_status fm_zero_load_shard(fm_zero *z, const char *path) {
    if (!z || !path) return fm_set_error(FM_ERR_INVALID, "zero load shard: NULL argument");
    if (fm_optim_init_state(z->local) != FM_OK) return fm_last_status();
    fm_named_list file, local;
    int64_t shard = 0;
    fm_status st = read_shard(path, z->d->size, z->d->rank, z->total, layout_of_zero(z), &file, &shard);
    if (st) return st;
    if (shard != z->shard) {
        fm_named_list_free(&file);
        return fm_set_error(FM_ERR_FORMAT, "%s: shards of %lld values, this run's are %lld", path, (long long)shard,
                            (long long)z->shard);
    }
    if ((st = fm_optim_state(z->local, &local))) { fm_named_list_free(&file); return st; }
    const char *const *slots;
    int ns = slot_names(z->local, &slots);
    int64_t base = (int64_t)z->d->rank * z->shard;
    for (int s = 0; s < ns && st == FM_OK; s++) {
        const float *src = shard_slot(&file, slots[s], shard, path);
        if (!src) { st = fm_last_status(); break; }
        for (int j = 0; j < local.n; j++) {
            const char *sfx;
            int k = view_of(z, local.items[j].name, &sfx);
            if (k < 0 || strcmp(sfx, slots[s])) continue;
            zero_view *v = &z->views[k];
            if ((st = write_f32(local.items[j].tensor, src + (z->off[v->param] + v->lo - base)))) break;
        }
    }
    fm_named_list_free(&local);
    fm_named_list_free(&file);
    return st;
}

fm_status fm_zero_state_from_shards(const char *const *paths, int world, const fm_optim *full, fm_named_list *out) {
    if (!paths || world < 1 || !full || !out) return fm_set_error(FM_ERR_INVALID, "zero state from shards: bad arguments");
    memset(out, 0, sizeof *out);
    out->owns_tensors = true;
    int64_t total = 0;
    const uint64_t layout = layout_of(full, &total);
    const char *const *slots;
    const int ns = slot_names(full, &slots);
    float *flat = malloc(sizeof(float) * (size_t)(ns * total + 1));
    if (!flat) return fm_set_error(FM_ERR_OOM, "zero: out of memory for %lld state values", (long long)(ns * total));
    fm_status st = FM_OK;
    for (int r = 0; r < world && st == FM_OK; r++) {
        fm_named_list l;
        int64_t shard = 0;
        if ((st = read_shard(paths[r], world, r, total, layout, &l, &shard))) break;
        int64_t lo = (int64_t)r * shard, hi = lo + shard < total ? lo + shard : total;
        for (int s = 0; s < ns && st == FM_OK && hi > lo; s++) {
            const float *src = shard_slot(&l, slots[s], shard, paths[r]);
            if (!src) st = fm_last_status();
            else memcpy(flat + (int64_t)s * total + lo, src, sizeof(float) * (size_t)(hi - lo));
        }
        fm_named_list_free(&l);
    }
    for (int s = 0; s < ns && st == FM_OK; s++) {
        int64_t off = 0;
        for (int i = 0, n = fm_optim_param_count(full); i < n && st == FM_OK; i++) {
            const char *name;
            fm_tensor *p;
            if ((st = fm_optim_param_at(full, i, &name, &p, NULL))) break;
            fm_tensor *t = fm_tensor_empty(p->ndim, p->shape, FM_F32, FM_CPU);
            if (!t) { st = fm_last_status(); break; }
            memcpy(fm_tensor_data(t), flat + (int64_t)s * total + off, sizeof(float) * (size_t)fm_tensor_numel(t));
            off += fm_tensor_numel(t);
            char nm[600];
            snprintf(nm, sizeof nm, "%s.%s", name, slots[s]);
            st = fm_named_list_push(out, nm, t, false, true);
            fm_tensor_release(t);
        }
    }
    free(flat);
    if (st) fm_named_list_free(out);
    return st;
}
