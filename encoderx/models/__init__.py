"""models: embeddings, attention variants, the encoder stack, heads.

Importing the package registers every attention variant in attention.VARIANTS.
"""
from encoderx.models import disentangled  # noqa: F401  (model.attention.variant="disentangled")
# model.attention.variant="two_stream_relative" (XLNet)
from encoderx.models import two_stream_attention  # noqa: F401,E402
