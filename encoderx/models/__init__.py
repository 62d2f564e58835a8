"""models: embeddings, attention variants, the encoder stack, heads.

Importing the package registers every attention variant in attention.VARIANTS.
"""
from encoderx.models import disentangled  # noqa: F401  (model.attention="disentangled")
