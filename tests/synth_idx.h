/* The synthetic image set the trainer tests share (test_train, test_prune,
 * test_distill): 4 classes of 8x8 u8 images, each class a bright 4x4 quadrant on
 * noise, written as idx files DIR/NAME-images and DIR/NAME-labels. The same
 * bytes for the same seed on every run, so a tiny model learns it in a few steps. */
#ifndef FATHOM_TESTS_SYNTH_IDX_H
#define FATHOM_TESTS_SYNTH_IDX_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void synth_write_idx(const char *path, int ndim, const int *dims, const unsigned char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    unsigned char hdr[4] = {0, 0, 0x08, (unsigned char)ndim};
    fwrite(hdr, 1, 4, f);
    for (int i = 0; i < ndim; i++) {
        unsigned char d[4] = {(unsigned char)(dims[i] >> 24), (unsigned char)(dims[i] >> 16),
                              (unsigned char)(dims[i] >> 8), (unsigned char)dims[i]};
        fwrite(d, 1, 4, f);
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

static void synth_quadrants(const char *dir, const char *name, int n, uint32_t seed) {
    unsigned char *img = malloc((size_t)n * 64), *lab = malloc((size_t)n);
    if (!img || !lab) { fprintf(stderr, "synth_quadrants: out of memory\n"); exit(2); }
    uint32_t s = seed;
    for (int i = 0; i < n; i++) {
        int c = i % 4;
        lab[i] = (unsigned char)c;
        for (int p = 0; p < 64; p++) {
            s = s * 1664525u + 1013904223u;
            int y = p / 8, x = p % 8, q = (y >= 4) * 2 + (x >= 4);
            img[i * 64 + p] = (unsigned char)((s >> 24) % 100 + (q == c ? 120 : 0));
        }
    }
    char path[512];
    int d3[3] = {n, 8, 8}, d1[1] = {n};
    snprintf(path, sizeof path, "%s/%s-images", dir, name);
    synth_write_idx(path, 3, d3, img, (size_t)n * 64);
    snprintf(path, sizeof path, "%s/%s-labels", dir, name);
    synth_write_idx(path, 1, d1, lab, (size_t)n);
    free(img);
    free(lab);
}
#endif
