/* Batches uploaded one step ahead (fathom/train_step.h: fm_batch_stage).
 *
 * A trainer takes batch N (already on the device), puts batch N+1, then runs step
 * N. put copies the host batch into staging memory from the backend (CUDA: the
 * page-locked cache) and queues its upload with copy_h2d_ahead (CUDA: on the copy
 * stream, not waited for by compute), so on a GPU the upload runs while step N's
 * compute does; take makes the compute queued afterwards wait for the upload
 * (ticket_wait: an event, the host does not wait). The staging block goes back to
 * its cache as soon as the copy is queued: the cache reuses a block only once its
 * last copy has finished. A backend without these entries gets a plain copy_h2d at
 * put (the CPU needs no staging: its trainer reads the loader's batch in place).
 *
 * The check device runs the same calls synchronously and counts them, so
 * tests/test_train_stage.c sees that batch N+1's upload is issued before step N's
 * first kernel and waited for only when step N+1 takes it. */
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "fathom/ops.h"
#include "fathom/train_step.h"

enum { STAGE_DEPTH = 4 };

typedef struct staged {
    fm_tensor *t[2];
    void *ticket[2];
} staged;

struct fm_batch_stage {
    fm_device dev;
    const fm_backend *be;
    staged q[STAGE_DEPTH];
    int head, n;
};

fm_batch_stage *fm_batch_stage_new(fm_device dev) {
    if (dev.type == FM_DEV_CPU) {
        fm_set_error(FM_ERR_INVALID, "batch staging: the cpu needs none (its trainer reads the loader's batch in place)");
        return NULL;
    }
    if (fm_device_validate(dev) != FM_OK) return NULL;
    const fm_backend *be = fm_backend_get(dev.type);
    if (!be) {
        char nm[32];
        fm_set_error(FM_ERR_UNSUPPORTED, "batch staging: device %s has no backend", fm_device_name(dev, nm, sizeof nm));
        return NULL;
    }
    fm_batch_stage *s = calloc(1, sizeof *s);
    if (!s) { fm_set_error(FM_ERR_OOM, "batch staging: out of host memory"); return NULL; }
    s->dev = dev;
    s->be = be;
    return s;
}

/* One host tensor to a new device tensor, its upload queued (*ticket) or done. */
static fm_tensor *upload(fm_batch_stage *s, const fm_tensor *h, void **ticket) {
    *ticket = NULL;
    if (h->storage->device.type != FM_DEV_CPU) return fm_tensor_to((fm_tensor *)h, s->dev); /* already elsewhere */
    fm_tensor *c = fm_tensor_is_contiguous(h) ? fm_tensor_retain((fm_tensor *)h) : fm_contiguous((fm_tensor *)h);
    fm_tensor *d = c ? fm_tensor_empty(h->ndim, h->shape, h->dtype, s->dev) : NULL;
    if (!d) { fm_tensor_release(c); return NULL; }
    const size_t n = fm_tensor_nbytes(c);
    const fm_backend *be = s->be;
    fm_status st;
    if (be->copy_h2d_ahead && be->host_alloc && be->host_free && be->ticket_wait) {
        void *stg = be->host_alloc(s->dev.index, n);
        if (!stg) {
            st = fm_set_error(FM_ERR_OOM, "batch staging: no staging memory for %zu bytes", n);
        } else {
            memcpy(stg, fm_tensor_data(c), n);
            st = be->copy_h2d_ahead(s->dev.index, fm_tensor_data(d), stg, n, ticket);
            be->host_free(stg); /* reused by the cache only once the copy is done */
        }
    } else {
        st = be->copy_h2d(s->dev.index, fm_tensor_data(d), fm_tensor_data(c), n);
    }
    fm_tensor_release(c);
    if (st != FM_OK) {
        fm_tensor_release(d);
        return NULL;
    }
    return d;
}

static void drop(fm_batch_stage *s, staged *b) {
    for (int i = 0; i < 2; i++) {
        /* compute that may reuse the block after its release is ordered after the copy */
        if (b->ticket[i]) s->be->ticket_wait(s->dev.index, b->ticket[i]);
        fm_tensor_release(b->t[i]);
    }
    memset(b, 0, sizeof *b);
}

fm_status fm_batch_stage_put(fm_batch_stage *s, const fm_tensor *x, const fm_tensor *y) {
    if (!s || !x || !y) return fm_set_error(FM_ERR_INVALID, "batch staging: NULL stage or batch");
    if (s->n == STAGE_DEPTH) return fm_set_error(FM_ERR_STATE, "batch staging: %d batches staged and none taken", s->n);
    staged *b = &s->q[(s->head + s->n) % STAGE_DEPTH];
    memset(b, 0, sizeof *b);
    b->t[0] = upload(s, x, &b->ticket[0]);
    b->t[1] = b->t[0] ? upload(s, y, &b->ticket[1]) : NULL;
    if (!b->t[1]) {
        fm_status st = fm_last_status();
        drop(s, b);
        return st;
    }
    s->n++;
    return FM_OK;
}

fm_status fm_batch_stage_take(fm_batch_stage *s, fm_tensor **x, fm_tensor **y) {
    *x = *y = NULL;
    if (!s || s->n == 0) return fm_set_error(FM_ERR_STATE, "batch staging: no batch staged");
    staged *b = &s->q[s->head];
    fm_status st = FM_OK;
    for (int i = 0; i < 2; i++) {
        fm_status w = b->ticket[i] ? s->be->ticket_wait(s->dev.index, b->ticket[i]) : FM_OK;
        b->ticket[i] = NULL;
        if (st == FM_OK) st = w;
    }
    s->head = (s->head + 1) % STAGE_DEPTH;
    s->n--;
    if (st != FM_OK) {
        drop(s, b);
        return st;
    }
    *x = b->t[0];
    *y = b->t[1];
    memset(b, 0, sizeof *b);
    return FM_OK;
}

int fm_batch_stage_count(const fm_batch_stage *s) { return s ? s->n : 0; }

void fm_batch_stage_clear(fm_batch_stage *s) {
    if (!s) return;
    while (s->n > 0) {
        drop(s, &s->q[s->head]);
        s->head = (s->head + 1) % STAGE_DEPTH;
        s->n--;
    }
}

void fm_batch_stage_free(fm_batch_stage *s) {
    fm_batch_stage_clear(s);
    free(s);
}
