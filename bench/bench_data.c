/* bench_data: data-loader throughput on Fashion-MNIST-sized data (60000 x 1 x 28
 * x 28 F32, the real set when installed) with the usual training transforms
 * (random crop with padding 2, horizontal flip, normalize), for 0, 1 and 2
 * worker threads. One JSON line per measurement:
 *   {"bench":"loader_epoch","workers":W,"batch":B,"metric":"batches_per_s","fathom":..,"samples_per_s":..}
 *   {"bench":"loader_overlap","workers":W,...,"metric":"wait_ms_per_batch","fathom":..}
 * The overlap run has the consumer busy for --work-ms per batch (a stand-in for a
 * training step) and reports how long it still waited for data: with workers the
 * next batch is prepared during the step, so the wait should drop to ~0.
 * There is no peer: a PyTorch DataLoader uses worker processes and pickling,
 * which is a different design rather than a comparable number.
 * Usage: bench_data [--data DIR] [--batch N] [--epochs E] [--work-ms X] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "fathom/data.h"

/* keeps the CPU busy (like a training step would) for `ms` */
static double busy(double ms) {
    double t0 = bench_now_s(), acc = 0;
    while ((bench_now_s() - t0) * 1e3 < ms)
        for (int i = 0; i < 1000; i++) acc += (double)i * 1e-9;
    return acc;
}

static void opts(fm_loader_options *o, int workers, int64_t batch) {
    fm_loader_options_init(o);
    o->batch_size = batch;
    o->shuffle = true;
    o->seed = 42;
    o->workers = workers;
    o->transforms.crop_padding = 2;
    o->transforms.hflip = true;
    o->transforms.normalize_channels = 1;
    o->transforms.mean[0] = 0.2860f;
    o->transforms.std[0] = 0.3530f;
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    int64_t batch = 64;
    int epochs = 2;
    double work_ms = 2.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--epochs") && i + 1 < argc) epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--work-ms") && i + 1 < argc) work_ms = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_data [--data DIR] [--batch N] [--epochs E] [--work-ms X]\n");
            return 2;
        }
    }
    double t0 = bench_now_s();
    fm_dataset *d = fm_dataset_fashion_mnist(dir, FM_SPLIT_TRAIN);
    const char *source = "fashion-mnist";
    if (d) {
        printf("{\"bench\":\"fashion_mnist_load\",\"metric\":\"ms\",\"fathom\":%.1f,\"samples\":%lld}\n",
               (bench_now_s() - t0) * 1e3, (long long)fm_dataset_size(d));
    } else {
        fprintf(stderr, "bench_data: %s; using synthetic data of the same size\n", fm_last_error());
        source = "synthetic";
        int64_t sx[4] = {60000, 1, 28, 28}, sy[1] = {60000};
        fm_rng r;
        fm_rng_init(&r, 1);
        fm_tensor *x = fm_tensor_rand(4, sx, FM_F32, &r), *y = fm_tensor_zeros(1, sy, FM_I64, FM_CPU);
        d = x && y ? fm_dataset_from_tensors(x, y) : NULL;
        fm_tensor_release(x);
        fm_tensor_release(y);
        if (!d) {
            fprintf(stderr, "bench_data: %s\n", fm_last_error());
            return 1;
        }
    }
    double sink = 0;
    for (int w = 0; w <= 2; w++) {
        fm_loader_options o;
        opts(&o, w, batch);
        fm_dataloader *l = fm_dataloader_create(d, &o);
        if (!l) {
            fprintf(stderr, "bench_data: %s\n", fm_last_error());
            return 1;
        }
        /* throughput: consume as fast as possible */
        fm_batch b;
        int64_t nb = 0;
        double ts = bench_now_s();
        for (int e = 0; e < epochs; e++)
            while (fm_dataloader_next(l, &b) == FM_OK && b.x) {
                sink += ((const float *)fm_tensor_data(b.x))[0];
                nb++;
            }
        double dt = bench_now_s() - ts;
        printf("{\"bench\":\"loader_epoch\",\"data\":\"%s\",\"workers\":%d,\"batch\":%lld,\"transforms\":\"crop2+hflip+normalize\","
               "\"metric\":\"batches_per_s\",\"fathom\":%.1f,\"samples_per_s\":%.0f,\"batches\":%lld}\n",
               source, w, (long long)batch, (double)nb / dt, (double)nb * (double)batch / dt, (long long)nb);
        /* overlap: a consumer that works on each batch */
        double w0 = fm_dataloader_wait_seconds(l);
        int64_t steps = 300;
        ts = bench_now_s();
        for (int64_t k = 0; k < steps;) {
            if (fm_dataloader_next(l, &b) != FM_OK) return 1;
            if (!b.x) continue;
            sink += busy(work_ms);
            k++;
        }
        double waited = fm_dataloader_wait_seconds(l) - w0;
        printf("{\"bench\":\"loader_overlap\",\"data\":\"%s\",\"workers\":%d,\"batch\":%lld,\"work_ms\":%.1f,"
               "\"metric\":\"wait_ms_per_batch\",\"fathom\":%.3f,\"step_ms\":%.3f}\n",
               source, w, (long long)batch, work_ms, waited * 1e3 / (double)steps, (bench_now_s() - ts) * 1e3 / (double)steps);
        fm_dataloader_free(l);
    }
    fm_dataset_release(d);
    if (sink == 12345.678) printf("#\n"); /* keep the reads alive */
    return 0;
}
