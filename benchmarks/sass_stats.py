"""Offline SASS statistics of the attention kernels: no GPU needed, only Triton's bundled ptxas and cuobjdump.

  python benchmarks/sass_stats.py [--seq 4096 --heads 16 --head-dim 128] [--causal] [--p-scale row]
      [--qkv-scale tensor] [--segments] [--window 1024] [--fwd-config block_m=64,num_warps=8] [--bwd-config ...]
      [--arch 90] [--sass-dir DIR] [--json out.json] [--int-divisibility]

Builds the launch plans of one forward and one backward (``jqat.ffi.plan``: the exact kernels, constexprs and
launch configurations the bindings run), compiles each launch for ``sm_<arch>`` as jax-triton does (pointers
16-byte aligned, a scalar argument equal to 1 specialized to a constant), and prints per kernel: registers,
stack bytes (spills), shared memory, the number of SASS instructions and the instruction mix of each loop
(a backward branch's body; the KV-tile and query-tile loops are the large ones), with the counts of local
loads/stores (spills), MUFU, HGMMA and WARPGROUP (wgmma arrive/wait) instructions. Static counts: per thread,
per loop iteration; they say what the compiler emitted, not how fast it runs (docs/PERFORMANCE.md, section 3).

Each kernel's line also names any "Potential Performance Loss" that ptxas reports for it (``ptxas -v`` on its
PTX), such as wgmma serialized after every instruction (the windowed forward and dQ once were: 18% of the
window's dQ time on the H200), which the loop counts show only as many WARPGROUP instructions.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from jqat.ffi import plan as P
from jqat.ffi.options import AttentionOptions

_POINTER = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32", "int32": "*i32", "int64": "*i64",
            "int8": "*i8", "uint8": "*u8"}
_INSTR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_KEY_OPS = ("LDL", "STL", "MUFU", "HGMMA", "WARPGROUP", "FMUL", "FFMA", "FSEL", "FSETP", "FMNMX", "LOP3", "SHF", "SEL")


def _bin(name: str) -> str:
  return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_launch(plan: P.Plan, launch: P.Launch, arch: int, int_divisibility: bool = False):
  """The compiled kernel of ``launch`` for ``sm_<arch>``, specialized as jax-triton specializes it.

  int_divisibility: also mark integer arguments divisible by 16 as such, as Triton's own launcher (the torch
  binding) does; jax-triton 0.3.1 does not."""
  fn = launch.kernel
  names = fn.arg_names
  params = [n for n in names if n not in launch.constexprs]
  values = list(launch.args) + [P.Ref(o) for o in launch.outputs]
  if len(params) != len(values):
    raise ValueError(f"{launch.name}: {len(params)} kernel parameters, {len(values)} plan arguments")
  signature, constants, attrs = {}, {}, {}
  for name, value in zip(params, values):
    if isinstance(value, P.Ref):
      signature[name] = _POINTER[plan.buffers[value.name].dtype]
      attrs[(names.index(name),)] = [["tt.divisibility", 16]]
    elif isinstance(value, float):
      signature[name] = "fp32"
    elif value == 1:  # jax-triton turns a scalar 1 into a constant
      signature[name], constants[name] = "constexpr", 1
    else:
      signature[name] = "i32"
      if int_divisibility and value % 16 == 0:
        attrs[(names.index(name),)] = [["tt.divisibility", 16]]
  for name, value in launch.constexprs.items():
    signature[name], constants[name] = "constexpr", value
  source = ASTSource
  if getattr(fn, "is_gluon", lambda: False)():  # the Gluon decode kernel
    from triton.experimental.gluon._runtime import GluonASTSource as source  # noqa: PLC0415, N813
  return triton.compile(source(fn, signature, constants, attrs), target=GPUTarget("cuda", arch, 32),
                        options=launch.options())


def ptxas_warnings(kernel, arch: int) -> list[str]:
  """The "Potential Performance Loss" notes of the bundled ptxas (``-v``) on a compiled kernel's PTX."""
  with tempfile.TemporaryDirectory() as tmp:
    ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
    with open(ptx, "w") as f:
      f.write(kernel.asm["ptx"])
    suffix = "a" if arch >= 90 else ""  # wgmma needs the arch-specific target (sm_90a), as Triton compiles it
    log = subprocess.run([_bin("ptxas"), "-v", "--gpu-name", f"sm_{arch}{suffix}", ptx, "-o", cubin],
                         capture_output=True, text=True, check=True).stderr
  return [re.sub(r" in the function '.*'$", "", line.split("Potential Performance Loss: ", 1)[1])
          for line in log.splitlines() if "Potential Performance Loss" in line]


