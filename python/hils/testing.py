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
"""

from . import verify


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
    if not report.passed:
        raise AssertionError(("" if kernel is None else f"kernel {kernel}\n") + str(report))
    return report
