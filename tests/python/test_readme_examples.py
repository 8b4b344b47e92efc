"""The README's printed reports, reproduced: each block of text the README shows as what a call
printed or raised (README "From Python": a FlashAttention batch, a varlen pack, a chunked
prefill, a paged decode step) is computed here again from the same inputs (numpy arrays
standing in for the kernels' outputs: the reference's own, in float32, one entry moved) and
must equal the README's block line for line (same_report: the words, verdicts, counts and
indices exactly, columns up to their padding; a measured number, such as a headroom or the float
baseline's error, within a factor of 1.5 of the README's, because it follows the CPU's rounding:
a headroom 0.0125 on the AVX-512 machine that printed the README is 0.0122 on an AVX2 one, a
float r error 4.88e-07 is 3.64e-07). A change to a report's wording, or to a number the oracle
computes beyond rounding, fails here until the README shows what a user will see. CPU only."""

import pathlib
import re

import numpy as np
import pytest

import hils
from hils.testing import assert_kernel_matches

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def readme_block(first_line_prefix):
    """The README's unlabelled ``` block whose first line starts with first_line_prefix."""
    blocks, lines, fence = [], [], None
    for line in README.read_text().split("\n"):
        if fence is None and line.startswith("```"):
            fence, lines = line, []                 # "```" alone: printed text; "```python": code
        elif fence is not None and line == "```":
            if fence == "```" and lines:
                blocks.append(lines)
            fence = None
        elif fence is not None:
            lines.append(line)
    found = [b for b in blocks if b[0].startswith(first_line_prefix)]
    assert len(found) == 1, f"README: expected one ``` block opening with {first_line_prefix!r}, found {len(found)}"
    return found[0]


MEASURED = re.compile(r"-?\d+\.\d*(?:e[-+]?\d+)?|-?\d+e[-+]?\d+")


def same_report(got, shown):
    """got and shown (lists of lines) agree line for line: equal once every decimal or exponent
    number is replaced by a mark and runs of spaces by one, and each such number within a factor
    of 1.5 of the README's (0 only as 0)."""
    assert len(got) == len(shown), f"{len(got)} lines printed, the README shows {len(shown)}"
    words = lambda line: re.sub(" +", " ", MEASURED.sub("#", line))
    for printed, readme in zip(got, shown):
        assert words(printed) == words(readme), (printed, readme)
        for a, b in zip(map(float, MEASURED.findall(printed)), map(float, MEASURED.findall(readme))):
            assert (a == b == 0) or (a * b > 0 and max(a / b, b / a) <= 1.5), (a, b, printed)
    return True


def raised_by(call):
    with pytest.raises(AssertionError) as error:
        call()
    return str(error.value).split("\n")


def test_flash_attention_batch_report():
    # README: B = 4, T = 1024, Hq = 8, Hkv = 2, d = 64, the full preset's reference outputs in
    # FlashAttention's layout, one lse entry of sequence 3 off by 1e-3.
    rng = np.random.default_rng(0)
    B, T, Hq, Hkv, d = 4, 1024, 8, 2, 64
    q = rng.standard_normal((B, T, Hq, d), dtype=np.float32)
    k, v = (rng.standard_normal((B, T, Hkv, d), dtype=np.float32) for _ in range(2))
    spec = {"preset": "full"}
    refs = [hils.reference(spec, *(np.swapaxes(x[b], 0, 1) for x in (q, k, v))) for b in range(B)]
    o = np.stack([np.swapaxes(r["o"], 0, 1) for r in refs]).astype(np.float32)
    lse = np.stack([r["lse"] for r in refs]).astype(np.float32)
    lse[3, 5, 700] += 1e-3
    got = raised_by(lambda: assert_kernel_matches(spec, q, k, v, {"o": o, "lse": lse}, layout="bshd",
                                                  lse_layout="bhsd", kernel="fa2"))
    assert same_report(got, readme_block("kernel fa2:"))


def test_varlen_pack_report():
    # README: the nsa preset S = 64, W = 256, K = 8; sequences of 1024, 333 and 700 tokens,
    # Hq = 8, Hkv = 2, d = 64; one lse entry of sequence 1 (its row 200, head 5) off by 1e-3.
    spec = {"preset": "nsa", "S": 64, "W": 256, "K": 8}
    rng = np.random.default_rng(0)
    cu = np.cumsum([0, 1024, 333, 700]).astype(np.int32)
    q = rng.standard_normal((cu[-1], 8, 64)).astype(np.float32)
    k, v = (rng.standard_normal((cu[-1], 2, 64)).astype(np.float32) for _ in range(2))
    ref = hils.reference(spec, q, k, v, layout="thd", lse_layout="htd", cu_seqlens=cu)
    out = {"o": ref["o"].astype(np.float32), "lse": ref["lse"].astype(np.float32), "selection": ref["selection"]}
    out["lse"][5, 1024 + 200] += 1e-3
    got = raised_by(lambda: assert_kernel_matches(spec, q, k, v, out, layout="thd", lse_layout="htd",
                                                  cu_seqlens=cu, kernel="varlen"))
    assert same_report(got, readme_block("kernel varlen"))


