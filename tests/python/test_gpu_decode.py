"""hils.gpu.DecodeCache, the decode step from PyTorch, judged by the oracle step by step as a
kernel author's pytest would: a cache of B = 2 sequences filled from a prefix, then one token
per sequence per step across a chunk boundary (chunk 34 completes at T = 2240, its summary made
from that step's query, and is a candidate from T = 2304 on), every step of both sequences judged
with hils.verify(**cache.verify_arguments(out, b)) for each summary store (bf16, fp8, int4, int4h
with d40), K = 32 with more than 32 candidates (the default kernel's selection in its chunk tiles,
gpu/NOTES.md "d36"), the steps that complete a chunk and the last one judged again on the test's
own full q, q~, k and v; a flat mechanism without prior (nsa); a planted fault that must FAIL (a
completed chunk summarized with another head's prior); bad arguments named before the library is
looked for, the cache's own refusals (out= tensors included), and a refusal of the library
itself; a step captured in a CUDA graph replays the eager step bit for bit (out= buffers), which a
planted fault breaks, and int4h's capture of a chunk completion is refused; the hard cases
(data/hard_cases.md) as single steps with every store, and walks through the two large-logit
cases, which fusion logits from bf16 rows fail (a planted fault). Needs libhils_gpu_c.so
(HILS_GPU_LIB) and hils._core; ctest label gpu; skipped without torch or CUDA. Each boundary
report is printed, and per walk the largest headroom of every tensor (pytest -s)."""

import pytest

import hils
import hils.gpu
from conftest import seed_of

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

B, Hq, Hkv, d = 2, 8, 2, 64
S, W, K = 64, 64, 32
T0, T_END = 2230, 2305  # prefix slots; capacity (the last step's T)
NEW_CHUNK = 34  # completes at T = 2240 (chunk 35 at T = 2304); a candidate from T = 2304 on
HILS = {"preset": "hils", "S": S, "W": W, "K": K}
NOWHERE = "/nonexistent/libhils_gpu_c.so"  # reached only by a call that passed every check


def draw(name, t=T_END):
    """q (gain 2), k, v, q~ = q + 0.3 noise, [B, heads, t, d] bf16, seeded by `name`."""
    generator = torch.Generator(device="cuda").manual_seed(seed_of(name) % 2**63)
    normal = lambda *shape: torch.randn(*shape, device="cuda", generator=generator)  # noqa: E731
    q = 2.0 * normal(B, Hq, t, d)
    k, v = normal(B, Hkv, t, d), normal(B, Hkv, t, d)
    q_retrieval = q + 0.3 * normal(B, Hq, t, d)
    return tuple(x.bfloat16() for x in (q, k, v, q_retrieval))


def walk(spec, summaries, name, t0=T0, t_end=T_END):
    """The cache filled with slots < t0 of draw(name), then a step per slot t0..t_end-1, each
    judged for both sequences; yields (cache, out, T, [report per sequence])."""
    q, k, v, qr = draw(name, t_end)
    cache = hils.gpu.DecodeCache(spec, q[:, :, :t0], k[:, :, :t0], v[:, :, :t0], capacity=t_end,
                                 summaries=summaries, q_retrieval=qr[:, :, :t0])
    for t in range(t0, t_end):
        cache.append(k[:, :, t], v[:, :, t])
        out = cache.step(q[:, :, t], q_retrieval=qr[:, :, t], diagnostics=True)
        assert cache.length == t + 1
        yield cache, out, t + 1, [hils.verify(**cache.verify_arguments(out, b)) for b in range(B)]


def judge_on_own_inputs(spec, name, cache, out, T):
    """The step judged on the test's own full inputs (every row of q and q~ as drawn): the
    helper's zeros and its record of the priors are not what this judges."""
    q, k, v, qr = draw(name)
    for b in range(B):
        arguments = cache.verify_arguments(out, b)
        report = hils.verify(spec, q[b, :, :T], k[b, :, :T], v[b, :, :T], arguments["outputs"],
                             q_retrieval=qr[b, :, :T], queries=[T - 1], input_precision="bf16",
                             score_precision=arguments["score_precision"], kernel=arguments["kernel"])
        assert report.passed, f"{arguments['kernel']} on the test's own inputs\n{report}"


