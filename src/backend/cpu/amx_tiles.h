/* The AMX tile configuration fathom's tile kernels use (gemm_amx.c, quant_panel_amx.c):
 * palette 1, eight tiles of 16 rows x 64 bytes (tiles 0-3 a 32x32 block of C, 4-5 two
 * A tiles, 6-7 two B tiles). The configuration is per thread: load it before a
 * kernel's tiles and release them after (_tile_release), so that the thread's tile
 * state is not carried through context switches. Include only from *_amx.c files. */
#ifndef FATHOM_AMX_TILES_H
#define FATHOM_AMX_TILES_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef struct fm_amx_tile_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} fm_amx_tile_config;

static inline void fm_amx_tiles_on(void) {
    fm_amx_tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.rows[i] = 16;
        c.colsb[i] = 64;
    }
    _tile_loadconfig(&c);
}
#endif
