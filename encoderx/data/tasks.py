"""seqio Tasks for pretraining, registered from a config's `data` section.

    source (text files or a TFDS dataset) -> documents {'text', 'document_id'}
      -> tokenize_documents            (cacheable, deterministic)
      -> build_<examples>              (seeded: new pairs every epoch)

The source reads text files whole (on the fly, for small corpora) or file by file
(`data.streaming`), a TFDS dataset file by file, or a directory of preprocessed examples
(`data.preprocessed`, no preprocessors left to run); the last three are streamed shard by
shard (encoderx/data/shard_stream.py). Each distinct data config registers one Task, named after
its contents (or as the caller names it); importing this module registers none.
"""
from __future__ import annotations

import functools
import hashlib
import json
from typing import Iterator

import ml_collections
import numpy as np
import seqio
import tensorflow as tf

from encoderx import files as files_lib
from encoderx.data import bpe_vocabulary, corpus, example_builders, example_files, pipeline
from encoderx.data import fields, resources
from encoderx.data import segment_pairs, sentencepiece_vocabulary, shard_stream
from encoderx.data import vocabulary as vocabulary_lib

SPLITS = ("train", "validation")
# Example builders: name -> (data config, sentence objective) -> preprocessor of
# tokenized documents. Sentence pairs are labelled for the sentence objective.
BUILDERS = {
    "sentence_pairs": lambda data, objective: functools.partial(
        example_builders.build_sentence_pairs, short_seq_prob=data.short_seq_prob,
        document_pool=data.document_pool, label_mode=objective),
    "full_sentences": lambda data, _: functools.partial(
        example_builders.build_packed_sentences, cross_documents=True,
        document_pool=data.document_pool, packing_method=data.packing),
    "doc_sentences": lambda data, _: functools.partial(
        example_builders.build_packed_sentences, cross_documents=False,
        document_pool=data.document_pool),
}
# Vocabularies: config.data.vocab.kind -> the vocabulary built from config.data.vocab.
VOCABULARIES = {
    "wordpiece": lambda vocab: vocabulary_lib.WordPieceVocabulary(
        vocab.path, lower_case=vocab.lower_case, strip_accents=vocab.strip_accents),
    "byte_bpe": lambda vocab: bpe_vocabulary.ByteLevelBpeVocabulary(
        vocab.path, layout=fields.vocab_layout(vocab)),
    "sentencepiece": lambda vocab: sentencepiece_vocabulary.SentencePieceVocabulary(
        vocab.path, lower_case=vocab.lower_case, strip_accents=vocab.strip_accents,
        layout=fields.vocab_layout(vocab)),
}


def build_vocabulary(vocab_config: ml_collections.ConfigDict) -> seqio.Vocabulary:
  """The vocabulary `config.data.vocab` describes; built once per description."""
  return _cached_vocabulary(json.dumps(vocab_config.to_dict(), sort_keys=True))


@functools.cache
def _cached_vocabulary(description: str) -> seqio.Vocabulary:
  vocab_config = ml_collections.ConfigDict(json.loads(description))
  return VOCABULARIES[vocab_config.kind](vocab_config)


def sentence_objective(config) -> str | None:
  """The sentence-level objective of a config ('nsp', 'sop'), which labels the pairs."""
  return segment_pairs.label_mode(config.objective.names)


STREAMS_BUILDER = "xlnet_streams"  # what a manifest names XLNet's row streams


def builds_streams(config) -> bool:
  """Whether a config's examples are XLNet's row streams (method 'xlnet',
  encoderx/data/row_streams.py) rather than data.builder's."""
  return config.method == "xlnet"


def stream_rows(config, process_count: int) -> int:
  """The rows of the row streams each process reads (a batch row each): its share of
  train.batch_size, or all of it with data.process_split='rows' (every process reads the
  global stream and keeps its own rows of each batch)."""
  if config.data.process_split == "rows":
    return config.train.batch_size
  return config.train.batch_size // process_count


