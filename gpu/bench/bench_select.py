"""Selection kernels by name on bench_hils.py's problem (Hq=16, Hkv=2, d=64, S=64, K=32, W=512,
bf16, seed 1234): the time of each kernel (median of CUDA-event-timed calls, the kernels taken
in turns so that a drift of the card's clock spreads over all of them) and whether its
selection and selected scores equal the baseline kernel's byte for byte. For the kernels that
are not bit-identical to v8 by construction (hils.gpu.APPROXIMATE_SELECT_KERNELS: v21, v22, v25)
it counts the selection rows that differ from the baseline's and the largest reference margin
among them: r(missed) - r(chosen) of the worst swap, as the oracle measures it (oracle.cpp
compare_row), with r the group score (max over the group's heads of s_hat - log Z_hat, natural
log) in fp64 from the same summaries, q and lse_swa.

    python3 gpu/bench/bench_select.py --lib build/gpu/libhils_gpu_c.so \
        --kernels two_pass_v22,two_pass_v25 --T 16384,524288 [--baseline two_pass_v8] [--out f.json]
        [--profile]

--profile also prints, per kernel and T, the GPU time of each of its launches (torch.profiler over
10 calls: the bf16 copy of k', the selection kernel, the scores kernel).

Exit status 1 when the bytes of a kernel that is bit-identical to v8 by construction differ
from the baseline's.
"""
import argparse
import json
import sys

from script_needs import needs
needs("torch")

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import hils.gpu as hc  # noqa: E402  (python/hils/gpu; script_needs puts python/ first)
from bench_hils import paper_problem  # noqa: E402


def time_in_turns(calls, rounds):
    """Median ms of each call, the calls timed one after another in each of `rounds` rounds."""
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def profile_launches(name, T, fn, calls=10):
    """GPU time per launch of one selection kernel (torch.profiler / CUPTI) over `calls` calls."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    print(f"T={T} {name}, {calls} calls:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6, max_name_column_width=100), flush=True)


def group_scores(st, q, rows, chunks):
    """fp64 group scores r(t, c) of the default rule (max_normalized) for the (g, t) of `rows`
    and their chunks (a list of 1-D int64 tensors): max over the group's heads of s_hat - log
    Z_hat, s_hat = scale q . key + bias, Z_hat = exp(lse_swa) + sum over V(t) of exp(s_hat)."""
    p = st.p
    G, nc = p.Hq // p.Hkv, p.T // p.S
    scale = 1.0 / (p.d ** 0.5)
    out = []
    for (g, t), cs in zip(rows, chunks):
        tau = (t - p.W + 1) // p.S
        n = max(0, min(tau, nc))
        heads = slice(g * G, (g + 1) * G)
        qq = q[heads, t].double()                                    # [G, d]
        s = scale * torch.einsum("hd,hcd->hc", qq, st.key[heads, :n].double()) + st.bias[heads, :n].double()
        log_z = torch.logaddexp(st.lse_swa[heads, t].double(), torch.logsumexp(s, dim=1))
        out.append((s[:, cs] - log_z[:, None]).max(dim=0).values)
    return out


def differing_rows(st, q, base_sel, sel, most=2000):
    """Rows (g, t) whose chunk sets differ from the baseline's, and the largest reference margin
    of their worst swaps (0 when none differ) over the first `most` of them."""
    diff = (sel != base_sel).any(dim=2).nonzero().tolist()
    worst = 0.0
    for g, t in diff[:most]:
        a = set(base_sel[g, t].tolist()) - {-1}
        b = set(sel[g, t].tolist()) - {-1}
        missed, chosen = sorted(a - b), sorted(b - a)
        r_missed, r_chosen = group_scores(st, q, [(g, t), (g, t)],
                                          [torch.tensor(missed or [0], device="cuda"),
                                           torch.tensor(chosen or [0], device="cuda")])
        if missed and chosen:
            worst = max(worst, float(r_missed.max() - r_chosen.min()))
    return len(diff), worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--kernels", required=True, help="comma-separated SelectKernel names")
    ap.add_argument("--T", default="16384,32768,131072,524288")
    ap.add_argument("--baseline", default="two_pass_v8")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="")
    ap.add_argument("--profile", action="store_true", help="GPU time per launch of each kernel")
    args = ap.parse_args()
    lib = hc.Library(args.lib)
    kernels = args.kernels.split(",")
    for name in kernels + [args.baseline]:
        if name not in hc.SELECT_KERNEL:
            sys.exit(f"--kernels: unknown kernel '{name}' (expected one of {', '.join(hc.SELECT_KERNEL)})")
    print(f"device: {torch.cuda.get_device_name()}")
    results, all_equal = [], True
    for T in (int(t) for t in args.T.split(",")):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1234)
        q, k, v, p = paper_problem(T, gen)
        st = hc.Stages(lib, p)
        st.window()
        st.summarize()
        st.select(args.baseline)
        torch.cuda.synchronize()
        base = (st.selection.clone(), st.selected_score.clone())
        equal, differ = {}, {}
        for name in kernels:
            st.select(name)
            torch.cuda.synchronize()
            equal[name] = bool(torch.equal(st.selection, base[0]) and
                               torch.equal(st.selected_score.view(torch.int32), base[1].view(torch.int32)))
            if name in hc.APPROXIMATE_SELECT_KERNELS:
                rows, margin = differing_rows(st, q, base[0], st.selection)
                differ[name] = {"rows": rows, "of": p.Hkv * T, "max_margin": margin}
            else:
                all_equal &= equal[name]
        # --rounds 0: one call of each kernel only (for a profiler or memcheck), no times.
        ms = time_in_turns({name: (lambda n=name: st.select(n)) for name in kernels}, args.rounds) \
            if args.rounds > 0 else {}
        if args.profile:
            for name in kernels:
                profile_launches(name, T, lambda n=name: st.select(n))
        results.append({"T": T, "ms": ms, "bytes_equal_" + args.baseline: equal,
                        "rows_differing_from_" + args.baseline: differ})
        print(f"T={T}: " + "  ".join(f"{n} {ms[n]:.3f} ms" if n in ms else n for n in kernels) + "; bytes equal to " +
              args.baseline + ": " + ", ".join(f"{n} {'yes' if equal[n] else 'NO'}" for n in kernels) +
              "".join(f"; {n}: {d['rows']} of {d['of']} rows differ, largest margin {d['max_margin']:.3g}"
                      for n, d in differ.items()), flush=True)
        del st, q, k, v
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    sys.exit(0 if all_equal else 1)


if __name__ == "__main__":
    main()