def test_chunked_prefill_report_opens_as_shown():
    # README: the hils preset S = 64, W = 256, K = 8; Tk = 1024, 333, 700 with the last
    # Tq = 128, 333 and 1 queried; a kernel aligned top-left (its rows the first Tq slots).
    # The README shows the report's first lines (one per sequence).
    spec = {"preset": "hils", "S": 64, "W": 256, "K": 8}
    keys, queries = (1024, 333, 700), (128, 333, 1)
    Hq, Hkv, d, S = 8, 2, 64, 64
    rng = np.random.default_rng(5)
    seqs = [tuple(rng.standard_normal(s).astype(np.float32) for s in ((Hq, T, d), (Hkv, T, d), (Hkv, T, d)))
            for T in keys]
    refs = [hils.reference(spec, *qkv) for qkv in seqs]
    pack = lambda parts: np.concatenate([np.swapaxes(p, 0, 1) for p in parts])
    q = pack([s[0][:, keys[b] - queries[b]:] for b, s in enumerate(seqs)])
    k, v = pack([s[1] for s in seqs]), pack([s[2] for s in seqs])
    landmark_queries = np.zeros((3, max((T - m) // S for T, m in zip(keys, queries)), Hq, d), np.float32)
    for b, (qb, _, _) in enumerate(seqs):
        c = (keys[b] - queries[b]) // S
        landmark_queries[b, :c] = np.swapaxes(qb[:, S - 1:c * S:S], 0, 1)
    top_left = lambda name: [r[name][:, :m] for r, m in zip(refs, queries)]
    out = {"o": pack([x.astype(np.float32) for x in top_left("o")]),
           "lse": np.concatenate(top_left("lse"), axis=1).astype(np.float32),
           "selection": pack(top_left("selection"))}
    report = hils.verify(spec, q, k, v, out, layout="thd", lse_layout="htd",
                         cu_seqlens=np.cumsum((0,) + queries).astype(np.int32),
                         cu_seqlens_k=np.cumsum((0,) + keys).astype(np.int32), landmark_queries=landmark_queries)
    shown = readme_block('batch of 3 sequences, layout "thd": 1 pass, 2 fail')
    assert same_report(str(report).split("\n")[:len(shown)], shown)


def test_paged_decode_report():
    # README: the hils preset S = 64, W = 512, K = 16; B = 4 sequences of 4096, 1000, 2500 and
    # 77 slots in scattered pages of 16, Hq = 8, Hkv = 2, d = 64; one o entry of sequence 1 off
    # by 0.01.
    spec = {"preset": "hils", "S": 64, "W": 512, "K": 16}
    lengths, Hq, Hkv, d, P = [4096, 1000, 2500, 77], 8, 2, 64, 16
    rng = np.random.default_rng(0)
    B = len(lengths)
    pages = [-(-T // P) for T in lengths]
    order = rng.permutation(sum(pages) + 8)
    block_table = np.zeros((B, max(pages)), np.int32)
    k_cache = rng.standard_normal((len(order), P, Hkv, d)).astype(np.float32)
    v_cache = rng.standard_normal((len(order), P, Hkv, d)).astype(np.float32)
    q_hist = [rng.standard_normal((T, Hq, d)).astype(np.float32) for T in lengths]
    used = 0
    for b in range(B):
        block_table[b, :pages[b]] = order[used:used + pages[b]]
        used += pages[b]
    q = np.stack([x[-1] for x in q_hist])
    landmark_queries = np.zeros((B, max(T // 64 for T in lengths), Hq, d), np.float32)
    for b, T in enumerate(lengths):
        landmark_queries[b, :T // 64] = q_hist[b][63:(T // 64) * 64:64]
    refs = []
    for b, T in enumerate(lengths):
        gather = lambda cache: cache[block_table[b, :pages[b]]].reshape(-1, Hkv, d)[:T].swapaxes(0, 1)
        refs.append(hils.reference(spec, q_hist[b].swapaxes(0, 1), gather(k_cache), gather(v_cache), queries=[T - 1]))
    out = {n: np.stack([r[n][:, 0] for r in refs]) for n in ("o", "lse", "selection")}
    out["o"], out["lse"] = out["o"].astype(np.float32), out["lse"].astype(np.float32)
    out["o"][1, 3, 10] += 0.01
    report = hils.verify_decode(spec, q, k_cache, v_cache, out, cache_seqlens=np.array(lengths, np.int32),
                                block_table=block_table, landmark_queries=landmark_queries)
    assert same_report(str(report).split("\n"), readme_block("batch of 4 sequences, decode step"))
