"""The one file layer: every path a run reads or writes (work directory, data files,
vocabulary, --init_from, export) goes through here, so that each may be a local path,
a `file://` URL or a `gs://` URL (any scheme tf.io.gfile knows).

    files.path("file:///data/x.txt")   # epath.Path('/data/x.txt'): file:// is local
    files.glob("gs://bucket/corpus/*.txt")
    files.local_copy("gs://bucket/hf-model")  # for libraries that open local files only
    files.write_atomically(path, data)

Built on etils.epath: local paths use the os module (the same errors, with strerror, as
before), remote ones tf.io.gfile. Orbax, TFDS and TensorBoard take remote paths
themselves; give them str(files.path(p)).
"""
from __future__ import annotations

import atexit
import io
import os
import re
import shutil
import tempfile
import urllib.parse

from etils import epath

from encoderx import errors

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_WILDCARD = re.compile(r"[*?[]")


def _text(p: str | os.PathLike) -> str:
  text = os.fspath(p)
  if text.startswith("file://"):  # file:///x and file://localhost/x are /x; not
    # urlparse, which takes a glob's ? for a query
    text = urllib.parse.unquote(text[len("file://"):].removeprefix("localhost"))
  return text


def is_remote(p: str | os.PathLike) -> bool:
  """Whether `p` is a URL other than file:// (an object store: gs://, s3://, ...)."""
  return bool(_URL.match(_text(p)))


def path(p: str | os.PathLike) -> epath.Path:
  """`p` as an epath.Path: a local one absolute with ~ expanded (file:// URLs too), a
  remote one as it is."""
  text = _text(p)
  if is_remote(text):
    return epath.Path(text)
  return epath.Path(os.path.abspath(os.path.expanduser(text)))


def optional(p: str) -> str | None:
  """An optional path field (TFDS's data_dir) for a library: None when empty."""
  return str(path(p)) if p else None


def exists(p: str | os.PathLike) -> bool:
  return path(p).exists()


def read_text(p: str | os.PathLike) -> str:
  return path(p).read_text(encoding="utf-8")


def open_text(p: str | os.PathLike, errors: str = "strict") -> io.TextIOWrapper:
  """A UTF-8 text file to read (epath's open() takes no `errors`)."""
  return io.TextIOWrapper(path(p).open("rb"), encoding="utf-8", errors=errors)


def read_bytes(p: str | os.PathLike) -> bytes:
  return path(p).read_bytes()


def glob(pattern: str) -> list[str]:
  """The sorted paths (as strings) of the files and directories matching `pattern`,
  whose wildcards may be in any part after the first (gs://bucket/*/x.txt)."""
  full = str(path(pattern))
  head = _URL.match(full).group() if is_remote(full) else ""
  parts = full[len(head):].split("/")
  fixed = next((i for i, part in enumerate(parts) if _WILDCARD.search(part)), len(parts))
  if fixed == len(parts):
    return [full] if path(full).exists() else []
  if fixed <= int(bool(head)):  # a wildcard in the bucket's name: nothing to list
    return []
  base = path(head + "/".join(parts[:fixed]) or "/")
  return sorted(str(m) for m in base.glob("/".join(parts[fixed:])))


_copies: dict[str, str] = {}  # remote path -> its local copy (removed at exit)


@atexit.register
def _remove_copies() -> None:
  for copy in _copies.values():
    shutil.rmtree(os.path.dirname(copy), ignore_errors=True)


def local_copy(p: str | os.PathLike) -> str:
  """A local path of `p`'s file or directory, for libraries that open local files only
  (sentencepiece, tokenizers, safetensors): a local `p` itself, a remote one copied to a
  temporary directory once (removed at exit)."""
  source = path(p)
  if not is_remote(source):
    return str(source)
  if str(source) not in _copies:
    target = os.path.join(tempfile.mkdtemp(prefix="encoderx-copy-"), source.name)
    copy(source, target)
    _copies[str(source)] = target
  return _copies[str(source)]


def copy(source: str | os.PathLike, target: str | os.PathLike) -> None:
  """Copies a file, or a directory and everything in it, between any two places."""
  source, target = path(source), path(target)
  if not source.is_dir():
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())
    return
  for directory, _, names in source.walk():
    into = target / directory.relative_to(source)
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
      (into / name).write_bytes((directory / name).read_bytes())


def write_atomically(p: str | os.PathLike, data: bytes | str) -> None:
  """Writes `data` to `p` so that no reader, and no crash, ever sees half of it: locally
  to a temporary file beside it, then renamed into place (a rename within a directory
  is atomic); an object store's write is atomic itself (an object appears when whole)."""
  target = path(p)
  target.parent.mkdir(parents=True, exist_ok=True)
  if isinstance(data, str):
    data = data.encode("utf-8")
  if is_remote(target):
    target.write_bytes(data)
    return
  descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}-")
  try:
    with os.fdopen(descriptor, "wb") as f:
      f.write(data)
    os.chmod(temporary, 0o644)
    os.replace(temporary, target)
  except BaseException:
    os.remove(temporary)  # a failed write leaves nothing behind
    raise


def resolve_patterns(patterns: str, field: str = "data.files") -> list[str]:
  """Comma-separated globs -> their files, sorted per glob; a ConfigError naming `field`
  if they are empty or one matches no file."""
  if not patterns.strip():
    errors.fail(field, "is empty.", "Give comma-separated paths or globs of text files.")
  matched_files = []
  for pattern in (p.strip() for p in patterns.split(",") if p.strip()):
    matched = [m for m in glob(pattern) if path(m).is_file()]
    if not matched:
      errors.fail(field, f"'{pattern}' matches no file.",
                  "Check the path (it is resolved from the current directory).")
    matched_files.extend(matched)
  return matched_files
