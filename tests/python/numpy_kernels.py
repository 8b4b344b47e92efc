"""Attention "kernels" written in numpy float32 from reference/SEMANTICS.md §2-5, as a kernel author
would write them (dense T x T masks, no landmarks), with switches that plant the faults the
oracle must catch. Arrays in the verify layout: q [Hq, T, d], k [Hkv, T, d], v [Hkv, T, dv]."""

import numpy as np


def logits(q, k, scale):
    """s(t, j) = scale q_t . k_j per query head (head h reads KV head h // G): [Hq, T, T]."""
    group = q.shape[0] // k.shape[0]
    return np.float32(scale) * np.einsum("htd,hsd->hts", q, np.repeat(k, group, axis=0))


# The softmax's shift: the row maximum, or two faults a kernel author writes: a running maximum
# started at 0 instead of -inf ("from_zero"), no shift at all ("none").
SOFTMAX_SHIFTS = ("max", "from_zero", "none")


def masked_attention(s, mask, v, shift="max"):
    """Softmax of s over mask [Hq or 1, T, T] times v -> o [Hq, T, dv], lse [Hq, T] (float32)."""
    group = s.shape[0] // v.shape[0]
    s = np.where(mask, s, np.float32(-np.inf))
    top = s.max(axis=-1, keepdims=True)
    if shift == "from_zero":
        top = np.maximum(top, np.float32(0))
    elif shift == "none":
        top = np.zeros_like(top)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        p = np.exp(s - top)
        total = p.sum(axis=-1, keepdims=True)
        o = (p / total) @ np.repeat(v, group, axis=0)
        return o.astype(np.float32), (top + np.log(total))[..., 0].astype(np.float32)


def window_left(T, S, W):
    """l(t) = max(0, floor((t - W + 1) / S) S): first slot of the chunk-aligned window (Eq. 1)."""
    t = np.arange(T)
    return np.maximum(0, ((t - W + 1) // S) * S)


def candidate_count(T, S, W):
    """|V(t)| = max(0, min(tau(t), floor(T / S))): complete chunks left of the window."""
    t = np.arange(T)
    return np.maximum(0, np.minimum((t - W + 1) // S, T // S))


def window_mask(T, S, W):
    t, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (j <= t) & (j >= window_left(T, S, W)[:, None])


def dense_attention(q, k, v, scale):
    """Full causal attention -> o, lse."""
    T = q.shape[1]
    causal = np.arange(T)[None, :] <= np.arange(T)[:, None]
    return masked_attention(logits(q, k, scale), causal[None], v)


def window_attention(q, k, v, S, W, scale):
    """Chunk-aligned sliding window attention -> o, lse."""
    return masked_attention(logits(q, k, scale), window_mask(q.shape[1], S, W)[None], v)


def _logsumexp(x, axis):
    if x.shape[axis] == 0:  # no chunk yet (T < S): the empty sum's log
        return np.full(np.delete(x.shape, axis), -np.inf, dtype=x.dtype)
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    with np.errstate(divide="ignore"):
        return (top + np.log(np.exp(x - top).sum(axis=axis, keepdims=True))).squeeze(axis)


def chunk_scores(q, k, S, scale, rule):
    """s_hat(t, h, c) for every chunk [Hq, T, n_chunks]: "exact" = L(t, c), the log-mass of
    chunk c (naive BSA); "mean" = scale q_t . mean key of the chunk (NSA)."""
    Hkv, T, d = k.shape
    n = T // S
    if rule == "exact":
        s = logits(q, k, scale)[:, :, : n * S].reshape(q.shape[0], T, n, S)
        return _logsumexp(s, axis=3)
    means = k[:, : n * S].reshape(Hkv, n, S, d).mean(axis=2)
    return logits(q, means, scale)


def _threshold_top_k(r, K):
    """The fault of a top-K by threshold: every score >= the K-th largest, the first K of them
    in chunk order. Right without ties; on a tie at the cut it can drop a stronger chunk of a
    higher index for a tied one of a lower index."""
    kth = np.sort(r)[::-1][K - 1]
    return np.flatnonzero(r >= kth)[:K]


def block_sparse(q, k, v, S, W, K, scale, rule, wrong_chunk=False, drop_chunk=False,
                 shift="max", threshold_top_k=False, first_head_only=False, skip_chunk0=False,
                 window_out_of_log_z=False):
    """Top-K chunks per KV group by max_h (s_hat - log Z_hat), then one softmax over the window
    and the selected chunks' tokens (flat fusion, Eq. 2, 3). -> o, lse, selection [Hkv, T, K].
    Planted faults: wrong_chunk: the last query takes its worst candidate instead of its best;
    drop_chunk: the last selected chunk of every row is reported but not attended; shift: the
    softmax's (SOFTMAX_SHIFTS); threshold_top_k: _threshold_top_k; first_head_only: r from the
    group's first head alone; skip_chunk0: chunk 0 never a candidate; window_out_of_log_z:
    log Z_hat without the window's lse."""
    Hq, T, _ = q.shape
    Hkv, group, n = k.shape[0], Hq // k.shape[0], T // S
    s = logits(q, k, scale)
    scores = chunk_scores(q, k, S, scale, rule)
    valid = np.arange(n)[None, :] < candidate_count(T, S, W)[:, None]          # [T, n]
    if skip_chunk0:
        valid[:, 0] = False
    scores = np.where(valid[None], scores, np.float32(-np.inf))
    lse_window = masked_attention(s, window_mask(T, S, W)[None], v)[1]
    log_z = _logsumexp(scores, axis=2)
    if not window_out_of_log_z:
        log_z = np.logaddexp(lse_window, log_z)
    with np.errstate(invalid="ignore"):  # -inf - -inf where no candidate: NaN, never chosen
        r = (scores - log_z[..., None]).reshape(Hkv, group, T, n)
    r = r[:, 0] if first_head_only else r.max(axis=1)                            # [Hkv, T, n]
    selection = np.full((Hkv, T, K), -1, dtype=np.int64)
    mask = np.repeat(window_mask(T, S, W)[None], Hkv, axis=0)
    count = candidate_count(T, S, W)
    for g in range(Hkv):
        for t in range(T):
            row = np.where(valid[t, : count[t]], r[g, t, : count[t]], -np.inf)
            order = np.argsort(-row, kind="stable")
            chosen = order[: min(K, int(valid[t].sum()))]
            if threshold_top_k and len(chosen) == K:
                chosen = _threshold_top_k(row, K)
            if wrong_chunk and t == T - 1 and count[t] > K:
                chosen = np.concatenate([chosen[1:], order[-1:]])
            chosen = np.sort(chosen)
            selection[g, t, : len(chosen)] = chosen
            attended = chosen[:-1] if drop_chunk and len(chosen) else chosen
            for c in attended:
                mask[g, t, c * S:(c + 1) * S] = True
    o, lse = masked_attention(s, np.repeat(mask, group, axis=0), v, shift)
    return o, lse, selection


def round_to_bf16(x):
    """float32 -> the nearest bf16 value (ties to even), kept in float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)
