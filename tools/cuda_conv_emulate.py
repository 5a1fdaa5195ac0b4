#!/usr/bin/env python3
"""CPU check of src/backend/cuda/conv.cu without a GPU: a line-by-line Python
mirror of its conv2d algorithm (im2col, the NCHW rows transpose, the gather
col2im, db, and the three GEMMs through fm_cuda_gemm_raw's operand swap into
cuBLASLt's column-major problem, emulated as cuBLASLt defines it), compared
with a direct convolution and its gradients for both layouts, strides,
padding, dilation, groups and several chunk sizes; plus the pool backwards'
gather ranges against a scatter. Keep it in step with conv.cu when the
kernels change. Pure Python (no numpy): python3 tools/cuda_conv_emulate.py
prints the worst errors and exits 1 if any exceeds 1e-9."""
import sys
import random, itertools

def lt_gemm(m, n, k, ta, tb, lda, ldb, ldd, A, ao, B, bo, D, do, acc):
    for i in range(m):
        for j in range(n):
            s = 0.0
            for p in range(k):
                a = A[ao + (p + i * lda if ta else i + p * lda)]
                b = B[bo + (j + p * ldb if tb else p + j * ldb)]
                s += a * b
            idx = do + i + j * ldd
            D[idx] = (D[idx] if acc else 0.0) + s

def gemm_raw(ta, tb, M, N, K, A, ao, lda, B, bo, ldb, C, co, ldc, acc):
    # d.m=N, d.n=M, d.k=K; d.ta=tb, d.lda=ldb; d.tb=ta, d.ldb=lda; lt_gemm(d, B, A, C)
    lt_gemm(N, M, K, tb, ta, ldb, lda, ldc, B, bo, A, ao, C, co, acc)

class G: pass

def geom(lay, N, C, H, W, O, kh, kw, sh, sw, ph, pw, dh, dw, groups):
    g = G()
    g.nhwc = lay == 'NHWC'
    g.N, g.C, g.H, g.W, g.O, g.kh, g.kw = N, C, H, W, O, kh, kw
    g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.G = sh, sw, ph, pw, dh, dw, groups
    g.Ho = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    g.Wo = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    g.Cg, g.Og = C // groups, O // groups
    g.K = g.Cg * kh * kw
    g.P = g.Ho * g.Wo
    return g

def x_index(g, n, c, h, w):
    return ((n * g.H + h) * g.W + w) * g.C + c if g.nhwc else ((n * g.C + c) * g.H + h) * g.W + w
def y_index(g, n, o, oh, ow):
    return ((n * g.Ho + oh) * g.Wo + ow) * g.O + o if g.nhwc else ((n * g.O + o) * g.Ho + oh) * g.Wo + ow

def im2col(g, x, cols, n0, nb, gi):
    for e in range(nb * g.P * g.K):
        r, k = e // g.K, e % g.K
        n = n0 + r // g.P; p = r % g.P; oh = p // g.Wo; ow = p % g.Wo
        c = k // (g.kh * g.kw); t = k % (g.kh * g.kw); i = t // g.kw; j = t % g.kw
        ih = oh * g.sh - g.ph + i * g.dh; iw = ow * g.sw - g.pw + j * g.dw
        v = 0.0
        if 0 <= ih < g.H and 0 <= iw < g.W: v = x[x_index(g, n, gi * g.Cg + c, ih, iw)]
        cols[e] = v

