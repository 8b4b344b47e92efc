"""Attention "kernels" written in numpy float32 from reference/SEMANTICS.md §2-5, as a kernel author
would write them (dense T x T masks, no landmarks), with switches that plant the faults the
oracle must catch. Arrays in the verify layout: q [Hq, T, d], k [Hkv, T, d], v [Hkv, T, dv]."""

import numpy as np


def logits(q, k, scale):
    """s(t, j) = scale q_t . k_j per query head (head h reads KV head h // G): [Hq, T, T]."""
    group = q.shape[0] // k.shape[0]
    return np.float32(scale) * np.einsum("htd,hsd->hts", q, np.repeat(k, group, axis=0))


def masked_attention(s, mask, v):
    """Softmax of s over mask [Hq or 1, T, T] times v -> o [Hq, T, dv], lse [Hq, T] (float32)."""
    group = s.shape[0] // v.shape[0]
    s = np.where(mask, s, np.float32(-np.inf))
    top = s.max(axis=-1, keepdims=True)
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


def block_sparse(q, k, v, S, W, K, scale, rule, wrong_chunk=False, drop_chunk=False):
    """Top-K chunks per KV group by max_h (s_hat - log Z_hat), then one softmax over the window
    and the selected chunks' tokens (flat fusion, Eq. 2, 3). -> o, lse, selection [Hkv, T, K].
    wrong_chunk: the last query takes its worst candidate instead of its best;
    drop_chunk: the last selected chunk of every row is reported but not attended."""
    Hq, T, _ = q.shape
    Hkv, group, n = k.shape[0], Hq // k.shape[0], T // S
    s = logits(q, k, scale)
    scores = chunk_scores(q, k, S, scale, rule)
    valid = np.arange(n)[None, :] < candidate_count(T, S, W)[:, None]          # [T, n]
    scores = np.where(valid[None], scores, np.float32(-np.inf))
    lse_window = masked_attention(s, window_mask(T, S, W)[None], v)[1]
    log_z = np.logaddexp(lse_window, _logsumexp(scores, axis=2))
    r = (scores - log_z[..., None]).reshape(Hkv, group, T, n).max(axis=1)       # [Hkv, T, n]
    selection = np.full((Hkv, T, K), -1, dtype=np.int64)
    mask = np.repeat(window_mask(T, S, W)[None], Hkv, axis=0)
    count = candidate_count(T, S, W)
    for g in range(Hkv):
        for t in range(T):
            order = np.argsort(-r[g, t, : count[t]], kind="stable")
            chosen = order[: min(K, count[t])]
            if wrong_chunk and t == T - 1 and count[t] > K:
                chosen = np.concatenate([chosen[1:], order[-1:]])
            chosen = np.sort(chosen)
            selection[g, t, : len(chosen)] = chosen
            attended = chosen[:-1] if drop_chunk and len(chosen) else chosen
            for c in attended:
                mask[g, t, c * S:(c + 1) * S] = True
    o, lse = masked_attention(s, np.repeat(mask, group, axis=0), v)
    return o, lse, selection


def round_to_bf16(x):
    """float32 -> the nearest bf16 value (ties to even), kept in float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)
