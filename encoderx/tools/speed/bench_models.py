"""The bench's models (MODELS: a name -> a config of configs/ and the sizes it changes),
their FLOPs per token, and their data: the input pipeline's speed and the example
builders' padding."""
from __future__ import annotations

import gc
import math
import time

from encoderx import config as config_lib
from encoderx import configs
from encoderx.data import packing
from encoderx.methods import registry as method_registry
from encoderx.tools.speed import flops as flops_lib

SEQ_LENGTH = 128
# ModernBERT-base's model sizes (configs/modernbert.py SIZES, answerdotai/ModernBERT-base).
MODERNBERT_BASE = dict(num_layers=22, hidden_size=768, num_heads=12, intermediate_size=1152,
                       attention=dict(window=128), vocab_size=50368)
PIPELINE_MIN_BATCHES = 40  # timed pipeline batches; more if the train steps need more

# Model name -> (its config, `family:variant` of configs/, the model fields it changes).
# Which PyTorch model stands beside it is the method's adapter (torch_adapters.py).
MODELS = {
    "bert_tiny": ("bert:tiny", {}),
    "bert_small": ("bert:tiny", dict(num_layers=4, hidden_size=512, num_heads=8,
                                     intermediate_size=2048)),
    # BERT-Mini's sizes (4 x 256): the model of the 600-step real-run comparison.
    "bert_mini": ("bert:tiny", dict(num_layers=4, hidden_size=256, num_heads=4,
                                    intermediate_size=1024)),
    "roberta_tiny": ("roberta:tiny", {}),
    "albert_tiny": ("albert:tiny", {}),
    "spanbert_tiny": ("spanbert:tiny", {}),
    "deberta_tiny": ("deberta:tiny", {}),
    "electra_tiny": ("electra:tiny", {}),
    # ELECTRA-Small's sizes (12 x 256, 4 heads, FFN 1024; embeddings 128 wide) on the
    # bundled vocabulary, and a BERT of the same sizes (the paper's BERT-Small; Hugging
    # Face's BERT has no narrower embeddings): what replaced-token detection costs.
    "electra_small": ("electra:tiny", dict(num_layers=12, hidden_size=256, num_heads=4,
                                           intermediate_size=1024, embeddings=dict(size=128))),
    "bert_electra_small": ("bert:tiny", dict(num_layers=12, hidden_size=256, num_heads=4,
                                             intermediate_size=1024)),
    "xlnet_tiny": ("xlnet:tiny", {}),
    # The modern encoders at tiny size (their configs' own settings, in float32), and
    # ModernBERT-base's sizes (22 x 768, 12 heads, GeGLU of 1,152, a window of 128 in
    # two layers of three, its 50,368-token table) on tiny's data, at 128 and 1,024
    # tokens, at the batch a 2-core, 24 GB host holds beside PyTorch's (BATCH_SIZES).
    "modernbert_tiny": ("modernbert:tiny", {}),
    "eurobert_tiny": ("eurobert:tiny", {}),
    "modernbert_base": ("modernbert:tiny", MODERNBERT_BASE),
    "modernbert_base_1024": ("modernbert:tiny", MODERNBERT_BASE),
}
# Models at another length than SEQ_LENGTH.
LENGTHS = {"modernbert_base_1024": 1024}
DEFAULT_MODELS = tuple(MODELS)
# The most a model runs at (2,048 tokens a step: ModernBERT-base at 1,024 tokens and
# batch 2 holds about 13 GB with PyTorch's model beside it); the others at --batch_size.
BATCH_SIZES = {"modernbert_base": 16, "modernbert_base_1024": 2}


def batch_size(model_name: str, requested: int) -> int:
  """The bench's batch for `model_name`: `requested` (--batch_size), at most its
  BATCH_SIZES entry."""
  return min(requested, BATCH_SIZES.get(model_name, requested))