def check_walk(spec, summaries, name):
    most = {}
    steps = 0
    for cache, out, T, reports in walk(spec, summaries, name):
        steps += 1
        assert out["o"].shape == (B, Hq, d) and out["o"].dtype == torch.float32
        assert out["lse"].shape == (B, Hq) and out["selection"].shape == (B, Hkv, K)
        assert out["surrogate_scores"].shape == (B, Hq, T // S)
        for b, report in enumerate(reports):
            assert report.passed, f"step T = {T}, sequence {b}\n{report}"
            assert "summary_key" in report.tensors and report.selection.compared
            for tensor, result in report.tensors.items():
                most[tensor] = max(most.get(tensor, 0.0), result.headroom)
        if T % S == 0 or T == T_END:
            print(f"\n{summaries} T = {T} (sequence 0)\n{reports[0]}")
            judge_on_own_inputs(spec, name, cache, out, T)
    assert steps == T_END - T0
    # the chunk completed during the walk is a candidate at the last step
    assert bool((out["surrogate_scores"][:, :, NEW_CHUNK] > float("-inf")).all())
    print(f"HEADROOM {spec.get('preset')} {summaries} ({steps} steps x {B} sequences): " +
          " ".join(f"{t}={h:.3g}" for t, h in sorted(most.items())))


@pytest.mark.parametrize("summaries", ("bf16", "fp8", "int4", "int4h"))
def test_each_step_passes_the_oracle(summaries):
    check_walk(HILS, summaries, "gpu_decode_cache_hils")


def test_a_flat_mechanism_without_prior():
    check_walk({"preset": "nsa", "S": S, "W": W, "K": K}, "fp8", "gpu_decode_cache_nsa")


def test_verify_decode_judges_the_cache_step():
    """hils.verify_decode over the cache's own tensors (k, v [B, Hkv, capacity, d]: cache_layout
    "bhsd"; the priors it keeps, [B, Hq, chunk_capacity, d], as landmark_queries) judges the step
    that completes chunk 34 (T = 2240) and the next as verify_arguments does: each sequence passes
    both ways with the same o error (query_inputs builds both problems)."""
    q, k, v, qr = draw("gpu_decode_cache_hils")
    t0 = 2236
    cache = hils.gpu.DecodeCache(HILS, q[:, :, :t0], k[:, :, :t0], v[:, :, :t0], capacity=T_END,
                                 summaries="bf16", q_retrieval=qr[:, :, :t0])
    for t in range(t0, 2242):
        cache.append(k[:, :, t], v[:, :, t])
        out = cache.step(q[:, :, t], q_retrieval=qr[:, :, t])
        if t + 1 < 2240:
            continue
        report = hils.verify_decode(HILS, q[:, :, t], cache.k, cache.v, out,
                                    cache_seqlens=[t + 1] * B, cache_layout="bhsd",
                                    q_retrieval=qr[:, :, t], landmark_queries=cache.priors,
                                    input_precision="bf16", score_precision="bf16",
                                    kernel="DecodeCache step")
        print(f"\nhils.verify_decode of the cache's step T = {t + 1}\n{report}")
        assert report.passed and report.lengths == [t + 1] * B, str(report)
        for b in range(B):
            single = hils.verify(**cache.verify_arguments(out, b))
            assert single.passed, str(single)
            assert report[b].tensors["o"].max_abs == single.tensors["o"].max_abs
            assert report[b].tensors["lse"].max_abs == single.tensors["lse"].max_abs


def test_a_planted_fault_fails():
    """Chunk 34, completed at T = 2240, summarized with the prior of the neighbouring head (the
    step's q~ rolled over heads): the step that completes it must FAIL the oracle; the same walk
    without the plant passes (test_each_step_passes_the_oracle's bf16 walk, the same draws)."""
    q, k, v, qr = draw("gpu_decode_cache_hils")
    t0 = 2236
    cache = hils.gpu.DecodeCache(HILS, q[:, :, :t0], k[:, :, :t0], v[:, :, :t0], capacity=T_END,
                                 summaries="bf16", q_retrieval=qr[:, :, :t0])
    honest = cache._summarize_chunk
    cache._summarize_chunk = lambda c, prior: honest(c, prior.roll(1, dims=1))
    for t in range(t0, 2240):
        cache.append(k[:, :, t], v[:, :, t])
        out = cache.step(q[:, :, t], q_retrieval=qr[:, :, t])
    report = hils.verify(**cache.verify_arguments(out, 0))
    print(f"\nplanted: chunk 34 summarized with the neighbouring head's prior\n{report}")
    assert not report.passed and not report.tensors["summary_key"].passed


GRAPH_T0 = 2236  # the captured steps: T = 2240 completes chunk 34, T = 2241 completes none


def bytes_of(tensors):
    """name -> the tensor's bytes, so that equality is bit for bit (-0.0, NaN payloads, -inf)."""
    return {name: t.contiguous().view(torch.uint8) for name, t in tensors.items() if t is not None}


def differences(expected, found):
    """The names whose tensors differ in any bit (or are missing in `found`)."""
    a, b = bytes_of(expected), bytes_of(found)
    return [name for name in a if name not in b or not torch.equal(a[name], b[name])]


def summary_store_of(cache):
    """The cache's stored summaries and priors, every store's tensors."""
    return {name: getattr(cache, name) for name in ("key", "bias", "scale", "pairs", "key_fp32", "priors")}


def eager_and_graphed(summaries, name="gpu_decode_cache_hils"):
    """Two caches filled alike from slots < GRAPH_T0 of draw(name) and stepped eagerly to T = 2239:
    (draws, eager, graphed)."""
    q, k, v, qr = draws = draw(name)
    caches = [hils.gpu.DecodeCache(HILS, q[:, :, :GRAPH_T0], k[:, :, :GRAPH_T0], v[:, :, :GRAPH_T0],
                                   capacity=T_END, summaries=summaries, q_retrieval=qr[:, :, :GRAPH_T0])
              for _ in range(2)]
    for t in range(GRAPH_T0, 2239):
        for cache in caches:
            cache.append(k[:, :, t], v[:, :, t])
            cache.step(q[:, :, t], q_retrieval=qr[:, :, t])
    return draws, caches[0], caches[1]


def eager_step(cache, draws, t):
    q, k, v, qr = draws
    cache.append(k[:, :, t], v[:, :, t])
    return cache.step(q[:, :, t], q_retrieval=qr[:, :, t], diagnostics=True)


def captured_step(cache, draws, t):
    """Slot t appended, the step captured in a CUDA graph with NaN in its static q, q~ and output
    buffers, then slot t's q and q~ copied into the static inputs and the graph replayed: what
    the replay reads is what the buffers hold at replay. Returns (buffers, graph)."""
    q, k, v, qr = draws
    cache.append(k[:, :, t], v[:, :, t])
    nan = dict(device="cuda", dtype=torch.bfloat16)
    static_q, static_qr = torch.full((B, Hq, d), float("nan"), **nan), torch.full((B, Hq, d), float("nan"), **nan)
    buffers = {name: torch.full(shape, -7 if dtype == torch.int32 else float("nan"), device="cuda", dtype=dtype)
               for name, (shape, dtype) in cache.output_shapes(diagnostics=True).items()}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        returned = cache.step(static_q, q_retrieval=static_qr, diagnostics=True, out=buffers)
    assert all(returned[name] is buffers[name] for name in buffers)
    static_q.copy_(q[:, :, t])
    static_qr.copy_(qr[:, :, t])
    graph.replay()
    torch.cuda.synchronize()
    return buffers, graph


@pytest.mark.parametrize("summaries", ("bf16", "fp8", "int4"))
def test_a_captured_step_replays_the_eager_step(summaries):
    """step(..., out=buffers) captured in a torch.cuda.CUDAGraph and replayed gives the eager
    step's outputs bit for bit, and the same stored summaries: at T = 2240, which completes chunk
    34 (its summary and quantization inside the graph), and at T = 2241; a second replay gives
    the same bits."""
    draws, eager, graphed = eager_and_graphed(summaries)
    for t in (2239, 2240):
        expected = eager_step(eager, draws, t)
        replayed, graph = captured_step(graphed, draws, t)
        assert differences(expected, replayed) == [], f"T = {t + 1}"
        assert differences(summary_store_of(eager), summary_store_of(graphed)) == [], f"T = {t + 1}"
        graph.replay()
        torch.cuda.synchronize()
        assert differences(expected, replayed) == [], f"T = {t + 1}, second replay"
    assert hils.verify(**graphed.verify_arguments(replayed, 1)).passed


@pytest.mark.parametrize("plant", ("out ignored", "summary left out of the graph"))
def test_a_planted_capture_fault_fails(plant):
    """The comparison of test_a_captured_step_replays_the_eager_step finds a step that writes
    its own tensors instead of out=, and a completed chunk whose summary is not made in the
    graph (chunk 34 at T = 2240)."""
    draws, eager, graphed = eager_and_graphed("fp8")
    if plant == "out ignored":  # the step writes tensors of its own and hands back the caller's
        honest = graphed.step
        graphed.step = lambda *args, out=None, **kwargs: (honest(*args, **kwargs), out)[1]
    else:
        graphed._summarize_chunk = lambda c, prior: None
    expected = eager_step(eager, draws, 2239)
    replayed, _ = captured_step(graphed, draws, 2239)
    found = differences(expected, replayed) + differences(summary_store_of(eager), summary_store_of(graphed))
    print(f"\nplanted ({plant}): differing {found}")
    assert found


# The refused capture ends with nothing captured, and torch warns that the graph is empty.
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")
def test_capturing_an_int4h_chunk_completion_is_refused():
    """The int4h quantizer synchronizes (its refused-row flag): a step that completes a chunk is
    refused under capture, naming the rule, and the refusal changes nothing (the same step then
    runs eagerly, bit for bit the other cache's); the next step, which completes none, captures."""
    draws, eager, graphed = eager_and_graphed("int4h")
    q, k, v, qr = draws
    graphed.append(k[:, :, 2239], v[:, :, 2239])
    with pytest.raises(ValueError, match=r"step: T = 2240 completes chunk 34, whose int4h summary cannot "
                                         r"be captured in a CUDA graph"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            graphed.step(q[:, :, 2239], q_retrieval=qr[:, :, 2239])
    found = graphed.step(q[:, :, 2239], q_retrieval=qr[:, :, 2239], diagnostics=True)
    assert differences(eager_step(eager, draws, 2239), found) == []
    replayed, _ = captured_step(graphed, draws, 2240)
    assert differences(eager_step(eager, draws, 2240), replayed) == []
    assert differences(summary_store_of(eager), summary_store_of(graphed)) == []


def test_a_prefix_in_flash_attention_layout_steps_as_in_sdpa_layout():
    """The same prefix as [B, T0, H, d] (layout="bshd", a contiguous tensor read through a
    transposed view) and as [B, H, T0, d]: every step bit for bit alike across the completion of
    chunk 34 (T = 2240), the K/V slots and stored summaries too, and each step of the bshd cache
    passes the oracle."""
    q, k, v, qr = draw("gpu_decode_cache_hils")
    t0 = 2236
    prefix = [x[:, :, :t0] for x in (q, k, v, qr)]
    flash = [x.transpose(1, 2).contiguous() for x in prefix]
    caches = [hils.gpu.DecodeCache(HILS, *prefix[:3], q_retrieval=prefix[3], capacity=T_END, summaries="fp8"),
              hils.gpu.DecodeCache(HILS, *flash[:3], q_retrieval=flash[3], capacity=T_END, summaries="fp8",
                                   layout="bshd")]
    for t in range(t0, 2242):
        outs = []
        for cache in caches:
            cache.append(k[:, :, t], v[:, :, t])
            outs.append(cache.step(q[:, :, t], q_retrieval=qr[:, :, t], diagnostics=True))
        assert differences(outs[0], outs[1]) == [], t
        for b in range(B):
            report = hils.verify(**caches[1].verify_arguments(outs[1], b))
            assert report.passed, f"bshd cache, T = {t + 1}, sequence {b}\n{report}"
    assert differences(summary_store_of(caches[0]), summary_store_of(caches[1])) == []
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)


def test_bad_arguments_are_named_before_the_library_is_looked_for():
    q, k, v, qr = draw("gpu_decode_cache_arguments", 100)

    def refused(error, words, *args, **kwargs):
        kwargs.setdefault("capacity", 128)
        with pytest.raises(error) as raised:
            hils.gpu.DecodeCache(HILS, *args, library=NOWHERE, **kwargs)
        assert str(raised.value).startswith(words), str(raised.value)

    refused(ValueError, "q: expected a CUDA tensor, found one on cpu", q.cpu(), k, v)
    refused(TypeError, "k: expected dtype torch.bfloat16 (the decode step reads bf16 K/V and queries), "
            "found torch.float32", q, k.float(), v)
    refused(ValueError, 'v: layout "bhsd" expects [B, Hkv, T, dv] = [2, 2, 100, *] (q is [B, Hq, T, d] = '
            '[2, 8, 100, 64]; k is [B, Hkv, T, d] = [2, 2, 100, 64]), found shape [2, 2, 99, 64]', q, k, v[:, :, :99])
    refused(ValueError, 'q_retrieval: layout "bhsd" expects [B, Hq, T, d] = [2, 8, 100, 64]', q, k, v,
            q_retrieval=qr[:1])
    refused(ValueError, 'k: expected 4 dimensions [B, Hkv, T, d] (layout "bhsd"), found shape (2, 100, 64)',
            q, k[0], v)
    refused(ValueError, 'k: layout "bshd" expects [B, T, Hkv, d] = [2, 100, *, 64] (q is [B, T, Hq, d] = '
            '[2, 100, 8, 64]), found shape [2, 2, 100, 64], which is [B, Hkv, T, d], the order of layout "bhsd"',
            q.transpose(1, 2), k, v.transpose(1, 2), layout="bshd")
    refused(ValueError, 'layout: expected "bhsd" (prefix [B, heads, T0, d]) or "bshd"', q[0], k[0], v[0],
            layout="hsd")
    refused(ValueError, "k: expected a number of KV heads dividing q's 8 heads, found 3", q,
            torch.cat([k, k[:, :1]], 1), torch.cat([v, v[:, :1]], 1))
    refused(ValueError, "q: the sequences' prefixes have lengths [100, 99]: the decode step "
            "(hils_gpu_decode, decode_c_api.h) keeps one length T for all B sequences",
            [q[0], q[1, :, :99]], [k[0], k[1, :, :99]], [v[0], v[1, :, :99]])
    refused(ValueError, "capacity: expected at least the prefix's 100 slots, got 99", q, k, v, capacity=99)
    refused(ValueError, "summaries: expected one of bf16 | fp8 | int4 | int4h, got 'fp4'", q, k, v,
            summaries="fp4")
    refused(ValueError, "kernel: int4h summaries are scanned by d40 only", q, k, v, summaries="int4h",
            kernel="fused")
    with pytest.raises(FileNotFoundError, match="library path '/nonexistent/libhils_gpu_c.so'"):
        hils.gpu.DecodeCache(HILS, q, k, v, capacity=128, library=NOWHERE)  # every check passed


def test_the_caches_own_refusals():
    q, k, v, qr = draw("gpu_decode_cache_refusals", 101)
    cache = hils.gpu.DecodeCache(HILS, q[:, :, :100], k[:, :, :100], v[:, :, :100], capacity=101)
    with pytest.raises(ValueError, match=r"step: no token appended since the last step \(T = 100\)"):
        cache.step(q[:, :, 99])
    with pytest.raises(ValueError, match=r"k: expected shape \[2, 2, 64\]"):
        cache.append(k[:1, :, 100], v[:1, :, 100])
    with pytest.raises(ValueError, match="k: expected a CUDA tensor, found one on cpu"):
        cache.append(k[:, :, 100].cpu(), v[:, :, 100])
    cache.append(k[:, :, 100], v[:, :, 100])
    with pytest.raises(ValueError, match="append: slot 100 was appended and not stepped: call step"):
        cache.append(k[:, :, 100], v[:, :, 100])
    with pytest.raises(TypeError, match="q: expected dtype torch.bfloat16"):
        cache.step(q[:, :, 100].float())
    with pytest.raises(ValueError, match=r"q_retrieval: expected shape \[2, 8, 64\]"):
        cache.step(q[:, :, 100], q_retrieval=qr[:, :4, 100])
    with pytest.raises(ValueError, match="kernel: decode kernel d25 .code 11. was removed in session 17"):
        cache.step(q[:, :, 100], kernel="d25")
    with pytest.raises(ValueError, match=r"out: the cache has no step at its length T = 101"):
        cache.verify_arguments({"o": q, "lse": q})
    good = {name: torch.empty(shape, device="cuda", dtype=dtype)
            for name, (shape, dtype) in cache.output_shapes().items()}
    with pytest.raises(ValueError, match=r"out: expected the keys \['lse', 'o', 'selection'\] "
                                         r"\(diagnostics=False\), found \['lse', 'o'\]"):
        cache.step(q[:, :, 100], out={name: good[name] for name in ("o", "lse")})
    with pytest.raises(TypeError, match=r"out\['selection'\]: expected dtype torch.int32, found torch.int64"):
        cache.step(q[:, :, 100], out=dict(good, selection=good["selection"].long()))
    with pytest.raises(ValueError, match=r"out\['o'\]: expected a contiguous tensor"):
        cache.step(q[:, :, 100], out=dict(good, o=torch.empty(2, 64, 8, device="cuda").transpose(1, 2)))
    with pytest.raises(ValueError, match=r"out\['surrogate_scores'\]: expected shape \[2, 8, 1\] \(T = 101\)"):
        cache.step(q[:, :, 100], diagnostics=True, out=dict(
            {name: torch.empty(shape, device="cuda", dtype=dtype)
             for name, (shape, dtype) in cache.output_shapes(diagnostics=True).items()},
            surrogate_scores=torch.empty(2, 8, 2, device="cuda")))
    out = cache.step(q[:, :, 100], kernel="d5", out=good)  # a kept kernel by name, into given tensors
    assert all(out[name] is good[name] for name in good)
    assert hils.verify(**cache.verify_arguments(out, 1)).passed
    with pytest.raises(ValueError, match=r"b: expected a sequence 0..1, got 2"):
        cache.verify_arguments(out, 2)
    with pytest.raises(ValueError, match=r"append: the cache is full \(101 of capacity 101 slots\)"):
        cache.append(k[:, :, 100], v[:, :, 100])


def test_a_library_refusal_carries_its_message():
    # d = 264 passes Python's checks; the decode step takes d <= 256 (decode.hpp validate_decode).
    empty = lambda h: torch.zeros(1, h, 0, 264, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    with pytest.raises(hils.gpu.GpuInvalidArgument) as refused:
        hils.gpu.DecodeCache(HILS, empty(8), empty(2), empty(2), capacity=64)
    assert isinstance(refused.value, ValueError) and refused.value.code == 2
    assert "d = 264" in refused.value.message, refused.value.message
    print(f"\nrefused: {refused.value}")


# --- a non-finite key (gpu/NOTES.md "Non-finite summary rows (session 22)") -------------------
NSA = {"preset": "nsa", "S": S, "W": W, "K": K}
BAD_B, BAD_G = 1, 1  # the sequence and KV head of the non-finite key
BAD_SLOT = {"prefix": 330, "appended chunk": 2238}  # in chunk 5 of the prefix; in chunk 34


def with_bad_key(where, value, summaries, t_end=T_END):
    """Two caches of nsa (mean keys, no bias: a non-finite key reaches the summary row and
    nothing else that a step reads from T = 2304 on) from draw("gpu_decode_cache_nsa"), filled
    to 2236 slots and stepped to t_end; the second's key at BAD_SLOT[where] (sequence BAD_B, KV
    head BAD_G, dimension 5) is `value`. Returns (clean, bad) as (cache, last step's out)."""
    q, k, v, qr = draw("gpu_decode_cache_nsa", t_end)
    bad = k.clone()
    bad[BAD_B, BAD_G, BAD_SLOT[where], 5] = value
    runs = []
    for keys in (k, bad):
        cache = hils.gpu.DecodeCache(NSA, q[:, :, :2236], keys[:, :, :2236], v[:, :, :2236],
                                     capacity=t_end, summaries=summaries, q_retrieval=qr[:, :, :2236])
        for t in range(2236, t_end):
            cache.append(keys[:, :, t], v[:, :, t])
            out = cache.step(q[:, :, t], q_retrieval=qr[:, :, t], diagnostics=True)
        runs.append((cache, out))
    return runs


@pytest.mark.parametrize("value", (float("nan"), float("inf"), float("-inf")))
@pytest.mark.parametrize("where", ("prefix", "appended chunk"))
@pytest.mark.parametrize("summaries", ("bf16", "fp8", "int4"))
def test_a_non_finite_key_gives_its_group_nan_outputs(summaries, where, value):
    """A NaN or an infinity in one key of sequence 1's KV head 1 (in the prefix's chunk 5, or in
    chunk 34, appended and completed during the walk): at T = 2305, where that chunk is a
    candidate, the step's o and lse are NaN for the four heads of that group (their selection
    ranked a non-finite score) and bit for bit the clean cache's everywhere else, selection and
    surrogate scores included; the fp8 and int4 quantizers store those heads' row marked (scale
    NaN, the codes of 0) without a synchronisation. Main before session 22 stored it with a
    finite scale (fp8: Inf as 448 x s; int4: NaN as code 0, Inf with scale 1 and codes +-7)."""
    (clean, want), (bad, got) = with_bad_key(where, value, summaries)
    chunk = BAD_SLOT[where] // S
    heads = slice(BAD_G * (Hq // Hkv), (BAD_G + 1) * (Hq // Hkv))
    assert bool(torch.isnan(got["o"][BAD_B, heads]).all()) and bool(torch.isnan(got["lse"][BAD_B, heads]).all())
    elsewhere = torch.ones(B, Hq, dtype=torch.bool, device="cuda")
    elsewhere[BAD_B, heads] = False
    for name in ("o", "lse", "o_window", "lse_window", "fusion_weights"):
        assert torch.equal(got[name][elsewhere].view(torch.int32), want[name][elsewhere].view(torch.int32)), name
    surrogate_kept = elsewhere[:, :, None].expand_as(got["surrogate_scores"]).clone()
    assert torch.equal(got["surrogate_scores"][surrogate_kept].view(torch.int32),
                       want["surrogate_scores"][surrogate_kept].view(torch.int32))
    assert bool(torch.isnan(got["surrogate_scores"][BAD_B, heads, chunk]).all())
    groups = torch.ones(B, Hkv, dtype=torch.bool, device="cuda")
    groups[BAD_B, BAD_G] = False
    assert torch.equal(got["selection"][groups], want["selection"][groups])
    if summaries != "bf16":
        assert bool(torch.isnan(bad.scale[BAD_B, heads, chunk]).all())
        assert bool(torch.isfinite(clean.scale[:, :, :chunk + 1]).all())
        zero = 0 if summaries == "fp8" else 0x88
        assert bool((bad.key[BAD_B, heads, chunk] == zero).all())


@pytest.mark.parametrize("where", ("prefix", "appended chunk"))
def test_an_int4h_cache_refuses_a_non_finite_key(where):
    """int4h's quantizer refuses a non-finite row naming it (it synchronizes for that): the
    prefix's at construction, the appended chunk's at the step that completes it (T = 2240)."""
    with pytest.raises(hils.gpu.GpuInvalidArgument, match=r"quantize_summaries_int4h: summary_key row \d+:"):
        with_bad_key(where, float("nan"), "int4h", t_end=2241)


# The hard cases (data/hard_cases.md) as decode steps: each case's last slot stepped against a
# cache of its T slots (the prefix T - 1 slots, then one append and one step), every summary
# store, judged as every other step here (cache.verify_arguments). Hq 16, Hkv 2, d = S = 64,
# W 512, K 32 is the paper's shape (bench_decode's); many_candidates (T ~ 19.7K) is left out by
# max_T to keep the oracle's share short.
HARD_DECODE_GEOMETRY = {"S": S, "W": 512, "K": K}


def cache_before(spec, case, t0, summaries="fp8"):
    """The case's q, k, v as CUDA bf16 [1, heads, T, d] and a DecodeCache of capacity T holding
    their slots < t0 -> (q, k, v, cache)."""
    q, k, v = (torch.from_numpy(x)[None].cuda().bfloat16() for x in (case.q, case.k, case.v))
    cache = hils.gpu.DecodeCache(spec, q[:, :, :t0], k[:, :, :t0], v[:, :, :t0], capacity=case.T,
                                 summaries=summaries)
    return q, k, v, cache


def step_hard_case(spec, case, summaries):
    """case's slots < T - 1 as the prefix, slot T - 1 appended and stepped -> (cache, out)."""
    T = case.T
    q, k, v, cache = cache_before(spec, case, T - 1, summaries)
    cache.append(k[:, :, T - 1], v[:, :, T - 1])
    return cache, cache.step(q[:, :, T - 1], diagnostics=True)


@pytest.mark.parametrize("summaries", ("bf16", "fp8", "int4", "int4h"))
@pytest.mark.parametrize("preset", ("hils", "nsa", "lmk"))
def test_every_hard_case_passes_the_oracle_as_a_decode_step(preset, summaries):
    spec = {"preset": preset, **HARD_DECODE_GEOMETRY}
    cases = hils.hard_cases(spec, Hq=16, Hkv=2, d=d, precision="bf16", max_T=6000)
    assert [name for name, _ in cases.skipped] == ["many_candidates"]
    failed = []
    for case in cases:
        cache, out = step_hard_case(spec, case, summaries)
        report = hils.verify(**cache.verify_arguments(out, 0))
        print(f"\n{preset} {summaries} {case.name} T={case.T}: " +
              " ".join(f"{t}={r.headroom:.3g}" for t, r in report.tensors.items()))
        if not report.passed:
            failed.append(f"{case.name}\n{report}")
    assert not failed, "\n".join(failed)


# The hils hard cases large_logits and negative_logits as a walk of steps: a step judges one query,
# and the last one of these cases passed with the fusion logits read from bf16 rows (o headroom
# 0.0002 and 0.56) where 8 and 5 of their last 160 steps failed o (headroom up to 3.19: the same
# rows as the prefill's, gpu/NOTES.md "Hard cases (session 24)", session 25). Since then the
# logits come from fp32 rows (DecodeCache.key_fp32); the same walk with those rows rounded to
# bf16 must fail.
WALK_FIRST, WALK_STEPS = 160, 48  # steps T - 160 .. T - 113: large_logits failed at two, negative_logits at one


def walk_hard_case(name, bf16_logit_rows=False):
    """Steps T - WALK_FIRST .. of hils hard case `name` (fp8 store, the default), each judged ->
    the steps (t) whose report failed, and the largest o headroom."""
    spec = {"preset": "hils", **HARD_DECODE_GEOMETRY}
    case = next(c for c in hils.hard_cases(spec, Hq=16, Hkv=2, d=d, precision="bf16", max_T=6000)
                if c.name == name)
    t0 = case.T - WALK_FIRST
    q, k, v, cache = cache_before(spec, case, t0)
    failed, most = [], 0.0
    for t in range(t0, t0 + WALK_STEPS):
        cache.append(k[:, :, t], v[:, :, t])
        out = cache.step(q[:, :, t])
        if bf16_logit_rows:  # the planted fault: session 24's bf16 rows, then the step again
            cache.key_fp32.copy_(cache.key_fp32.bfloat16().float())
            cache._run(q[:, :, t].contiguous(), None, cache.kernel, out)
        report = hils.verify(**cache.verify_arguments(out, 0))
        most = max(most, report.tensors["o"].headroom)
        if not report.passed:
            failed.append(t)
    print(f"\n{name}, bf16 logit rows {bf16_logit_rows}: steps {t0}..{t0 + WALK_STEPS - 1}, "
          f"failed {failed}, largest o headroom {most:.3g}")
    return failed, most


@pytest.mark.parametrize("name", ("large_logits", "negative_logits"))
def test_a_walk_through_a_large_logit_case_passes_every_step(name):
    failed, _ = walk_hard_case(name)
    assert failed == []


def test_the_walk_fails_with_the_logits_from_bf16_rows():
    failed, most = walk_hard_case("large_logits", bf16_logit_rows=True)
    assert failed and most > 1.0
