"""LinearAttention and CausalConvWithState (opset 27) run by `fathom run` (the ONNX interpreter)
against ONNX Runtime (1.32 implements both), on one-node models made with onnx.helper and random
inputs. ONNX's reference implementation (onnx.reference.ReferenceEvaluator) is run on each model
too, and must agree with ONNX Runtime, so that both references pin the math down.

LinearAttention: every update rule (linear, gated with a decay per key dim and per head, delta,
gated_delta, the default when update_rule is absent), with and without past_state, a value head
size other than the key's, grouped-query (q_num_heads 4, kv_num_heads 2) and multi-query
(kv_num_heads 1) head sharing, beta per head and one for all heads, an explicit scale, a one-token
decode step with a past, float16 inputs (with a float16 state, and with a float32 past_state:
present_state then float32), and a long prefill split into a prefill and decode steps that carry
present_state along, which must give the one-pass outputs.
CausalConvWithState: no state, a bias with past_state, silu, swish (silu's alias), a one-token
decode step, kernel size 1 (present_state [B, C, 0]), an input shorter than the state (L < k - 1)
with and without past_state, and float16 with silu.

Every model also runs with --device check (the CPU's kernels behind the device interface),
which must give the CPU's outputs bit for bit. Then models fathom must refuse with exit code 1
and an error naming the op and the problem: an unknown update_rule, q_num_heads not a multiple
of kv_num_heads, a query hidden size the heads do not divide, a key of another head size, a
past_state of the wrong shape, a gated rule without decay, a linear rule given beta, a decay of
the wrong width; an unknown activation, a past_state of the wrong length, a weight that is not
depthwise [C, 1, k], a bias of the wrong length.

Tolerances, element for element:
  float32 |got - want| <= 1e-5 + 1e-4 |want|
  float16 |got - want| <= 2e-3 + 4e-3 |want|   (fathom computes float16 in float32)

  onnx_linattn_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy, onnx or onnxruntime is missing."""
import os
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto as T, helper
    from onnx.reference import ReferenceEvaluator
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime ({e.name} missing)")
    sys.exit(77)
from onnx_check_lib import D, FATHOM, fathom_run, finish, report  # noqa: E402 (after the skip above)

ETYPE = {np.dtype(np.float32): T.FLOAT, np.dtype(np.float16): T.FLOAT16, np.dtype(np.float64): T.DOUBLE}
TOL = {np.dtype(np.float32): (1e-5, 1e-4), np.dtype(np.float16): (2e-3, 4e-3), np.dtype(np.float64): (1e-6, 1e-6)}
OUTS = ["output", "present_state"]
rng = np.random.default_rng(11)


def rnd(*shape, dt=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dt)


def model(tag, op, feeds, inputs, outputs=OUTS, **attrs):
    """One node reading `inputs` (feed names, "" for an omitted one); output 0 typed as the first
    feed, present_state as past_state when it is given."""
    ins = [helper.make_tensor_value_info(k, ETYPE[v.dtype], list(v.shape)) for k, v in feeds.items()]
    first = next(iter(feeds.values())).dtype
    types = {"output": ETYPE[first], "present_state": ETYPE[feeds["past_state"].dtype if "past_state" in feeds else first]}
    outs = [helper.make_tensor_value_info(o, types[o], None) for o in outputs if o]
    node = helper.make_node(op, inputs, outputs, name=tag, **attrs)
    m = helper.make_model(helper.make_graph([node], tag, ins, outs), opset_imports=[helper.make_opsetid("", 27)])
    m.ir_version = 11
    p = os.path.join(D, tag + ".onnx")
    onnx.save(m, p)
    return p


def close(got, want):
    if got.dtype != want.dtype or got.shape != want.shape:
        return False, f"{got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    atol, rtol = TOL[want.dtype]
    g, w = got.astype(np.float64), want.astype(np.float64)
    err = np.abs(g - w) - (atol + rtol * np.abs(w))
    d = float(np.max(np.abs(g - w), initial=0))
    return bool(np.all(err <= 0)) and not np.isnan(g).any(), f"max |diff| {d:.3g}"


