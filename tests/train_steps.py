"""Batches of a pretraining config and the losses of a Trainer's steps over them, shared
by the tests that compare runs step by step (test_training, test_flash_attention)."""
from encoderx.data import pipeline, tasks


def pretraining_batches(config, count, batch_size=None):
  """The first `count` training batches of the config's pretraining Task (seed 11)."""
  task = tasks.register_pretraining_task(config)
  return pipeline.take_batches(task, "train", config.data.seq_length,
                               batch_size or config.train.batch_size, count, seed=11)


def step_losses(trainer, batches):
  """(the loss of each of the trainer's steps over `batches` from a fresh state, the last
  state)."""
  state = trainer.init_state()
  step = trainer.train_step(0)
  losses = []
  for batch in batches:
    state, metrics = step(state, trainer.device_batch(batch))
    losses.append(float(metrics["loss"]))
  return losses, state
