"""The GLUE sweep as a library (glue/sweep.py): `sweep`, and the recipe it runs
(`config_section`, configs/glue.py).

    from encoderx import glue
    result = glue.sweep("hf:DIR", "runs/glue", glue.config_section(), data_dir="GLUE_DIR")

The command line is `python -m encoderx.glue` (glue/__main__.py).
"""
from encoderx.glue.sweep import (RESULT_FILE, SWEEP_FILE, GlueError, Run, config_section,
                                 grid, plan, prepare_data, run_config, sweep, validate)

__all__ = ["RESULT_FILE", "SWEEP_FILE", "GlueError", "Run", "config_section", "grid",
           "plan", "prepare_data", "run_config", "sweep", "validate"]
