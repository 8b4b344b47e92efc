#!/usr/bin/env python3
"""Check hf_dump.py against the C++ llama2.c dump: load stories260K.bin into a transformers
LlamaForCausalLM in memory (no download), dump the same tokens with hf_dump, and print the
largest absolute difference per tensor.

    python3 check_llama2c_hf.py --checkpoint stories260K.bin --cpp-dump llama_cpp.h5 --out DIR

The C++ dump comes from `hils dump llama2c --tokens 128 --precision float64 -o llama_cpp.h5`.
llama2.c rotates interleaved pairs (2i, 2i+1); Hugging Face rotates (i, i + d/2). As in the
official Meta -> HF conversion, wq and wk rows are permuted so that both compute the same model;
the HF q/k are mapped back to the interleaved order before comparing. Runs twice: float64 (with
RMSNorm and the RoPE tables evaluated in float64, which transformers would otherwise do in
float32) and plain float32.
"""

import argparse
import json
import os
import sys
import traceback
import types

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_dump  # noqa: E402


def read_llama2c(path):
    """Config dict and weight arrays of a legacy llama2.c checkpoint."""
    raw = np.fromfile(path, dtype=np.int32, count=7)
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = (int(x) for x in raw)
    shared = vocab > 0
    vocab = abs(vocab)
    w = np.fromfile(path, dtype=np.float32, offset=28)
    hs, kv_dim, at = dim // n_heads, dim // n_heads * n_kv, 0

    def take(*shape):
        nonlocal at
        n = int(np.prod(shape))
        out = w[at:at + n].reshape(shape)
        at += n
        return out

    weights = dict(emb=take(vocab, dim), att_norm=take(n_layers, dim), wq=take(n_layers, dim, dim),
                   wk=take(n_layers, kv_dim, dim), wv=take(n_layers, kv_dim, dim),
                   wo=take(n_layers, dim, dim), ffn_norm=take(n_layers, dim),
                   w1=take(n_layers, hidden, dim), w2=take(n_layers, dim, hidden),
                   w3=take(n_layers, hidden, dim), final_norm=take(dim))
    take(seq_len * hs)  # legacy RoPE tables
    if not shared:
        weights["cls"] = take(vocab, dim)
    config = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv,
                  vocab=vocab, seq_len=seq_len, head_dim=hs)
    return config, weights


def permute_rows(w, heads):
    """Meta interleaved -> Hugging Face half rotation order (as the HF conversion script)."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def to_interleaved(x):
    """[..., d] in HF half order -> llama2.c interleaved order."""
    half = x.shape[-1] // 2
    return np.stack([x[..., :half], x[..., half:]], axis=-1).reshape(x.shape)


def build_model(cfg, weights, dtype, device, attention="sdpa"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = dict(vocab_size=cfg["vocab"], hidden_size=cfg["dim"], intermediate_size=cfg["hidden"],
                  num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
                  num_key_value_heads=cfg["n_kv"], head_dim=cfg["head_dim"],
                  max_position_embeddings=cfg["seq_len"], rms_norm_eps=1e-5,
                  tie_word_embeddings="cls" not in weights, attention_bias=False, mlp_bias=False,
                  hidden_act="silu")
    try:  # transformers >= 5 keeps RoPE settings in rope_parameters
        config = LlamaConfig(**kwargs, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    except TypeError:
        config = LlamaConfig(**kwargs, rope_theta=10000.0)
    config._attn_implementation = attention  # eager takes the softmax in float32
    model = LlamaForCausalLM(config)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(t(weights["emb"]))
        for i, layer in enumerate(model.model.layers):
            layer.input_layernorm.weight.copy_(t(weights["att_norm"][i]))
            layer.self_attn.q_proj.weight.copy_(t(permute_rows(weights["wq"][i], cfg["n_heads"])))
            layer.self_attn.k_proj.weight.copy_(t(permute_rows(weights["wk"][i], cfg["n_kv"])))
            layer.self_attn.v_proj.weight.copy_(t(weights["wv"][i]))
            layer.self_attn.o_proj.weight.copy_(t(weights["wo"][i]))
            layer.post_attention_layernorm.weight.copy_(t(weights["ffn_norm"][i]))
            layer.mlp.gate_proj.weight.copy_(t(weights["w1"][i]))
            layer.mlp.down_proj.weight.copy_(t(weights["w2"][i]))
            layer.mlp.up_proj.weight.copy_(t(weights["w3"][i]))
        model.model.norm.weight.copy_(t(weights["final_norm"]))
        if "cls" in weights:
            model.lm_head.weight.copy_(t(weights["cls"]))
        else:
            model.tie_weights()
    model = model.to(device=device, dtype=dtype).eval()
    if dtype == torch.float64:
        exact_float64(model, cfg)
    return model


def exact_float64(model, cfg):
    """RMSNorm and the RoPE tables in the model's own dtype (transformers uses float32)."""
    import torch

    def rms_forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))

    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = types.MethodType(rms_forward, module)

    d = cfg["head_dim"]

    def rope_forward(x, position_ids):
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d))
        freqs = position_ids.to(torch.float64)[..., None] * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    model.model.rotary_emb.forward = rope_forward


