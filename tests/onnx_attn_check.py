"""Attention (opset 23 and 24) and RotaryEmbedding (opset 23) run by `fathom run` (the ONNX
interpreter) against ONNX Runtime, on one-node models made with onnx.helper and random inputs.

Attention: 4-D multi-head (fathom's fused attention kernel), grouped-query with past_key /
past_value and the present outputs, causal with and without a past (the causal diagonal shifted
by the past length: query i sees keys j <= past + i), cross attention (q_seq != kv_seq) causal, a bool mask and float masks of
several broadcast shapes, causal with a mask, softcap, scale, 3-D inputs with q_num_heads /
kv_num_heads (grouped, a different value head size, with a past), qk_matmul_output modes 0-3
(mode 0 with softcap: the scores before the softcap, as ONNX Runtime gives), softmax_precision,
float16 and float64 inputs, and opset 24's nonpad_kv_seqlen (with is_causal compared with numpy:
ONNX Runtime then aligns the causal diagonal to each batch's last valid key, where ONNX's
reference and the spec keep it top-left, as fathom does). Two masks ONNX Runtime refuses are
compared with numpy instead: one broadcast over q_seq ([B, 1, 1, kv_seq]), and one whose last
dim is shorter than the keys (opset 24: padded with -inf).
RotaryEmbedding: 4-D and 3-D (num_heads) inputs, with position_ids and without (per-token
caches), interleaved or not, partial rotation (rotary_embedding_dim), float16.

The graph form (`fathom compile MODEL -o DIR`, then `fathom run DIR`) against the interpreter, each
model with dynamic dims run at two or three sizes through one compiled graph: grouped-query causal
with a past (causal_attention; a past of 0 and a one-token decode step among the sizes), causal with
a past and another key length than the queries', with softcap and a value head size of its own (composed), a
float mask with qk_matmul_output, a bool mask shorter than the keys (padded) with a past and
is_causal, 3-D inputs (scaled_dot_product_attention; and composed, causal with their own value head
size), nonpad_kv_seqlen with is_causal, float16 (scaled_dot_product_attention in float32), and
RotaryEmbedding 4-D, batch one (the graph's rope), 3-D interleaved partial and without
position_ids: within 1e-5 of the largest magnitude of the interpreter's output (float16: the
float16 tolerance below, one rounding apart). Refused by `fathom compile`: a dynamic head size,
and a mask whose padding follows the dynamic dims.

Every model also runs with --device check (the CPU's kernels behind the device interface),
which must give the CPU's outputs bit for bit. Then models fathom must refuse with exit code 1
and an error naming the node's op and the problem: q_num_heads not a multiple of kv_num_heads,
head sizes that differ between Q and K, masks of the wrong shape (a dim that does not broadcast,
a last dim longer than the keys), 3-D inputs without the head counts or with a hidden size that
the heads do not divide, past_key without past_value, a scale of 0, nonpad_kv_seqlen at opset 23, a
RotaryEmbedding cache of the wrong width and an odd rotary_embedding_dim.

Tolerances, element for element (NaN where the reference has NaN):
  float32 |got - want| <= 1e-5 + 1e-4 |want|
  float64 |got - want| <= 1e-6 + 1e-6 |want|    (ONNX Runtime's scale is a float32 1/sqrt(head_size):
          it is ~1e-7 off ONNX's reference, which fathom matches to ~1e-15)
  float16 |got - want| <= 2e-3 + 4e-3 |want|   (fathom computes float16 in float32)

  onnx_attn_check.py FATHOM_BIN TMPDIR
Exit 77 when numpy, onnx or onnxruntime is missing."""
import json
import os
import subprocess
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto as T, helper
except ImportError as e:
    print(f"SKIP: needs numpy, onnx and onnxruntime ({e.name} missing)")
    sys.exit(77)
from onnx_check_lib import D, FATHOM, close_within, fathom_run, finish, report  # noqa: E402 (after the skip above)

ETYPE = {np.dtype(np.float32): T.FLOAT, np.dtype(np.float64): T.DOUBLE, np.dtype(np.float16): T.FLOAT16,
         np.dtype(np.int64): T.INT64, np.dtype(np.bool_): T.BOOL}
TOL = {np.dtype(np.float32): (1e-5, 1e-4), np.dtype(np.float64): (1e-6, 1e-6), np.dtype(np.float16): (2e-3, 4e-3)}
ATT_OUT = ["Y", "present_key", "present_value", "qk"]
rng = np.random.default_rng(5)


