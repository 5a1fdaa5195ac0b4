/* Sharded checkpoint units written by every rank, and ZeRO-1 shards read back (dist_ckpt.h). */
#include <dirent.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_ckpt.h"
#include "fathom/autograd.h" /* fm_set_grad_enabled */
#include "fathom/ops.h"      /* fm_copy_ */
#include "io/io_internal.h" /* checkpoint units */

void dist_ckpt_file(char *buf, size_t n, const char *kind, int rank, int world) {
    snprintf(buf, n, "%s-%05d-of-%05d.safetensors", kind, rank, world);
}

int dist_ckpt_world(const char *dir, const char *kind) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    const size_t kl = strlen(kind);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL) {
        int w = 0, k = 0;
        if (!strncmp(e->d_name, kind, kl) && sscanf(e->d_name + kl, "-00000-of-%5d%n", &w, &k) == 1 && w > 0 &&
            !strcmp(e->d_name + kl + k, ".safetensors"))
            n = w;
    }
    closedir(d);
    return n;
}

/* bad: 1 = a file not written on some rank; 4096 (more than any count of ranks) = NaN or inf */
#define NONFINITE 4096

fm_status dist_ckpt_save(const dist_ckpt_unit *u, bool *poisoned) {
    if (!u || !u->d || !u->out_dir || !u->write || u->n_common < 0 || u->n_kinds < 0)
        return fm_set_error(FM_ERR_INVALID, "sharded checkpoint: bad arguments");
    const int rank = fm_dist_rank(u->d), world = fm_dist_size(u->d);
    struct { int32_t st; char tmp[PATH_MAX]; } hdr;
    memset(&hdr, 0, sizeof hdr);
    fm_ckpt_tx tx;
    memset(&tx, 0, sizeof tx);
    fm_status st = FM_OK;
    char why[512] = "";
    if (rank == 0) {
        st = fm_ckpt_begin(&tx, u->out_dir, u->step);
        if (st) snprintf(why, sizeof why, "%s", fm_last_error());
        hdr.st = (int32_t)st;
        snprintf(hdr.tmp, sizeof hdr.tmp, "%s", tx.tmp);
    }
    if (fm_dist_broadcast(u->d, &hdr, sizeof hdr, 0) != FM_OK) {
        if (rank == 0) fm_ckpt_abort(&tx);
        return fm_last_status();
    }
    /* every rank writes (or, without a unit, takes part in the writer's collectives) */
    bool nonfinite = false;
    fm_status wst = u->write(u->ctx, hdr.st == FM_OK ? hdr.tmp : NULL, &nonfinite);
    double bad = nonfinite ? NONFINITE : (wst != FM_OK || hdr.st != FM_OK) ? 1 : 0;
    if (hdr.st != FM_OK)
        st = rank == 0 ? fm_set_error((fm_status)hdr.st, "%s", why)
                       : fm_set_error(FM_ERR_IO, "rank 0 could not open the checkpoint unit (its error says why)");
    else
        st = wst;
    double all = bad; /* every rank learns whether every file was written */
    if (fm_dist_allreduce_sum_f64(u->d, &all, 1) != FM_OK) {
        if (rank == 0) fm_ckpt_abort(&tx);
        return fm_last_status();
    }
    if (all >= NONFINITE && poisoned) *poisoned = true;
    if (all > 0) {
        if (rank == 0) fm_ckpt_abort(&tx);
        if (!st) st = fm_set_error(all >= NONFINITE ? FM_ERR_STATE : FM_ERR_IO, "%s", all >= NONFINITE ? "another rank "
                                   "found NaN or inf in the weights or its optimizer shard (its error says which)" :
                                   "another rank could not write its part of the checkpoint (its error says why)");
        fm_error_prefix("checkpoint of step %lld not written; the previous checkpoints in %s/ckpt are unchanged",
                        (long long)u->step, u->out_dir);
        return st;
    }
    if (rank != 0) return FM_OK;
    /* the MANIFEST: rank 0's files, then every rank's file of each kind, kind by kind */
    const int total = u->n_common + u->n_kinds * world;
    const char **names = calloc((size_t)total + 1, sizeof *names);
    char *store = calloc((size_t)(u->n_kinds * world) + 1, 300);
    if (!names || !store) st = fm_set_error(FM_ERR_OOM, "out of host memory");
    for (int i = 0; !st && i < total; i++) {
        if (i < u->n_common) { names[i] = u->common[i]; continue; }
        const int k = i - u->n_common;
        char *b = store + (size_t)k * 300;
        dist_ckpt_file(b, 300, u->kinds[k / world], k % world, world);
        names[i] = b;
    }
    if (!st) st = fm_ckpt_commit(&tx, total, names, u->keep, u->log);
    else fm_ckpt_abort(&tx);
    free(names);
    free(store);
    return st;
}

fm_status dist_ckpt_load_zero(const char *dir, int world, int rank, int now, fm_dist_trainer *dt, fm_optim *full) {
    if (!dir || world < 1 || !full) return fm_set_error(FM_ERR_INVALID, "ZeRO-1 shards: bad arguments");
    fm_zero *z = fm_dist_trainer_zero(dt);
    char name[64];
    if (z && world == now) { /* the same sharding: this rank's own shard, as it is */
        dist_ckpt_file(name, sizeof name, "zero-shard", rank, world);
        char *path = malloc(strlen(dir) + sizeof name + 2);
        if (!path) return fm_set_error(FM_ERR_OOM, "out of host memory");
        sprintf(path, "%s/%s", dir, name);
        fm_status st = fm_zero_load_shard(z, path);
        free(path);
        return st;
    }
    /* another world size, plain data parallel or one process: the whole state, resharded */
    char **paths = calloc((size_t)world, sizeof *paths);
    fm_status st = paths ? FM_OK : fm_set_error(FM_ERR_OOM, "out of host memory");
    for (int r = 0; r < world && !st; r++) {
        dist_ckpt_file(name, sizeof name, "zero-shard", r, world);
        if (!(paths[r] = malloc(strlen(dir) + sizeof name + 2))) st = fm_set_error(FM_ERR_OOM, "out of host memory");
        else sprintf(paths[r], "%s/%s", dir, name);
    }
    fm_named_list whole;
    memset(&whole, 0, sizeof whole);
    if (!st) st = fm_zero_state_from_shards((const char *const *)paths, world, full, &whole);
    if (!st && dt) st = fm_dist_trainer_load_full_state(dt, &whole);
    if (!st && !dt) {
        fm_named_list mine;
        if (!(st = fm_optim_init_state(full)) && !(st = fm_optim_state(full, &mine))) {
            bool prev = fm_set_grad_enabled(false);
            for (int i = 0; i < mine.n && !st; i++) {
                int k = fm_named_list_find(&whole, mine.items[i].name);
                st = k < 0 ? fm_set_error(FM_ERR_FORMAT, "%s: optimizer state '%s' is in no shard", dir, mine.items[i].name)
                           : fm_copy_(mine.items[i].tensor, whole.items[k].tensor);
            }
            fm_set_grad_enabled(prev);
            fm_named_list_free(&mine);
        }
    }
    fm_named_list_free(&whole);
    for (int r = 0; paths && r < world; r++) free(paths[r]);
    free(paths);
    return st;
}
