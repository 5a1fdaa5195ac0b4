/* dtype names, sizes and conversions. Scalar f16/bf16 conversions round to
 * nearest even; the bulk converters use F16C/AVX2 (dtype_avx2.c) when present. */
#include <math.h>
#include <string.h>

#include "core/cpu_features.h"
#include "fathom/tensor.h"

static const struct { const char *name; size_t size; bool is_float; } k_dtypes[FM_DTYPE_COUNT] = {
    [FM_F32] = {"f32", 4, true},  [FM_F64] = {"f64", 8, true}, [FM_F16] = {"f16", 2, true},
    [FM_BF16] = {"bf16", 2, true}, [FM_I8] = {"i8", 1, false}, [FM_U8] = {"u8", 1, false},
    [FM_I32] = {"i32", 4, false}, [FM_I64] = {"i64", 8, false}, [FM_BOOL] = {"bool", 1, false},
};

size_t fm_dtype_size(fm_dtype dt) { return (unsigned)dt < FM_DTYPE_COUNT ? k_dtypes[dt].size : 0; }
const char *fm_dtype_name(fm_dtype dt) { return (unsigned)dt < FM_DTYPE_COUNT ? k_dtypes[dt].name : "invalid"; }
bool fm_dtype_is_float(fm_dtype dt) { return (unsigned)dt < FM_DTYPE_COUNT && k_dtypes[dt].is_float; }

fm_status fm_dtype_from_name(const char *name, fm_dtype *out) {
    static const struct { const char *alias; fm_dtype dt; } aliases[] = {
        {"float32", FM_F32}, {"float", FM_F32}, {"fp32", FM_F32}, {"float64", FM_F64}, {"double", FM_F64},
        {"float16", FM_F16}, {"half", FM_F16}, {"fp16", FM_F16}, {"bfloat16", FM_BF16},
        {"int8", FM_I8}, {"uint8", FM_U8}, {"int32", FM_I32}, {"int64", FM_I64}, {"long", FM_I64}};
    for (int i = 0; i < FM_DTYPE_COUNT; i++)
        if (!strcmp(name, k_dtypes[i].name)) { *out = (fm_dtype)i; return FM_OK; }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(name, aliases[i].alias)) { *out = aliases[i].dt; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "unknown dtype '%s' (expected f32, f64, f16, bf16, i8, u8, i32, i64 or bool)", name);
}

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t fm_f32_to_f16(float f) {
    uint32_t x = f2u(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: overflow */
    if (ax < 0x38800000u) { /* result is subnormal or zero: scale into place with an fp add */
        float r = u2f(ax) + 0.5f; /* 0.5 has the exponent where f16 subnormal ulp = 2^-24 becomes 1 ulp of float */
        return (uint16_t)(sign | (f2u(r) - f2u(0.5f)));
    }
    uint32_t mant_odd = (ax >> 13) & 1u;
    ax += ((uint32_t)(15 - 127) << 23) + 0xfffu + mant_odd; /* rebias + round to nearest even */
    return (uint16_t)(sign | (ax >> 13));
}

float fm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f); /* 2^-24 */
        return u2f(f2u(v) | sign);
    }
    if (exp == 31) return u2f(sign | 0x7f800000u | (mant << 13));
    return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t fm_f32_to_bf16(float f) {
    uint32_t x = f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float fm_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

/* SIMD versions live in dtype_avx2.c and dtype_avx512.c */
void fm_convert_f32_to_f16_avx2(const float *src, uint16_t *dst, size_t n);
void fm_convert_f16_to_f32_avx2(const uint16_t *src, float *dst, size_t n);
void fm_convert_f32_to_bf16_avx2(const float *src, uint16_t *dst, size_t n);
void fm_convert_bf16_to_f32_avx2(const uint16_t *src, float *dst, size_t n);
void fm_convert_f32_to_f16_avx512(const float *src, uint16_t *dst, size_t n);
void fm_convert_f16_to_f32_avx512(const uint16_t *src, float *dst, size_t n);
void fm_convert_f32_to_bf16_avx512(const float *src, uint16_t *dst, size_t n);
void fm_convert_bf16_to_f32_avx512(const uint16_t *src, float *dst, size_t n);
void fm_convert_f32_to_bf16_avx512bf16(const float *src, uint16_t *dst, size_t n);

void fm_convert_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    if (fm_cpu_use_avx512()) { fm_convert_f32_to_f16_avx512(src, dst, n); return; }
    if (fm_cpu_use_avx2()) { fm_convert_f32_to_f16_avx2(src, dst, n); return; }
    for (size_t i = 0; i < n; i++) dst[i] = fm_f32_to_f16(src[i]);
}
void fm_convert_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    if (fm_cpu_use_avx512()) { fm_convert_f16_to_f32_avx512(src, dst, n); return; }
    if (fm_cpu_use_avx2()) { fm_convert_f16_to_f32_avx2(src, dst, n); return; }
    for (size_t i = 0; i < n; i++) dst[i] = fm_f16_to_f32(src[i]);
}
void fm_convert_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
    if (fm_cpu_use_avx512()) {
        if (fm_cpu_get_features()->avx512_bf16) fm_convert_f32_to_bf16_avx512bf16(src, dst, n);
        else fm_convert_f32_to_bf16_avx512(src, dst, n);
        return;
    }
    if (fm_cpu_use_avx2()) { fm_convert_f32_to_bf16_avx2(src, dst, n); return; }
    for (size_t i = 0; i < n; i++) dst[i] = fm_f32_to_bf16(src[i]);
}
void fm_convert_bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
    if (fm_cpu_use_avx512()) { fm_convert_bf16_to_f32_avx512(src, dst, n); return; }
    if (fm_cpu_use_avx2()) { fm_convert_bf16_to_f32_avx2(src, dst, n); return; }
    for (size_t i = 0; i < n; i++) dst[i] = fm_bf16_to_f32(src[i]);
}