def run_both(tag, p, feeds):
    """fathom's outputs (None after reporting a refusal), also checked on --device check."""
    got, err = fathom_run(p, feeds, tag)
    if got is None:
        report(False, f"{tag}: fathom refused it: {err}")
        return None
    dev, err = fathom_run(p, feeds, tag, "check")
    same = dev is not None and all(np.array_equal(dev[k], got[k]) and dev[k].dtype == got[k].dtype for k in got)
    report(same, f"{tag}: --device check gives the CPU's outputs bit for bit" + ("" if dev is not None else f": {err}"))
    return got


def compare(tag, got, want, what):
    msgs, ok = [], True
    for k, w in want.items():
        if k not in got:
            ok, msgs = False, msgs + [f"{k} missing"]
            continue
        good, m = close(got[k], w)
        ok &= good
        msgs.append(f"{k} {w.dtype}{list(w.shape)} {m}")
    report(ok, f"{tag} vs {what}: " + "; ".join(msgs))


def references(p, feeds):
    """ONNX Runtime's outputs by name, checked against ONNX's reference implementation."""
    s = ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
    ref = dict(zip([o.name for o in s.get_outputs()], ReferenceEvaluator(p).run(None, feeds)))
    return want, ref


def check(tag, op, feeds, inputs, outputs=OUTS, **attrs):
    """The model against ONNX Runtime (ONNX's reference agreeing with it); fathom's outputs."""
    p = model(tag, op, feeds, inputs, outputs, **attrs)
    got = run_both(tag, p, feeds)
    if got is None:
        return None
    try:
        want, ref = references(p, feeds)
    except Exception as e:  # noqa: BLE001 (a reference's own refusal: reported, not raised)
        report(False, f"{tag}: ONNX Runtime or the reference could not run it: {str(e)[:300]}")
        return got
    agree = all(close(ref[k].astype(w.dtype), w)[0] for k, w in want.items())
    report(agree, f"{tag}: ONNX Runtime and ONNX's reference agree")
    compare(tag, got, want, "ORT")
    return got


def linattn(tag, b, t, hq, hkv, dk, dv, rule=None, past=False, decay=None, beta=None, dt=np.float32, past_dt=None, **attrs):
    """decay: None, "key" ([B, T, Hkv dk]) or "head" ([B, T, Hkv]); beta: None, "head" or "one"."""
    feeds = {"query": rnd(b, t, hq * dk, dt=dt), "key": rnd(b, t, hkv * dk, dt=dt, scale=0.5), "value": rnd(b, t, hkv * dv, dt=dt)}
    inputs = ["query", "key", "value"]
    extra = [("past_state", past and rnd(b, hkv, dk, dv, dt=past_dt or dt, scale=0.3)),
             ("decay", decay and -np.abs(rnd(b, t, hkv * (dk if decay == "key" else 1), dt=dt, scale=0.5))),
             ("beta", beta and (1 / (1 + np.exp(-rnd(b, t, hkv if beta == "head" else 1)))).astype(dt))]
    for name, val in extra:
        if val is not None and val is not False:
            feeds[name] = val
            inputs.append(name)
        else:
            inputs.append("")
    while inputs[-1] == "":
        inputs.pop()
    if rule:
        attrs["update_rule"] = rule
    return check(tag, "LinearAttention", feeds, inputs, q_num_heads=hq, kv_num_heads=hkv, **attrs)


