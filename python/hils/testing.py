"""pytest helpers: judge a kernel with the oracle in one line.

    from hils.testing import assert_kernel_matches

    def test_my_kernel():
        o, lse, sel = my_kernel(q, k, v)
        assert_kernel_matches({"preset": "nsa", "S": 64, "W": 512, "K": 16}, q, k, v,
                              {"o": o, "lse": lse, "selection": sel}, input_precision="bf16")

    def test_my_batched_kernel():      # FlashAttention's layout: q [B, T, Hq, d], lse [B, Hq, T]
        o, lse, sel = my_kernel(q, k, v)               # sel: torch.topk indices [B, T, Hkv, K]
        assert_kernel_matches(spec, q, k, v, {"o": o, "lse": lse, "selection": sel},
                              layout="bshd", lse_layout="bhsd", selection_order="any")

    def test_my_decode_step():         # B sequences, one new query each, a paged cache
        o, lse = my_decode(q, k_cache, v_cache, block_table, cache_seqlens)
        assert_decode_matches({"preset": "full"}, q, k_cache, v_cache, {"o": o, "lse": lse},
                              cache_seqlens=cache_seqlens, block_table=block_table)
"""

from . import verify, verify_decode


def _passed(report, kernel):
    """The report of a kernel that passes; AssertionError whose message is the report (preceded
    by the kernel's name when given) for one that fails."""
    if not report.passed:
        raise AssertionError(("" if kernel is None else f"kernel {kernel}\n") + str(report))
    return report


def assert_kernel_matches(spec, q, k, v, outputs, *, layout="hsd", lse_layout=None,
                          selection_order="ascending", input_precision="fp32",
                          score_precision="fp32", bf16_rounding="detect", q_retrieval=None,
                          prior=None, queries=None, kernel=None, max_messages=8, do=None,
                          dlse=None, grads=None, cu_seqlens=None, cu_seqlens_k=None,
                          landmark_queries=None):
    """hils.verify with the same arguments; raises AssertionError whose message is the report
    (preceded by the kernel's name when given) when the kernel fails, returns the Report (a
    BatchReport for a batched or packed layout: the message then names the sequences that fail, each
    with its full report) when it passes."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this one
    report = verify(spec, q, k, v, outputs, layout=layout, lse_layout=lse_layout,
                    selection_order=selection_order, input_precision=input_precision,
                    score_precision=score_precision, bf16_rounding=bf16_rounding,
                    q_retrieval=q_retrieval, prior=prior, queries=queries, kernel=kernel,
                    max_messages=max_messages, do=do, dlse=dlse, grads=grads, cu_seqlens=cu_seqlens,
                    cu_seqlens_k=cu_seqlens_k, landmark_queries=landmark_queries)
    return _passed(report, kernel)


def assert_decode_matches(spec, q, k_cache, v_cache, outputs, *, cache_seqlens, block_table=None,
                          cache_layout="bshd", q_retrieval=None, landmark_queries=None,
                          selection_order="ascending", input_precision="fp32",
                          score_precision="fp32", bf16_rounding="detect", kernel=None,
                          max_messages=8):
    """hils.verify_decode with the same arguments (a decode step of B sequences, one new query
    each, from a dense or paged cache); raises AssertionError whose message is the BatchReport
    (preceded by the kernel's name when given: the sequences that fail, each with its full
    report) when the step fails, returns the BatchReport when it passes."""
    __tracebackhide__ = True
    report = verify_decode(spec, q, k_cache, v_cache, outputs, cache_seqlens=cache_seqlens,
                           block_table=block_table, cache_layout=cache_layout,
                           q_retrieval=q_retrieval, landmark_queries=landmark_queries,
                           selection_order=selection_order, input_precision=input_precision,
                           score_precision=score_precision, bf16_rounding=bf16_rounding,
                           kernel=kernel, max_messages=max_messages)
    return _passed(report, kernel)
