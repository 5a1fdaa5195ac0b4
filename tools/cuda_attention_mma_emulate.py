#!/usr/bin/env python3
"""A line-by-line mirror of attention_mma.cu's kernels (mma_fwd, mma_dq, mma_dkv) in numpy,
run against a direct attention and its gradients.

No GPU: it checks the kernels' index arithmetic as written - the fragment layouts of
mma.sync.m16n8k16 (A: a0 rows g / cols 2t..2t+1, a1 rows g+8, a2 cols +8, a3 both; B: b0
k 2t..2t+1 / n g, b1 k +8; C: c0 c1 row g, c2 c3 row g+8, cols 2t..2t+1, as the PTX ISA
gives them), the staged tiles (row order and transposed, padded rows), the accumulator
-> A-fragment reuse for P and dS, causal limits and tile skipping, the base-2 online
softmax, rows and keys past the ends, grouped-query heads and Tq != Tk. A warp's 32 lanes
are numpy vectors; operands are rounded to bf16 where the kernel packs them, products
accumulate in f64 (the device's are f32), so agreement is to bf16 rounding. It does not
check the device, the instruction itself, shared-memory races or the compiler.

    python3 tools/cuda_attention_mma_emulate.py      (exit 1 on a mismatch)
"""
import sys

import numpy as np

MW, MR, MT, MPAD = 4, 16, 64, 8
LOG2E = 1.4426950408889634
LANE = np.arange(32)
G, T4 = LANE >> 2, LANE & 3


def bf16(x):
    """round to bfloat16 (nearest even), kept as float64"""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def ld32(flat, idx):
    """per lane: the two 16-bit elements at idx and idx + 1 of a flat array -> (32, 2)"""
    return np.stack([flat[idx], flat[idx + 1]], axis=1)


def mma(c, a, b0, b1):
    """c (4, 32) += A (from a: 4 x (32, 2)) . B (from b0, b1: (32, 2))"""
    A = np.zeros((16, 16))
    for r in range(4):
        rows = G + (8 if r & 1 else 0)
        cols = 2 * T4 + (8 if r & 2 else 0)
        A[rows, cols] = a[r][:, 0]
        A[rows, cols + 1] = a[r][:, 1]
    B = np.zeros((16, 8))
    for i, b in enumerate((b0, b1)):
        k = 2 * T4 + 8 * i
        B[k, G] = b[:, 0]
        B[k + 1, G] = b[:, 1]
    C = np.zeros((16, 8))
    C[G, 2 * T4], C[G, 2 * T4 + 1], C[G + 8, 2 * T4], C[G + 8, 2 * T4 + 1] = c[0], c[1], c[2], c[3]
    C = C + A @ B
    c[0], c[1], c[2], c[3] = C[G, 2 * T4], C[G, 2 * T4 + 1], C[G + 8, 2 * T4], C[G + 8, 2 * T4 + 1]


def pack2(lo, hi):
    return np.stack([bf16(lo), bf16(hi)], axis=1)


def stage(src, r0, n, D):
    s = np.zeros((MT, D + MPAD))
    for r in range(MT):
        if r0 + r < n:
            s[r, :D] = src[r0 + r]
    return s.ravel()


def stage_t(src, r0, n, D):
    s = np.zeros((D, MT + MPAD))
    for r in range(MT):
        if r0 + r < n:
            s[:D, r] = src[r0 + r]
    return s.ravel()


