"""The one config schema of encoderx: defaults for every field, and validation.

Family configs in `configs/` start from `default_config()` and change fields. The
returned ConfigDict is locked, so a misspelt field in a config file or on the command
line fails at once with the field's name; `validate()` then checks values and sizes
before anything is built or compiled.
"""
from __future__ import annotations

import dataclasses
import difflib

import ml_collections

from encoderx import errors
from encoderx import files as files_lib
from encoderx import objectives, optim
from encoderx.data import resources
from encoderx.models import attention, common, disentangled


# Vocabulary kinds -> the module whose command line trains one (named in errors).
VOCAB_KINDS = {"wordpiece": "encoderx.data.vocabulary",
               "byte_bpe": "encoderx.data.bpe_vocabulary",
               "sentencepiece": "encoderx.data.sentencepiece_vocabulary"}
# SentencePiece special-piece layouts (encoderx/data/sentencepiece_vocabulary.py: LAYOUTS).
SENTENCEPIECE_LAYOUTS = ("albert", "deberta")




def default_config() -> ml_collections.ConfigDict:
  """Every field encoderx reads, with BERT-base defaults; locked against new fields."""
  config = ml_collections.ConfigDict()

  # The training method (encoderx/method.py: REGISTRY): "pretrain" (MLM with optional
  # NSP / SOP / SBO terms), "electra" (replaced-token detection, config.rtd), "xlnet"
  # (permutation language modelling with memory, config.objective.plm), or fine-tuning:
  # "classify", "similarity", "tag", "qa", "simcse".
  config.method = "pretrain"
  # Parameters to start from (fresh init when empty): a work directory or checkpoint
  # directory of another run, or "hf:<Hugging Face model directory>". The encoder's
  # fields (config.model but dropout, dtypes, scan and remat) and the vocabulary
  # (config.data.vocab) are taken from it. Same as the --init_from flag.
  config.init_from = ""

  # The model's fields are defined, defaulted and documented in one place:
  # encoderx/models/common.py's ModelConfig.
  config.model = ml_collections.ConfigDict(dataclasses.asdict(common.ModelConfig()))

  config.data = ml_collections.ConfigDict(dict(
      # Comma-separated file globs, or resources.BUNDLED_CORPUS. Ignored when tfds_name is set.
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
      # datasets and preprocessed examples are always streamed (encoderx/data/stream.py).
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
          # "sentencepiece": the special pieces' layout, "albert" (<pad> <unk> [CLS] [SEP]
          # [MASK] = 0-4) or "deberta" ([PAD] [CLS] [SEP] [UNK] = 0-3, [MASK] after the
          # pieces; DeBERTa v2/v3's spm.model).
          layout="albert",
      )),
  ))

  # Pretraining objectives (method "pretrain").
  config.objective = ml_collections.ConfigDict(dict(
      names=("mlm", "nsp"),
      # The loss is the sum over `names` of weight x that objective's mean loss.
      weights=ml_collections.ConfigDict({name: 1.0 for name in objectives.NAMES}),
      mlm=ml_collections.ConfigDict(dict(
          rate=0.15,
          mask_token_prob=0.8,
          random_token_prob=0.1,
          max_predictions=20,
          # The cap in the long-sequence phase (train.long_fraction; BERT: 80 at 512).
          long_max_predictions=80,
          # What is masked: "token" (BERT), "word" (whole-word masking, BERT-wwm),
          # "ngram" (n whole words, p(n) ~ 1/n, n <= max_ngram: ALBERT) or "span"
          # (SpanBERT: n whole words, n ~ Geometric(span_geometric_p) on
          # 1..max_span_words). Words come from the batch's word_starts.
          unit="token",
          max_ngram=3,
          span_geometric_p=0.2,
          max_span_words=10,
      )),
      # Permutation language modelling (method "xlnet"); XLNet's values at length 512.
      plm=ml_collections.ConfigDict(dict(
          # The last 1/K of each factorization order is predicted: 1/K of the tokens.
          partial_prediction_k=6,
          num_predict=85,  # prediction slots per row (a cap, like max_predictions)
          max_span_words=5,  # predicted n-grams of 1..n whole words, p(n) ~ 1/n
          perm_size=256,  # orders permute blocks of this many tokens
          # A row's first reuse_len tokens continue the previous step's row; their
          # hidden states are what the memory keeps.
          reuse_len=256,
          mem_len=384,  # tokens of previous steps each layer attends to; 0: no memory
          # Half of the rows read their stream backwards, with negated relative
          # positions (XLNet's bidirectional data pipeline).
          bi_data=False,
      )),
  ))

  # Replaced-token detection (method "electra", encoderx/methods/electra.py): a small
  # generator, trained by MLM (config.objective.mlm), fills the masked positions with
  # samples; the discriminator (config.model) learns which tokens were replaced.
  config.rtd = ml_collections.ConfigDict(dict(
      # The generator's layers, and its hidden size, heads and FFN size, as fractions of
      # the discriminator's (ELECTRA: depth 1, width 1/4 small, 1/3 base; DeBERTa-v3:
      # depth 1/2, width 1).
      generator_depth=1.0,
      generator_width=0.25,
      # loss = objective.weights.mlm x generator MLM + rtd_lambda x discriminator binary
      # cross-entropy over every non-padding token (ELECTRA 50, DeBERTa-v3 10).
      rtd_lambda=50.0,
      # "shared" (ELECTRA): one token, position and type embedding and embedding
      # LayerNorm, trained by both losses. "gdes" (DeBERTa-v3, gradient-disentangled):
      # the discriminator's word (and absolute position) embedding is stop_gradient(the
      # generator's) + its own delta initialized at zero, its other embedding parameters
      # its own; the generator is trained by MLM only.
      embedding_sharing="shared",
      # "joint" (ELECTRA): one optimizer update of the summed loss. "decoupled" (DeBERTa's
      # decoupled_training): the generator's update (MLM), then the discriminator's
      # (rtd_lambda x BCE) on the batch the generator corrupted, each with its own
      # optimizer state.
      training="joint",
      # The discriminator's peak learning rate when decoupled; 0: optimizer.learning_rate.
      discriminator_learning_rate=0.0,
  ))

  config.optimizer = ml_collections.ConfigDict(dict(
      name="adamw",  # or "lamb" (ALBERT): same schedule, clipping and decay mask.
      learning_rate=1e-4,
      warmup_steps=10_000,
      b1=0.9,
      b2=0.999,
      eps=1e-6,
      weight_decay=0.01,
      clip_norm=1.0,
  ))

  config.train = ml_collections.ConfigDict(dict(
      steps=1_000_000,
      batch_size=256,  # global batch, per optimizer update.
      grad_accum_steps=1,  # micro-batches per update; batch_size must divide by it.
      seed=0,
      log_every=100,
      # Final fraction of the steps run at long_seq_length (BERT: 0.1 at 512).
      long_fraction=0.0,
      long_seq_length=512,
      # Steps in a row whose loss or gradient norm is not finite (NaN/inf) that are
      # skipped, leaving the state as it was, before the run stops with an error naming
      # them; 0: stop at the first.
      max_skipped_steps=10,
  ))

  # Fine-tuning on labelled examples (methods classify, similarity, tag, qa, simcse).
  config.finetune = ml_collections.ConfigDict(dict(
      # classify / similarity / simcse: TSV, CSV or JSON-lines files (by extension, or
      # `format`), one example a row, with a header naming the columns (TSV/CSV) or keys
      # (JSONL). tag: CoNLL column files. qa: SQuAD JSON files. tag and qa read a TFDS
      # dataset instead when data.tfds_name is set (splits data.tfds_train_split and
      # data.tfds_eval_split).
      train_file="",
      dev_file="",
      format="",  # "", "tsv", "csv" or "jsonl"; "": from the file's extension.
      # The text column (tag on TFDS: the feature of a sentence's tokens).
      text_column="text",
      text_pair_column="",  # set for sentence-pair tasks: [CLS] text [SEP] pair [SEP].
      # The label column: a label (classify), a score (similarity, simcse's dev file);
      # tag on TFDS: the feature of the tags (a ClassLabel sequence, e.g. "ner").
      label_column="label",
      # Label names in order (ids 0, 1, ...); (): the training file's, sorted.
      labels=(),
      # The sentence representation: classify / similarity feed "pooler" (BERT's tanh
      # dense on the first token) or "first_token" (the encoder's output there) to the
      # head; simcse embeds by "first_token" or "mean" (of the tokens' outputs).
      pooling="pooler",
      classifier_dropout=0.1,
      # tag: which whitespace-separated column of a CoNLL line holds the tag (the
      # token is the first); -1: the last.
      tag_column=-1,
      # qa: SQuAD v2.0 (questions may have no answer: "" is predicted when the no-answer
      # score exceeds the best span's score by more than null_score_threshold).
      version_2=False,
      null_score_threshold=0.0,
      doc_stride=128,  # tokens between the starts of a long context's windows
      max_query_length=64,  # question tokens kept
      max_answer_length=30,  # answer tokens at most
      n_best_size=20,  # start and end candidates considered per window
      # simcse: "unsupervised" (every sentence of the training file's text columns,
      # twice through dropout) or "supervised" (rows of text, text_pair and optionally
      # hard_negative_column).
      simcse="unsupervised",
      hard_negative_column="",
      temperature=0.05,  # of the cosine similarities in the contrastive loss
  ))

  config.eval = ml_collections.ConfigDict(dict(
      batches=20,  # held-out batches per evaluation; 0: the whole split.
      batch_size=64,
      every_steps=0,  # 0: only at the end of the run.
      # A metric of the evaluation (e.g. "accuracy") to keep the best checkpoint by, in
      # best/ of the work directory; "": no best checkpoint.
      best_metric="",
      best_mode="max",  # or "min".
  ))

  config.checkpoint = ml_collections.ConfigDict(dict(
      every_steps=1000,
      keep=3,
      async_save=True,
  ))

  # Device mesh: the product must equal the device count; -1 takes what is left.
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  # Logical axis -> the mesh axes it is split over ("data,fsdp", "tensor"; "" keeps it
  # whole), activations' names included; sharding.LOGICAL_AXIS_RULES is the default.
  from encoderx import sharding  # pylint: disable=g-import-not-at-top (it imports us)
  config.mesh.rules = sharding.rules_as_config()

  config.lock()
  return config


