"""seqio Tasks for pretraining, registered from a config's `data` section.

    source (text files or a TFDS dataset) -> documents {'text', 'document_id'}
      -> tokenize_documents            (cacheable, deterministic)
      -> build_<examples>              (seeded: new pairs every epoch)

Each distinct data config registers one Task, named after its contents; importing this
module registers `encoderx_bert_austen`, BERT pretraining data from the bundled corpus.
"""
from __future__ import annotations

import functools
import hashlib
import json

import ml_collections
import seqio
import tensorflow as tf

from encoderx import config as config_lib
from encoderx import objectives
from encoderx.data import bpe_vocabulary, corpus, preprocessors, resources, segment_pairs
from encoderx.data import sentencepiece_vocabulary, vocabulary as vocabulary_lib

SPLITS = ("train", "validation")
# Example builders: name -> (data config, sentence objective) -> preprocessor of
# tokenized documents. Sentence pairs are labelled for the sentence objective.
BUILDERS = {
    "sentence_pairs": lambda data, objective: functools.partial(
        preprocessors.build_sentence_pairs, short_seq_prob=data.short_seq_prob,
        document_pool=data.document_pool, label_mode=objective),
    "full_sentences": lambda data, _: functools.partial(
        preprocessors.build_packed_sentences, cross_documents=True,
        document_pool=data.document_pool),
    "doc_sentences": lambda data, _: functools.partial(
        preprocessors.build_packed_sentences, cross_documents=False,
        document_pool=data.document_pool),
}
# Vocabularies: config.data.vocab.kind -> the vocabulary built from config.data.vocab.
VOCABULARIES = {
    "wordpiece": lambda vocab: vocabulary_lib.WordPieceVocabulary(
        vocab.path, lower_case=vocab.lower_case, strip_accents=vocab.strip_accents),
    "byte_bpe": lambda vocab: bpe_vocabulary.ByteLevelBpeVocabulary(vocab.path),
    "sentencepiece": lambda vocab: sentencepiece_vocabulary.SentencePieceVocabulary(
        vocab.path, lower_case=vocab.lower_case, strip_accents=vocab.strip_accents,
        layout=vocab.layout),
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
  return objectives.sentence_objective(config.objective.names)


def corpus_files(data_config) -> list[str]:
  if data_config.files == config_lib.BUNDLED_CORPUS:
    return resources.bundled_corpus_files()
  return config_lib.resolve_file_patterns(data_config.files)


def _corpus_format(data_config) -> corpus.CorpusFormat:
  return corpus.CorpusFormat(data_config.document_marker, data_config.sentence_per_line,
                             data_config.invalid_utf8)


def check_text_corpus(config) -> dict[str, int]:
  """Reads the whole corpus of a pretraining config once, so that bad input fails before
  training starts.

  Returns the number of documents per split. Raises CorpusError for an unreadable,
  empty or non-UTF-8 corpus, and for a split with too few documents to pair (NSP draws
  random next segments from other documents; SOP needs one).
  """
  data_config = config.data
  counts = dict.fromkeys(SPLITS, 0)
  documents = corpus.read_documents(corpus_files(data_config), _corpus_format(data_config))
  for index, _ in enumerate(documents):
    held_out = corpus.is_held_out(index, data_config.eval_every_nth_document)
    counts["validation" if held_out else "train"] += 1
  # NSP draws random segments from a second document; everything else needs one.
  needed = 2 if (data_config.builder == "sentence_pairs"
                 and sentence_objective(config) == "nsp") else 1
  for split, count in counts.items():
    if count < needed:
      raise corpus.CorpusError(
          f"the {split} split of the corpus has {count} document(s); the "
          f"'{data_config.builder}' examples{' for nsp' if needed == 2 else ''} need at "
          f"least {needed} (every {data_config.eval_every_nth_document}th document is "
          "held out). Add documents, or check how they are separated "
          "(data.document_marker).")
  return counts


def text_file_source(data_config) -> seqio.DataSource:
  files = corpus_files(data_config)
  corpus_format = _corpus_format(data_config)
  every_nth = data_config.eval_every_nth_document

  def dataset_fn(split, shuffle_files, seed=None):
    def documents():
      for index, blocks in enumerate(corpus.read_documents(files, corpus_format)):
        if corpus.is_held_out(index, every_nth) == (split == "validation"):
          yield {"text": "\n".join(blocks), "document_id": index}
    dataset = tf.data.Dataset.from_generator(documents, output_signature={
        "text": tf.TensorSpec([], tf.string), "document_id": tf.TensorSpec([], tf.int64)})
    if shuffle_files:
      dataset = dataset.shuffle(data_config.shuffle_buffer, seed=seed)
    return dataset

  return seqio.FunctionDataSource(dataset_fn, splits=SPLITS)


def tfds_source(data_config) -> seqio.DataSource:
  return seqio.TfdsDataSource(
      tfds_name=data_config.tfds_name, tfds_data_dir=data_config.tfds_data_dir or None,
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


def register_pretraining_task(config, name: str | None = None) -> seqio.Task:
  """Registers (once) and returns the seqio Task of a pretraining config: its `data`
  section, with sentence pairs labelled for its sentence objective (NSP or SOP)."""
  data_config = config.data
  name = name or task_name(config)
  if name in seqio.TaskRegistry.names():
    return seqio.get_mixture_or_task(name)
  if data_config.tfds_name:
    source = tfds_source(data_config)
    documents = [functools.partial(_tfds_documents, text_key=data_config.tfds_text_key)]
  else:
    source = text_file_source(data_config)
    documents = []
  builder = BUILDERS[data_config.builder](data_config, sentence_objective(config))
  return seqio.TaskRegistry.add(
      name,
      source=source,
      preprocessors=documents + [
          functools.partial(preprocessors.tokenize_documents,
                            sentence_per_line=data_config.sentence_per_line),
          seqio.CacheDatasetPlaceholder(),
          builder,
      ],
      output_features=output_features(build_vocabulary(data_config.vocab)),
      shuffle_buffer_size=data_config.shuffle_buffer,
  )


def _register_default():
  from encoderx.configs import bert_tiny  # pylint: disable=g-import-not-at-top
  register_pretraining_task(bert_tiny.get_config(), name="encoderx_bert_austen")


_register_default()
