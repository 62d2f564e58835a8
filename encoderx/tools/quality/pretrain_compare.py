"""Equal-budget comparison: encoderx and Hugging Face PyTorch trained on the identical
batch stream of a pretraining config for N steps, scored on the same held-out batches.

    python -m encoderx.tools.quality.pretrain_compare --config=configs/bert.py:tiny \
        --steps=600 --seeds=0,1,2 [--config.<field>=...] [--same_init] [--output=compare.json]

For each seed: the config's batch stream (train.seed = seed) masked by encoderx at every
step (Trainer.prepared_batch, the train step's own masks) trains encoderx (its train
step) and the family's HF pretraining class (the pretrain method's PyTorch adapter,
encoderx/tools/parity/torch_adapters.py: its own loss; torch_optim.py: the same optimizer
settings, clipping and schedule; the same dropout, in train mode). Each starts from its
own initialization (seeded), or with --same_init both from HF's, converted. Held out:
config.eval.batches batches of the validation split, masked once with a fixed key; both
models' MLM logits at the masked positions are scored by the same code (`score`): loss
(mean cross-entropy) and accuracy. Reported per framework: mean and spread (std over
seeds, min, max) of held-out MLM loss and accuracy, and training wall time (the first
step, with compilation, apart from the rest). CPU timings need a quiet machine.
"""
from __future__ import annotations

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from encoderx.train import trainer as trainer_lib
from encoderx.data import pipeline
from encoderx.tools.parity import torch_adapters, torch_optim

HELD_OUT_SEED = 1234  # the key of the held-out masks, the same for every run


def held_out_batches(trainer) -> list[dict]:
  """config.eval.batches validation batches, masked once (numpy)."""
  config = trainer.config
  batches = pipeline.take_batches(
      trainer.method.task(), "validation", config.data.seq_length,
      trainer.evaluation_batch_size(config.data.seq_length), config.eval.batches, seed=0)
  key = jax.random.key(HELD_OUT_SEED)
  prepare = jax.jit(trainer.method.prepare)
  return [jax.device_get(prepare({k: jnp.asarray(v) for k, v in b.items()},
                                 jax.random.fold_in(key, i)))
          for i, b in enumerate(batches)]


def score(logits: np.ndarray, batch: dict) -> tuple[float, float, float]:
  """(loss sum, correct, count) of MLM logits [batch, predictions, vocab] at a prepared
  batch's masked positions."""
  logits = np.asarray(logits, np.float64)
  targets, weights = np.asarray(batch["masked_ids"]), np.asarray(batch["masked_weights"])
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  loss = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
  correct = logits.argmax(-1) == targets
  return float((loss * weights).sum()), float((correct * weights).sum()), float(weights.sum())


def encoderx_logits(trainer, params, batch: dict) -> np.ndarray:
  outputs = trainer.method.model.apply({"params": params},
                                       {k: jnp.asarray(v) for k, v in batch.items()})
  return np.asarray(outputs["mlm_logits"])


def hf_logits(torch_model, batch: dict) -> np.ndarray:
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    outputs = torch_model(**torch_adapters.hf_inputs(batch))
  logits = getattr(outputs, "prediction_logits", None)
  logits = (outputs.logits if logits is None else logits).numpy()
  return np.take_along_axis(logits, np.asarray(batch["masked_positions"])[..., None], 1)


def evaluate(logits_fn, batches: list[dict]) -> dict[str, float]:
  totals = np.sum([score(logits_fn(b), b) for b in batches], axis=0)
  return {"mlm_loss": totals[0] / totals[2], "mlm_accuracy": totals[1] / totals[2]}