def _unknown_fields(config, schema, prefix=""):
  """Every field of `config` that `schema` lacks, as messages."""
  for key in config.keys():
    name = f"{prefix}{key}"
    if key not in schema:
      close = difflib.get_close_matches(key, list(schema.keys()), n=1)
      hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
      yield f"unknown field '{name}'{hint}"
    elif isinstance(schema[key], ml_collections.ConfigDict):
      if not isinstance(config[key], ml_collections.ConfigDict):
        yield f"field '{name}' must be a group of fields, got {config[key]!r}"
      else:
        yield from _unknown_fields(config[key], schema[key], prefix=f"{name}.")


def unknown_field(path: str) -> str | None:
  """'model.hiden_size' -> a message naming the unknown part (None if the field exists)."""
  node, parts = default_config(), path.split(".")
  for depth, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      options = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      close = difflib.get_close_matches(part, options, n=1)
      hint = f" (did you mean '{'.'.join(parts[:depth] + close)}'?)" if close else ""
      return f"unknown config field '{path}'{hint}"
    node = node[part]
  return None


def changed_fields(config: ml_collections.ConfigDict, section: str) -> dict:
  """The fields of `config.<section>` that differ from the defaults (nested), as plain
  values: what a description of the run records, so that a field added later, at its
  default, changes nothing."""
  def changed(node, default):
    result = {}
    for key in node.keys():
      value = node[key]
      if isinstance(value, ml_collections.ConfigDict):
        inner = changed(value, default[key] if key in default else {})
        if inner:
          result[key] = inner
      elif key not in default or value != default[key]:
        result[key] = list(value) if isinstance(value, tuple) else value
    return result
  return changed(config[section], default_config()[section])












