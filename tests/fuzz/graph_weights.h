/* The weights.safetensors that fuzz_graph.c's graphs and its seed files
 * (tests/data/graph, loaded by test_graph.c) read: "w" [8, 8] and "b" [8] (f32),
 * and for the quantized ops "q8" (i8 [8, 8]), "q4" (u8 [8, 16]: 8 rows of 32 int4
 * codes), "s4" and "m4" (f16 [8, 1]), "p8" (i8 [1, 2, 16, 4]: int8 panels of 8
 * rows of 8) and "u8s" (i32 [8]: their row sums). */
#ifndef FATHOM_TESTS_FUZZ_GRAPH_WEIGHTS_H
#define FATHOM_TESTS_FUZZ_GRAPH_WEIGHTS_H
#include "fathom/io.h"
#include "fathom/nn.h" /* fm_named_list */
#include "fathom/tensor.h"

static inline fm_status graph_weights_save(const char *path) {
    const char *names[8] = {"w", "b", "q8", "q4", "s4", "m4", "p8", "u8s"};
    fm_tensor *t[8] = {
        fm_tensor_full(2, (int64_t[]){8, 8}, 0.5, FM_F32, FM_CPU),         fm_tensor_full(1, (int64_t[]){8}, 0.25, FM_F32, FM_CPU),
        fm_tensor_full(2, (int64_t[]){8, 8}, 3, FM_I8, FM_CPU),            fm_tensor_full(2, (int64_t[]){8, 16}, 0x5A, FM_U8, FM_CPU),
        fm_tensor_full(2, (int64_t[]){8, 1}, 0.01, FM_F16, FM_CPU),        fm_tensor_full(2, (int64_t[]){8, 1}, -0.05, FM_F16, FM_CPU),
        fm_tensor_full(4, (int64_t[]){1, 2, 16, 4}, 3, FM_I8, FM_CPU),     fm_tensor_full(1, (int64_t[]){8}, 24, FM_I32, FM_CPU)};
    fm_named_list l = {0};
    for (int i = 0; i < 8; i++) fm_named_list_push(&l, names[i], t[i], false, false);
    fm_status st = fm_safetensors_save(path, &l, NULL);
    fm_named_list_free(&l);
    for (int i = 0; i < 8; i++) fm_tensor_release(t[i]);
    return st;
}

#endif
