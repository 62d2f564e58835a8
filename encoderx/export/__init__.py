"""Export as a library (export/writer.py): `export_hf`, `export_npz`.

    from encoderx import export
    exported = export.export_hf("runs/tiny", "exported/tiny")   # writer.Exported

The command line is `python -m encoderx.export` (export/__main__.py).
"""
from encoderx.export.writer import ExportError, Exported, export_hf, export_npz

__all__ = ["ExportError", "Exported", "export_hf", "export_npz"]
