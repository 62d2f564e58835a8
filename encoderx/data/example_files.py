"""Preprocessed examples: the files `python -m encoderx.preprocess` writes, their manifest,
and the seqio DataSource a run reads them through.

    DIR/manifest.json                                       what, how many, from what
    DIR/<split>-len<L>-copy<c>-<shard>-of-<shards>.array_record   one per input shard

A record is one example: its features' little-endian arrays, concatenated in the
manifest's feature order (shapes and dtypes in the manifest), so reading one is a
`numpy.frombuffer`. Files are ArrayRecord rather than TFRecord because ArrayRecord reads
a record by its index: a stream resumes inside a file by seeking to its example, where a
TFRecord file must be read from its start (or from a byte offset kept beside the index),
and each file's example count is in the file. Copy c holds the examples that epoch c of
streaming the text would build (pairs and packing drawn with that epoch's seeds); epoch
e of a run reads copy e % copies (BERT's dupe_factor).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Iterator

import numpy as np
import seqio
import tensorflow as tf
from array_record.python import array_record_module

from encoderx import errors
from encoderx import files as files_lib
from encoderx.data import bpe_vocabulary, resources, shard_stream

MANIFEST = "manifest.json"
FORMAT = "encoderx-examples-1"
# Records per compressed chunk: small enough that opening a file at an example decodes
# little, large enough to compress the padding.
WRITER_OPTIONS = "group_size:64"
READ_CHUNK = 256  # records read at once when streaming a file


class ManifestError(errors.ConfigError):
  """Preprocessed data that is missing, damaged or made for another config."""


# --- what decides the examples ------------------------------------------------------------
def _vocabulary_files(vocab_config) -> list[str]:
  path = resources.resolve(vocab_config.path)
  if vocab_config.kind == "byte_bpe":
    return bpe_vocabulary.vocabulary_files(path)
  return [path]


def vocabulary_fingerprint(vocab_config) -> dict:
  """The vocabulary as the examples depend on it: its kind, text options and the sha256 of
  its files (their content, not their path)."""
  digest = hashlib.sha256()
  for path in _vocabulary_files(vocab_config):
    digest.update(files_lib.read_bytes(path))
  return {"vocabulary_kind": vocab_config.kind, "vocabulary_sha256": digest.hexdigest(),
          "vocabulary_lower_case": bool(vocab_config.lower_case),
          "vocabulary_strip_accents": bool(vocab_config.strip_accents)}


def sequence_lengths(config) -> list[int]:
  """Every length the config trains at (encoderx/train/trainer.py: phases)."""
  train = config.train
  return sorted({config.data.seq_length} | (
      {train.long_seq_length} if train.long_fraction else set()))


def examples_description(config, options: dict) -> dict:
  """What a run must agree on with a manifest: the builder and its `options`
  (tasks.examples_options: e.g. the sentence objective that labels pairs, XLNet's rows
  per process), the vocabulary."""
  return {**options, **vocabulary_fingerprint(config.data.vocab)}


# --- records -------------------------------------------------------------------------------
def feature_spec(element_spec: dict) -> dict:
  """{name: {'shape', 'dtype'}} of a dataset's examples (tf.TensorSpecs)."""
  return {name: {"shape": [int(d) for d in spec.shape], "dtype": spec.dtype.name}
          for name, spec in element_spec.items()}


def encode(example: dict, features: dict) -> bytes:
  return b"".join(np.ascontiguousarray(example[name], spec["dtype"]).tobytes()
                  for name, spec in features.items())


def decode(record: bytes, features: dict) -> dict[str, np.ndarray]:
  example, offset = {}, 0
  for name, spec in features.items():
    dtype = np.dtype(spec["dtype"])
    count = int(np.prod(spec["shape"], dtype=np.int64))
    example[name] = np.frombuffer(record, dtype, count, offset).reshape(spec["shape"])
    offset += count * dtype.itemsize
  return example


def shard_file(split: str, seq_length: int, copy: int, shard: int, shards: int) -> str:
  return f"{split}-len{seq_length}-copy{copy}-{shard:05d}-of-{shards:05d}.array_record"


def write_records(path: str, examples) -> int:
  """Writes `examples` (encoded records) to `path` (complete or absent: a temporary file
  renamed at the end); returns their number."""
  partial = path + ".partial"
  writer = array_record_module.ArrayRecordWriter(partial, WRITER_OPTIONS)
  count = 0
  try:
    for record in examples:
      writer.write(record)
      count += 1
  finally:
    writer.close()
  os.replace(partial, path)
  return count


def count_records(path: str) -> int:
  reader = array_record_module.ArrayRecordReader(path)
  try:
    return reader.num_records()
  finally:
    reader.close()


def read_records(path: str, features: dict, start: int = 0
                 ) -> Iterator[dict[str, np.ndarray]]:
  """The examples of one file from the `start`-th on (a seek, not a scan)."""
  reader = array_record_module.ArrayRecordReader(path)
  try:
    total = reader.num_records()
    for begin in range(start, total, READ_CHUNK):
      for record in reader.read(begin, min(begin + READ_CHUNK, total)):
        yield decode(record, features)
  finally:
    reader.close()


