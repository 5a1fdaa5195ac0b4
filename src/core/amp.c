/* Autocast state (thread-local) and the input cast used by the ops that opt in. */
#include "fathom/amp.h"
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
