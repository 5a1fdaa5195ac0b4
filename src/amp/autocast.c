/* Autocast: the thread's setting and the one function that applies the
 * precision policy (the prec column of fathom/ops.def) to an op's inputs.
 * Precision names for options and messages live here too. */
#include "amp/autocast.h"

#include <string.h>

static _Thread_local fm_dtype t_autocast = FM_F32;

fm_dtype fm_autocast_set(fm_dtype dt) {
    fm_dtype prev = t_autocast;
    t_autocast = (dt == FM_BF16 || dt == FM_F16) ? dt : FM_F32;
    return prev;
}

fm_dtype fm_autocast_get(void) { return t_autocast; }

static bool lowp_dt(fm_dtype dt) { return dt == FM_BF16 || dt == FM_F16; }

/* The dtype t should have under op's policy (t's own when it stays). For
 * PROMOTE, `wide` is the promoted dtype of the inputs (FM_DTYPE_COUNT: none). */
static fm_dtype target(fm_prec prec, const fm_tensor *t, fm_dtype wide) {
    if (!t) return FM_DTYPE_COUNT;
    switch (prec) {
    case FM_PREC_LOWP: /* any f32/bf16/f16 input to the autocast dtype (as torch.autocast) */
        return (t->dtype == FM_F32 || lowp_dt(t->dtype)) ? t_autocast : t->dtype;
    case FM_PREC_F32: return lowp_dt(t->dtype) ? FM_F32 : t->dtype;
    case FM_PREC_PROMOTE: return wide != FM_DTYPE_COUNT ? wide : t->dtype;
    default: return t->dtype;
    }
}

/* Mixed float dtypes promote to the wider one; bf16 with f16 (same size) to f32. */
static fm_dtype promoted(int n, fm_tensor *const *in) {
    fm_dtype wide = FM_DTYPE_COUNT;
    bool mixed = false;
    for (int i = 0; i < n; i++) {
        if (!in[i]) continue;
        if (!fm_dtype_is_float(in[i]->dtype)) return FM_DTYPE_COUNT;
        if (wide == FM_DTYPE_COUNT) { wide = in[i]->dtype; continue; }
        if (in[i]->dtype == wide) continue;
        mixed = true;
        size_t a = fm_dtype_size(wide), b = fm_dtype_size(in[i]->dtype);
        wide = a == b ? FM_F32 : a > b ? wide : in[i]->dtype;
    }
    return mixed ? wide : FM_DTYPE_COUNT;
}

static fm_prec policy(fm_op_id op) {
    const fm_op_info *info = fm_op_get_info(op);
    return t_autocast != FM_F32 && info ? info->prec : FM_PREC_ANY;
}

bool fm_autocast_changes(fm_op_id op, int n, fm_tensor *const *in) {
    fm_prec prec = policy(op);
    if (prec == FM_PREC_ANY) return false;
    fm_dtype wide = prec == FM_PREC_PROMOTE ? promoted(n, in) : FM_DTYPE_COUNT;
    for (int i = 0; i < n; i++)
        if (in[i] && target(prec, in[i], wide) != in[i]->dtype) return true;
    return false;
}

int fm_autocast_inputs(fm_op_id op, int n, fm_tensor *const *in, fm_tensor **out) {
    if (!fm_autocast_changes(op, n, in)) return 0;
    fm_prec prec = policy(op);
    fm_dtype wide = prec == FM_PREC_PROMOTE ? promoted(n, in) : FM_DTYPE_COUNT;
    for (int i = 0; i < n; i++) out[i] = NULL;
    for (int i = 0; i < n; i++) {
        if (!in[i]) continue;
        if (!(out[i] = fm_to_dtype(in[i], target(prec, in[i], wide)))) {
            for (int j = 0; j < i; j++) { fm_tensor_release(out[j]); out[j] = NULL; }
            return -1;
        }
    }
    return 1;
}

fm_tensor *fm_autocast_cast(fm_op_id op, fm_tensor *t) {
    if (!t) return NULL;
    fm_prec prec = policy(op);
    return prec == FM_PREC_ANY || prec == FM_PREC_PROMOTE ? fm_tensor_retain(t) : fm_to_dtype(t, target(prec, t, FM_DTYPE_COUNT));
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