def examples_options(config, process_count: int = 1) -> dict:
  """What a config's examples depend on besides the vocabulary and the lengths (what a
  preprocessed manifest records and a run compares): the builder and its options; for
  XLNet's row streams, the rows each of `process_count` processes reads, reuse_len and
  bi_data."""
  data = config.data
  if builds_streams(config):
    plm = config.objective.plm
    return {"builder": STREAMS_BUILDER,
            "rows_per_process": stream_rows(config, process_count),
            "reuse_len": plm.reuse_len, "bi_data": bool(plm.bi_data),
            "document_pool": data.document_pool}
  options = {"builder": data.builder, "sentence_objective": sentence_objective(config),
             "short_seq_prob": data.short_seq_prob, "document_pool": data.document_pool}
  if data.packing != "greedy":  # recorded where it changes the rows (older manifests)
    options["packing"] = data.packing
  return options


def corpus_files(data_config) -> list[str]:
  if data_config.files == resources.BUNDLED_CORPUS:
    return resources.bundled_corpus_files()
  return files_lib.resolve_patterns(data_config.files)


def _corpus_format(data_config) -> corpus.CorpusFormat:
  return corpus.CorpusFormat(data_config.document_marker, data_config.sentence_per_line,
                             data_config.invalid_utf8, data_config.document_per_line)


def check_text_corpus(config, examples: str = "") -> dict[str, int]:
  """Reads the whole corpus of a pretraining config once, so that bad input fails before
  training starts.

  Returns the number of documents per split. Raises CorpusError for an unreadable,
  empty or non-UTF-8 corpus, and for a split with too few documents to pair (NSP draws
  random next segments from other documents; SOP needs one). `examples` names what the
  documents become when it is not the config's `data.builder` (one document will do).
  """
  data_config = config.data
  counts = dict.fromkeys(SPLITS, 0)
  documents = corpus.read_documents(corpus_files(data_config), _corpus_format(data_config))
  for index, _ in enumerate(documents):
    held_out = corpus.is_held_out(index, data_config.eval_every_nth_document)
    counts["validation" if held_out else "train"] += 1
  # NSP draws random segments from a second document; everything else needs one.
  needed = 2 if (not examples and data_config.builder == "sentence_pairs"
                 and sentence_objective(config) == "nsp") else 1
  examples = examples or f"'{data_config.builder}' examples"
  for split, count in counts.items():
    if count < needed:
      raise corpus.CorpusError(
          f"the {split} split of the corpus has {count} document(s); the "
          f"{examples}{' for nsp' if needed == 2 else ''} need at "
          f"least {needed} (every {data_config.eval_every_nth_document}th document is "
          "held out). Add documents, or check how they are separated "
          "(data.document_marker, data.document_per_line).")
  return counts


def train_documents(data_config) -> Iterator[list[str]]:
  """The corpus's documents of the train split (every n-th is held out), as text blocks."""
  documents = corpus.read_documents(corpus_files(data_config), _corpus_format(data_config))
  for index, blocks in enumerate(documents):
    if not corpus.is_held_out(index, data_config.eval_every_nth_document):
      yield blocks


_DOCUMENT_SIGNATURE = {"text": tf.TensorSpec([], tf.string),
                       "document_id": tf.TensorSpec([], tf.int64)}


def text_file_source(data_config) -> seqio.DataSource:
  """All the text files as one pass (on the fly): documents are numbered across files."""
  files = corpus_files(data_config)
  corpus_format = _corpus_format(data_config)
  every_nth = data_config.eval_every_nth_document

  def dataset_fn(split, shuffle_files, seed=None):
    def documents():
      for index, blocks in enumerate(corpus.read_documents(files, corpus_format)):
        if corpus.is_held_out(index, every_nth) == (split == "validation"):
          yield {"text": "\n".join(blocks), "document_id": index}
    dataset = tf.data.Dataset.from_generator(documents, output_signature=_DOCUMENT_SIGNATURE)
    if shuffle_files:
      dataset = dataset.shuffle(data_config.shuffle_buffer, seed=seed)
    return dataset

  return seqio.FunctionDataSource(dataset_fn, splits=SPLITS)


