"""The training loop as a library (train/loop.py): `run`, `evaluate`, `predict`.

    from encoderx import train
    result = train.run(config, workdir)   # {'history', 'eval', 'step', 'stopped', ...}

The command line is `python -m encoderx.train` (train/__main__.py). What a run is made of
and its jitted step functions are the trainer's (train/trainer.py: `Trainer`, `Phase`).
The loop is imported on first use: `encoderx.train.trainer` alone needs no input pipeline
(tensorflow, seqio), which the GPU bench runs without (tools/speed/gpu_bench.py).
"""
__all__ = ["evaluate", "predict", "run"]


def __getattr__(name: str):
  if name in __all__:
    from encoderx.train import loop  # pylint: disable=g-import-not-at-top
    return getattr(loop, name)
  raise AttributeError(f"module 'encoderx.train' has no attribute {name!r}")
