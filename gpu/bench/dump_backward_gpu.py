"""PyTorch's backward kernels dumped as `hils verify` files (data/verify_format.md, "Gradients"),
for the oracle's gradient check (issue 10). Three steps, the middle one on the GPU machine:

  prepare INPUTS.npz   here (numpy + the hils module): bf16 q, k, v, do, dlse from a fixed seed
                       and the naive-BSA selection of hils.reference (the ground truth's top-K)
  dump INPUTS.npz DIR  on the GPU (torch + h5py only): autograd through SDPA flash and cuDNN
                       (full causal), FlexAttention with the chunk-aligned window, the naive-BSA
                       block mask, and a zero-logit sink key under a softmax1 spec; plus one
                       planted fault from the GPU: the sink's forward with a backward that forgot
                       the sink (the softmax1 term missing from the gradient)
  plant DIR            here (h5py): planted faults derived from the dumps: dk of one chunk
                       zeroed (naive BSA), dq scaled by a wrong sigma (SDPA flash)

then `hils verify DIR/*.h5`: the kernels must pass, every planted fault must fail with a
diagnosis naming it. Shapes are small enough that every file comes back from the device.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

HQ, HKV, T, D = 4, 2, 1024, 64
G = HQ // HKV
S, W, K = 64, 256, 4
SCALE = 1.0 / math.sqrt(D)
SEED = 20261122
NAIVE_BSA = {"preset": "naive_bsa", "S": S, "W": W, "K": K}
# Exact hierarchical fusion with every candidate chunk selected is full attention (a CPU test);
# softmax1 adds the zero logit, i.e. a sink key with logit 0 and value 0.
SINK_SOFTMAX1 = {"preset": "naive_bsa", "fusion": "hierarchical", "softmax1": True, "S": S,
                 "W": W, "K": T // S}


def to_bf16(x):
    """float32 array -> the nearest bf16 values (ties to even), still float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def prepare(path):
    """Inputs and the naive-BSA selection -> INPUTS.npz (needs the hils module)."""
    import hils
    rng = np.random.default_rng(SEED)
    draw = lambda *shape: to_bf16(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    q = to_bf16(2.0 * draw(HQ, T, D))  # gain 2: peaked enough to make chunks differ
    k, v, do = draw(HKV, T, D), draw(HKV, T, D), draw(HQ, T, D)
    dlse = rng.standard_normal((HQ, T)).astype(np.float32)
    selection = hils.reference(NAIVE_BSA, q, k, v)["selection"].astype(np.int32)
    np.savez(path, q=q, k=k, v=v, do=do, dlse=dlse, selection=selection)
    print(f"wrote {path}")


def write_verify_file(path, spec, inputs, outputs, grads, kernel, dlse=True):
    """One verify file: inputs (q, k, v, do, dlse), forward outputs, gradients; gzip'd."""
    import h5py
    with h5py.File(path + ".tmp", "w") as f:
        f.attrs["format"] = "hils-verify"
        f.attrs["format_version"] = np.int64(1)
        f.attrs["spec"] = json.dumps(spec)
        f.attrs["input_precision"] = "bf16"
        f.attrs["kernel"] = kernel
        put = lambda key, x, dtype=np.float32: f.create_dataset(  # noqa: E731
            key, data=np.asarray(x, dtype), compression="gzip", shuffle=True)
        for key in ("q", "k", "v", "do") + (("dlse",) if dlse else ()):
            put("inputs/" + key, inputs[key])
        for key, x in outputs.items():
            put("outputs/" + key, x, np.int32 if key == "selection" else np.float32)
        for key, x in grads.items():
            put("grads/" + key, x)
    os.replace(path + ".tmp", path)
    print(f"wrote {path}")


def dump(inputs_path, directory):
    """Every kernel's forward and backward on the GPU -> DIR/<kernel>.h5."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention import flex_attention as flex

    data = dict(np.load(inputs_path))
    cuda = {name: torch.from_numpy(data[name]).cuda() for name in ("q", "k", "v", "do", "dlse")}
    for name in ("q", "k", "v", "do"):
        cuda[name] = cuda[name].bfloat16()     # exact: the values are bf16 already
    compiled = torch.compile(flex.flex_attention)
    host = lambda x: x.detach().float().cpu().numpy()  # noqa: E731

    def autograd(attention, with_dlse):
        """attention(q [1,Hq,T,d], k, v with KV heads repeated) -> (o, lse or None); returns
        o, lse, {dq, dk, dv} on the host after backpropagating do (and dlse)."""
        leaves = [cuda[n].clone().requires_grad_(True) for n in ("q", "k", "v")]
        ke, ve = (x.repeat_interleave(G, 0)[None] for x in leaves[1:])
        o, lse = attention(leaves[0][None], ke, ve)
        outs, ups = [o[0]], [cuda["do"]]
        if with_dlse:
            outs.append(lse[0])
            ups.append(cuda["dlse"])
        torch.autograd.backward(outs, ups)
        grads = {n: host(x.grad) for n, x in zip(("dq", "dk", "dv"), leaves)}
        return host(o[0]), None if lse is None else host(lse[0]), grads

    def sdpa(backend):
        def attention(q, k, v):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SCALE), None
        return attention

    def window_mask(b, h, q_idx, kv_idx):
        # l(t) = max(0, floor((t - W + 1) / S) S), the chunk-aligned window's first slot (Eq. 1).
        left = torch.clamp(torch.div(q_idx - W + 1, S, rounding_mode="floor") * S, min=0)
        return (kv_idx <= q_idx) & (kv_idx >= left)

    n_chunks = T // S
    chosen = torch.zeros(HKV, T, n_chunks + 1, dtype=torch.bool, device="cuda")
    index = torch.from_numpy(data["selection"]).cuda().long()
    chosen.scatter_(2, torch.where(index < 0, n_chunks, index), True)   # -1 -> the spare column
    chosen = chosen[:, :, :n_chunks]

    def bsa_mask(b, h, q_idx, kv_idx):
        chunk = torch.clamp(kv_idx // S, max=n_chunks - 1)
        return window_mask(b, h, q_idx, kv_idx) | ((kv_idx < n_chunks * S) & chosen[h // G, q_idx, chunk])

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    def flex_run(mask_mod, sink=False):
        """FlexAttention with a block mask; with `sink`, key slot T is a zero key and value
        (logit 0), padded to a whole key block."""
        pad = 128 if sink else 0

        def mask(b, h, q_idx, kv_idx):
            inside = (kv_idx < T) & mask_mod(b, h, q_idx, torch.clamp(kv_idx, max=T - 1))
            return inside | (kv_idx == T) if sink else inside
        block_mask = flex.create_block_mask(mask, B=None, H=HQ, Q_LEN=T, KV_LEN=T + pad,
                                            device="cuda")

        def attention(q, k, v):
            if sink:
                zeros = torch.zeros(1, HQ, pad, D, device="cuda", dtype=k.dtype)
                k, v = torch.cat([k, zeros], 2), torch.cat([v, zeros], 2)
            return compiled(q, k, v, block_mask=block_mask, scale=SCALE, return_lse=True)
        return attention

    os.makedirs(directory, exist_ok=True)
    path = lambda name: os.path.join(directory, name + ".h5")  # noqa: E731
    for backend, name in ((SDPBackend.FLASH_ATTENTION, "sdpa_flash"),
                          (SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn")):
        try:
            o, _, grads = autograd(sdpa(backend), False)
        except RuntimeError as error:
            print(f"{name}: unavailable ({error})")
            continue
        write_verify_file(path(name), {"preset": "full"}, data, {"o": o}, grads,
                          f"PyTorch autograd, SDPA {backend.name} bf16", dlse=False)
    o, lse, grads = autograd(flex_run(window_mask), True)
    write_verify_file(path("flex_window"), {"preset": "swa", "S": S, "W": W}, data,
                      {"o": o, "lse": lse}, grads, "PyTorch autograd, FlexAttention window bf16")
    o, lse, grads = autograd(flex_run(bsa_mask), True)
    write_verify_file(path("flex_naive_bsa"), NAIVE_BSA, data,
                      {"o": o, "lse": lse, "selection": data["selection"]}, grads,
                      "PyTorch autograd, FlexAttention naive-BSA block mask bf16")
    o, lse, grads = autograd(flex_run(causal, sink=True), False)
    write_verify_file(path("flex_sink_softmax1"), SINK_SOFTMAX1, data, {"o": o, "lse": lse},
                      grads, "PyTorch autograd, FlexAttention causal + zero-logit sink bf16",
                      dlse=False)
    _, _, without = autograd(flex_run(causal), False)
    write_verify_file(path("planted_softmax1_term_missing"), SINK_SOFTMAX1, data,
                      {"o": o, "lse": lse}, without,
                      "planted fault: the sink's forward, a backward without the sink", dlse=False)


def plant(directory):
    """Planted faults derived from the dumps (h5py): a zeroed chunk of dk, dq x 1/sqrt(2)."""
    import h5py

    def derive(source, target, kernel, change):
        with h5py.File(os.path.join(directory, source + ".h5"), "r") as f:
            spec = json.loads(f.attrs["spec"])
            inputs = {k: f["inputs/" + k][()] for k in f["inputs"]}
            outputs = {k: f["outputs/" + k][()] for k in f["outputs"]}
            grads = {k: f["grads/" + k][()] for k in f["grads"]}
        change(grads)
        write_verify_file(os.path.join(directory, target + ".h5"), spec, inputs, outputs, grads,
                          kernel, dlse="dlse" in inputs)

    def zero_chunk(grads):
        grads["dk"][1, 3 * S:4 * S] = 0           # KV head 1, chunk 3: a skipped key block

    def wrong_sigma(grads):
        grads["dq"] = grads["dq"] / math.sqrt(2.0)  # sigma with the head dim padded to 2d

    derive("flex_naive_bsa", "planted_dk_chunk_zeroed", "planted fault: dk of chunk 3 zeroed",
           zero_chunk)
    derive("sdpa_flash", "planted_dq_wrong_sigma", "planted fault: dq x 1/sqrt(2)", wrong_sigma)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    sub.add_parser("prepare").add_argument("inputs")
    p = sub.add_parser("dump")
    p.add_argument("inputs")
    p.add_argument("directory")
    sub.add_parser("plant").add_argument("directory")
    args = ap.parse_args()
    if args.step == "prepare":
        prepare(args.inputs)
    elif args.step == "dump":
        dump(args.inputs, args.directory)
    else:
        plant(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
