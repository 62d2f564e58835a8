"""Writing a file so that no reader, and no crash, ever sees half of it."""
from __future__ import annotations

import os
import tempfile


def write_atomically(path: str, data: bytes | str) -> None:
  """Writes `data` to a temporary file beside `path`, then renames it into place (a
  rename within a directory is atomic): `path` holds the old content or the new."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  if isinstance(data, str):
    data = data.encode("utf-8")
  with tempfile.NamedTemporaryFile(dir=directory, delete=False) as f:
    f.write(data)
  os.chmod(f.name, 0o644)
  os.replace(f.name, path)