class TextFileShards(shard_stream.ShardedSource, seqio.DataSource):
  """Text files as shards, one file each, streamed (data.streaming): a document is held
  out by its index within its file (every n-th), so a file is read without the files
  before it. (The on-the-fly source numbers documents across files; for one file the
  two splits are the same.)"""

  def __init__(self, files: list[str], corpus_format: corpus.CorpusFormat, every_nth: int):
    super().__init__(splits=SPLITS)
    self.files, self.corpus_format, self.every_nth = files, corpus_format, every_nth

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return False

  def list_shards(self, split: str) -> list[str]:
    return self.files

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: int | None = None,
                  shard_info: seqio.ShardInfo | None = None, *, sequence_length=None,
                  use_cached: bool = False, num_epochs: int | None = 1) -> tf.data.Dataset:
    """Documents of every num_shards-th file (`shard_info`), in an order drawn from `seed`
    when shuffled."""
    del sequence_length, use_cached, num_epochs
    files = self.files[shard_info.index::shard_info.num_shards] if shard_info else self.files
    if shuffle:
      files = [files[i] for i in np.random.default_rng(seed).permutation(len(files))]

    def documents():
      for path in files:
        yield from self._file_documents(path, split)

    return tf.data.Dataset.from_generator(documents, output_signature=_DOCUMENT_SIGNATURE)

  def shard_documents(self, split: str, index: tf.Tensor) -> tf.data.Dataset:
    """The documents of file `index` (an int64 scalar tensor), as `get_dataset` gives
    them for that one shard. The file is picked when the dataset is read, not when it is
    built, so a pipeline built on this once reads any file (pipeline.py:
    _tokenized_shard)."""
    def documents(file_index):
      yield from self._file_documents(self.files[int(file_index)], split)

    return tf.data.Dataset.from_generator(documents, args=(index,),
                                          output_signature=_DOCUMENT_SIGNATURE)

  def _file_documents(self, path: str, split: str):
    for index, blocks in enumerate(corpus.documents_of_file(path, self.corpus_format)):
      if corpus.is_held_out(index, self.every_nth) == (split == "validation"):
        yield {"text": "\n".join(blocks), "document_id": index}


class TfdsShards(shard_stream.ShardedSource, seqio.TfdsDataSource):
  """A TFDS dataset, streamed a file of it at a time (seqio's TfdsDataSource)."""


def tfds_source(data_config) -> seqio.DataSource:
  return TfdsShards(
      tfds_name=data_config.tfds_name,
      tfds_data_dir=files_lib.optional(data_config.tfds_data_dir),
      splits={"train": data_config.tfds_train_split,
              "validation": data_config.tfds_eval_split})


def _tfds_documents(dataset, text_key):
  """TFDS examples -> documents; a running index stands in for a document id."""
  dataset = dataset.enumerate()
  return dataset.map(lambda i, ex: {"text": ex[text_key], "document_id": i})


def task_name(config) -> str:
  blob = json.dumps([config.data.to_dict(), sentence_objective(config)], sort_keys=True,
                    default=str)
  data_config = config.data
  return f"encoderx_{data_config.builder}_{hashlib.sha1(blob.encode()).hexdigest()[:12]}"


def output_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
  features = {"input_ids": seqio.Feature(vocabulary, add_eos=False, dtype=tf.int32)}
  plain = seqio.PassThroughVocabulary(size=0)
  for name in segment_pairs.TOKEN_FEATURES[1:]:
    features[name] = seqio.Feature(plain, add_eos=False, dtype=tf.int32, required=False)
  return features