def _opcode(text: str) -> str:
  text = re.sub(r"^@!?U?P\w+\s+", "", text)  # predicate guard
  return text.split()[0].split(".")[0]


def sass_stats(kernel) -> dict:
  """Registers, stack, shared memory, instruction count and the mix of every loop of a compiled kernel."""
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "k.cubin")
    with open(path, "wb") as f:
      f.write(kernel.asm["cubin"])
    usage = subprocess.run([_bin("cuobjdump"), "-res-usage", path], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([_bin("cuobjdump"), "-sass", path], capture_output=True, text=True, check=True).stdout
  res = re.search(r"REG:(\d+).*?STACK:(\d+)", usage, re.S)
  instrs = [(int(m.group(1), 16), m.group(2)) for m in map(_INSTR.match, sass.splitlines()) if m]
  loops = []
  for addr, text in instrs:
    target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
    if target and int(target.group(1), 16) < addr:
      body = collections.Counter(_opcode(t) for a, t in instrs if int(target.group(1), 16) <= a <= addr)
      loops.append({"start": hex(int(target.group(1), 16)), "end": hex(addr), "instructions": sum(body.values()),
                    "mix": {op: body[op] for op in _KEY_OPS if body[op]}})
  total = collections.Counter(_opcode(t) for _, t in instrs)
  return {"registers": int(res.group(1)), "stack_bytes": int(res.group(2)), "shared_bytes": kernel.metadata.shared,
          "instructions": len(instrs), "mix": {op: total[op] for op in _KEY_OPS if total[op]},
          "loops": [loop for loop in loops if loop["instructions"] >= 100], "sass": sass}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--seq", type=int, default=4096)
  ap.add_argument("--heads", type=int, default=16)
  ap.add_argument("--kv-heads", type=int, default=None)
  ap.add_argument("--head-dim", type=int, default=128)
  ap.add_argument("--causal", action="store_true")
  ap.add_argument("--p-scale", default="block", choices=("block", "row"))
  ap.add_argument("--qkv-scale", default="block", choices=("block", "tensor"))
  ap.add_argument("--segments", action="store_true", help="with q_segment_ids / kv_segment_ids (packed documents)")
  ap.add_argument("--window", type=int, default=0, help="W > 0: local_window_size=(W - 1, 0), as benchmarks/masks.py")
  ap.add_argument("--fwd-config", default="", help='"field=int,...", as JQAT_ATTN_FWD_CONFIG')
  ap.add_argument("--bwd-config", default="", help='"field=int,...", as JQAT_ATTN_BWD_CONFIG')
  ap.add_argument("--arch", type=int, default=90, help="compute capability as an integer (90 = H100/H200)")
  ap.add_argument("--kernels", default="fwd,bwd",
                  help="which plans: fwd, fwd_out (O alone, the primal of jqat.attention), bwd, rope, decode "
                       "(comma-separated; decode: one new token per sequence over a --seq cache of --batch sequences)")
  ap.add_argument("--int-divisibility", action="store_true",
                  help="mark integer arguments divisible by 16 as Triton's launcher (torch) does; jax-triton does not")
  ap.add_argument("--sass-dir", default=None, help="also write each kernel's SASS there")
  ap.add_argument("--json", default=None)
  args = ap.parse_args(argv)
  kh = args.kv_heads or args.heads
  q = P.Tensor.dense((args.batch, args.seq, args.heads, args.head_dim), "bfloat16")
  k = P.Tensor.dense((args.batch, args.seq, kh, args.head_dim), "bfloat16")
  stats = P.Tensor.dense((args.batch, args.heads, args.seq), "float32")
  opts = AttentionOptions(scale=args.head_dim ** -0.5, is_causal=args.causal, p_scale=args.p_scale,
                          qkv_scale=args.qkv_scale, local_window_size=(args.window - 1, 0) if args.window else None)
  target = P.Target((args.arch // 10, args.arch % 10))
  override = P.parse_config(args.fwd_config, "fwd")
  fwd_cfg, out_cfg = (P.kfwd.ForwardConfig(**{**vars(P.forward_config(args.head_dim, residuals)), **override})
                      for residuals in (True, False))
  bwd_cfg = P.kbwd.BackwardConfig(**{**vars(P.backward_config(args.head_dim, bool(args.window))),
                                     **P.parse_config(args.bwd_config, "bwd")})
  seg = P.Tensor.dense((args.batch, args.seq), "int32")
  masks = (None, None, seg, seg) if args.segments else P.NO_MASKS
  plans = []
  kinds = args.kernels.split(",")
  if "fwd" in kinds:
    plans.append(P.attention_forward(q, k, k, opts, target, config=fwd_cfg, masks=masks))
  if "fwd_out" in kinds:
    plans.append(P.attention_forward(q, k, k, opts, target, config=out_cfg, masks=masks, residuals=False))
  if "bwd" in kinds:
    plans.append(P.attention_backward(q, q, k, k, q, stats, opts, target, config=bwd_cfg, masks=masks,
                                      row_max=stats if args.p_scale == "row" else None,
                                      q_hat_over_out=True))  # as the JAX binding plans it
  if "decode" in kinds:
    from jqat.ffi.options import DecodeOptions, default_num_splits  # noqa: PLC0415

    d = args.head_dim
    cache = lambda w: P.Tensor.dense((args.batch, args.seq, kh, w), "uint8")
    plans.append(P.decode_attention(
        P.Tensor.dense((args.batch, 1, args.heads, d), "bfloat16"), cache(d // 2), cache(d // 16), cache(d // 2),
        cache(d // 16), P.Tensor.dense((args.batch,), "int32"),
        DecodeOptions(scale=d ** -0.5, num_splits=default_num_splits(args.batch, kh, args.seq, 64)), target))
  report = {"args": vars(args), "kernels": {}}
  for plan in plans:
    for launch in plan.launches:
      if "attention" not in launch.name and "decode_split" not in launch.name:
        continue
      # The forward of fwd_out has the training forward's launch name: keyed apart.
      name = launch.name + ("_out" if launch.name in report["kernels"] else "")
      kernel = compile_launch(plan, launch, args.arch, args.int_divisibility)
      s = sass_stats(kernel)
      s["ptxas_warnings"] = ptxas_warnings(kernel, args.arch)
      if args.sass_dir:
        os.makedirs(args.sass_dir, exist_ok=True)
        with open(os.path.join(args.sass_dir, name + ".sass"), "w") as f:
          f.write(s["sass"])
      del s["sass"]
      report["kernels"][name] = {**s, "num_warps": launch.num_warps, "num_stages": launch.num_stages}
      print(f"{name}: {s['registers']} registers, {s['stack_bytes']} B stack, {s['shared_bytes']} B shared, "
            f"{s['instructions']} instructions, {launch.num_warps} warps, {launch.num_stages} stages; {s['mix']}"
            + "".join(f"\n  ptxas: {w}" for w in s["ptxas_warnings"]))
      for loop in s["loops"]:
        print(f"  loop {loop['start']}-{loop['end']}: {loop['instructions']} instructions/iteration {loop['mix']}")
  if "rope" in kinds:
    report["kernels"].update(rope_stats(args.arch))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1)
  return report


def rope_stats(arch: int) -> dict:
  """Registers and SASS instructions per element of x of the in-place RoPE + QDQ kernel, per mode of
  docs/NUMERICS.md, section 9.2 (1M rows, a 65,536-row cache, one position per row). No loop: each program handles
  one tile."""
  from jqat._src.rope_qdq_reference import MODES  # noqa: PLC0415

  out = {}
  for (quant, group, scale_format), mode in MODES.items():
    name, width, rows = f"{quant}/{group}/{scale_format}", mode.width, 1 << 20
    plan = P.rope_qdq(P.Tensor.dense((rows, width), "bfloat16"), P.Tensor.dense((65536, 64), "float32"),
                      P.Tensor.dense((rows,), "int32"), P.Target((arch // 10, arch % 10)), heads=1, group=group,
                      fp8=mode.fp8, e4m3_scale=mode.e4m3_scale, amax_floor=mode.floor)
    launch = plan.launches[0]
    s = sass_stats(compile_launch(plan, launch, arch))
    del s["sass"]
    per_elem = s["instructions"] * 32 * launch.num_warps / (launch.constexprs["BLOCK_R"] * width)
    out[f"rope_qdq {name}"] = {**s, "instructions_per_element": per_elem, "num_warps": launch.num_warps}
    print(f"rope_qdq {name} (width {width}): {s['registers']} registers, {s['instructions']} instructions per "
          f"thread = {per_elem:.1f} per element of x; {s['mix']}")
  return out


if __name__ == "__main__":
  main()