def rnd(*shape, dt=np.float32):
    return rng.standard_normal(shape).astype(dt)


def model(tag, op, feeds, inputs, outputs, opset, dims=None, **attrs):
    """One node reading `inputs` (feed names, "" for an omitted one); outputs typed as the first feed.
    dims: per feed name, its declared shape with dim names for the dynamic dims (else the feed's)."""
    ins = [helper.make_tensor_value_info(k, ETYPE[v.dtype], (dims or {}).get(k, list(v.shape))) for k, v in feeds.items()]
    et = ETYPE[next(iter(feeds.values())).dtype]
    outs = [helper.make_tensor_value_info(o, et, None) for o in outputs if o]
    node = helper.make_node(op, inputs, outputs, name=tag, **attrs)
    m = helper.make_model(helper.make_graph([node], tag, ins, outs), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    p = os.path.join(D, tag + ".onnx")
    onnx.save(m, p)
    return p


def close(got, want):
    return close_within(got, want, *TOL[want.dtype])


def run_both(tag, p, feeds):
    """fathom's outputs (None after reporting a refusal), also checked on --device check."""
    got, err = fathom_run(p, feeds, tag)
    if got is None:
        report(False, f"{tag}: fathom refused it: {err}")
        return None
    dev, err = fathom_run(p, feeds, tag, "check")
    same = dev is not None and all(np.array_equal(dev[k], got[k], equal_nan=True) and dev[k].dtype == got[k].dtype for k in got)
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
        msgs.append(f"{k} {m}")
    report(ok, f"{tag} vs {what}: " + "; ".join(msgs))


def check(tag, op, feeds, inputs, outputs, opset=23, ref=None, **attrs):
    """The model against ONNX Runtime, or against ref(feeds) (a dict by output name) when given."""
    p = model(tag, op, feeds, inputs, outputs, opset, **attrs)
    got = run_both(tag, p, feeds)
    if got is None:
        return
    if ref is not None:
        compare(tag, got, ref(feeds), "numpy")
        return
    try:
        s = ort.InferenceSession(p, providers=["CPUExecutionProvider"])
        want = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
    except Exception as e:  # noqa: BLE001 (ONNX Runtime's own refusal: reported, not raised)
        report(False, f"{tag}: ONNX Runtime could not run it: {str(e)[:300]}")
        return
    compare(tag, got, want, "ORT")


def attn(tag, q, k, v, mask=None, past=None, nonpad=None, n_out=1, opset=23, ref=None, **attrs):
    feeds, inputs = {"Q": q, "K": k, "V": v}, ["Q", "K", "V"]
    for name, val in (("attn_mask", mask), ("past_key", past and past[0]), ("past_value", past and past[1]),
                      ("nonpad_kv_seqlen", nonpad)):
        if val is not None:
            feeds[name] = val
        inputs.append(name if val is not None else "")
    while inputs[-1] == "":
        inputs.pop()
    outs = ATT_OUT[:n_out] if n_out != "qk" else ["Y", "", "", "qk"]
    check(tag, "Attention", feeds, inputs, outs, opset, ref, **attrs)


def np_attention(f, causal=False):
    """numpy, in float64: 4-D multi-head attention with the ONNX reference's bias: a float mask
    padded with -inf up to the keys, the causal mask aligned top-left (no past), and
    nonpad_kv_seqlen's padding mask."""
    q, k, v = (f[n].astype(np.float64) for n in "QKV")
    sq, t = q.shape[2], k.shape[2]
    bias = np.zeros((1, 1, sq, t))
    if "attn_mask" in f:
        m = f["attn_mask"].astype(np.float64)
        bias = bias + np.concatenate([m, np.full(m.shape[:-1] + (t - m.shape[-1],), -np.inf)], -1)
    j = np.arange(t)
    if causal:
        bias = bias + np.where(j[None, :] > np.arange(sq)[:, None], -np.inf, 0)
    if "nonpad_kv_seqlen" in f:
        bias = bias + np.where(j[None, :] < f["nonpad_kv_seqlen"][:, None], 0, -np.inf)[:, None, None, :]
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + bias
    e = np.exp(s - s.max(-1, keepdims=True))
    return {"Y": ((e / e.sum(-1, keepdims=True)) @ v).astype(f["Q"].dtype)}


def np_causal(f):
    return np_attention(f, causal=True)


def attention_cases():
    B, Sq, Skv, P, D = 2, 4, 6, 5, 8
    q, k, v = rnd(B, 4, Sq, D), rnd(B, 4, Skv, D), rnd(B, 4, Skv, D)
    attn("mha", q, k, v)
    attn("mha_causal_self", q, rnd(B, 4, Sq, D), rnd(B, 4, Sq, D), is_causal=1)
    attn("mha_causal_cross", q, k, v, is_causal=1)
    attn("mha_scale", q, k, v, scale=0.05)
    qg, kg, vg = rnd(B, 6, Sq, D), rnd(B, 2, Skv, D), rnd(B, 2, Skv, 12)
    past = (rnd(B, 2, P, D), rnd(B, 2, P, 12))
    attn("gqa_past_present", qg, kg, vg, past=past, n_out=3)
    attn("gqa_past_causal", qg, kg, vg, past=past, n_out=3, is_causal=1)
    attn("gqa_softcap", qg, kg, vg, softcap=1.5)
    attn("mask_bool_2d", q, k, v, mask=rng.random((Sq, Skv)) > 0.3)
    attn("mask_bool_4d", q, k, v, mask=rng.random((B, 1, Sq, Skv)) > 0.3)
    attn("mask_float_2d", q, k, v, mask=rnd(Sq, Skv))
    # ONNX Runtime needs the mask's q_seq dim to be q_seq (no broadcast there): numpy
    attn("mask_float_b1", q, k, v, mask=rnd(B, 1, 1, Skv), ref=np_attention)
    attn("mask_float_4d_causal", qg, kg, vg, mask=rnd(B, 6, Sq, Skv), is_causal=1)
    attn("mask_past_3d", qg, kg, vg, mask=rnd(1, Sq, P + Skv), past=past, n_out=3)
    q3, k3, v3 = rnd(B, Sq, 6 * D), rnd(B, Skv, 2 * D), rnd(B, Skv, 2 * 12)
    attn("3d_gqa", q3, k3, v3, q_num_heads=6, kv_num_heads=2)
    attn("3d_gqa_past_causal_mask", q3, k3, v3, mask=rng.random((Sq, P + Skv)) > 0.2, past=past, n_out=3, is_causal=1,
         q_num_heads=6, kv_num_heads=2)
    m = rnd(Sq, Skv)
    m[1, 2:4] = -np.inf
    for mode in range(4):
        attn(f"qk_mode{mode}", qg, kg, vg, mask=m, n_out="qk", softcap=2.0, qk_matmul_output_mode=mode)
    attn("qk_mode0_past", qg, kg, vg, past=past, n_out=4)
    attn("softmax_precision", q, k, v, mask=m, softmax_precision=T.FLOAT)
    h = lambda a: a.astype(np.float16)  # noqa: E731
    attn("fp16", h(q), h(k), h(v))
    attn("fp16_gqa_past_mask", h(qg), h(kg), h(vg), mask=h(rnd(Sq, P + Skv)), past=(h(past[0]), h(past[1])), n_out=3)
    f8 = lambda a: a.astype(np.float64)  # noqa: E731
    attn("f64_mask_softcap", f8(qg), f8(kg), f8(vg), mask=f8(m), softcap=3.0)
    attn("o24_nonpad", q, k, v, nonpad=np.array([3, 6], np.int64), opset=24)
    attn("o24_nonpad_mask", q, k, v, mask=rnd(B, 4, Sq, Skv), nonpad=np.array([6, 2], np.int64), opset=24)
    # with nonpad_kv_seqlen ONNX Runtime aligns the causal diagonal to each batch's last valid key;
    # ONNX's reference (and fathom) keep it top-left, as the spec's is_causal says: numpy
    attn("o24_nonpad_mask_causal", q, k, v, mask=rnd(B, 4, Sq, Skv), nonpad=np.array([6, 3], np.int64), opset=24, is_causal=1,
         ref=np_causal)
    short = rnd(B, 1, Sq, 4)
    attn("o24_short_mask", q, k, v, mask=short, opset=24, ref=np_attention)


def rope(tag, x, cos, sin, pos=None, **attrs):
    feeds, inputs = {"X": x, "cos_cache": cos, "sin_cache": sin}, ["X", "cos_cache", "sin_cache"]
    if pos is not None:
        feeds["position_ids"] = pos
        inputs.append("position_ids")
    check(tag, "RotaryEmbedding", feeds, inputs, ["Y"], 23, **attrs)


def rope_cases():
    B, H, S, D, P = 2, 3, 5, 16, 40
    pos = rng.integers(0, P, (B, S)).astype(np.int64)
    ang = rng.uniform(0, 6.3, (P, D // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    x4, x3 = rnd(B, H, S, D), rnd(B, S, H * D)
    for inter in (0, 1):
        rope(f"rope_4d_i{inter}", x4, cos, sin, pos, interleaved=inter)
        rope(f"rope_3d_i{inter}", x3, cos, sin, pos, interleaved=inter, num_heads=H)
        rope(f"rope_partial_i{inter}", x4, cos[:, :3].copy(), sin[:, :3].copy(), pos, interleaved=inter, rotary_embedding_dim=6)
        rope(f"rope_3d_partial_i{inter}", x3, cos[:, :5].copy(), sin[:, :5].copy(), pos, interleaved=inter, num_heads=H,
             rotary_embedding_dim=10)
        c3, s3 = cos[pos].copy(), sin[pos].copy()
        rope(f"rope_nopos_i{inter}", x4, c3, s3, interleaved=inter)
    rope("rope_fp16", x4.astype(np.float16), cos.astype(np.float16), sin.astype(np.float16), pos, interleaved=1)


def graph_form(tag, op, inputs, outputs, dims, runs, opset=23, fused=None, **attrs):
    """`fathom compile` of a model with dynamic dims (dims: each feed's declared shape), then `fathom run`
    of the graph against the interpreter on each feed set of runs (one compiled graph, several sizes):
    within 1e-5 of the largest magnitude of the interpreter's output (float16: one float16 rounding,
    TOL's); fused: a graph op the compiled graph must hold (the fused attention or rope)."""
    p = model(tag, op, runs[0], inputs, outputs, opset, dims, **attrs)
    out = os.path.join(D, tag + "_graph")
    r = subprocess.run([FATHOM, "compile", p, "-o", out], capture_output=True, text=True)
    if r.returncode:
        report(False, f"{tag}: fathom compile failed: {(r.stderr + r.stdout).strip()[:600]}")
        return
    if fused:
        with open(os.path.join(out, "graph.json")) as f:
            ops = [n["op"] for n in json.load(f)["nodes"]]
        report(fused in ops, f"{tag}: the compiled graph runs {fused}" + ("" if fused in ops else f"; its ops: {ops}"))
    for i, feeds in enumerate(runs):
        want, err = fathom_run(p, feeds, f"{tag}_{i}_i")
        got, gerr = fathom_run(out, feeds, f"{tag}_{i}_g")
        what = f"{tag} graph form, {', '.join(f'{k} {list(v.shape)}' for k, v in feeds.items() if k in ('Q', 'K', 'X'))}"
        if want is None or got is None:
            report(False, f"{what}: {'interpreter' if want is None else 'graph'} failed: {err or gerr}")
            continue
        msgs, ok = [], True
        for k, w in want.items():
            g = got.get(k)
            if g is None or g.dtype != w.dtype or g.shape != w.shape:
                ok, msgs = False, msgs + [f"{k}: {None if g is None else (g.dtype, g.shape)} vs {(w.dtype, w.shape)}"]
                continue
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            same_nan = np.array_equal(np.isnan(g64), np.isnan(w64))
            fin = ~np.isnan(w64) & (g64 != w64)
            d = np.abs(g64[fin] - w64[fin])
            lim = 1e-5 * max(1.0, float(np.max(np.abs(w64[np.isfinite(w64)]), initial=0)))
            good = same_nan and bool(np.all(d <= (lim if w.dtype != np.float16 else TOL[w.dtype][0] + TOL[w.dtype][1] * np.abs(w64[fin]))))
            ok &= good
            msgs.append(f"{k} max |diff| {float(np.max(d, initial=0)):.3g}" + ("" if same_nan else "; NaN differs"))
        report(ok, f"{what} vs the interpreter: " + "; ".join(msgs))


def graph_cases():
    """The graph form (`fathom compile`): the fused attention where it fits, compositions of graph ops
    for the rest, at two or three sizes of the dynamic dims through one compiled graph."""
    f = lambda *s: rnd(*s)  # noqa: E731
    gqa = dict(Q=["b", 6, "s", 8], K=["b", 2, "s", 8], V=["b", 2, "s", 8], past_key=["b", 2, "p", 8], past_value=["b", 2, "p", 8])
    runs = [dict(Q=f(b, 6, s, 8), K=f(b, 2, s, 8), V=f(b, 2, s, 8), past_key=f(b, 2, p, 8), past_value=f(b, 2, p, 8))
            for b, s, p in ((2, 4, 5), (1, 1, 9), (3, 3, 0))]
    graph_form("g_gqa_causal_past", "Attention", ["Q", "K", "V", "", "past_key", "past_value"], ATT_OUT[:3], gqa, runs,
               fused="causal_attention", is_causal=1)
    cross = dict(gqa, K=["b", 2, "t", 8], V=["b", 2, "t", 12], past_value=["b", 2, "p", 12])
    runs = [dict(Q=f(b, 6, s, 8), K=f(b, 2, t, 8), V=f(b, 2, t, 12), past_key=f(b, 2, p, 8), past_value=f(b, 2, p, 12))
            for b, s, t, p in ((2, 4, 6, 5), (1, 3, 1, 2))]
    graph_form("g_gqa_causal_cross_past_softcap", "Attention", ["Q", "K", "V", "", "past_key", "past_value"], ATT_OUT[:3], cross, runs,
               is_causal=1, softcap=1.5)
    mk = dict(Q=["b", 4, "s", 8], K=["b", 4, "t", 8], V=["b", 4, "t", 8], attn_mask=["b", 1, "s", "t"])
    runs = [dict(Q=f(b, 4, s, 8), K=f(b, 4, t, 8), V=f(b, 4, t, 8), attn_mask=f(b, 1, s, t)) for b, s, t in ((2, 4, 6), (1, 5, 3))]
    graph_form("g_mask_float_qk", "Attention", ["Q", "K", "V", "attn_mask"], ["Y", "", "", "qk"], mk, runs, qk_matmul_output_mode=2)
    pm = dict(gqa, attn_mask=["s", "s"])
    runs = [dict(Q=f(b, 6, s, 8), K=f(b, 2, s, 8), V=f(b, 2, s, 8), attn_mask=rng.random((s, s)) > 0.3, past_key=f(b, 2, 3, 8),
                 past_value=f(b, 2, 3, 8)) for b, s in ((2, 4), (1, 6))]
    graph_form("g_mask_bool_short_past_causal", "Attention", ["Q", "K", "V", "attn_mask", "past_key", "past_value"], ATT_OUT[:3],
               dict(pm, past_key=["b", 2, 3, 8], past_value=["b", 2, 3, 8]), runs, opset=24, is_causal=1)
    d3 = dict(Q=["b", "s", 48], K=["b", "t", 16], V=["b", "t", 16])
    runs = [dict(Q=f(b, s, 48), K=f(b, t, 16), V=f(b, t, 16)) for b, s, t in ((2, 4, 6), (1, 5, 2))]
    graph_form("g_3d_gqa", "Attention", ["Q", "K", "V"], ["Y"], d3, runs, fused="scaled_dot_product_attention", q_num_heads=6,
               kv_num_heads=2)
    runs = [dict(Q=f(b, s, 48), K=f(b, t, 16), V=f(b, t, 24)) for b, s, t in ((2, 4, 6), (1, 5, 2))]
    graph_form("g_3d_gqa_dv_causal", "Attention", ["Q", "K", "V"], ["Y"], dict(d3, V=["b", "t", 24]), runs, is_causal=1, q_num_heads=6,
               kv_num_heads=2)
    np_ = dict(Q=["b", 4, "s", 8], K=["b", 4, "t", 8], V=["b", 4, "t", 8], nonpad_kv_seqlen=["b"])
    runs = [dict(Q=f(b, 4, s, 8), K=f(b, 4, t, 8), V=f(b, 4, t, 8), nonpad_kv_seqlen=rng.integers(1, t + 1, b).astype(np.int64))
            for b, s, t in ((2, 4, 6), (3, 2, 5))]
    graph_form("g_o24_nonpad_causal", "Attention", ["Q", "K", "V", "", "", "", "nonpad_kv_seqlen"], ["Y"], np_, runs, opset=24, is_causal=1)
    h = lambda a: a.astype(np.float16)  # noqa: E731
    runs = [dict(Q=h(f(b, 6, s, 8)), K=h(f(b, 2, s, 8)), V=h(f(b, 2, s, 8))) for b, s in ((2, 4), (1, 3))]
    graph_form("g_fp16_gqa", "Attention", ["Q", "K", "V"], ["Y"], {k: gqa[k] for k in "QKV"}, runs, fused="scaled_dot_product_attention")
    P = 40
    ang = rng.uniform(0, 6.3, (P, 8))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    ids = lambda b, s: rng.integers(0, P, (b, s)).astype(np.int64)  # noqa: E731
    rp = dict(X=["b", 3, "s", 16], cos_cache=[P, 8], sin_cache=[P, 8], position_ids=["b", "s"])
    runs = [dict(X=f(b, 3, s, 16), cos_cache=cos, sin_cache=sin, position_ids=ids(b, s)) for b, s in ((2, 5), (1, 2))]
    graph_form("g_rope_4d", "RotaryEmbedding", ["X", "cos_cache", "sin_cache", "position_ids"], ["Y"], rp, runs)
    runs = [dict(X=f(1, 3, s, 16), cos_cache=cos, sin_cache=sin, position_ids=ids(1, s)) for s in (5, 2)]
    graph_form("g_rope_batch1", "RotaryEmbedding", ["X", "cos_cache", "sin_cache", "position_ids"], ["Y"],
               dict(rp, X=[1, 3, "s", 16], position_ids=[1, "s"]), runs, fused="rope")
    c4, s4 = cos[:, :4].copy(), sin[:, :4].copy()
    runs = [dict(X=f(b, s, 48), cos_cache=c4, sin_cache=s4, position_ids=ids(b, s)) for b, s in ((2, 5), (1, 3))]
    graph_form("g_rope_3d_interleaved_partial", "RotaryEmbedding", ["X", "cos_cache", "sin_cache", "position_ids"], ["Y"],
               dict(X=["b", "s", 48], cos_cache=[P, 4], sin_cache=[P, 4], position_ids=["b", "s"]), runs, num_heads=3, interleaved=1,
               rotary_embedding_dim=8)
    runs = [dict(X=f(b, 3, s, 16), cos_cache=cos[ids(b, s)], sin_cache=sin[ids(b, s)]) for b, s in ((2, 5), (1, 3))]
    graph_form("g_rope_no_position_ids", "RotaryEmbedding", ["X", "cos_cache", "sin_cache"], ["Y"],
               dict(X=["b", 3, "s", 16], cos_cache=["b", "s", 8], sin_cache=["b", "s", 8]), runs)


def graph_refusals():
    """What the graph form refuses (exit 1 from `fathom compile`, naming the node's op and why)."""
    cases = [("gbad_head_size", dict(Q=rnd(2, 4, 3, 8), K=rnd(2, 4, 3, 8), V=rnd(2, 4, 3, 8)), ["Q", "K", "V"],
              dict(Q=[2, 4, 3, "d"], K=[2, 4, 3, "d"], V=[2, 4, 3, "d"]), 23,
              ["(Attention)", "has a graph form with fixed head counts and head sizes (input 0's dim 3 varies)"]),
             ("gbad_mask_pad", dict(Q=rnd(2, 4, 3, 8), K=rnd(2, 4, 5, 8), V=rnd(2, 4, 5, 8), attn_mask=rnd(3, 4)),
              ["Q", "K", "V", "attn_mask"], dict(Q=[2, 4, "s", 8], K=[2, 4, "t", 8], V=[2, 4, "t", 8], attn_mask=["s", 4]), 24,
              ["(Attention)", "an attn_mask whose last dim falls short of the total key length by an amount that follows the "
               "dynamic dims"])]
    for tag, feeds, inputs, dims, opset, needles in cases:
        p = model(tag, "Attention", feeds, inputs, ["Y"], opset, dims)
        r = subprocess.run([FATHOM, "compile", p, "-o", os.path.join(D, tag + "_graph")], capture_output=True, text=True)
        msg = (r.stderr + r.stdout).strip()
        ok = r.returncode == 1 and all(s in msg for s in needles)
        report(ok, f"{tag}: fathom compile exits 1 naming {'; '.join(needles)}" + ("" if ok else f"; got {r.returncode}: {msg[:400]}"))


def refusals():
    q, k, v = rnd(2, 4, 3, 8), rnd(2, 4, 5, 8), rnd(2, 4, 5, 8)
    att = ("Attention", ["Q", "K", "V"])
    cases = [
        ("bad_gqa_heads", att, {"Q": rnd(2, 3, 32), "K": rnd(2, 5, 24), "V": rnd(2, 5, 24)}, dict(q_num_heads=4, kv_num_heads=3), 23,
         ["bad_gqa_heads", "(Attention)", "Q's 4 heads (q_num_heads) must be a multiple of K and V's 3 heads"]),
        ("bad_head_size", att, {"Q": q, "K": rnd(2, 4, 5, 6), "V": v}, {}, 23, ["(Attention)", "K's head size 6 differs from Q's 8"]),
        ("bad_mask_shape", ("Attention", ["Q", "K", "V", "attn_mask"]), {"Q": q, "K": k, "V": v, "attn_mask": rnd(2, 5)}, {}, 23,
         ["(Attention)", "attn_mask [2, 5] does not broadcast to [batch, q_num_heads, q_seq, total_seq] = [2, 4, 3, 5]"]),
        ("bad_mask_long", ("Attention", ["Q", "K", "V", "attn_mask"]), {"Q": q, "K": k, "V": v, "attn_mask": rnd(3, 7)}, {}, 23,
         ["(Attention)", "attn_mask [3, 7] does not broadcast"]),
        ("bad_3d_no_heads", att, {"Q": rnd(2, 3, 32), "K": rnd(2, 5, 32), "V": rnd(2, 5, 32)}, {}, 23,
         ["(Attention)", "3-D inputs need the q_num_heads and kv_num_heads attributes"]),
        ("bad_3d_hidden", att, {"Q": rnd(2, 3, 30), "K": rnd(2, 5, 32), "V": rnd(2, 5, 32)}, dict(q_num_heads=4, kv_num_heads=4), 23,
         ["(Attention)", "Q [2, 3, 30]: its hidden size 30 is not a multiple of q_num_heads = 4"]),
        ("bad_past_alone", ("Attention", ["Q", "K", "V", "", "past_key"]), {"Q": q, "K": k, "V": v, "past_key": rnd(2, 4, 2, 8)}, {}, 23,
         ["(Attention)", "past_key and past_value must be given together"]),
        ("bad_scale", att, {"Q": q, "K": k, "V": v}, dict(scale=0.0), 23, ["(Attention)", "scale must be a finite value greater than 0"]),
        ("bad_nonpad_o23", ("Attention", ["Q", "K", "V", "", "", "", "n"]), {"Q": q, "K": k, "V": v, "n": np.array([1, 2], np.int64)},
         {}, 23, ["(Attention)", "nonpad_kv_seqlen (input 6) needs opset 24"]),
        ("bad_rope_cache", ("RotaryEmbedding", ["X", "c", "s", "p"]),
         {"X": rnd(2, 3, 4, 8), "c": rnd(10, 3), "s": rnd(10, 3), "p": np.zeros((2, 4), np.int64)}, {}, 23,
         ["(RotaryEmbedding)", "cos_cache [10, 3] and sin_cache [10, 3] must both be", "rotary_embedding_dim / 2 = 4"]),
        ("bad_rope_dim", ("RotaryEmbedding", ["X", "c", "s", "p"]),
         {"X": rnd(2, 3, 4, 8), "c": rnd(10, 3), "s": rnd(10, 3), "p": np.zeros((2, 4), np.int64)}, dict(rotary_embedding_dim=5), 23,
         ["(RotaryEmbedding)", "rotary_embedding_dim 5 must be even and at most the head size 8"]),
    ]
    for tag, (op, inputs), feeds, attrs, opset, needles in cases:
        p = model(tag, op, feeds, inputs, ["Y"], opset, **attrs)
        got, err = fathom_run(p, feeds, tag)
        ok = got is None and err[0] == 1 and all(s in err[1] for s in needles)
        report(ok, f"{tag}: exit 1, naming {'; '.join(needles)}" + ("" if ok else f"; got: {err if err else 'outputs'}"))


if __name__ == "__main__":
    os.makedirs(D, exist_ok=True)
    print(f"onnxruntime {ort.__version__}, onnx {onnx.__version__}")
    attention_cases()
    rope_cases()
    graph_cases()
    refusals()
    graph_refusals()
    finish("onnx_attn_check")
