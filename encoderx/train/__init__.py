"""The training loop as a library (train/loop.py): `run`, `evaluate`, `predict`.

    from encoderx import train
    result = train.run(config, workdir)   # {'history', 'eval', 'step', 'stopped', ...}

The command line is `python -m encoderx.train` (train/__main__.py). What a run is made of
and its jitted step functions are the trainer's (train/trainer.py: `Trainer`, `Phase`).
"""
from encoderx.train.loop import evaluate, predict, run

__all__ = ["evaluate", "predict", "run"]
