#!/usr/bin/env python3
"""Dump a Hugging Face causal LM's attention activations into a hils activation file.

Writes the format of data/activation_format.md (read by `hils info`, `hils run` and the
studies): per layer q and k after RoPE, q_unrotated and k_unrotated before it, v, and the
hidden state entering the layer, for one text (or a list of token ids).

Supported families: Llama, Qwen2/Qwen3, OLMo/OLMo2 and others whose attention module has
q_proj/k_proj/v_proj and whose modeling module applies RoPE through a module-level
`apply_rotary_pos_emb(q, k, cos, sin, ...)` (the Hugging Face convention: "half" pairing, dim j
with j + d/2); and GPT-2 style models (fused `c_attn`, no RoPE: rotated = 0, rope_pairing none).

How the capture works (hooks, no change to the model's arithmetic):
  - a forward pre-hook on every attention module records which layer is running;
  - the modeling module's `apply_rotary_pos_emb` is wrapped for the duration of the forward
    pass: its inputs are the pre-RoPE q/k (after any q/k norm), its outputs the post-RoPE q/k;
  - a forward hook on `v_proj` (or `c_attn`) gives v;
  - a forward pre-hook on each decoder layer gives the residual stream entering it.
Caveat: OLMo v1's clip_qkv clamps q/k/v after the projections; v is recorded before that clamp.

Usage (on your own machine; nothing is downloaded unless --model names a Hub id you allow):
  python3 hf_dump.py --model meta-llama/Llama-3.2-1B --text story.txt --tokens 2048 -o acts.h5
  python3 hf_dump.py --model ./my_checkpoint --token-ids ids.txt -o acts.h5 --dtype float32
  python3 hf_dump.py --model ./my_checkpoint --text story.txt -o acts.h5 --storage float16

--storage float16 halves the file (data/activation_format.md: readers accept IEEE float16); a
value beyond float16's range (|x| > 65504, a hidden state's outlier, say) is refused by dataset
name instead of being stored as Inf: store that model in float32.

Library use: `dump_activations(model, input_ids, path, source={...})`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

FORMAT = "hils-activations"
FORMAT_VERSION = 1


# ---- writing the format (numpy + h5py only) ---------------------------------------------------

def _check_heads(name, array, heads, T, d):
    """Raise ValueError naming the dataset unless array is finite with shape [heads, T, d]."""
    if array.shape != (heads, T, d):
        raise ValueError(f"{name}: expected shape {(heads, T, d)}, found {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: expected finite values, found NaN or Inf")


STORAGE = {"float16": np.float16, "float32": np.float32, "float64": np.float64}


def _check_storable(name, array, storage):
    """Raise ValueError naming the dataset when a value lies beyond the storage type's range
    (numpy would store it as Inf, which every reader refuses: data/activation_format.md)."""
    limit = np.finfo(STORAGE[storage]).max
    beyond = np.abs(array) > limit
    if np.any(beyond):
        index = tuple(int(i) for i in np.argwhere(beyond)[0])
        raise ValueError(f"{name}: expected values within {storage}'s range (|x| <= {limit:g}), "
                         f"found {float(array[index]):g} at {list(index)}; store float32")


def _umask():
    """The process's umask (os.umask sets it, so it is set back at once)."""
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def write_activation_file(path, layers, *, tokens, rotated, rope_pairing, rope_theta, source,
                          storage="float32"):
    """Write layers (list of dicts of numpy arrays) atomically: temp file + rename.

    Each layer dict holds q [Hq,T,d], k [Hkv,T,d], v [Hkv,T,dv] and optionally q_unrotated,
    k_unrotated (same shapes as q, k), hidden [T,d_model]. storage: the datasets' type,
    float32 (default), float16 (half the disk; values beyond its range are refused) or float64.
    """
    import h5py

    if not layers:
        raise ValueError("no layers to write")
    Hq, T, d = layers[0]["q"].shape
    Hkv, _, dv = layers[0]["v"].shape
    if Hq % Hkv != 0:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    hidden = layers[0].get("hidden")
    d_model = 0 if hidden is None else hidden.shape[1]
    if storage not in STORAGE:
        raise ValueError(f"storage: expected one of {', '.join(STORAGE)}, found {storage!r}")
    dtype = STORAGE[storage]
    for i, layer in enumerate(layers):
        _check_heads(f"layer{i}/q", layer["q"], Hq, T, d)
        _check_heads(f"layer{i}/k", layer["k"], Hkv, T, d)
        _check_heads(f"layer{i}/v", layer["v"], Hkv, T, dv)
        if "q_unrotated" in layer:
            _check_heads(f"layer{i}/q_unrotated", layer["q_unrotated"], Hq, T, d)
            _check_heads(f"layer{i}/k_unrotated", layer["k_unrotated"], Hkv, T, d)
        if layer.get("hidden") is not None:
            _check_heads(f"layer{i}/hidden", layer["hidden"][None], 1, T, d_model)
        for name in ("q", "k", "v", "q_unrotated", "k_unrotated", "hidden"):
            if layer.get(name) is not None:
                _check_storable(f"layer{i}/{name}", layer[name], storage)

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{path}: expected an output folder that exists, found no folder {folder}")
    fd, temp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".tmp-", dir=folder)
    os.close(fd)
    # mkstemp makes the file owner-only (0600); the published file gets the mode of any new
    # file, as the C++ writers' files do (0666 less the umask).
    os.chmod(temp, 0o666 & ~_umask())
    rotation = "after RoPE" if rotated else "not rotated"
    try:
        with h5py.File(temp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = np.int64(FORMAT_VERSION)
            for key, value in (("n_layers", len(layers)), ("Hq", Hq), ("Hkv", Hkv), ("T", T),
                               ("d", d), ("dv", dv), ("d_model", d_model),
                               ("rotated", 1 if rotated else 0)):
                f.attrs[key] = np.int64(value)
            f.attrs["rope_pairing"] = rope_pairing
            f.attrs["rope_theta"] = np.float64(rope_theta)
            f.attrs["source"] = json.dumps(source, sort_keys=True)
            ds = f.create_dataset("position_ids", data=np.arange(T, dtype=np.int64))
            ds.attrs["meaning"] = "position id of every slot (for RoPE)"
            ds = f.create_dataset("landmarks", data=np.zeros(T, dtype=np.uint8))
            ds.attrs["meaning"] = "1 where the slot is a landmark slot"
            ds = f.create_dataset("tokens", data=np.asarray(tokens, dtype=np.int32))
            ds.attrs["meaning"] = "token id of every slot, -1 at landmarks"
            meanings = {
                "q": f"queries [Hq, T, d], {rotation}",
                "k": f"keys [Hkv, T, d], {rotation}",
                "v": "values [Hkv, T, dv]",
                "q_unrotated": "queries [Hq, T, d] before RoPE",
                "k_unrotated": "keys [Hkv, T, d] before RoPE",
                "hidden": "hidden state entering the layer [T, d_model]",
            }
            for i, layer in enumerate(layers):
                group = f.create_group(f"layer{i}")
                for name, meaning in meanings.items():
                    if layer.get(name) is None:
                        continue
                    ds = group.create_dataset(name, data=np.asarray(layer[name], dtype=dtype))
                    ds.attrs["meaning"] = meaning
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise


# ---- capturing a Hugging Face model -----------------------------------------------------------

def _attention_modules(model):
    """(name, module) of every self-attention module, in layer order."""
    found = []
    for name, module in model.named_modules():
        cls = type(module).__name__
        if not cls.endswith("Attention"):
            continue
        if all(hasattr(module, p) for p in ("q_proj", "k_proj", "v_proj")) or hasattr(module, "c_attn"):
            found.append((name, module))
    if not found:
        raise ValueError(f"{type(model).__name__}: no attention module with q_proj/k_proj/v_proj or "
                         "c_attn found; this architecture is not supported")
    return found


def _parent(model, name):
    parent_name = name.rsplit(".", 1)[0]
    return model.get_submodule(parent_name)


def _rope_theta(config):
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        theta = params.get("rope_theta")
    return float(theta) if theta is not None else 10000.0


def _heads(tensor):
    """[1, H, T, d] torch tensor -> numpy [H, T, d] in float64."""
    return tensor[0].detach().to("cpu").double().numpy()


def capture(model, input_ids):
    """Run model on input_ids ([1, T] tensor); return (layers, logits, rotated)."""
    import torch

    attention = _attention_modules(model)
    fused = hasattr(attention[0][1], "c_attn")
    n_layers = len(attention)
    layers = [dict() for _ in range(n_layers)]
    state = {"layer": None}
    handles = []
    patched = []

    config = model.config
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads

    def attention_pre_hook(index):
        def hook(module, args, kwargs):
            state["layer"] = index
        return hook

    def layer_pre_hook(index):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            layers[index]["hidden"] = hidden[0].detach().to("cpu").double().numpy()
        return hook

    def v_hook(index, module_attn):
        def hook(module, args, output):
            T = output.shape[1]
            dv = output.shape[2] // n_kv
            layers[index]["v"] = output[0].detach().to("cpu").double().numpy().reshape(T, n_kv, dv).transpose(1, 0, 2)
        return hook

    def c_attn_hook(index):
        def hook(module, args, output):
            T = output.shape[1]
            width = output.shape[2] // 3
            hd = width // n_heads
            qkv = output[0].detach().to("cpu").double().numpy()
            q, k, v = (qkv[:, i * width:(i + 1) * width].reshape(T, n_heads, hd).transpose(1, 0, 2)
                       for i in range(3))
            layers[index].update(q=q, k=k, v=v)
        return hook

    for index, (name, module) in enumerate(attention):
        handles.append(module.register_forward_pre_hook(attention_pre_hook(index), with_kwargs=True))
        handles.append(_parent(model, name).register_forward_pre_hook(layer_pre_hook(index), with_kwargs=True))
        if fused:
            handles.append(module.c_attn.register_forward_hook(c_attn_hook(index)))
        else:
            handles.append(module.v_proj.register_forward_hook(v_hook(index, module)))

    if not fused:
        modeling = sys.modules[type(attention[0][1]).__module__]
        original = getattr(modeling, "apply_rotary_pos_emb", None)
        if original is None:
            raise ValueError(f"{modeling.__name__} has no apply_rotary_pos_emb: cannot see q/k around RoPE")

        def wrapped(q, k, *args, **kwargs):
            q_out, k_out = original(q, k, *args, **kwargs)
            layer = layers[state["layer"]]
            layer["q_unrotated"], layer["k_unrotated"] = _heads(q), _heads(k)
            layer["q"], layer["k"] = _heads(q_out), _heads(k_out)
            return q_out, k_out

        setattr(modeling, "apply_rotary_pos_emb", wrapped)
        patched.append((modeling, original))
    try:
        with torch.no_grad():
            logits = model(input_ids=input_ids).logits[0].detach().to("cpu").double().numpy()
    finally:
        for handle in handles:
            handle.remove()
        for modeling, original in patched:
            setattr(modeling, "apply_rotary_pos_emb", original)
    missing = [i for i, layer in enumerate(layers) if not {"q", "k", "v"} <= set(layer)]
    if missing:
        raise ValueError(f"layers {missing}: q/k/v were not captured (unsupported attention path)")
    return layers, logits, not fused


def mean_next_token_nll(logits, tokens):
    """Mean -log p(tokens[t+1] | ..t) in nats, from logits [T, vocab]."""
    logits = np.asarray(logits, dtype=np.float64)
    top = logits.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    t = np.arange(len(tokens) - 1)
    return float(np.mean(lse[:-1] - logits[t, np.asarray(tokens[1:])]))


def dump_activations(model, input_ids, path, source=None, storage="float32", rope_pairing="half"):
    """Capture every layer of model on input_ids and write the activation file; returns the NLL."""
    layers, logits, has_rope = capture(model, input_ids)
    tokens = input_ids[0].tolist()
    nll = mean_next_token_nll(logits, tokens)
    source = dict(source or {})
    source.update(kind="huggingface", architecture=type(model).__name__, tokens=len(tokens),
                  mean_next_token_nll=nll, computation=str(next(model.parameters()).dtype))
    write_activation_file(path, layers, tokens=tokens, rotated=has_rope,
                          rope_pairing=rope_pairing if has_rope else "none",
                          rope_theta=_rope_theta(model.config) if has_rope else 0.0,
                          source=source, storage=storage)
    return nll


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("--model", required=True, help="local folder or Hub id of a causal LM")
    parser.add_argument("--text", help="UTF-8 text file to tokenize with the model's tokenizer")
    parser.add_argument("--token-ids", help="file of whitespace-separated token ids instead of --text")
    parser.add_argument("--tokens", type=int, default=1024, help="number of tokens (default 1024)")
    parser.add_argument("-o", "--output", required=True, help="activation file to write")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"],
                        help="computation dtype (default float32)")
    parser.add_argument("--storage", default="float32", choices=list(STORAGE),
                        help="datasets' type in the file (default float32; float16 halves the "
                             "disk and refuses values beyond its range)")
    parser.add_argument("--device", default="cuda", help="torch device (default cuda)")
    args = parser.parse_args(argv)
    if (args.text is None) == (args.token_ids is None):
        parser.error("give exactly one of --text and --token-ids")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import transformers
    # transformers 5 renamed torch_dtype to dtype.
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(args.model, **{dtype_key: getattr(torch, args.dtype)})
    model.to(args.device).eval()
    if args.text is not None:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        with open(args.text, encoding="utf-8") as f:
            ids = tokenizer(f.read(), return_tensors="pt").input_ids[:, :args.tokens]
    else:
        with open(args.token_ids) as f:
            ids = torch.tensor([[int(x) for x in f.read().split()][:args.tokens]])
    nll = dump_activations(model, ids.to(args.device), args.output,
                           source={"model": args.model, "text": args.text or args.token_ids},
                           storage=args.storage)
    print(f"tokens {ids.shape[1]}  mean next-token NLL {nll:.5f} nats/token  -> {args.output}")


if __name__ == "__main__":
    main()