def build_config(model_name: str, batch_size: int, seq_length: int | None = None):
  """The config of the bench's `model_name` at `seq_length` (default: its LENGTHS entry
  or SEQ_LENGTH): one batch size, no schedule of sizes."""
  spec, model_fields = MODELS[model_name]
  config = configs.get(spec)
  for field, value in model_fields.items():
    if isinstance(value, dict):  # a group's fields (model.attention.window): the rest stay
      config.model[field].update(value)
    else:
      config.model[field] = value
  if seq_length is None and model_name in LENGTHS:
    seq_length = LENGTHS[model_name]
    mlm = config.objective.mlm  # as many predictions per token as at the config's length
    mlm.max_predictions = math.ceil(mlm.max_predictions * seq_length /
                                    config.data.seq_length)
  seq_length = seq_length or SEQ_LENGTH
  config.data.seq_length = seq_length
  config.model.embeddings.max_positions = max(config.model.embeddings.max_positions,
                                             seq_length)
  config.train.batch_size = batch_size
  config.train.batch_size_schedule = ()
  return config


def model_flops_per_token(config, method, scores_every_position: bool = False) -> float:
  """The step's model FLOPs per token (encoderx/tools/speed/flops.py) for the method's sizes:
  the MLM head on the config's predictions per row, or on every position (Hugging Face's
  MLM heads but for ModernBERT's sparse prediction, which scores the masked positions:
  counted, as encoderx's, at the config's predictions, at most what it scores); XLNet's
  on its predictions either way (its target mapping)."""
  seq_length = config.data.seq_length
  if config.method == "xlnet":
    predictions = config.objective.plm.num_predict
  else:
    predictions = seq_length if scores_every_position else (
        config.objective.mlm.max_predictions)
  return flops_lib.training_flops_per_token(
      method.model_config, seq_length, predictions,
      getattr(method, "generator_config", None),
      span_boundary="sbo" in config.objective.names)


# --- data -------------------------------------------------------------------------------
# The input pipeline (seqio, tensorflow) is imported where batches are made, not with this
# module: the bench's rows on recorded batches run without it (gpu_bench.py).
def pretraining_task(config):
  """The Task the config's method trains on (XLNet's row streams for method 'xlnet')."""
  if config.method != "pretrain":
    return method_registry.build(config_lib.validate(config)).task()
  from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
  return tasks.register_pretraining_task(config)


def training_batches(config, count: int) -> list[dict]:
  """The first `count` training batches of the config's Task, at its data.seq_length and
  train.batch_size."""
  from encoderx.data import pipeline  # pylint: disable=g-import-not-at-top
  return pipeline.take_batches(pretraining_task(config), "train", config.data.seq_length,
                               config.train.batch_size, count)


def measure_pipeline(config, num_batches: int) -> tuple[float, float, list[dict]]:
  """(seconds to the first batch, examples/s after it, the batches pulled)."""
  from encoderx.data import pipeline  # pylint: disable=g-import-not-at-top
  task = pretraining_task(config)
  batches = pipeline.BatchIterator(task, "train", config.data.seq_length,
                                   config.train.batch_size, seed=0)
  try:
    start = time.perf_counter()
    pulled = [next(batches)]
    first_seconds = time.perf_counter() - start
    start = time.perf_counter()
    pulled += [next(batches) for _ in range(num_batches)]
    examples_per_second = num_batches * config.train.batch_size / (
        time.perf_counter() - start)
  finally:
    batches.close(wait=True)  # the next epoch may be opening in the background
  del batches
  gc.collect()  # frees tf.data's iterators, so no prefetch thread runs in the timings
  return first_seconds, examples_per_second, pulled


PADDING_BUILDERS = {"sentence_pairs": ("mlm", "nsp"), "full_sentences": ("mlm",),
                    "doc_sentences": ("mlm",)}


def measure_padding(lengths=(128, 512), num_batches: int = 8) -> list[dict]:
  """Share of padding per example builder and length, on the bundled corpus:
  {"builder", "padding_at_<length>": fraction}."""
  rows = []
  for builder, objectives in PADDING_BUILDERS.items():
    row = {"builder": builder}
    for length in lengths:
      config = configs.get("bert:tiny")
      config.data.builder, config.objective.names = builder, objectives
      config.data.seq_length = length
      config.train.batch_size = 16
      pulled = training_batches(config, num_batches)
      row[f"padding_at_{length}"] = float(packing.padding_fraction(pulled))
    rows.append(row)
  return rows