def linattn_cases():
    linattn("la_linear", 2, 5, 2, 2, 4, 3, "linear")
    linattn("la_linear_past", 2, 5, 2, 2, 4, 3, "linear", past=True)
    linattn("la_gated_key_decay", 2, 6, 2, 2, 4, 4, "gated", past=True, decay="key")
    linattn("la_gated_head_decay", 1, 6, 3, 3, 4, 5, "gated", decay="head")
    linattn("la_delta", 2, 6, 2, 2, 4, 4, "delta", beta="head")
    linattn("la_delta_past_beta_one", 2, 4, 2, 2, 4, 3, "delta", past=True, beta="one")
    linattn("la_gated_delta_default_rule", 2, 6, 2, 2, 4, 4, None, decay="key", beta="head")
    linattn("la_gated_delta_gqa_past", 2, 5, 4, 2, 4, 6, "gated_delta", past=True, decay="key", beta="head")
    linattn("la_gated_delta_mqa_beta_one", 2, 5, 4, 1, 8, 4, "gated_delta", decay="head", beta="one")
    linattn("la_gated_delta_scale", 1, 4, 2, 2, 4, 4, "gated_delta", decay="key", beta="head", scale=0.3)
    linattn("la_decode_step", 2, 1, 4, 2, 4, 4, "gated_delta", past=True, decay="key", beta="head")
    linattn("la_linear_t1_no_past", 2, 1, 2, 2, 4, 4, "linear")
    linattn("la_fp16_gqa", 2, 4, 4, 2, 8, 8, "gated_delta", decay="key", beta="head", dt=np.float16)
    linattn("la_fp16_f32_state", 2, 3, 2, 2, 4, 4, "gated", past=True, decay="head", dt=np.float16, past_dt=np.float32)
    # a prefill and two decode steps, present_state carried: the one-pass outputs
    b, t, hq, hkv, dk, dv = 1, 6, 4, 2, 4, 4
    f = {"query": rnd(b, t, hq * dk), "key": rnd(b, t, hkv * dk, scale=0.5), "value": rnd(b, t, hkv * dv),
         "past_state": rnd(b, hkv, dk, dv, scale=0.3), "decay": -np.abs(rnd(b, t, hkv * dk, scale=0.5)),
         "beta": (1 / (1 + np.exp(-rnd(b, t, hkv)))).astype(np.float32)}
    names = list(f)
    whole = check("la_chunks_whole", "LinearAttention", f, names, q_num_heads=hq, kv_num_heads=hkv)
    state, outs = f["past_state"], []
    for i, (s, e) in enumerate(((0, 4), (4, 5), (5, 6))):
        part = {k: (v if k == "past_state" else v[:, s:e]) for k, v in f.items()}
        part["past_state"] = state
        p = model(f"la_chunk{i}", "LinearAttention", part, names, q_num_heads=hq, kv_num_heads=hkv)
        got, err = fathom_run(p, part, f"la_chunk{i}")
        if got is None:
            report(False, f"la_chunk{i}: fathom refused it: {err}")
            return
        state = got["present_state"]
        outs.append(got["output"])
    if whole is not None:
        cat = np.concatenate(outs, axis=1)
        ok = np.allclose(cat, whole["output"], rtol=1e-5, atol=1e-6) and np.allclose(state, whole["present_state"], rtol=1e-5, atol=1e-6)
        report(ok, "la_chunks: a prefill of 4 and two decode steps carrying present_state give the one-pass outputs")


def conv(tag, b, c, L, k, bias=False, past=False, dt=np.float32, **attrs):
    feeds = {"input": rnd(b, c, L, dt=dt), "weight": rnd(c, 1, k, dt=dt, scale=0.5)}
    inputs = ["input", "weight", "", ""]
    if bias:
        feeds["bias"], inputs[2] = rnd(c, dt=dt), "bias"
    if past:
        feeds["past_state"], inputs[3] = rnd(b, c, k - 1, dt=dt), "past_state"
    while inputs[-1] == "":
        inputs.pop()
    return check(tag, "CausalConvWithState", feeds, inputs, **attrs)


def conv_cases():
    conv("cc_basic", 2, 4, 8, 4)
    conv("cc_bias_past", 2, 4, 8, 4, bias=True, past=True)
    conv("cc_silu", 2, 3, 7, 3, activation="silu")
    conv("cc_swish_past", 2, 3, 7, 3, past=True, activation="swish")
    conv("cc_none_explicit", 1, 5, 6, 2, bias=True, activation="none")
    conv("cc_decode_step", 2, 4, 1, 4, bias=True, past=True, activation="silu")
    conv("cc_kernel_one", 2, 4, 5, 1, bias=True)
    conv("cc_short_no_past", 2, 4, 2, 5)
    conv("cc_short_past", 1, 3, 2, 5, past=True)
    conv("cc_fp16_silu", 2, 4, 8, 4, bias=True, past=True, dt=np.float16, activation="silu")


