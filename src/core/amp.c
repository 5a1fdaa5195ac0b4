/* Autocast state (thread-local) and the input cast used by the ops that opt in. */
#include "fathom/amp.h"
#include <string.h>

#include "fathom/ops.h"

static _Thread_local fm_dtype t_autocast = FM_F32;

fm_dtype fm_autocast_set(fm_dtype dt) {
    fm_dtype prev = t_autocast;
    t_autocast = (dt == FM_BF16 || dt == FM_F16) ? dt : FM_F32;
    return prev;
}

fm_dtype fm_autocast_get(void) { return t_autocast; }

fm_tensor *fm_autocast_input(fm_tensor *t) {
    if (!t) return NULL;
    if (t_autocast != FM_F32 && t->dtype == FM_F32) return fm_to_dtype(t, t_autocast);
    return fm_tensor_retain(t);
}

bool fm_autocast_would_cast(const fm_tensor *t) {
    return t && t_autocast != FM_F32 && t->dtype != t_autocast &&
           (t->dtype == FM_F32 || t->dtype == FM_BF16 || t->dtype == FM_F16);
}

fm_tensor *fm_autocast_lowp(fm_tensor *t) {
    if (!t) return NULL;
    return fm_autocast_would_cast(t) ? fm_to_dtype(t, t_autocast) : fm_tensor_retain(t);
}

fm_tensor *fm_autocast_f32(fm_tensor *t) {
    if (!t) return NULL;
    if (t_autocast != FM_F32 && (t->dtype == FM_BF16 || t->dtype == FM_F16)) return fm_to_dtype(t, FM_F32);
    return fm_tensor_retain(t);
}

fm_status fm_precision_parse(const char *s, fm_dtype *out) {
    static const struct { const char *name; fm_dtype dt; } names[] = {
        {"fp32", FM_F32}, {"f32", FM_F32}, {"float32", FM_F32}, {"bf16", FM_BF16}, {"bfloat16", FM_BF16},
        {"fp16", FM_F16}, {"f16", FM_F16}, {"float16", FM_F16}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) { *out = names[i].dt; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "unknown precision '%s' (expected fp32, bf16 or fp16)", s ? s : "(null)");
}

const char *fm_precision_name(fm_dtype dt) {
    return dt == FM_BF16 ? "bf16" : dt == FM_F16 ? "fp16" : dt == FM_F32 ? "fp32" : "?";
}
