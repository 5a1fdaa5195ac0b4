/* The int8 product on packed panels (quant_kernels.h, "vnni16x4") on AMX-INT8 tiles.
 *
 * The panel layout is already the tile unit's B operand: a panel's 16 steps of 4 k
 * (16 rows of 64 bytes, 16 columns x 4 k each) are one 1 KiB tile, so the weights
 * packed at quantize time load as they are. A's rows (u8, lda >= 4 Kq) load as
 * 16 x 64-byte tiles straight from the activations. TDPBUSD adds u8 x s8 products
 * into s32, as vpdpbusd does, so the integers equal the other kernels' and the
 * shared epilogue (quant_epilogue_avx512.h) gives the same floats.
 *
 * Block: 32 rows x 2 panels (32 columns) in four C tiles over all of K. What the
 * tiles cannot take goes to the VNNI kernel (the same integers): K not a multiple of
 * 64 (a tile row is 64 k), the rows past the last whole 32 and an odd last panel.
 * On one core of the Intel Xeon with AMX the tile unit does 7.7 int8 TOP/s against
 * vpdpbusd's ~1 (bench/bench_dot_rates.c's figure, 496 multiply-adds per ns). */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/quant_epilogue_avx512.h"

/* C[m .. m + 32, 16 p .. 16 p + 32] */
static void block(const fm_q8_pgemm *g, int64_t m, int64_t p, int64_t Kq) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint8_t *a = g->A + m * g->lda;
    const int8_t *b0 = g->P + p * Kq * 64, *b1 = b0 + Kq * 64;
    for (int64_t s = 0; s < Kq; s += 16) {
        _tile_loadd(4, a + 4 * s, g->lda);
        _tile_loadd(5, a + 16 * g->lda + 4 * s, g->lda);
        _tile_loadd(6, b0 + s * 64, 64);
        _tile_loadd(7, b1 + s * 64, 64);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    int32_t acc[32 * 32] __attribute__((aligned(64)));
    _tile_stored(0, acc, 128);
    _tile_stored(1, acc + 16, 128);
    _tile_stored(2, acc + 16 * 32, 128);
    _tile_stored(3, acc + 16 * 32 + 16, 128);
    for (int j = 0; j < 2; j++) {
        int64_t n = 16 * (p + j);
        if (n >= g->N) break;
        const q8_ep x = q8_ep_copy(g);
        col16 c = col_terms(&x, n);
        for (int i = 0; i < 32; i++) store16(&x, m + i, n, &c, _mm512_load_si512(acc + i * 32 + 16 * j));
    }
}

bool fm_q8_pgemm_tile_amx(const fm_q8_pgemm *g, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
    const int64_t Kq = (g->K + 3) / 4;
    if (Kq % 16 || g->lda < 4 * Kq) return false;
    int64_t mw = m0 + (m1 - m0) / 32 * 32, pw = p0 + (p1 - p0) / 2 * 2;
    if (mw > m0 && pw > p0) {
        fm_amx_tiles_on();
        for (int64_t p = p0; p < pw; p += 2)
            for (int64_t m = m0; m < mw; m += 32) block(g, m, p, Kq);
        _tile_release();
    } else {
        mw = m0;
        pw = p0;
    }
    if (mw < m1) fm_q8_pgemm_tile_vnni(g, mw, m1, p0, p1);
    if (pw < p1 && mw > m0) fm_q8_pgemm_tile_vnni(g, m0, mw, pw, p1);
    return true;
}