def _register(name: str, config, builder, shuffle_buffer_size: int,
              process_count: int = 1, task_cls: type[seqio.Task] = seqio.Task
              ) -> seqio.Task:
  """Registers (once) the Task: the config's documents, tokenized, then `builder`; or the
  examples `builder` made into data.preprocessed (checked against the config)."""
  if name in seqio.TaskRegistry.names():
    return seqio.get_mixture_or_task(name)
  data_config = config.data
  if data_config.preprocessed:
    return seqio.TaskRegistry.add(
        name, task_cls=task_cls, source=preprocessed_source(config, process_count),
        preprocessors=[],
        output_features=output_features(build_vocabulary(data_config.vocab)),
        shuffle_buffer_size=shuffle_buffer_size)
  if data_config.tfds_name:
    source = tfds_source(data_config)
    documents = [functools.partial(_tfds_documents, text_key=data_config.tfds_text_key)]
  elif data_config.streaming:
    source = TextFileShards(corpus_files(data_config), _corpus_format(data_config),
                            data_config.eval_every_nth_document)
    documents = []
  else:
    source = text_file_source(data_config)
    documents = []
  return seqio.TaskRegistry.add(
      name,
      task_cls=task_cls,
      source=source,
      preprocessors=documents + [
          functools.partial(example_builders.tokenize_documents,
                            sentence_per_line=data_config.sentence_per_line),
          seqio.CacheDatasetPlaceholder(),
          builder,
      ],
      output_features=output_features(build_vocabulary(data_config.vocab)),
      shuffle_buffer_size=shuffle_buffer_size,
  )


def register_pretraining_task(config, name: str | None = None, process_count: int = 1
                              ) -> seqio.Task:
  """Registers (once) and returns the seqio Task of a pretraining config: its `data`
  section, with sentence pairs labelled for its sentence objective (NSP or SOP), XLNet's
  row streams for method 'xlnet' (as `process_count` processes read them), or the
  examples of `data.preprocessed`."""
  if builds_streams(config):
    return register_stream_task(config, process_count)
  data_config = config.data
  builder = BUILDERS[data_config.builder](data_config, sentence_objective(config))
  return _register(name or task_name(config), config, builder, data_config.shuffle_buffer)


def preprocessed_source(config, process_count: int = 1) -> example_files.PreprocessedSource:
  """The examples of `config.data.preprocessed`, checked against the config (its manifest
  must list the same vocabulary, builder and options, and every length it trains at)."""
  directory = config.data.preprocessed
  manifest = example_files.read_manifest(directory)
  example_files.check_manifest(manifest, config, examples_options(config, process_count),
                              directory)
  return example_files.PreprocessedSource(str(files_lib.path(directory)), manifest,
                                         config.data.seq_length)


def register_stream_task(config, process_count: int = 1) -> seqio.Task:
  """Registers (once) and returns XLNet's Task for a config read by `process_count`
  processes: every row of a process's batch a stream of consecutive chunks
  (encoderx/data/row_streams.py), with `config.objective.plm`'s reuse_len and bidirectional
  data, built from the corpus or read from data.preprocessed. Its examples keep their
  stream order (an OrderedTask); the documents are shuffled at the source, every epoch,
  and streamed shards are read one after another in an order drawn per epoch."""
  plm, rows = config.objective.plm, stream_rows(config, process_count)
  blob = json.dumps([config.data.to_dict(), rows, plm.reuse_len, plm.bi_data],
                    sort_keys=True, default=str)
  name = f"encoderx_xlnet_streams_{hashlib.sha1(blob.encode()).hexdigest()[:12]}"
  builder = functools.partial(example_builders.build_streams, reuse_len=plm.reuse_len,
                              rows=rows, bi_data=plm.bi_data,
                              document_pool=config.data.document_pool)
  return _register(name, config, builder, 1, process_count, pipeline.OrderedTask)
