#!/usr/bin/env python3
"""Check hf_dump.py on small randomly initialised models of several families (no download):
Llama, Qwen2, Qwen3, OLMo, OLMo2 and GPT-2. For each, in float64:
  - q equals the Hugging Face (half-pairing) RoPE of q_unrotated at positions 0..T-1 (same for k);
  - causal softmax attention recomputed with numpy from the dumped q, k, v equals the attention
    output the model fed into its output projection (captured by a hook), i.e. the dump holds
    exactly the vectors the model attended with.
Writes <family>.h5 dumps and summary.json into --out.

    python3 check_hf_families.py --out DIR
"""

import argparse
import json
import os
import sys
import traceback

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_dump  # noqa: E402

T = 96


def families():
    import transformers as tf
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    out = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, common),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, common),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(common, head_dim=16)),
        "olmo": (tf.OlmoConfig, tf.OlmoForCausalLM, common),
        "olmo2": (tf.Olmo2Config, tf.Olmo2ForCausalLM, common),
        "gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel,
                 dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256)),
    }
    return out


def rope_half(x, theta):
    """Hugging Face RoPE of x [H, T, d] at positions 0..T-1."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    freqs = np.arange(x.shape[1])[:, None] * inv[None]
    emb = np.concatenate([freqs, freqs], axis=-1)
    rotated = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def attention(q, k, v):
    """Causal softmax attention per query head, GQA; returns [T, Hq*dv]."""
    Hq, Tn, d = q.shape
    G = Hq // k.shape[0]
    outs = []
    for h in range(Hq):
        s = q[h] @ k[h // G].T / np.sqrt(d)
        s[np.triu_indices(Tn, 1)] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        outs.append(p @ v[h // G])
    return np.concatenate(outs, axis=1)


def check(name, config_cls, model_cls, kwargs, out_dir, device):
    import torch
    torch.manual_seed(0)
    config = config_cls(**kwargs)
    config._attn_implementation = "sdpa"  # eager takes the softmax in float32
    model = model_cls(config).to(device=device, dtype=torch.float64).eval()
    attn_inputs = {}
    handles = []
    for index, (mod_name, module) in enumerate(hf_dump._attention_modules(model)):
        proj = module.c_proj if hasattr(module, "c_attn") else module.o_proj

        def hook(m, args, index=index):
            attn_inputs[index] = args[0][0].detach().cpu().double().numpy()
        handles.append(proj.register_forward_pre_hook(hook))
    ids = torch.randint(0, 128, (1, T), generator=torch.Generator().manual_seed(1)).to(device)
    path = os.path.join(out_dir, f"{name}.h5")
    nll = hf_dump.dump_activations(model, ids, path, source={"model": f"random {name}"},
                                   storage="float64")
    for h in handles:
        h.remove()
    result = {"nll": nll, "attention_max_abs_diff": 0.0, "rope_max_abs_diff": None}
    with h5py.File(path) as f:
        theta = float(f.attrs["rope_theta"])
        result["rotated"] = int(f.attrs["rotated"])
        result["rope_pairing"] = f.attrs["rope_pairing"]
        for i in range(int(f.attrs["n_layers"])):
            q, k, v = (np.asarray(f[f"layer{i}/{n}"]) for n in ("q", "k", "v"))
            diff = float(np.abs(attention(q, k, v) - attn_inputs[i]).max())
            result["attention_max_abs_diff"] = max(result["attention_max_abs_diff"], diff)
            if result["rotated"]:
                r = max(float(np.abs(rope_half(np.asarray(f[f"layer{i}/q_unrotated"]), theta) - q).max()),
                        float(np.abs(rope_half(np.asarray(f[f"layer{i}/k_unrotated"]), theta) - k).max()))
                result["rope_max_abs_diff"] = max(result["rope_max_abs_diff"] or 0.0, r)
    return result


def main():
    import torch
    import transformers
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(f"torch {torch.__version__}  transformers {transformers.__version__}")
    summary = {}
    for name, (config_cls, model_cls, kwargs) in families().items():
        try:
            summary[name] = check(name, config_cls, model_cls, kwargs, args.out, args.device)
        except Exception as e:  # report every family, whatever happens to one
            traceback.print_exc()
            summary[name] = {"error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps(summary[name]))
    with open(os.path.join(args.out, "families_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
