#!/usr/bin/env python3
"""Compares the kernels of GPU units between two trees: is each kernel's code unchanged?

The proof behind the GPU file splits and folds (gpu/NOTES.md "packed_kernels.cu split (session
20)", "select_packed.cu and sparse_chunked.cu split (session 19)", "decode_kernels.cu split
(session 18)"). Each unit gpu/src/UNIT.cu of both trees goes to PTX with the build's own nvcc
command (from BUILD/compile_commands.json, -c swapped for -ptx), then through ptxas -v. Reported:

- per kernel (.entry), IDENTICAL or DIFFERS after normalising what a move of source lines
  changes: labels, .loc/.file line info, comments, parameter and register numbering, the unit's
  anonymous-namespace hash;
- per kernel, ptxas -v's registers, shared memory, stack and spills;
- the PTX before its debug sections, .loc/.file dropped and the unit hashes replaced: byte-identical
  or not (the strongest check: entry order and module-level declarations too).

Usage (repository root, a configured build folder):
  scripts/ptx_compare.py BEFORE AFTER UNIT [UNIT ...] [--build build]
BEFORE and AFTER are folders (a tree's root) or git revisions (read with git archive), e.g.
  scripts/ptx_compare.py main . packed_kernels decode_kernels
Exits 0 when every kernel and every code part is identical, 1 otherwise.
"""
import argparse
import difflib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile


