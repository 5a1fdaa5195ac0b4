#!/usr/bin/env python3
"""A line-by-line mirror of attention.cu's tiled kernels (sdpa_fwd_tiled, sdpa_dq_tiled,
sdpa_dkv_tiled) in numpy, run against a direct attention and its gradients.

No GPU: it checks the kernels' index arithmetic as written (block -> head and row tile,
the staged tiles and their zero padding, causal limits and tile skipping, lanes as the
staged side's rows, the per-tile online softmax, the shuffled weights) at shapes that
are not multiples of the tiles, with grouped-query heads and Tq != Tk. Each warp's 32
lanes are a numpy vector; warp reductions are sums/maxima over it. Arithmetic is f64
here (the kernels' is f32), so agreement is to rounding. It does not check the device,
shared-memory races or the CUDA compiler.

    python3 tools/cuda_attention_emulate.py      (exit 1 on a mismatch)
"""
import sys

import numpy as np

TILE, WARPS, FWD_RPW, BWD_RPW = 32, 4, 4, 2


def stage(src, r0, n, rows_valid):
    """stage_rows: n rows from r0, zeros past rows_valid."""
    out = np.zeros((n, src.shape[1]))
    for r in range(n):
        if r0 + r < rows_valid:
            out[r] = src[r0 + r]
    return out