def run_seed(config, seed: int, steps: int, same_init: bool, head: str | None = None
             ) -> dict[str, dict]:
  """Trains both on `steps` batches of seed `seed`; their held-out metrics and times."""
  import torch  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  config.train.seed, config.train.steps = seed, steps
  trainer = trainer_lib.Trainer(config)
  torch.manual_seed(seed)
  adapter = torch_adapters.adapter(trainer.method, head)
  torch_model = adapter.model
  state = trainer.init_state(adapter.converted_params(trainer) if same_init else None)
  batches = pipeline.take_batches(trainer.method.task(), "train", config.data.seq_length,
                                  config.train.batch_size, steps, seed=seed)
  held_out = held_out_batches(trainer)
  prepared = [trainer.prepared_batch(b, step) for step, b in enumerate(batches)]

  step_fn, times = trainer.train_step(0), {}
  start = time.perf_counter()
  for step, batch in enumerate(batches):
    state, metrics = step_fn(state, trainer.device_batch(batch))
    if step == 0:
      jax.block_until_ready(metrics)
      first = time.perf_counter()
  jax.block_until_ready(state.params)
  times["encoderx"] = (first - start, time.perf_counter() - first)

  optimizer, schedule = torch_optim.torch_optimizer(config.optimizer, torch_model, steps)
  torch_model.train()
  start = time.perf_counter()
  for step, batch in enumerate(prepared):
    torch_optim.torch_step(torch_model, optimizer, schedule, config.optimizer.clip_norm,
                           lambda: adapter.loss(adapter.inputs(batch)))  # pylint: disable=cell-var-from-loop
    if step == 0:
      first = time.perf_counter()
  times["hf"] = (first - start, time.perf_counter() - first)
  torch_model.eval()

  params = jax.device_get(state.params)
  results = {"encoderx": evaluate(lambda b: encoderx_logits(trainer, params, b), held_out),
             "hf": evaluate(lambda b: hf_logits(torch_model, b), held_out)}
  for name, (first_step, rest) in times.items():
    results[name].update(first_step_seconds=first_step, other_steps_seconds=rest)
  return results


def summarize(per_seed: list[dict]) -> dict:
  """{framework: {metric: {mean, std, min, max}}} over seeds."""
  summary = {}
  for framework in per_seed[0]:
    summary[framework] = {}
    for metric in per_seed[0][framework]:
      values = np.array([r[framework][metric] for r in per_seed])
      summary[framework][metric] = dict(mean=float(values.mean()), std=float(values.std()),
                                        min=float(values.min()), max=float(values.max()))
  return summary


def report(summary: dict, steps: int, seeds: list[int]) -> str:
  lines = [f"{steps} steps, seeds {seeds}: mean (std, min..max) over seeds"]
  for framework, metrics in summary.items():
    cells = [f"{metric} {s['mean']:.4f} ({s['std']:.4f}, {s['min']:.4f}..{s['max']:.4f})"
             for metric, s in metrics.items()]
    lines.append(f"  {framework:9s} " + "; ".join(cells))
  return "\n".join(lines)


def main(argv) -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags_ = flags.FLAGS
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {' '.join(argv[1:])}")
  seeds = [int(s) for s in flags_.seeds.split(",")]
  config = flags_.config
  per_seed = []
  for seed in seeds:
    per_seed.append(run_seed(config, seed, flags_.steps, flags_.same_init))
    print(f"seed {seed}: {json.dumps(per_seed[-1])}", flush=True)
  summary = summarize(per_seed)
  print(report(summary, flags_.steps, seeds))
  if flags_.output:
    with open(flags_.output, "w", encoding="utf-8") as f:
      json.dump({"steps": flags_.steps, "seeds": seeds, "same_init": flags_.same_init,
                 "per_seed": per_seed, "summary": summary}, f, indent=2)
    print(f"wrote {flags_.output}")


def cli() -> None:
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from encoderx import cli  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", None, "A pretraining config file.",
                                  lock_config=True)
  flags.DEFINE_integer("steps", 600, "Train steps of each run.")
  flags.DEFINE_string("seeds", "0,1,2", "Comma-separated seeds (data order, masks, init).")
  flags.DEFINE_bool("same_init", False, "Start encoderx from HF's initial weights.")
  flags.DEFINE_string("output", "", "Also write the results as JSON here.")
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  sys.exit(cli())