# --- the manifest --------------------------------------------------------------------------
def check_local(directory: str, field: str) -> None:
  """ArrayRecord's reader and writer open local files only (no gs:// in its C++ file
  layer): a bucket must be mounted (gcsfuse) and given by its mount path."""
  if files_lib.is_remote(directory):
    errors.fail(field, f"'{directory}' is a URL, but ArrayRecord files are read and "
                    "written with local file calls.", "Mount the bucket (e.g. gcsfuse) "
                    "on every worker and give its local path.")


def read_manifest(directory: str) -> dict:
  check_local(directory, "data.preprocessed")
  path = os.path.join(str(files_lib.path(directory)), MANIFEST)
  try:
    manifest = json.loads(files_lib.read_text(path))
  except FileNotFoundError:
    raise ManifestError(
        f"config field 'data.preprocessed': '{directory}' holds no {MANIFEST}. Write it "
        "with `python -m encoderx.preprocess --config=<this config> --output="
        f"{directory}` (an interrupted one is continued by the same command).") from None
  except (OSError, ValueError) as error:
    raise ManifestError(f"config field 'data.preprocessed': cannot read {path}: "
                        f"{error}.") from None
  if manifest.get("format") != FORMAT:
    raise ManifestError(f"config field 'data.preprocessed': {path} is not an encoderx "
                        f"manifest of format {FORMAT!r} (it says "
                        f"{manifest.get('format')!r}). Preprocess the corpus again.")
  return manifest


def check_manifest(manifest: dict, config, options: dict, directory: str) -> None:
  """Raises ManifestError, listing every difference, unless the examples in `directory`
  are what `config` would build (the builder with `options`) at every length it trains
  at."""
  written = manifest["examples"]
  differences = [f"{name}: preprocessed {written.get(name, '<absent>')!r}, this config "
                 f"{value!r}" for name, value in
                 examples_description(config, options).items()
                 if written.get(name, "<absent>") != value]
  missing = [n for n in sequence_lengths(config) if str(n) not in manifest["lengths"]]
  if missing:
    differences.append(f"lengths: preprocessed {sorted(map(int, manifest['lengths']))}, "
                       f"this config trains at {sequence_lengths(config)}")
  if differences:
    raise ManifestError(
        f"config field 'data.preprocessed': '{directory}' holds examples made for another "
        f"config: {'; '.join(differences)}. Preprocess the corpus with this config "
        "(python -m encoderx.preprocess) into a new directory, or use the config that "
        "made these.")


# --- the DataSource ------------------------------------------------------------------------
class PreprocessedSource(shard_stream.ShardedSource, seqio.DataSource):
  """The examples of a preprocessed directory: at `seq_length` for seqio's `get_dataset`
  (what seqio users read), at any preprocessed length for `example_shards` (what a run
  streams, phase by phase).

  manifest['lengths'][str(length)] = {'features': {name: {'shape', 'dtype'}} in record
  order, 'splits': {split: {'examples': total, 'copies': [[{'file', 'examples',
  'source'} per shard] per copy]}}}.
  """

  def __init__(self, directory: str, manifest: dict, seq_length: int):
    super().__init__(splits=tuple(manifest["lengths"][str(seq_length)]["splits"]),
                     caching_permitted=False)
    self.directory, self.manifest, self.seq_length = directory, manifest, seq_length

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return False

  def _length(self, seq_length: int) -> dict:
    return self.manifest["lengths"][str(seq_length)]

  def list_shards(self, split: str) -> list[str]:
    copies = self._length(self.seq_length)["splits"][split]["copies"]
    return [entry["file"] for entry in copies[0]]

  def example_shards(self, split: str, seq_length: int) -> list[shard_stream.Shard]:
    """The split's files at `seq_length` as stream shards; epoch e reads copy e % copies."""
    length = self._length(seq_length)
    copies, features = length["splits"][split]["copies"], length["features"]

    def open_shard(index, epoch, start):
      entry = copies[epoch % len(copies)][index]
      return read_records(os.path.join(self.directory, entry["file"]), features, start)

    return [shard_stream.Shard(entry["file"], functools.partial(open_shard, index))
            for index, entry in enumerate(copies[0])]

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: int | None = None,
                  shard_info: seqio.ShardInfo | None = None, *, sequence_length=None,
                  use_cached: bool = False, num_epochs: int | None = 1) -> tf.data.Dataset:
    """The first copy's examples, shard after shard (in an order drawn from `seed` when
    shuffled); `shard_info` takes every num_shards-th shard."""
    del sequence_length, use_cached, num_epochs
    shards = self.example_shards(split, self.seq_length)
    if shard_info:
      shards = shards[shard_info.index::shard_info.num_shards]
    if shuffle:
      shards = [shards[i] for i in np.random.default_rng(seed).permutation(len(shards))]

    def examples():
      for shard in shards:
        yield from shard.open(0, 0)

    features = self._length(self.seq_length)["features"]
    return tf.data.Dataset.from_generator(examples, output_signature={
        name: tf.TensorSpec(spec["shape"], spec["dtype"]) for name, spec in features.items()})
