"""Export as a library (export/writer.py): `export_hf`, `export_npz`; and
(export/interchange.py) `export_sentence_transformers`, `export_cross_encoder`.

    from encoderx import export
    exported = export.export_hf("runs/tiny", "exported/tiny")   # writer.Exported

The command line is `python -m encoderx.export` (export/__main__.py).
"""
from encoderx.export.interchange import export_cross_encoder, export_sentence_transformers
from encoderx.export.writer import ExportError, Exported, export_hf, export_npz

__all__ = ["ExportError", "Exported", "export_cross_encoder", "export_hf", "export_npz",
           "export_sentence_transformers"]
