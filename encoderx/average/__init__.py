"""Checkpoint averaging as a library (average/averaging.py): `average`.

    from encoderx import average
    written, checkpoints = average.average(["runs/a"], "runs/a_last4", last=4)

The command line is `python -m encoderx.average` (average/__main__.py).
"""
from encoderx.average.averaging import (AverageError, average, chosen_checkpoints,
                                        mean_weights)

__all__ = ["AverageError", "average", "chosen_checkpoints", "mean_weights"]