def _validate_relative_attention(model) -> None:
  """DeBERTa's fields: disentangled attention's terms and buckets, the mask decoder."""
  terms = tuple(model.relative_attention_terms)
  for term in terms:
    errors.check_choice("model.relative_attention_terms", term, disentangled.TERMS)
  if len(set(terms)) != len(terms):
    errors.fail("model.relative_attention_terms", f"{terms} names a term twice.")
  if model.max_relative_positions < 2:
    errors.fail("model.max_relative_positions", f"must be >= 2, got {model.max_relative_positions}.")
  if model.position_buckets < 0 or model.position_buckets == 1:
    errors.fail("model.position_buckets", f"must be 0 (no buckets) or >= 2, got "
         f"{model.position_buckets}.")
  if model.position_buckets and model.max_relative_positions - 1 <= model.position_buckets // 2:
    errors.fail("model.max_relative_positions", f"{model.max_relative_positions} must exceed "
         f"model.position_buckets / 2 + 1 = {model.position_buckets // 2 + 1} (log buckets "
         "shrink the distances between the two).")
  if model.enhanced_mask_decoder and model.embedding_size not in (0, model.hidden_size):
    errors.fail("model.enhanced_mask_decoder", "adds position embeddings to hidden states; it "
         f"needs model.embedding_size = hidden_size, got {model.embedding_size}.")


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks every field a run depends on; raises ConfigError naming the first bad one.

  The fields every run reads are checked here; the method's own (config.objective for
  pretraining, config.finetune for fine-tuning) by the method's `validate`.
  """
  from encoderx import method as method_lib  # pylint: disable=g-import-not-at-top
  problems = list(_unknown_fields(config, default_config()))
  if problems:
    raise errors.ConfigError("; ".join(problems))
  errors.check_choice("method", config.method, tuple(method_lib.REGISTRY))

  model, data, train = config.model, config.data, config.train
  errors.check_positive(config, "model.hidden_size", "model.num_layers", "model.num_heads",
                  "model.intermediate_size", "model.max_position_embeddings",
                  "data.seq_length", "train.steps", "train.batch_size",
                  "train.grad_accum_steps", "train.log_every", "eval.batch_size",
                  "checkpoint.every_steps", "checkpoint.keep")
  if model.hidden_size % model.num_heads:
    errors.fail("model.hidden_size", f"{model.hidden_size} is not divisible by "
          f"model.num_heads={model.num_heads}.")
  if model.embedding_size < 0 or model.vocab_size < 0:
    errors.fail("model.embedding_size" if model.embedding_size < 0 else "model.vocab_size",
          "must be >= 0 (0 means the default).")
  if model.vocab_multiple < 1:
    errors.fail("model.vocab_multiple", f"must be >= 1 (1: no padding rows), got "
         f"{model.vocab_multiple}.", "Use e.g. 128 to pad the vocabulary so that it splits "
         "over the mesh.")
  if model.position_offset < 0:
    errors.fail("model.position_offset", f"must be >= 0, got {model.position_offset}.")
  from encoderx.export import hf  # pylint: disable=g-import-not-at-top
  errors.check_choice("model.family", model.family, tuple(hf.FAMILIES))
  errors.check_choice("model.hidden_act", model.hidden_act, tuple(common.ACTIVATIONS))
  errors.check_choice("model.pooler_act", model.pooler_act, tuple(common.ACTIVATIONS))
  errors.check_choice("model.attention", model.attention, tuple(attention.VARIANTS))
  errors.check_choice("model.attention_kernel", model.attention_kernel, common.ATTENTION_KERNELS)
  if model.attention_kernel != "auto" and model.attention != "standard":
    errors.fail("model.attention_kernel", f"{model.attention_kernel!r} is a kernel of the "
         f"standard attention; model.attention={model.attention!r} computes its own.",
         "Use 'auto'.")
  errors.check_choice("model.position_embedding", model.position_embedding,
                common.POSITION_EMBEDDINGS)
  errors.check_choice("model.layer_sharing", model.layer_sharing, common.LAYER_SHARING)
  _validate_relative_attention(model)
  common.validate_model(model)
  errors.check_choice("model.dtype", model.dtype, common.DTYPES)
  errors.check_choice("model.param_dtype", model.param_dtype, common.DTYPES)
  if model.scan_layers and model.layer_sharing != "none":
    errors.fail("model.scan_layers", "scans distinct layers; it cannot be combined with "
          f"model.layer_sharing={model.layer_sharing!r}.")
  for field in ("hidden_dropout", "attention_dropout"):
    if not 0.0 <= model[field] < 1.0:
      errors.fail(f"model.{field}", f"must be in [0, 1), got {model[field]}.")

  longest = max(data.seq_length, train.long_seq_length if train.long_fraction else 0)
  if ((model.position_embedding == "absolute" or model.enhanced_mask_decoder)
      and longest + model.position_offset > model.max_position_embeddings):
    offset = (f" + model.position_offset={model.position_offset}"
              if model.position_offset else "")
    errors.fail("data.seq_length" if longest == data.seq_length else "train.long_seq_length",
          f"{longest}{offset} exceeds model.max_position_embeddings="
          f"{model.max_position_embeddings}.")
  if data.seq_length < 8:
    errors.fail("data.seq_length", f"{data.seq_length} is too short for [CLS] A [SEP] B [SEP].")
  if not 0.0 <= train.long_fraction < 1.0:
    errors.fail("train.long_fraction", f"must be in [0, 1), got {train.long_fraction}.")
  errors.check_choice("data.vocab.kind", data.vocab.kind, VOCAB_KINDS)
  errors.check_choice("data.process_split", data.process_split, ("shards", "rows"))
  errors.check_choice("data.vocab.layout", data.vocab.layout, SENTENCEPIECE_LAYOUTS)
  if not data.vocab.path.startswith("bundled:") and not files_lib.exists(data.vocab.path):
    errors.fail("data.vocab.path", f"'{data.vocab.path}' does not exist.",
          f"Train one with `python -m {VOCAB_KINDS[data.vocab.kind]} --help`.")

  if train.max_skipped_steps < 0:
    errors.fail("train.max_skipped_steps", f"must be >= 0, got {train.max_skipped_steps}.")
  if train.batch_size % train.grad_accum_steps:
    errors.fail("train.batch_size", f"{train.batch_size} is not divisible by "
          f"train.grad_accum_steps={train.grad_accum_steps}.")
  optimizer = config.optimizer
  errors.check_choice("optimizer.name", optimizer.name, tuple(optim.OPTIMIZERS))
  if optimizer.learning_rate <= 0:
    errors.fail("optimizer.learning_rate", f"must be positive, got {optimizer.learning_rate}.")
  if optimizer.warmup_steps < 0 or optimizer.warmup_steps >= train.steps:
    errors.fail("optimizer.warmup_steps", f"{optimizer.warmup_steps} must be >= 0 and below "
          f"train.steps={train.steps}.")
  if config.eval.batches < 0:
    errors.fail("eval.batches", f"must be >= 0 (0: the whole split), got {config.eval.batches}.")
  errors.check_choice("eval.best_mode", config.eval.best_mode, ("max", "min"))
  for axis in ("data", "fsdp", "tensor"):
    if config.mesh[axis] == 0 or config.mesh[axis] < -1:
      errors.fail(f"mesh.{axis}", f"must be a positive size or -1, got {config.mesh[axis]}.")
  if sum(config.mesh[a] == -1 for a in ("data", "fsdp", "tensor")) > 1:
    errors.fail("mesh", "at most one axis may be -1.")
  from encoderx import sharding  # pylint: disable=g-import-not-at-top (it imports us)
  sharding.check_rules(config.mesh.rules)
  method_lib.method_class(config.method).validate(config)
  return config