def load_a(src, row0, n, D):
    flat = src.ravel()
    a = []
    r0, r1 = row0 + G, row0 + G + 8
    for kc in range(D // 16):
        c = kc * 16 + T4 * 2
        z = np.zeros((32, 2))
        f = lambda r, cc: np.where((r < n)[:, None], ld32(flat, np.where(r < n, r, 0) * D + cc), z)
        a.append([f(r0, c), f(r1, c), f(r0, c + 8), f(r1, c + 8)])
    return a


def mm_rows(acc, a, s, D):
    for j in range(8):
        for kc in range(D // 16):
            p = (j * 8 + G) * (D + MPAD) + kc * 16 + T4 * 2
            mma(acc[j], a[kc], ld32(s, p), ld32(s, p + 8))


def mm_cols(out, p, st, D):
    for kc in range(4):
        a = [pack2(p[2 * kc][0], p[2 * kc][1]), pack2(p[2 * kc][2], p[2 * kc][3]),
             pack2(p[2 * kc + 1][0], p[2 * kc + 1][1]), pack2(p[2 * kc + 1][2], p[2 * kc + 1][3])]
        for n in range(D // 8):
            q = (n * 8 + G) * (MT + MPAD) + kc * 16 + T4 * 2
            mma(out[n], a, ld32(st, q), ld32(st, q + 8))


def store_rows(dst, acc, row0, n, mul0, mul1, D):
    r0, r1 = row0 + G, row0 + G + 8
    for j in range(D // 8):
        c = j * 8 + T4 * 2
        for lane in range(32):
            if r0[lane] < n:
                dst[r0[lane], c[lane]:c[lane] + 2] = bf16([acc[j][0][lane] * mul0[lane], acc[j][1][lane] * mul0[lane]])
            if r1[lane] < n:
                dst[r1[lane], c[lane]:c[lane] + 2] = bf16([acc[j][2][lane] * mul1[lane], acc[j][3][lane] * mul1[lane]])


def quad(v, f):
    v = f(v, v[LANE ^ 1])
    return f(v, v[LANE ^ 2])


def zeros(n):
    return [np.zeros((4, 32)) for _ in range(n)]


def query_blocks(q, k, causal):
    """the forward's and dQ's grid: (batch, head, kv head, first query row, keys the block sees)"""
    B, H, Tq, _ = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    for b in range(B):
        for h in range(H):
            for bx in range((Tq + MW * MR - 1) // (MW * MR)):
                qb0 = bx * MW * MR
                yield b, h, h // (H // Hkv), qb0, qb0 + MW * MR if causal and qb0 + MW * MR < Tk else Tk


def fwd(q, k, v, causal, scale):
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    o = np.full(q.shape, np.nan)
    lse = np.full((B, H, Tq), np.nan)
    sl2 = scale * LOG2E
    for b, h, hk, qb0, kend in query_blocks(q, k, causal):
        W = []
        for w in range(MW):
            row0 = qb0 + w * MR
            W.append(dict(row0=row0, qa=load_a(q[b, h], row0, Tq, D), acc=zeros(D // 8),
                          m0=np.full(32, -np.inf), m1=np.full(32, -np.inf), l0=np.zeros(32), l1=np.zeros(32)))
        for k0 in range(0, kend, MT):
            ks = stage(k[b, hk], k0, Tk, D)
            vt = stage_t(v[b, hk], k0, Tk, D)
            for st in W:
                row0 = st["row0"]
                if causal and k0 > row0 + MR - 1:
                    continue
                r0, r1 = row0 + G, row0 + G + 8
                s = zeros(8)
                mm_rows(s, st["qa"], ks, D)
                mx0, mx1 = np.full(32, -np.inf), np.full(32, -np.inf)
                for j in range(8):
                    for e in range(4):
                        key = k0 + j * 8 + T4 * 2 + (e & 1)
                        r = r0 if e < 2 else r1
                        ok = (key < Tk) & ((not causal) | (key <= r))
                        s[j][e] = np.where(ok, s[j][e] * sl2, -np.inf)
                        if e < 2:
                            mx0 = np.maximum(mx0, s[j][e])
                        else:
                            mx1 = np.maximum(mx1, s[j][e])
                mx0, mx1 = quad(mx0, np.maximum), quad(mx1, np.maximum)
                n0, n1 = np.maximum(st["m0"], mx0), np.maximum(st["m1"], mx1)
                b0, b1 = np.where(n0 == -np.inf, 0, n0), np.where(n1 == -np.inf, 0, n1)
                c0, c1 = np.exp2(st["m0"] - b0), np.exp2(st["m1"] - b1)
                ps0, ps1 = np.zeros(32), np.zeros(32)
                for j in range(8):
                    s[j][0], s[j][1] = np.exp2(s[j][0] - b0), np.exp2(s[j][1] - b0)
                    s[j][2], s[j][3] = np.exp2(s[j][2] - b1), np.exp2(s[j][3] - b1)
                    ps0 += s[j][0] + s[j][1]
                    ps1 += s[j][2] + s[j][3]
                st["l0"], st["l1"] = st["l0"] * c0 + ps0, st["l1"] * c1 + ps1
                st["m0"], st["m1"] = n0, n1
                for j in range(D // 8):
                    st["acc"][j][0] *= c0
                    st["acc"][j][1] *= c0
                    st["acc"][j][2] *= c1
                    st["acc"][j][3] *= c1
                mm_cols(st["acc"], s, vt, D)
        for st in W:
            row0 = st["row0"]
            l0, l1 = quad(st["l0"], np.add), quad(st["l1"], np.add)
            store_rows(o[b, h], st["acc"], row0, Tq, 1 / l0, 1 / l1, D)
            r0, r1 = row0 + G, row0 + G + 8
            for lane in range(0, 32, 4):
                if r0[lane] < Tq:
                    lse[b, h, r0[lane]] = (st["m0"][lane] + np.log2(l0[lane])) * np.log(2)
                if r1[lane] < Tq:
                    lse[b, h, r1[lane]] = (st["m1"][lane] + np.log2(l1[lane])) * np.log(2)
    return o, lse


def dq_kernel(dout, q, k, v, lse, delta, causal, scale):
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    dq = np.full(q.shape, np.nan)
    sl2 = scale * LOG2E
    for b, h, hk, qb0, kend in query_blocks(q, k, causal):
        W = []
        for w in range(MW):
            row0 = qb0 + w * MR
            r0, r1 = row0 + G, row0 + G + 8
            L = lambda r: np.where(r < Tq, lse[b, h][np.minimum(r, Tq - 1)] * LOG2E, 0)
            Dl = lambda r: np.where(r < Tq, delta[b, h][np.minimum(r, Tq - 1)], 0)
            W.append(dict(row0=row0, qa=load_a(q[b, h], row0, Tq, D), da=load_a(dout[b, h], row0, Tq, D),
                          L0=L(r0), L1=L(r1), d0=Dl(r0), d1=Dl(r1), acc=zeros(D // 8)))
        for k0 in range(0, kend, MT):
            ks, vs, kt = stage(k[b, hk], k0, Tk, D), stage(v[b, hk], k0, Tk, D), stage_t(k[b, hk], k0, Tk, D)
            for st in W:
                row0 = st["row0"]
                if causal and k0 > row0 + MR - 1:
                    continue
                r0, r1 = row0 + G, row0 + G + 8
                s, dp = zeros(8), zeros(8)
                mm_rows(s, st["qa"], ks, D)
                mm_rows(dp, st["da"], vs, D)
                for j in range(8):
                    for e in range(4):
                        key = k0 + j * 8 + T4 * 2 + (e & 1)
                        r = r0 if e < 2 else r1
                        ok = (r < Tq) & (key < Tk) & ((not causal) | (key <= r))
                        p = np.where(ok, np.exp2(s[j][e] * sl2 - (st["L0"] if e < 2 else st["L1"])), 0)
                        s[j][e] = p * (dp[j][e] - (st["d0"] if e < 2 else st["d1"]))
                mm_cols(st["acc"], s, kt, D)
        for st in W:
            store_rows(dq[b, h], st["acc"], st["row0"], Tq, np.full(32, scale), np.full(32, scale), D)
    return dq


def dkv_kernel(dout, q, k, v, lse, delta, causal, scale):
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    group = H // Hkv
    dk, dv = np.full(k.shape, np.nan), np.full(v.shape, np.nan)
    sl2 = scale * LOG2E
    for b in range(B):
        for hk in range(Hkv):
            for bx in range((Tk + MW * MR - 1) // (MW * MR)):
                kb0 = bx * MW * MR
                W = []
                for w in range(MW):
                    row0 = kb0 + w * MR
                    W.append(dict(row0=row0, ka=load_a(k[b, hk], row0, Tk, D), va=load_a(v[b, hk], row0, Tk, D),
                                  ak=zeros(D // 8), av=zeros(D // 8)))
                qstart = kb0 - kb0 % MT if causal else 0
                for h in range(hk * group, (hk + 1) * group):
                    for i0 in range(qstart, Tq, MT):
                        qs, ds_ = stage(q[b, h], i0, Tq, D), stage(dout[b, h], i0, Tq, D)
                        qt, dt_ = stage_t(q[b, h], i0, Tq, D), stage_t(dout[b, h], i0, Tq, D)
                        ls = np.array([lse[b, h, i0 + e] * LOG2E if i0 + e < Tq else 0 for e in range(MT)])
                        dl = np.array([delta[b, h, i0 + e] if i0 + e < Tq else 0 for e in range(MT)])
                        for st in W:
                            row0 = st["row0"]
                            if causal and i0 + MT - 1 < row0:
                                continue
                            j0, j1 = row0 + G, row0 + G + 8
                            s, dp = zeros(8), zeros(8)
                            mm_rows(s, st["ka"], qs, D)
                            mm_rows(dp, st["va"], ds_, D)
                            for j in range(8):
                                for e in range(4):
                                    c = j * 8 + T4 * 2 + (e & 1)
                                    i = i0 + c
                                    key = j0 if e < 2 else j1
                                    ok = (i < Tq) & (key < Tk) & ((not causal) | (key <= i))
                                    p = np.where(ok, np.exp2(s[j][e] * sl2 - ls[c]), 0)
                                    s[j][e] = p
                                    dp[j][e] = p * (dp[j][e] - dl[c])
                            mm_cols(st["av"], s, dt_, D)
                            mm_cols(st["ak"], dp, qt, D)
                for st in W:
                    store_rows(dk[b, hk], st["ak"], st["row0"], Tk, np.full(32, scale), np.full(32, scale), D)
                    store_rows(dv[b, hk], st["av"], st["row0"], Tk, np.ones(32), np.ones(32), D)
    return dk, dv


def direct(q, k, v, dout, causal, scale):
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    grp = H // Hkv
    o, lse = np.zeros(q.shape), np.zeros((B, H, Tq))
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(B):
        for h in range(H):
            K, V = k[b, h // grp], v[b, h // grp]
            S = q[b, h] @ K.T * scale
            if causal:
                S = np.where(np.arange(Tk)[None, :] <= np.arange(Tq)[:, None], S, -np.inf)
            m = S.max(axis=1, keepdims=True)
            P = np.exp(S - m)
            l = P.sum(axis=1, keepdims=True)
            P /= l
            o[b, h] = P @ V
            lse[b, h] = (m + np.log(l))[:, 0]
            dP = dout[b, h] @ V.T
            dS = P * (dP - (dout[b, h] * o[b, h]).sum(axis=1, keepdims=True)) * scale
            dq[b, h] = dS @ K
            dk[b, h // grp] += dS.T @ q[b, h]
            dv[b, h // grp] += P.T @ dout[b, h]
    return o, lse, dq, dk, dv


def nse(a, ref):
    if not np.all(np.isfinite(a)):
        return np.inf
    return float(((a - ref) ** 2).sum() / max((ref ** 2).sum(), 1e-300))


def main():
    rng = np.random.default_rng(5)
    # T not a multiple of the tiles (64) nor of a warp's rows (16), grouped-query heads,
    # Tq < Tk and Tq > Tk (top-left causal), D = 32, 64, 96, 128
    shapes = [(1, 2, 1, 37, 37, 64), (1, 2, 2, 70, 70, 32), (1, 2, 1, 5, 45, 64), (1, 3, 1, 130, 130, 96),
              (1, 2, 1, 45, 5, 64), (1, 1, 1, 20, 20, 128)]
    bad = 0
    for (B, H, Hkv, Tq, Tk, D) in shapes:
        for causal in (0, 1):
            q = bf16(rng.uniform(-1, 1, (B, H, Tq, D)))
            k = bf16(rng.uniform(-1, 1, (B, Hkv, Tk, D)))
            v = bf16(rng.uniform(-1, 1, (B, Hkv, Tk, D)))
            dout = bf16(rng.uniform(-1, 1, (B, H, Tq, D)))
            scale = 1 / np.sqrt(D)
            ro, rl, rdq, rdk, rdv = direct(q, k, v, dout, causal, scale)
            o, lse = fwd(q, k, v, causal, scale)
            delta = (dout * bf16(o)).sum(axis=3)
            dq = dq_kernel(dout, q, k, v, lse, delta, causal, scale)
            dk, dv = dkv_kernel(dout, q, k, v, lse, delta, causal, scale)
            errs = {"out": nse(o, ro), "lse": nse(lse, rl), "dq": nse(dq, rdq), "dk": nse(dk, rdk), "dv": nse(dv, rdv)}
            ok = all(e <= 1e-4 for e in errs.values())
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} B{B} H{H}/{Hkv} Tq{Tq} Tk{Tk} D{D}{' causal' if causal else ''}: "
                  + " ".join(f"{n} {e:.2e}" for n, e in errs.items()))
    print("all match" if not bad else f"{bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
