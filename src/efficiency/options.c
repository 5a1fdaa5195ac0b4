/* Efficiency options: parsing, validation of flag combinations, the pre-training
 * memory check and the checkpointing switch used by training loops. */
#include <string.h>

#include "fathom/efficiency.h"

fm_status fm_checkpointing_parse(const char *s, fm_checkpointing *out) {
    if (s && !strcmp(s, "none")) { *out = FM_CKPT_NONE; return FM_OK; }
    if (s && !strcmp(s, "blocks")) { *out = FM_CKPT_BLOCKS; return FM_OK; }
    if (s && !strcmp(s, "selective")) { *out = FM_CKPT_SELECTIVE; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "unknown checkpointing '%s' (expected none, blocks or selective)", s ? s : "(null)");
}

const char *fm_checkpointing_name(fm_checkpointing c) {
    return c == FM_CKPT_NONE ? "none" : c == FM_CKPT_BLOCKS ? "blocks" : c == FM_CKPT_SELECTIVE ? "selective" : "?";
}

fm_efficiency_opts fm_efficiency_defaults(void) {
    fm_efficiency_opts o;
    memset(&o, 0, sizeof o);
    o.precision = FM_F32;
    o.grad_accum = 1;
    o.checkpointing = FM_CKPT_NONE;
    o.memory_mode = FM_MEMORY_GROW;
    return o;
}

fm_status fm_efficiency_validate(const fm_efficiency_opts *o, bool is_transformer, int batch) {
    if (!o) return fm_set_error(FM_ERR_INVALID, "efficiency options are NULL");
    if (o->precision != FM_F32 && o->precision != FM_BF16 && o->precision != FM_F16)
        return fm_set_error(FM_ERR_INVALID, "--precision must be fp32, bf16 or fp16 (got %s)", fm_dtype_name(o->precision));
    if (o->grad_accum < 1)
        return fm_set_error(FM_ERR_INVALID, "--grad-accum must be at least 1 (got %d)", o->grad_accum);
    if (batch > 0 && batch % o->grad_accum)
        return fm_set_error(FM_ERR_INVALID, "--batch %d is not divisible by --grad-accum %d (each micro-batch must have the same size)",
                            batch, o->grad_accum);
    if ((unsigned)o->checkpointing > FM_CKPT_SELECTIVE)
        return fm_set_error(FM_ERR_INVALID, "--checkpointing must be none, blocks or selective");
    if (o->checkpointing != FM_CKPT_NONE && !is_transformer)
        return fm_set_error(FM_ERR_INVALID, "--checkpointing %s needs a model with blocks: a transformer, or for blocks "
                            "a conv net (its blocks end in pooling layers); this model has none",
                            fm_checkpointing_name(o->checkpointing));
    if (o->loss_scaling && o->precision != FM_F16)
        return fm_set_error(FM_ERR_INVALID, "loss scaling is for --precision fp16 (got %s: %s)", fm_precision_name(o->precision),
                            o->precision == FM_BF16 ? "bf16 has fp32's exponent range and needs no scaler" : "fp32 needs no scaler");
    if (o->stochastic_rounding && o->precision != FM_BF16)
        return fm_set_error(FM_ERR_INVALID, "--stochastic-rounding needs --precision bf16 (got %s)", fm_precision_name(o->precision));
    if (o->memory_mode != FM_MEMORY_GROW && o->memory_mode != FM_MEMORY_PREALLOCATE)
        return fm_set_error(FM_ERR_INVALID, "--memory-mode must be grow or preallocate");
    if (o->memory_mode == FM_MEMORY_GROW && (o->prealloc_bytes || o->prealloc_fraction))
        return fm_set_error(FM_ERR_INVALID, "a preallocation size needs --memory-mode preallocate");
    if (o->prealloc_fraction < 0 || o->prealloc_fraction > 1)
        return fm_set_error(FM_ERR_INVALID, "preallocation fraction must be in (0, 1] (got %g)", o->prealloc_fraction);
    if (o->memory_limit && o->prealloc_bytes > o->memory_limit) {
        char a[32], b[32];
        return fm_set_error(FM_ERR_INVALID, "preallocation %s is larger than --memory-limit %s",
                            fm_format_bytes(o->prealloc_bytes, a, sizeof a), fm_format_bytes(o->memory_limit, b, sizeof b));
    }
    if (o->data_workers < 0) return fm_set_error(FM_ERR_INVALID, "--workers must be >= 0 (got %d)", o->data_workers);
    return FM_OK;
}

