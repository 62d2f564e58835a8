"""config.data: where a run's examples come from, how they are built, and its vocabulary.

The fields every method reads are checked here (`validate`); a method checks the ones
only it reads (the pretraining corpus: methods/pretrain.py). What only fine-tuning reads,
its labelled files and its batching (length buckets), is config.finetune
(methods/finetune.py).
"""
from __future__ import annotations

import ml_collections

from encoderx import errors
from encoderx import files as files_lib
from encoderx.data import packing, resources

# Vocabulary kinds -> the module whose command line trains one (named in errors).
VOCAB_KINDS = {"wordpiece": "encoderx.data.vocabulary",
               "byte_bpe": "encoderx.data.bpe_vocabulary",
               "sentencepiece": "encoderx.data.sentencepiece_vocabulary"}
# The special-token layouts of each vocabulary kind, its default (data.vocab.layout "")
# first: encoderx/data/bpe_vocabulary.py and sentencepiece_vocabulary.py, LAYOUTS.
VOCAB_LAYOUTS = {"wordpiece": (), "byte_bpe": ("roberta", "bert", "eurobert"),
                 "sentencepiece": ("albert", "deberta")}


def config_section() -> ml_collections.ConfigDict:
  """config.data with its defaults: the bundled corpus, BERT's sentence pairs, the bundled
  WordPiece vocabulary."""
  return ml_collections.ConfigDict(dict(
      # Comma-separated file globs, or resources.BUNDLED_CORPUS. Ignored when tfds_name
      # is set.
      files=resources.BUNDLED_CORPUS,
      # A TFDS dataset with its version, e.g. "wikipedia/20230601.en:1.0.0"; documents
      # are the tfds_text_key feature of its examples.
      tfds_name="",
      tfds_text_key="text",
      tfds_train_split="train",
      tfds_eval_split="validation",  # e.g. "train[99%:]" (then train: "train[:99%]")
      tfds_data_dir="",
      # Regex of a line that starts a new document (e.g. "^Chapter [0-9]+"); empty:
      # documents are separated by blank lines.
      document_marker="",
      sentence_per_line=False,  # True: each line is one sentence (BERT's own format).
      # True: each line is one whole document (the format of many dumps, e.g. Wikipedia
      # extractions), split into sentences by rule; blank lines are skipped.
      document_per_line=False,
      invalid_utf8="error",  # or "replace": undecodable bytes become U+FFFD.
      eval_every_nth_document=20,  # every n-th document is held out for evaluation.
      # True: data.files are streamed file by file (each process its own files, a bounded
      # shuffle window, a position that resumes in constant time) instead of read whole
      # at start-up; documents are then held out by their index within their file. TFDS
      # datasets and preprocessed examples are always streamed (encoderx/data/shard_stream.py).
      streaming=False,
      # How the processes of a multi-host run split the data. "shards": each process
      # reads its own shard of the data (scalable). "rows": every process builds the
      # global stream a single process would and keeps its own rows of each batch, so
      # the global batch equals a 1-process run's (each host does all the input work:
      # for small corpora and for verifying a pod setup).
      process_split="shards",
      # A directory written by `python -m encoderx.preprocess` (examples ready to train
      # on, and a manifest that must match this config): the run streams it instead of
      # reading data.files or data.tfds_name.
      preprocessed="",
      builder="sentence_pairs",
      # How builder 'full_sentences' fills its rows (encoderx/data/packing.py): "greedy"
      # (whole sentences in document order until the next does not fit) or "best_fit"
      # (documents cut at the row's length, mid-sentence, the pieces placed longest
      # first into the row they fit most tightly, within each group of document_pool
      # documents: almost no padding).
      packing="greedy",
      seq_length=128,
      short_seq_prob=0.1,
      # Documents kept to draw random segments from (NSP); for XLNet's streams, the
      # documents of one document set (the memory restarts with each).
      document_pool=1000,
      shuffle_buffer=10000,  # examples; the window a stream is shuffled in.
      vocab=ml_collections.ConfigDict(dict(
          # "wordpiece": path is a BERT vocab.txt. "byte_bpe" (RoBERTa, GPT-2): path is
          # a directory holding vocab.json and merges.txt. "sentencepiece" (ALBERT):
          # path is a .model file.
          kind="wordpiece",
          path=resources.BUNDLED_WORDPIECE_VOCAB,
          # Text preparation as in Hugging Face: BertTokenizer's do_lower_case and
          # strip_accents; for sentencepiece AlbertTokenizer's do_lower_case and (not)
          # keep_accents. Byte-level BPE keeps text as it is.
          lower_case=True,
          strip_accents=True,
          # The special tokens' layout ("": the kind's first). "sentencepiece": "albert"
          # (<pad> <unk> [CLS] [SEP] [MASK] = 0-4) or "deberta" ([PAD] [CLS] [SEP] [UNK] =
          # 0-3, [MASK] after the pieces; DeBERTa v2/v3's spm.model). "byte_bpe":
          # "roberta" (<s> <pad> </s> <unk> <mask>, <s> A </s></s> B </s>), "bert"
          # (ModernBERT: [CLS] A [SEP] B [SEP], [MASK] [PAD] [UNK]) or "eurobert"
          # (<|begin_of_text|> A <|end_of_text|>, <|mask|>, <|pad|>).
          layout="",
      )),
  ))


def validate(data) -> None:
  """Checks the fields of config.data every method reads; raises errors.ConfigError."""
  if data.seq_length < 8:
    errors.fail("data.seq_length", f"{data.seq_length} is too short for [CLS] A [SEP] B "
                "[SEP].")
  errors.check_choice("data.vocab.kind", data.vocab.kind, VOCAB_KINDS)
  errors.check_choice("data.process_split", data.process_split, ("shards", "rows"))
  errors.check_choice("data.packing", data.packing, packing.PACKINGS)
  if data.packing != "greedy" and data.builder != "full_sentences":
    errors.fail("data.packing", f"{data.packing!r} packs several documents into a row: "
                f"data.builder 'full_sentences' only, got {data.builder!r}.")
  layouts = VOCAB_LAYOUTS[data.vocab.kind]
  if data.vocab.layout and data.vocab.layout not in layouts:
    errors.fail("data.vocab.layout", f"{data.vocab.layout!r} is not a layout of "
                f"{data.vocab.kind} vocabularies ({', '.join(layouts) or 'they have none'}).")
  if not data.vocab.path.startswith("bundled:") and not files_lib.exists(data.vocab.path):
    errors.fail("data.vocab.path", f"'{data.vocab.path}' does not exist.",
                f"Train one with `python -m {VOCAB_KINDS[data.vocab.kind]} --help`.")


def vocab_layout(vocab) -> str:
  """The layout of config.data.vocab (a ConfigDict or dict): its `layout`, or its kind's
  default ('' for WordPiece, which has one)."""
  layout = vocab.get("layout") or ""
  return layout or (VOCAB_LAYOUTS.get(vocab["kind"]) or ("",))[0]


def migrate_vocab(vocab) -> None:
  """An older run's config.data.vocab (in place): its `layout` was 'albert' whatever the
  kind before byte-level BPE had layouts; for other kinds that meant none."""
  if vocab.kind != "sentencepiece" and vocab.layout == "albert":
    vocab.layout = ""
