"""encoderx: pretrain, fine-tune and export encoders in JAX/Flax."""
import sys

from encoderx import moved

__version__ = "0.1.0"

# First: an old module left elsewhere on the path (an editable install of another
# checkout, a stale copy) must not answer an old name instead.
if not any(isinstance(finder, moved.MovedModules) for finder in sys.meta_path):
  sys.meta_path.insert(0, moved.MovedModules())
