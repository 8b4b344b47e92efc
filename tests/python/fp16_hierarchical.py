"""An fp16 emulation of a hierarchical fusion's backward (lmk, hils), in numpy, written from
reference/SEMANTICS.md §3, §5 and §6 as a kernel author would write it (dense T x T masks), for
test_fp16_hierarchical_backward.py. The kernel computes in float32 from fp16 q, k, v, q~ and do
and rounds to fp16 what an fp16 kernel would round before a matmul or a store (data/verify_format.md
"Gradients"): P~ and dS of every softmax (the window's, each selected chunk's), the fusion
logits' gradients d s_hat (before dq~ = sigma d s_hat K' and dK' = sigma d s_hat^T Q~), the
summaries' gradients dk', db', the Taylor prior's p and d ell (before dk += p dk'^T, dk +=
sigma d ell mu^T, d mu = sigma K^T d ell), its o and every stored gradient."""

import numpy as np

FP16_NORMAL = 2.0**-14


def to_fp16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _lse(x, axis):
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    with np.errstate(divide="ignore"):
        return (top + np.log(np.exp(x - top).sum(axis=axis, keepdims=True))).squeeze(axis)


class Geometry:
    """Slots, landmarks, window and chunks of reference/SEMANTICS.md §1-2 (landmarks on)."""

    def __init__(self, T, S, W):
        self.T, self.S, self.W, self.n = T, S, W, T // S
        slot = np.arange(T)
        self.landmark = np.zeros(T, bool)
        self.landmark[(np.arange(self.n) + 1) * S - 1] = True
        left = np.maximum(0, ((slot - W + 1) // S) * S)
        t, j = slot[:, None], slot[None, :]
        self.window = (j <= t) & (j >= left[:, None]) & ~self.landmark[None, :]
        self.tokens = S - 1  # a chunk's attendable slots: the landmark is never attended


def _summaries(geo, k, mu, key_rule, sigma):
    """k' [n, d], b' [n], and for taylor the prior's ell, p [n, S-1] (float32)."""
    S, n, tok = geo.S, geo.n, geo.tokens
    keys = k[: n * S].reshape(n, S, -1)[:, :tok]
    if key_rule == "landmark_key":
        return k[(np.arange(n) + 1) * S - 1], np.zeros(n, k.dtype), None, None
    ell = sigma * np.einsum("csd,cd->cs", keys, mu)
    p = np.exp(ell - _lse(ell, 1)[:, None])
    bias = _lse(ell, 1) - (p * ell).sum(1)
    return np.einsum("cs,csd->cd", p, keys), bias, ell, p


def hierarchical_backward(spec, q, k, v, qr, d_o, selection, flush=False, drop_dscore=False,
                          exact=False):
    """The kernel's o [Hq, T, dv] and gradients {dq, dk, dv[, dq_retrieval]} (float32 holding fp16
    values) of spec {"preset": "lmk" | "hils", "S", "W", "K"}; qr = None when q~ = q (its
    gradient then goes into dq). `flush` flushes fp16's subnormals to zero at every rounding;
    `drop_dscore` leaves the fusion logits' gradient out (no gradient into q~, k' and b').
    `exact`: nothing rounded, in float64 (the emulation's own check against the reference)."""
    def half(x):
        if exact:
            return x
        r = to_fp16(x)
        return np.where(np.abs(r) < FP16_NORMAL, 0, r).astype(np.float32) if flush else r
    Hq, T, d = q.shape
    G, S, K = Hq // k.shape[0], spec["S"], spec["K"]
    geo = Geometry(T, S, spec["W"])
    n, tok = geo.n, geo.tokens
    key_rule = "taylor" if spec["preset"] == "hils" else "landmark_key"
    sigma = (np.float64 if exact else np.float32)(1 / np.sqrt(d))
    retrieval = q if qr is None else qr
    out = {"dq": np.zeros_like(q), "dk": np.zeros_like(k), "dv": np.zeros_like(v),
           "dq_retrieval": np.zeros_like(q)}
    o_all = np.zeros((Hq, T, v.shape[2]), q.dtype)
    marks = (np.arange(n) + 1) * S - 1
    for h in range(Hq):
        g = h // G
        kg, vg, qh, qrh, do = k[g], v[g], q[h], retrieval[h], d_o[h]
        s = sigma * (qh @ kg.T)
        # The window's softmax (§2) and every chunk's (§3: L(t, c), o_c), over its S-1 tokens.
        lse_w = _lse(np.where(geo.window, s, -np.inf), 1)
        p_w = np.where(geo.window, np.exp(s - lse_w[:, None]), 0)
        o_w = p_w @ vg
        s_c = s[:, : n * S].reshape(T, n, S)[:, :, :tok]
        mass = _lse(s_c, 2)
        p_c = np.exp(s_c - mass[:, :, None])
        v_c = vg[: n * S].reshape(n, S, -1)[:, :tok]
        o_c = np.einsum("tcs,csd->tcd", p_c, v_c)
        # The fusion (§5, Eq. 10) over the selected chunks' surrogates and the window.
        mu = qrh[marks]
        key, bias, ell, p = _summaries(geo, kg, mu, key_rule, sigma)
        sel = selection[g]
        valid = sel >= 0
        chunk = np.where(valid, sel, 0)
        z = np.where(valid, sigma * np.einsum("td,tkd->tk", qrh, key[chunk]) + bias[chunk], -np.inf)
        z = np.concatenate([z, lse_w[:, None]], 1)
        lse = _lse(z, 1)
        w = np.exp(z - lse[:, None])
        rows = np.arange(T)[:, None]
        o = (w[:, :K, None] * o_c[rows, chunk]).sum(1) + w[:, K, None] * o_w
        o_all[h] = half(o)
        # Backward (§6): D from the fp16 o, d z_i = w_i (do.o_i - D).
        delta = (do * o_all[h]).sum(1)
        do_oc = np.einsum("td,tcd->tc", do, o_c)
        dz = w[:, :K] * (do_oc[rows, chunk] - delta[:, None])
        # P~ and the branch's D of every (query, key): the window's w_K P_w, a chunk's w_c P_c.
        p_t = w[:, K, None] * p_w
        branch_delta = np.where(geo.window, delta[:, None], 0).astype(q.dtype)
        for slot in range(K):
            c = sel[:, slot]
            for t in np.nonzero(c >= 0)[0]:
                cols = slice(c[t] * S, c[t] * S + tok)
                p_t[t, cols] = w[t, slot] * p_c[t, c[t]]
                branch_delta[t, cols] = do_oc[t, c[t]]
        ds = half(p_t * (do @ vg.T - branch_delta))
        out["dv"][g] += half(p_t).T @ do
        out["dk"][g] += sigma * (ds.T @ qh)
        dq = sigma * (ds @ kg)
        # Into the summaries: d s_hat rounded before dq~ = sigma d s_hat K' and
        # dK' = sigma d s_hat^T Q~.
        dscore = np.zeros((T, n), q.dtype)
        if not drop_dscore:
            for slot in range(K):
                hit = valid[:, slot]
                dscore[hit, sel[hit, slot]] = dz[hit, slot]
        dscore = half(dscore)
        dqr = sigma * (dscore @ key)
        dkey, dbias = half(sigma * (dscore.T @ qrh)), half(dscore.sum(0))
        if key_rule == "landmark_key":
            out["dk"][g][marks] += dkey
        else:
            keys = kg[: n * S].reshape(n, S, -1)[:, :tok]
            dk_c = half(p)[:, :, None] * dkey[:, None, :]
            dell = p * (np.einsum("csd,cd->cs", keys, dkey) - (key * dkey).sum(1)[:, None])
            dell = half(dell - dbias[:, None] * p * (ell - (p * ell).sum(1)[:, None]))
            dk_c += sigma * dell[:, :, None] * mu[:, None, :]
            out["dk"][g][: n * S].reshape(n, S, -1)[:, :tok] += dk_c
            dqr[marks] += sigma * np.einsum("csd,cs->cd", keys, dell)
        if qr is None:
            dq = dq + dqr
        else:
            out["dq_retrieval"][h] = half(dqr)
        out["dq"][h] = half(dq)
    out["dk"], out["dv"] = half(out["dk"]), half(out["dv"])
    if qr is None:
        del out["dq_retrieval"]
    return o_all, out
