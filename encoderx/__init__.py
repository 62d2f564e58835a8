"""encoderx: pretrain, fine-tune and export the BERT family of encoders in JAX/Flax."""

__version__ = "0.1.0"
