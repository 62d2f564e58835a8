"""The bench's accelerator rows on a GPU host without the text stack (tensorflow, seqio):
`python launch/gpu_bench.py record|all|rows|profile|tune ...`, run from a checkout.
What it does and its arguments: encoderx/tools/speed/gpu_bench.py."""
import os
import sys


def _import_configs_from_checkout() -> None:
  """encoderx.configs as setup.py installs it, where encoderx runs from this checkout."""
  try:
    import encoderx.configs  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import configs  # pylint: disable=g-import-not-at-top
    sys.modules["encoderx.configs"] = configs


if __name__ == "__main__":
  _import_configs_from_checkout()
  from encoderx.tools.speed import gpu_bench  # pylint: disable=g-import-not-at-top
  gpu_bench.main()
