"""Compiles encoderx's Pallas attention kernels to GPU code on a machine without a GPU,
with the `triton` package that launch/setup.sh installs apart, into .venv/triton:
`python launch/triton_check.py [--arch=90] ...`. What it does and its arguments:
encoderx/tools/speed/triton_compile.py."""
import pathlib
import sys

TRITON_SITE = pathlib.Path(__file__).resolve().parents[1] / ".venv" / "triton"

if __name__ == "__main__":
  if not (TRITON_SITE / "triton").is_dir():
    sys.exit(f"triton is not in {TRITON_SITE}: run `source launch/setup.sh hf,test`, which "
             "installs it there.")
  sys.path.append(str(TRITON_SITE))  # after the environment's: triton alone comes from it
  from encoderx.tools.speed import triton_compile  # pylint: disable=g-import-not-at-top
  triton_compile.main()