fm_status fm_efficiency_apply_memory(const fm_efficiency_opts *o) {
    fm_memory_stats s;
    fm_status st = fm_memory_stats_get(o->device, &s); /* reads FATHOM_MEMORY_LIMIT etc. first */
    if (st != FM_OK) return st;
    fm_memory_config c = {o->memory_mode, o->prealloc_bytes, o->prealloc_fraction, o->memory_limit ? o->memory_limit : s.limit};
    if (c.mode == FM_MEMORY_PREALLOCATE && !c.prealloc_bytes && !c.prealloc_fraction) c.prealloc_fraction = 0.9;
    /* a device allocator other than the CPU's may not take a mode: growing with a limit is a limit */
    if (o->device.type != FM_DEV_CPU && c.mode == FM_MEMORY_GROW) return fm_memory_set_limit(o->device, c.limit);
    return fm_memory_configure(o->device, &c);
}

fm_status fm_efficiency_check_fits(const fm_efficiency_opts *o, int64_t n_params, int optimizer_slots) {
    return fm_efficiency_check_fits_sharded(o, n_params, optimizer_slots, 1);
}

fm_status fm_efficiency_check_fits_sharded(const fm_efficiency_opts *o, int64_t n_params, int optimizer_slots,
                                           int state_shards) {
    return fm_efficiency_check_fits_zero(o, n_params, optimizer_slots, state_shards, true);
}

fm_status fm_efficiency_check_fits_zero(const fm_efficiency_opts *o, int64_t n_params, int optimizer_slots,
                                        int state_shards, bool ckpt_gathers) {
    fm_memory_stats s;
    fm_status st = fm_memory_stats_get(o ? o->device : FM_CPU, &s);
    if (st != FM_OK) return st;
    size_t limit = o && o->memory_limit ? o->memory_limit : s.limit;
    if (!limit || n_params <= 0) return FM_OK;
    const int shards = state_shards > 1 ? state_shards : 1;
    const size_t slots = (size_t)(optimizer_slots > 0 ? optimizer_slots : 0);
    /* f32 weights + grads, and this rank's part of the state; sharded, a checkpoint that
     * gathers holds the whole state on every rank next to it (the gradients are gone by
     * then); one that writes the shard as it is copies only the shard (at most the
     * gradients' size from 2 shards on) */
    const size_t n = (size_t)n_params, own = slots * 4 * ((n + (size_t)shards - 1) / (size_t)shards);
    size_t need = n * 8 + own;
    const bool gathers = shards > 1 && ckpt_gathers;
    if (gathers && n * 4 + slots * 4 * n + own > need) need = n * 4 + slots * 4 * n + own;
    if (need <= limit) return FM_OK;
    char a[32], b[32], w[32], dn[32] = "cpu", sh[160] = "";
    if (o) fm_device_name(o->device, dn, sizeof dn);
    if (gathers)
        snprintf(sh, sizeof sh, " (ZeRO-1: this rank's 1/%d of the state, and the whole state a checkpoint gathers "
                 "next to the weights)", shards);
    else if (shards > 1)
        snprintf(sh, sizeof sh, " (ZeRO-1: this rank's 1/%d of the state; its checkpoints write that shard as it is)",
                 shards);
    return fm_set_error(FM_ERR_OOM,
                        "memory limit %s on %s cannot hold the model before training starts: %lld parameters need %s "
                        "for weights alone and %s with gradients and optimizer state%s (raise --memory-limit or use a "
                        "smaller model)",
                        fm_format_bytes(limit, a, sizeof a), dn, (long long)n_params, fm_format_bytes((size_t)n_params * 4, w, sizeof w),
                        fm_format_bytes(need, b, sizeof b), sh);
}

fm_status fm_efficiency_segment(const fm_efficiency_opts *o, fm_checkpointing level, fm_segment_fn fn, void *ctx,
                                int n_in, fm_tensor *const *inputs, int n_out, fm_tensor **outputs) {
    if (!fn) return fm_set_error(FM_ERR_INVALID, "segment: function is NULL");
    if (o && level != FM_CKPT_NONE && o->checkpointing == level && fm_grad_enabled())
        return fm_checkpoint(fn, ctx, n_in, inputs, n_out, outputs);
    for (int i = 0; i < n_out; i++) outputs[i] = NULL;
    fm_status st = fn(inputs, ctx, outputs);
    if (st != FM_OK)
        for (int i = 0; i < n_out; i++) { fm_tensor_release(outputs[i]); outputs[i] = NULL; }
    return st;
}
