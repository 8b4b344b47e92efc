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
from .layouts import BatchReport, _summary


def _headline(report):
    """What broke, in one line (pytest's -r summary shows only the message's first line): a
    Report's verdict line (the one a BatchReport gives each sequence), or for a batch the first
    failing sequence's, then how many fail."""
    if not isinstance(report, BatchReport):
        return _summary(report)
    failed = report.failed
    return (f"b={failed[0]}: {_summary(report[failed[0]])} ({len(failed)} of {len(report)} "
            f"sequences fail)")


def _passed(report, kernel):
    """The report of a kernel that passes; for one that fails, AssertionError whose message is
    a line saying what broke (after the kernel's name when given), then the report."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this one
    if not report.passed:
        raise AssertionError(("" if kernel is None else f"kernel {kernel}: ") + _headline(report)
                             + "\n" + str(report))
    return report


def assert_kernel_matches(spec, q, k, v, outputs, *, layout="hsd", lse_layout=None,
                          selection_order="ascending", input_precision="fp32",
                          score_precision="fp32", bf16_rounding="detect", q_retrieval=None,
                          prior=None, queries=None, kernel=None, max_messages=8, do=None,
                          dlse=None, grads=None, cu_seqlens=None, cu_seqlens_k=None,
                          landmark_queries=None):
    """hils.verify with the same arguments; raises AssertionError when the kernel fails, returns
    the Report (a BatchReport for a batched or packed layout) when it passes. The message's first
    line says what broke ("kernel mine: FAIL (o)  worst headroom 1.06e+03 (o)", the kernel's name
    first when given; for a batch the first failing sequence's: "b=3: FAIL (lse) ... (1 of 4
    sequences fail)"), the report follows (for a batch: one line per sequence, then each
    failing one in full)."""
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
    each, from a dense or paged cache); raises AssertionError when the step fails (its message
    as assert_kernel_matches': a line saying what broke, then the BatchReport), returns the
    BatchReport when it passes."""
    __tracebackhide__ = True
    report = verify_decode(spec, q, k_cache, v_cache, outputs, cache_seqlens=cache_seqlens,
                           block_table=block_table, cache_layout=cache_layout,
                           q_retrieval=q_retrieval, landmark_queries=landmark_queries,
                           selection_order=selection_order, input_precision=input_precision,
                           score_precision=score_precision, bf16_rounding=bf16_rounding,
                           kernel=kernel, max_messages=max_messages)
    return _passed(report, kernel)
