/* Load/store one element of any dtype as double: the slow, general path used by
 * element access, printing, and kernels' fallbacks for uncommon dtypes. */
#ifndef FATHOM_DTYPE_INTERNAL_H
#define FATHOM_DTYPE_INTERNAL_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "fathom/tensor.h"

static inline double fm_load_f64(const void *p, fm_dtype dt) {
    switch (dt) {
    case FM_F32: return *(const float *)p;
    case FM_F64: return *(const double *)p;
    case FM_F16: return fm_f16_to_f32(*(const uint16_t *)p);
    case FM_BF16: return fm_bf16_to_f32(*(const uint16_t *)p);
    case FM_I8: return *(const int8_t *)p;
    case FM_U8: return *(const uint8_t *)p;
    case FM_I32: return *(const int32_t *)p;
    case FM_I64: return (double)*(const int64_t *)p;
    case FM_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
    default: return 0;
    }
}

/* Integer stores truncate toward zero and saturate, so out-of-range values never
 * hit undefined behaviour. */
static inline int64_t fm_sat_i64(double v, double lo, double hi) {
    if (v != v) return 0;
    if (v < lo) v = lo;
    if (v > hi) v = hi;
    return (int64_t)v;
}

static inline void fm_store_f64(void *p, fm_dtype dt, double v) {
    switch (dt) {
    case FM_F32: *(float *)p = (float)v; break;
    case FM_F64: *(double *)p = v; break;
    case FM_F16: *(uint16_t *)p = fm_f32_to_f16((float)v); break;
    case FM_BF16: *(uint16_t *)p = fm_f32_to_bf16((float)v); break;
    case FM_I8: *(int8_t *)p = (int8_t)fm_sat_i64(v, -128, 127); break;
    case FM_U8: *(uint8_t *)p = (uint8_t)fm_sat_i64(v, 0, 255); break;
    case FM_I32: *(int32_t *)p = (int32_t)fm_sat_i64(v, -2147483648.0, 2147483647.0); break;
    case FM_I64: *(int64_t *)p = fm_sat_i64(v, -9.2233720368547748e18, 9.2233720368547748e18 - 1024.0); break;
    case FM_BOOL: *(uint8_t *)p = v != 0; break;
    default: break;
    }
}

/* Exact int64 load for index tensors (i32/i64/u8/i8/bool). */
static inline int64_t fm_load_i64(const void *p, fm_dtype dt) {
    switch (dt) {
    case FM_I64: return *(const int64_t *)p;
    case FM_I32: return *(const int32_t *)p;
    case FM_I8: return *(const int8_t *)p;
    case FM_U8: case FM_BOOL: return *(const uint8_t *)p;
    default: return (int64_t)fm_load_f64(p, dt);
    }
}
#endif
