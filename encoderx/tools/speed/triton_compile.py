"""Compiles encoderx's Pallas attention kernels to GPU code on a machine without a GPU.

    source launch/setup.sh hf,test   # installs triton 3.9.0 into .venv/triton
    python launch/triton_check.py [--arch=90] [--length=512] [--heads=16] [--head_dim=64]
                                  [--kv_heads=4] [--window=128]   # this module

jax lowers `encoderx.models.flash_attention` for CUDA (`jax.export`, platform "cuda":
no GPU needed) and hands XLA each kernel as Triton IR; XLA compiles that IR only on a
GPU. This script takes the IR as jax builds it (it wraps jax's internal
`lower_jaxpr_to_triton_module`: a developer's tool, tied to jax 0.10's layout) and
compiles it with the `triton` package for the given compute capability (90: H100/H200),
through Triton's own passes, PTX and ptxas, then prints each kernel's registers, spills
and shared memory (cuobjdump). The `triton` package is not jax's bundled Triton, so
this shows the kernels compile and fit, not that XLA's build will make the same code.
triton is kept out of the environment (in .venv/triton): tensorflow and triton in one process
abort, their LLVMs registering the same options, and torch imports triton wherever it
finds it. This module imports neither tensorflow nor torch.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile

import jax
import jax.numpy as jnp
from jax import export
from jax._src.pallas.triton import pallas_call_registration

from encoderx.models import flash_attention

def triton_modules(batch: int, length: int, heads: int, head_dim: int,
                   kv_heads: int = 0, window: int = 0) -> dict[str, str]:
  """The Triton IR of the forward and backward kernels (bf16 heads, dropout 0.1; key and
  value with `kv_heads` heads, all when 0; a local `window`, none when 0), by kernel
  name."""
  captured = {}
  lower = pallas_call_registration.lowering.lower_jaxpr_to_triton_module

  def capturing(*args, **kwargs):
    result = lower(*args, **kwargs)
    asm = result.module.operation.get_asm(enable_debug_info=False)
    captured[asm.split("@", 1)[1].split(" ", 1)[0]] = asm
    return result

  shape = jax.ShapeDtypeStruct((batch, length, heads, head_dim), jnp.bfloat16)
  kv_shape = jax.ShapeDtypeStruct((batch, length, kv_heads or heads, head_dim),
                                  jnp.bfloat16)
  segments = jax.ShapeDtypeStruct((batch, length), jnp.int32)

  def loss(q, k, v, segment_ids):
    out = flash_attention.flash_attention(q, k, v, segment_ids, 0.1, jax.random.key(0),
                                          window=window)
    return out.astype(jnp.float32).sum()

  pallas_call_registration.lowering.lower_jaxpr_to_triton_module = capturing
  try:
    export.export(
        jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(shape, kv_shape, kv_shape, segments)
  finally:
    pallas_call_registration.lowering.lower_jaxpr_to_triton_module = lower
  return captured


def compile_and_report(name: str, ir: str, arch: int, warps: int, stages: int) -> None:
  # Triton 3.9 warns unless told: keep its default, fusing multiply-adds, as XLA's does.
  os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
  try:
    import triton  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise SystemExit("triton is not importable: run `source launch/setup.sh hf,test`, "
                     "which installs it into .venv/triton, then `python "
                     "launch/triton_check.py`, which finds it there.") from None
  from triton.backends.compiler import GPUTarget  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as directory:
    path = os.path.join(directory, f"{name}.ttir")
    with open(path, "w") as f:
      f.write(ir)
    kernel = triton.compile(path, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": warps, "num_stages": stages})
    cubin = os.path.join(directory, f"{name}.cubin")
    with open(cubin, "wb") as f:
      f.write(kernel.asm["cubin"])
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage",
                            cubin], capture_output=True, text=True, check=True).stdout
  line = next(l.strip() for l in usage.splitlines() if l.strip().startswith("REG:"))
  print(f"{name}: compiled for sm_{arch} ({len(kernel.asm['cubin']):,} bytes of cubin); "
        f"{line.split(' TEXTURE')[0]}; Triton shared memory {kernel.metadata.shared:,} "
        "bytes", flush=True)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--arch", type=int, default=90, help="compute capability x 10")
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--length", type=int, default=512)
  parser.add_argument("--heads", type=int, default=16)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--kv_heads", type=int, default=0, help="0: as many as --heads")
  parser.add_argument("--window", type=int, default=0, help="local window; 0: global")
  args = parser.parse_args(argv)
  modules = triton_modules(args.batch, args.length, args.heads, args.head_dim,
                           args.kv_heads, args.window)
  tiling = flash_attention.default_tiling(args.head_dim)  # what flash_attention asks
  for name, ir in sorted(modules.items(), reverse=True):  # forward first
    if "backward" in name:
      warps, stages = tiling.backward_warps, tiling.backward_stages
    else:
      warps, stages = tiling.forward_warps, tiling.forward_stages
    compile_and_report(name, ir, args.arch, warps, stages)


if __name__ == "__main__":
  main()