def rows_nchw(g, nchw, rows, ro, n0, nb, d):
    for e in range(nb * g.P * g.O):
        p = e % g.P; o = (e // g.P) % g.O; n = e // (g.P * g.O)
        ri = (n * g.P + p) * g.O + o; ni = ((n0 + n) * g.O + o) * g.P + p
        if d == 0: nchw[ni] = rows[ro + ri]
        else: rows[ro + ri] = nchw[ni]

def col2im(g, dcols, dx, n0, nb, gi):
    for e in range(nb * g.Cg * g.H * g.W):
        w = e % g.W; h = (e // g.W) % g.H; c = (e // (g.W * g.H)) % g.Cg; nl = e // (g.W * g.H * g.Cg)
        acc = 0.0
        for i in range(g.kh):
            th = h + g.ph - i * g.dh
            if th < 0 or th % g.sh: continue
            oh = th // g.sh
            if oh >= g.Ho: continue
            for j in range(g.kw):
                tw = w + g.pw - j * g.dw
                if tw < 0 or tw % g.sw: continue
                ow = tw // g.sw
                if ow >= g.Wo: continue
                acc += dcols[(nl * g.P + oh * g.Wo + ow) * g.K + (c * g.kh + i) * g.kw + j]
        dx[x_index(g, n0 + nl, gi * g.Cg + c, h, w)] = acc

def conv_fwd(g, x, w, b, nbmax):
    y = [float('nan')] * (g.N * g.O * g.P)
    cols = [0.0] * (nbmax * g.P * g.K)
    rows = [0.0] * (nbmax * g.P * g.O)
    for n0 in range(0, g.N, nbmax):
        nb = min(nbmax, g.N - n0); R = nb * g.P
        if g.nhwc: yr, yo = y, n0 * g.P * g.O
        else: yr, yo = rows, 0
        for gi in range(g.G):
            im2col(g, x, cols, n0, nb, gi)
            gemm_raw(0, 1, R, g.Og, g.K, cols, 0, g.K, w, gi * g.Og * g.K, g.K, yr, yo + gi * g.Og, g.O, 0)
        if not g.nhwc: rows_nchw(g, y, rows, 0, n0, nb, 0)
    if b is not None:
        for e in range(len(y)):
            o = e % g.O if g.nhwc else (e // g.P) % g.O
            y[e] += b[o]
    return y

def conv_bwd(g, dy, x, w, nbmax):
    dx = [float('nan')] * (g.N * g.C * g.H * g.W)
    dw = [float('nan')] * (g.O * g.K)
    db = [0.0] * g.O
    for o in range(g.O):
        s = 0.0
        for m in range(g.N * g.P):
            n, p = m // g.P, m % g.P
            s += dy[(n * g.P + p) * g.O + o if g.nhwc else (n * g.O + o) * g.P + p]
        db[o] = s
    cols = [0.0] * (nbmax * g.P * g.K); dcols = [0.0] * (nbmax * g.P * g.K); rows = [0.0] * (nbmax * g.P * g.O)
    for n0 in range(0, g.N, nbmax):
        nb = min(nbmax, g.N - n0); R = nb * g.P
        if g.nhwc: dyr, dyo = dy, n0 * g.P * g.O
        else:
            dyr, dyo = rows, 0
            rows_nchw(g, dy, rows, 0, n0, nb, 1)
        for gi in range(g.G):
            dgo = dyo + gi * g.Og
            im2col(g, x, cols, n0, nb, gi)
            gemm_raw(1, 0, g.Og, g.K, R, dyr, dgo, g.O, cols, 0, g.K, dw, gi * g.Og * g.K, g.K, n0 > 0)
            gemm_raw(0, 0, R, g.K, g.Og, dyr, dgo, g.O, w, gi * g.Og * g.K, g.K, dcols, 0, g.K, 0)
            col2im(g, dcols, dx, n0, nb, gi)
    return dx, dw, db

def ref(g, x, w, b, dy):
    y = [0.0] * (g.N * g.O * g.P); dx = [0.0] * len(x); dw = [0.0] * (g.O * g.K)
    for n, o, oh, ow in itertools.product(range(g.N), range(g.O), range(g.Ho), range(g.Wo)):
        gi = o // g.Og; s = b[o] if b else 0.0
        gy = dy[y_index(g, n, o, oh, ow)]
        for c, i, j in itertools.product(range(g.Cg), range(g.kh), range(g.kw)):
            ih = oh * g.sh - g.ph + i * g.dh; iw = ow * g.sw - g.pw + j * g.dw
            if 0 <= ih < g.H and 0 <= iw < g.W:
                xi = x_index(g, n, gi * g.Cg + c, ih, iw); wi = o * g.K + (c * g.kh + i) * g.kw + j
                s += x[xi] * w[wi]
                dx[xi] += gy * w[wi]; dw[wi] += gy * x[xi]
        y[y_index(g, n, o, oh, ow)] = s
    db = [0.0] * g.O
    for n, o, oh, ow in itertools.product(range(g.N), range(g.O), range(g.Ho), range(g.Wo)): db[o] += dy[y_index(g, n, o, oh, ow)]
    return y, dx, dw, db

def maxerr(a, b): return max(abs(p - q) for p, q in zip(a, b)) if a else 0.0

random.seed(1)
cases = [('NCHW', 2, 3, 6, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1), ('NCHW', 3, 4, 7, 6, 6, 3, 2, 2, 1, 1, 0, 1, 2, 2),
         ('NHWC', 2, 6, 6, 6, 6, 3, 3, 2, 2, 1, 1, 2, 2, 6), ('NHWC', 2, 5, 5, 4, 7, 1, 1, 1, 1, 0, 0, 1, 1, 1),
         ('NHWC', 3, 4, 6, 5, 8, 3, 3, 1, 2, 0, 1, 1, 1, 2), ('NCHW', 3, 2, 5, 5, 4, 2, 2, 2, 2, 0, 0, 1, 1, 2)]
worst = 0
for cs in cases:
    g = geom(*cs)
    x = [random.uniform(-1, 1) for _ in range(g.N * g.C * g.H * g.W)]
    w = [random.uniform(-1, 1) for _ in range(g.O * g.K)]
    b = [random.uniform(-1, 1) for _ in range(g.O)]
    dy = [random.uniform(-1, 1) for _ in range(g.N * g.O * g.P)]
    ry, rdx, rdw, rdb = ref(g, x, w, b, dy)
    for nbmax in (1, 2, g.N):
        y = conv_fwd(g, x, w, b, nbmax)
        dx, dw, db = conv_bwd(g, dy, x, w, nbmax)
        e = max(maxerr(y, ry), maxerr(dx, rdx), maxerr(dw, rdw), maxerr(db, rdb))
        worst = max(worst, e)
        print(cs[0], cs[1:], 'chunk', nbmax, 'max err %.2e' % e)
print('worst', worst)

# pools: gather-form backward ranges against a scatter reference
def pool_check(H, W, kh, kw, sh, sw, ph, pw, incl):
    Ho = (H + 2 * ph - kh) // sh + 1; Wo = (W + 2 * pw - kw) // sw + 1
    dy = [[random.uniform(-1, 1) for _ in range(Wo)] for _ in range(Ho)]
    ref_ = [[0.0] * W for _ in range(H)]
    def window(oh, ow):
        h0 = oh * sh - ph; w0 = ow * sw - pw
        hs, ws = max(h0, 0), max(w0, 0); he, we = min(h0 + kh, H), min(w0 + kw, W)
        cnt = kh * kw if incl else (he - hs) * (we - ws)
        return hs, he, ws, we, cnt
    for oh in range(Ho):
        for ow in range(Wo):
            hs, he, ws, we, cnt = window(oh, ow)
            if cnt <= 0: continue
            for ih in range(hs, he):
                for iw in range(ws, we): ref_[ih][iw] += dy[oh][ow] / cnt
    err = 0
    for h in range(H):
        for w in range(W):
            oh0 = h + ph - kh + 1; ow0 = w + pw - kw + 1
            oh0 = 0 if oh0 <= 0 else (oh0 + sh - 1) // sh
            ow0 = 0 if ow0 <= 0 else (ow0 + sw - 1) // sw
            oh1 = min((h + ph) // sh, Ho - 1); ow1 = min((w + pw) // sw, Wo - 1)
            acc = 0.0
            for oh in range(oh0, oh1 + 1):
                for ow in range(ow0, ow1 + 1):
                    hs, he, ws, we, cnt = window(oh, ow)
                    if cnt <= 0: continue
                    acc += dy[oh][ow] / cnt
            err = max(err, abs(acc - ref_[h][w]))
    return err
pw_ = 0
for args in [(12, 10, 2, 2, 2, 2, 0, 0, True), (11, 13, 3, 3, 2, 2, 1, 1, False), (9, 8, 3, 2, 1, 2, 1, 0, True),
             (7, 7, 2, 2, 2, 2, 1, 1, False), (10, 9, 4, 3, 3, 1, 2, 1, True), (5, 6, 3, 3, 1, 1, 1, 1, False)]:
    pw_ = max(pw_, pool_check(*args))
print('avg pool backward gather vs scatter: max err %.2e' % pw_)
sys.exit(0 if worst < 1e-9 and pw_ < 1e-9 else 1)
