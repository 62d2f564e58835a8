"""encoderx: pretrain, fine-tune and export encoders in JAX/Flax."""
import sys

from encoderx import moved

__version__ = "0.1.0"

if not any(isinstance(finder, moved.MovedModules) for finder in sys.meta_path):
  sys.meta_path.append(moved.MovedModules())