def refusals():
    q, kk, v = rnd(1, 3, 8), rnd(1, 3, 8), rnd(1, 3, 8)
    LA, CC = "LinearAttention", "CausalConvWithState"
    la, qkv = ["query", "key", "value"], {"query": q, "key": kk, "value": v}

    def heads(hq=2, hkv=2, rule="linear"):
        return dict(q_num_heads=hq, kv_num_heads=hkv, update_rule=rule)

    cases = [
        ("bad_rule", LA, la, qkv, heads(rule="fancy"), "update_rule must be linear, gated, delta or gated_delta; got 'fancy'"),
        ("bad_gqa", LA, la, dict(qkv, query=rnd(1, 3, 12)), heads(3, 2), "q_num_heads (3) must be a positive multiple of kv_num_heads (2)"),
        ("bad_q_hidden", LA, la, dict(qkv, query=rnd(1, 3, 10)), heads(4, 2),
         "query [1, 3, 10]: its hidden size 10 is not a positive multiple of q_num_heads = 4"),
        ("bad_k_head", LA, la, dict(qkv, key=rnd(1, 3, 6)), heads(),
         "key [1, 3, 6]: its hidden size must be kv_num_heads * head_size = 2 * 4"),
        ("bad_past", LA, la + ["past_state"], dict(qkv, past_state=rnd(1, 2, 4, 3)), heads(),
         "past_state must be a float tensor [batch, kv_num_heads, head_size, v_head_size] = [1, 2, 4, 4]; got f32 [1, 2, 4, 3]"),
        ("bad_no_decay", LA, la, qkv, heads(rule="gated"), "update_rule gated needs the decay input"),
        ("bad_extra_beta", LA, la + ["", "", "beta"], dict(qkv, beta=rnd(1, 3, 2)), heads(), "update_rule linear does not take the beta input"),
        ("bad_decay_width", LA, la + ["", "decay"], dict(qkv, decay=rnd(1, 3, 3)), heads(rule="gated"),
         "decay must be f32 [batch, seq, kv_num_heads or kv_num_heads * head_size] = [1, 3, 2 or 8]; got f32 [1, 3, 3]"),
        ("bad_activation", CC, ["input", "weight"], {"input": rnd(1, 2, 5), "weight": rnd(2, 1, 3)}, dict(activation="relu"),
         "activation must be none, silu or swish; got 'relu'"),
        ("bad_conv_past", CC, ["input", "weight", "", "past_state"], {"input": rnd(1, 2, 5), "weight": rnd(2, 1, 3), "past_state": rnd(1, 2, 3)},
         {}, "past_state must be f32 [batch, channels, kernel_size - 1] = [1, 2, 2]; got f32 [1, 2, 3]"),
        ("bad_conv_weight", CC, ["input", "weight"], {"input": rnd(1, 2, 5), "weight": rnd(2, 2, 3)}, {},
         "weight must be f32 [channels, 1, kernel_size] = [2, 1, k >= 1] (depthwise); got f32 [2, 2, 3]"),
        ("bad_conv_bias", CC, ["input", "weight", "bias"], {"input": rnd(1, 2, 5), "weight": rnd(2, 1, 3), "bias": rnd(3)}, {},
         "bias must be f32 [channels] = [2]; got f32 [3]"),
    ]
    for tag, op, inputs, feeds, attrs, msg in cases:
        needles = [f"'{tag}' ({op})", msg]
        p = model(tag, op, feeds, inputs, **attrs)
        got, err = fathom_run(p, feeds, tag)
        ok = got is None and err[0] == 1 and all(s in err[1] for s in needles)
        report(ok, f"{tag}: exit 1, naming {'; '.join(needles)}" + ("" if ok else f"; got: {err if err else 'outputs'}"))


if __name__ == "__main__":
    os.makedirs(D, exist_ok=True)
    print(f"onnxruntime {ort.__version__}, onnx {onnx.__version__}")
    linattn_cases()
    conv_cases()
    refusals()
    finish("onnx_linattn_check")