def compare(cpp_path, hf_path):
    """Largest |difference| per tensor kind over all layers and heads."""
    result = {}
    with h5py.File(cpp_path, "r") as c, h5py.File(hf_path, "r") as h:
        for name in ("q", "k", "q_unrotated", "k_unrotated", "v", "hidden"):
            worst, scale = 0.0, 0.0
            for i in range(int(c.attrs["n_layers"])):
                a = np.asarray(c[f"layer{i}/{name}"], dtype=np.float64)
                b = np.asarray(h[f"layer{i}/{name}"], dtype=np.float64)
                if name in ("q", "k", "q_unrotated", "k_unrotated"):
                    b = to_interleaved(b)
                worst = max(worst, float(np.abs(a - b).max()))
                scale = max(scale, float(np.abs(a).max()))
            result[name] = {"max_abs_diff": worst, "max_abs_value": scale}
    return result


def main():
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--cpp-dump", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    cfg, weights = read_llama2c(args.checkpoint)
    with h5py.File(args.cpp_dump, "r") as f:
        tokens = np.asarray(f["tokens"], dtype=np.int64)
        cpp_nll = json.loads(f.attrs["source"])["mean_next_token_nll"]
    ids = torch.from_numpy(tokens)[None].to(args.device)
    import transformers
    print(f"torch {torch.__version__}  transformers {transformers.__version__}  device {args.device}")
    summary = {"device": args.device, "torch": torch.__version__,
               "transformers": transformers.__version__, "tokens": int(len(tokens)),
               "cpp_nll": cpp_nll}
    for dtype, storage in ((torch.float64, "float64"), (torch.float32, "float32")):
        path = os.path.join(args.out, f"hf_dump_{storage}.h5")
        for attention in ("sdpa", "eager"):
            try:
                model = build_model(cfg, weights, dtype, args.device, attention)
                nll = hf_dump.dump_activations(model, ids, path, source={"model": "stories260K.bin"},
                                               storage=storage)
                break
            except Exception:  # report and try the other attention path
                traceback.print_exc()
        else:
            continue
        summary[storage] = {"attention": attention, "nll": nll, "nll_diff": abs(nll - cpp_nll),
                            "tensors": compare(args.cpp_dump, path)}
        print(f"{storage} ({attention} attention):")
        print(f"{storage}: HF NLL {nll:.6f} (C++ {cpp_nll:.6f})")
        for name, r in summary[storage]["tensors"].items():
            print(f"  {name:12s} max |HF - C++| = {r['max_abs_diff']:.3e}   (max |value| {r['max_abs_value']:.3f})")
    with open(os.path.join(args.out, "check_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