def tree_root(spec, scratch):
    """A folder as given, or a git revision unpacked into scratch."""
    if os.path.isdir(spec):
        return os.path.abspath(spec)
    out = os.path.join(scratch, re.sub(r"\W", "_", spec))
    os.makedirs(out)
    archive = subprocess.run(["git", "archive", spec], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    return out


def ptx_command(build, unit):
    """The build's nvcc command for gpu/src/UNIT.cu, its source root, with -c swapped for -ptx."""
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    for e in entries:
        if e["file"].endswith(f"/gpu/src/{unit}.cu"):
            args = shlex.split(e["command"])
            root = e["file"][: -len(f"/gpu/src/{unit}.cu")]
            break
    else:
        sys.exit(f"ptx_compare: gpu/src/{unit}.cu is not in {build}/compile_commands.json")
    args = [a for a in args if not a.endswith("ccache")]
    keep, skip = [], 0
    for a in args:
        if skip:
            skip -= 1
        elif a in ("-MT", "-MF", "-o"):
            skip = 1
        elif a in ("-MD", "-c"):
            pass
        else:
            keep.append(a)
    return keep, root


def compile_unit(command, build_root, root, unit, out_dir):
    """PTX and ptxas -v of gpu/src/UNIT.cu of root; returns (ptx path, ptxas -v text)."""
    args = [a.replace(build_root, root) for a in command]
    ptx = os.path.join(out_dir, f"{unit}.ptx")
    subprocess.run(args + ["-ptx", "-o", ptx], check=True)
    arch = re.search(r"code=\[?[\w,]*?(sm_\w+)", " ".join(args))
    ptxas = os.path.join(os.path.dirname(args[0]), "ptxas")
    res = subprocess.run([ptxas, f"-arch={arch.group(1) if arch else 'sm_90a'}", "-O3", "-v",
                          "-warn-spills", ptx, "-o", os.devnull],
                         capture_output=True, text=True, check=True)
    return ptx, res.stdout + res.stderr


def unit_hashes(text):
    text = re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__H_", text)
    return re.sub(r"_INTERNAL_[0-9a-f]+_", "_INTERNAL_H_", text)


def entry_bodies(ptx_text):
    """Each .entry's body (to the next entry or the debug sections), normalised."""
    debug = ptx_text.find(".section\t.debug")
    debug = debug if debug >= 0 else len(ptx_text)
    starts = list(re.finditer(r"\.entry (\S+)\(", ptx_text))
    out = {}
    for k, m in enumerate(starts):
        name = m.group(1)
        body = ptx_text[m.start(): starts[k + 1].start() if k + 1 < len(starts) else debug]
        body = re.sub(r"\$L__\w+", "$L", body)
        body = re.sub(r"^\s*(\.loc|\.file|//).*$", "", body, flags=re.M)
        body = re.sub(r"_param_\d+", "_param", body).replace(name, "NAME")
        body = re.sub(r"_Z\w+", "SYM", unit_hashes(body))
        body = re.sub(r"\.reg \.\S+\s+%\w+<\d+>;", "", body)
        seen = {}
        body = re.sub(r"%(?:rd|r|f|fd|p|rs|h|hh)\d+",
                      lambda r: seen.setdefault(r.group(0), f"%v{len(seen)}"), body)
        out[unit_hashes(name)] = (name, [line.strip() for line in body.split("\n") if line.strip()])
    return out


def code_part(ptx_text):
    debug = ptx_text.find(".section\t.debug")
    text = ptx_text[: debug if debug >= 0 else len(ptx_text)]
    return unit_hashes(re.sub(r"^\s*\.(loc|file)\b.*\n", "", text, flags=re.M))


def resources(ptxas_text):
    """ptxas -v per kernel: 'R regs, S smem, stack, spill stores/loads'."""
    out, cur = {}, None
    for line in ptxas_text.split("\n"):
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = unit_hashes(m.group(1))
            out[cur] = {}
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            out[cur]["stack"] = "stack {}, spill {}/{}".format(*m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            smem = re.search(r"(\d+) bytes smem", line)
            out[cur]["regs"] = f"{m.group(1)} regs, {smem.group(1) if smem else 0} smem"
    return {k: f"{v.get('regs')}, {v.get('stack')}" for k, v in out.items()}


def demangled(names):
    text = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return [n.replace("hils::gpu::detail::(anonymous namespace)::", "") for n in text.split("\n")]


def compare_unit(unit, before, after):
    """Prints the unit's comparison; returns True when everything is identical."""
    (ptx_a, res_a), (ptx_b, res_b) = before, after
    text_a, text_b = open(ptx_a).read(), open(ptx_b).read()
    a, b = entry_bodies(text_a), entry_bodies(text_b)
    ra, rb = resources(res_a), resources(res_b)
    names = sorted(set(a) | set(b))
    shown_names = demangled([(b.get(n) or a.get(n))[0] for n in names])
    a = {k: v[1] for k, v in a.items()}
    b = {k: v[1] for k, v in b.items()}
    ok = True
    counts = {"IDENTICAL": 0, "DIFFERS": 0, "only one side": 0, "resources differ": 0}
    for name, shown in sorted(zip(names, shown_names), key=lambda x: x[1]):
        if name not in a or name not in b:
            print(f"  ONLY {'AFTER' if name in b else 'BEFORE'} {shown}")
            counts["only one side"] += 1
            ok = False
            continue
        same = a[name] == b[name]
        counts["IDENTICAL" if same else "DIFFERS"] += 1
        detail = ""
        if not same:
            changed = [d for d in difflib.unified_diff(a[name], b[name], lineterm="", n=0)
                       if d[:1] in "+-" and d[:3] not in ("+++", "---")]
            detail = f" ({len(a[name])} -> {len(b[name])} lines, {len(changed)} differing)"
        if ra.get(name) != rb.get(name):
            counts["resources differ"] += 1
            detail += f" [ptxas: {ra.get(name)} -> {rb.get(name)}]"
        ok = ok and same and ra.get(name) == rb.get(name)
        print(f"  {'IDENTICAL' if same else 'DIFFERS  '} {shown}{detail}")
    part_a, part_b = code_part(text_a), code_part(text_b)
    lines = sum(len(v) for v in b.values())
    print(f"{unit}: {len(a)} / {len(b)} kernels, {counts}, {lines} normalised lines after; "
          f"code part {part_a.count(chr(10))} / {part_b.count(chr(10))} lines, "
          f"{'BYTE-IDENTICAL' if part_a == part_b else 'DIFFERENT'}")
    return ok and part_a == part_b


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("units", nargs="+", help="gpu/src/UNIT.cu names, e.g. packed_kernels")
    parser.add_argument("--build", default="build", help="a configured build folder (its nvcc commands)")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as scratch:
        roots = [tree_root(args.before, scratch), tree_root(args.after, scratch)]
        for unit in args.units:
            command, build_root = ptx_command(args.build, unit)
            sides = []
            for k, root in enumerate(roots):
                out_dir = os.path.join(scratch, f"{unit}_{k}")
                os.makedirs(out_dir)
                sides.append(compile_unit(command, build_root, root, unit, out_dir))
            ok = compare_unit(unit, *sides) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
