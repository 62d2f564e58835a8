"""How each process feeds its part of a global batch: which rows its input pipeline reads
(data.process_split: each process its own shard of the data, or with `rows` every process
the whole global stream) and how they become global arrays on the run's mesh."""
from __future__ import annotations

import jax
import numpy as np
import seqio

from encoderx import errors, sharding
from encoderx.train import trainer as trainer_lib


def by_rows(config) -> bool:
  """data.process_split=rows: every process reads the whole global stream."""
  return config.data.process_split == "rows" and jax.process_count() > 1


def shard_info(config) -> seqio.ShardInfo | None:
  """The data shard this process reads (None: all of it)."""
  if jax.process_count() == 1 or by_rows(config):
    return None
  return seqio.ShardInfo(index=jax.process_index(), num_shards=jax.process_count())


def local_batch_size(config, global_batch: int) -> int:
  """The batch size this process's iterator yields (rows mode: the global one)."""
  if global_batch % jax.process_count():
    raise errors.ConfigError(
        f"batch size {global_batch} is not divisible by the {jax.process_count()} hosts.")
  return global_batch if by_rows(config) else global_batch // jax.process_count()


def device_batch(trainer: trainer_lib.Trainer, batch: dict[str, np.ndarray],
                 whole: bool = False):
  """This process's batch as global arrays; in rows mode, or with `whole`, `batch` is the
  global batch, of which this process keeps the rows its devices hold."""
  if whole or by_rows(trainer.config):
    rows = trainer.process_rows(len(next(iter(batch.values()))))
    batch = {name: value[rows] for name, value in batch.items()}
  return trainer.device_batch(batch)


def host_batch(trainer: trainer_lib.Trainer, batch: dict[str, np.ndarray], seq_length: int,
               phase_index: int = 0) -> dict[str, np.ndarray]:
  """The pipeline's batch as the phase's method trains on it (Method.host_batch: length
  buckets, packed texts), its rows a multiple of the data-parallel devices."""
  return trainer.methods[phase_index].host_batch(
      batch, seq_length, sharding.data_parallel_size(trainer.mesh))