def fwd_tiled(q, k, v, causal, scale):
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    BQ = FWD_RPW * WARPS
    nqt = (Tq + BQ - 1) // BQ
    o = np.full(q.shape, np.nan)
    lse = np.full((B, H, Tq), np.nan)
    lane = np.arange(32)
    for blk in range(B * H * nqt):
        bh, q0 = blk // nqt, (blk % nqt) * BQ
        b, h = bh // H, bh % H
        qm, km, vm = q[b, h], k[b, h // (H // Hkv)], v[b, h // (H // Hkv)]
        qs = stage(qm, q0, BQ, Tq)
        for w in range(WARPS):
            m = [-np.inf] * FWD_RPW
            l = [0.0] * FWD_RPW
            acc = [np.zeros(D) for _ in range(FWD_RPW)]
            nrow = []
            for rr in range(FWD_RPW):
                i = q0 + w * FWD_RPW + rr
                nrow.append(0 if i >= Tq else (min(i + 1, Tk) if causal else Tk))
            kend = min(q0 + BQ, Tk) if causal else Tk
            for k0 in range(0, kend, TILE):
                ks, vs = stage(km, k0, TILE, Tk), stage(vm, k0, TILE, Tk)
                for rr in range(FWD_RPW):
                    n = nrow[rr]
                    if k0 >= n:
                        continue
                    s = ks @ qs[w * FWD_RPW + rr]  # lane j: row j of the tile
                    valid = k0 + lane < n
                    s = np.where(valid, s * scale, -np.inf)
                    mn = max(m[rr], s.max())
                    corr = np.exp(m[rr] - mn)
                    p = np.where(valid, np.exp(s - mn), 0.0)
                    l[rr] = l[rr] * corr + p.sum()
                    acc[rr] *= corr
                    nj = min(n - k0, TILE)
                    for j in range(nj):
                        acc[rr] += p[j] * vs[j]
                    m[rr] = mn
            for rr in range(FWD_RPW):
                i = q0 + w * FWD_RPW + rr
                if i >= Tq:
                    continue
                o[b, h, i] = acc[rr] / l[rr] if nrow[rr] else np.nan
                lse[b, h, i] = m[rr] + np.log(l[rr]) if l[rr] > 0 else -np.inf
    return o, lse


def dq_tiled(dout, q, k, v, lse, delta, causal, scale):
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    BQ = BWD_RPW * WARPS
    nqt = (Tq + BQ - 1) // BQ
    dq = np.full(q.shape, np.nan)
    lane = np.arange(32)
    for blk in range(B * H * nqt):
        bh, q0 = blk // nqt, (blk % nqt) * BQ
        b, h = bh // H, bh % H
        km, vm = k[b, h // (H // Hkv)], v[b, h // (H // Hkv)]
        qs, dos = stage(q[b, h], q0, BQ, Tq), stage(dout[b, h], q0, BQ, Tq)
        for w in range(WARPS):
            acc = [np.zeros(D) for _ in range(BWD_RPW)]
            nrow, L, dl = [], [], []
            for rr in range(BWD_RPW):
                i = q0 + w * BWD_RPW + rr
                nrow.append(0 if i >= Tq else (min(i + 1, Tk) if causal else Tk))
                L.append(lse[b, h, i] if i < Tq else 0.0)
                dl.append(delta[b, h, i] if i < Tq else 0.0)
            kend = min(q0 + BQ, Tk) if causal else Tk
            for k0 in range(0, kend, TILE):
                ks, vs = stage(km, k0, TILE, Tk), stage(vm, k0, TILE, Tk)
                for rr in range(BWD_RPW):
                    n = nrow[rr]
                    if k0 >= n:
                        continue
                    s = ks @ qs[w * BWD_RPW + rr]
                    dp = vs @ dos[w * BWD_RPW + rr]
                    with np.errstate(over="ignore"):
                        p = np.where(k0 + lane < n, np.exp(s * scale - L[rr]), 0.0)
                    ds = p * (dp - dl[rr]) * scale
                    for j in range(min(n - k0, TILE)):
                        acc[rr] += ds[j] * ks[j]
            for rr in range(BWD_RPW):
                i = q0 + w * BWD_RPW + rr
                if i < Tq:
                    dq[b, h, i] = acc[rr]
    return dq


def dkv_tiled(dout, q, k, v, lse, delta, causal, scale):
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    BK = BWD_RPW * WARPS
    nkt = (Tk + BK - 1) // BK
    dk, dv = np.full(k.shape, np.nan), np.full(v.shape, np.nan)
    lane = np.arange(32)
    group = H // Hkv
    for blk in range(B * Hkv * nkt):
        bk, kb0 = blk // nkt, (blk % nkt) * BK
        b, hk = bk // Hkv, bk % Hkv
        krs, vrs = stage(k[b, hk], kb0, BK, Tk), stage(v[b, hk], kb0, BK, Tk)
        adk = [[np.zeros(D) for _ in range(BWD_RPW)] for _ in range(WARPS)]
        adv = [[np.zeros(D) for _ in range(BWD_RPW)] for _ in range(WARPS)]
        i_first = kb0 - kb0 % TILE if causal else 0
        for h in range(hk * group, (hk + 1) * group):
            for i0 in range(i_first, Tq, TILE):
                qs, dos = stage(q[b, h], i0, TILE, Tq), stage(dout[b, h], i0, TILE, Tq)
                ls = np.array([lse[b, h, i0 + t] if i0 + t < Tq else 0.0 for t in range(TILE)])
                dls = np.array([delta[b, h, i0 + t] if i0 + t < Tq else 0.0 for t in range(TILE)])
                ni = min(Tq - i0, TILE)
                for w in range(WARPS):
                    for rr in range(BWD_RPW):
                        j = kb0 + w * BWD_RPW + rr
                        if j >= Tk or (causal and i0 + TILE <= j):
                            continue
                        s = qs @ krs[w * BWD_RPW + rr]
                        dp = dos @ vrs[w * BWD_RPW + rr]
                        i = i0 + lane
                        valid = (i < Tq) & ((not causal) | (i >= j))
                        with np.errstate(over="ignore"):
                            p = np.where(valid, np.exp(s * scale - ls), 0.0)
                        ds = p * (dp - dls) * scale
                        for ii in range(ni):
                            adv[w][rr] += p[ii] * dos[ii]
                            adk[w][rr] += ds[ii] * qs[ii]
        for w in range(WARPS):
            for rr in range(BWD_RPW):
                j = kb0 + w * BWD_RPW + rr
                if j < Tk:
                    dk[b, hk, j], dv[b, hk, j] = adk[w][rr], adv[w][rr]
    return dk, dv


def direct(q, k, v, dout, causal, scale):
    """Attention and its gradients written out: top-left causal (key j <= query i), GQA."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    g = H // Hkv
    ke, ve = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, ke) * scale
    if causal:
        mask = np.arange(Tk)[None, :] <= np.arange(Tq)[:, None]
        s = np.where(mask, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    lse = (mx + np.log(e.sum(-1, keepdims=True)))[..., 0]
    p = e / e.sum(-1, keepdims=True)
    o = np.einsum("bhij,bhjd->bhid", p, ve)
    dp = np.einsum("bhid,bhjd->bhij", dout, ve)
    delta = (dout * o).sum(-1)
    ds = p * (dp - delta[..., None]) * scale
    dq = np.einsum("bhij,bhjd->bhid", ds, ke)
    dke = np.einsum("bhij,bhid->bhjd", ds, q)
    dve = np.einsum("bhij,bhid->bhjd", p, dout)
    dk = dke.reshape(B, Hkv, g, Tk, D).sum(2)
    dv = dve.reshape(B, Hkv, g, Tk, D).sum(2)
    return o, lse, delta, dq, dk, dv


def main():
    rng = np.random.default_rng(7)
    shapes = [(1, 4, 1, 37, 37, 64), (2, 2, 2, 70, 70, 128), (1, 2, 1, 5, 45, 64), (1, 6, 2, 129, 129, 128),
              (1, 2, 2, 33, 33, 96), (1, 2, 1, 45, 5, 64)]
    worst, bad = 0.0, 0
    for B, H, Hkv, Tq, Tk, D in shapes:
        for causal in (False, True):
            q = rng.uniform(-1, 1, (B, H, Tq, D))
            k = rng.uniform(-1, 1, (B, Hkv, Tk, D))
            v = rng.uniform(-1, 1, (B, Hkv, Tk, D))
            dout = rng.uniform(-1, 1, (B, H, Tq, D))
            scale = 1 / np.sqrt(D)
            o_r, lse_r, delta, dq_r, dk_r, dv_r = direct(q, k, v, dout, causal, scale)
            o, lse = fwd_tiled(q, k, v, causal, scale)
            dq = dq_tiled(dout, q, k, v, lse_r, delta, causal, scale)
            dk, dv = dkv_tiled(dout, q, k, v, lse_r, delta, causal, scale)
            for name, a, r in (("out", o, o_r), ("lse", lse, lse_r), ("dq", dq, dq_r), ("dk", dk, dk_r), ("dv", dv, dv_r)):
                err = float(np.max(np.abs(a - r))) if np.all(np.isfinite(a)) else float("inf")
                worst = max(worst, err)
                ok = err <= 1e-12
                bad += not ok
                if not ok:
                    print(f"MISMATCH {name} B{B} H{H}/{Hkv} Tq{Tq} Tk{Tk} D{D} causal={causal}: max |diff| {err:.3g}")
    print(f"tiled attention emulation: {len(shapes) * 2} cases x 5 outputs, worst max |diff| {worst:.3g}, {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
