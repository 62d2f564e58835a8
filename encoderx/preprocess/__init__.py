"""Offline preprocessing as a library (preprocess/writer.py): `run`, and its parts for a
cluster runner (`plan`, `write_unit`, `write_manifest`).

    from encoderx import preprocess
    manifest = preprocess.run(config, "DIR", copies=1)

The command line is `python -m encoderx.preprocess` (preprocess/__main__.py).
"""
from encoderx.preprocess.writer import (PLAN, Unit, plan, record_features, run,
                                        source_config, source_task, write_manifest,
                                        write_unit)

__all__ = ["PLAN", "Unit", "plan", "record_features", "run", "source_config",
           "source_task", "write_manifest", "write_unit"]
