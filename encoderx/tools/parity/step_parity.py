"""Training parity with Hugging Face PyTorch: the same weights, batches, masks and
optimizer, step for step.

    trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
    torch.manual_seed(0)
    adapter = torch_adapters.adapter(trainer.method, head)  # HF's initial weights
    result = step_parity(trainer, adapter, batches)
    result.losses      # [steps, 2]: (encoderx, Hugging Face) loss of every step
    result.grad_norms  # [steps, 2]: the global gradient norm before clipping
    result.param_diff  # max |encoderx - Hugging Face| over every weight after the last step

encoderx trains with its own train step (`Trainer.train_step`: masking inside, loss,
gradients, clipping, optimizer); Hugging Face trains the method's PyTorch counterpart
(encoderx/tools/parity/torch_adapters.py, strict: the same inputs and loss or an error) on the
batches as that step masks them (`Trainer.prepared_batch`: the masks are drawn once, by
encoderx, with the step's key), the adapter's loss (given the step's loss key, from which
ELECTRA's samples are drawn as encoderx draws them), `torch.nn.utils.clip_grad_norm_`,
and an optimizer built from the same `config.optimizer` (torch_optim.py
`torch_optimizer`: AdamW with transformers' schedule and decay groups, or LAMB). The
comparison script (encoderx/tools/quality/pretrain_compare.py) trains Hugging Face with
the same pieces.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from encoderx.train import feeding, trainer as trainer_lib
from encoderx.tools.parity import torch_optim

# The methods whose head has a dropout of its own (finetune.classifier_dropout).
FINE_TUNING = ("classify", "similarity", "tag")


@dataclasses.dataclass
class Parity:
  losses: np.ndarray  # [steps, 2]: encoderx, Hugging Face
  grad_norms: np.ndarray  # [steps, 2]
  param_diffs: dict[str, float]  # HF weight name -> max abs difference after the last step

  @property
  def param_diff(self) -> float:
    return max(self.param_diffs.values())

  def relative(self, values: np.ndarray) -> np.ndarray:
    return np.abs(values[:, 0] - values[:, 1]) / np.abs(values[:, 1])


def step_parity(trainer, adapter, batches: list[dict]) -> Parity:
  """Trains encoderx (`trainer`'s train step) and `adapter.model` (the method's HF
  counterpart, torch_adapters.adapter, whose initial weights both start from) on
  `batches`, one step each, and records loss and gradient norm of both at every step and
  the weights at the end.

  The trainer's config must turn dropout off (the two draw different dropout masks).
  Masks are drawn by encoderx for each step (Trainer.prepared_batch) and given to HF
  (`adapter.inputs`); `adapter.loss(inputs, loss_key)` gets the step's loss key too (the
  key the method's loss draws from, e.g. ELECTRA's samples). The initial parameters are
  `adapter.converted_params(trainer)`; `adapter.state_dicts` gives the two state dicts
  compared at the end.
  """
  config = trainer.config
  model_config = trainer.method.model_config
  if model_config.hidden_dropout or model_config.attention.dropout:
    raise ValueError("set model.hidden_dropout and model.attention.dropout to 0.")
  if config.method in FINE_TUNING and config.finetune.classifier_dropout:
    raise ValueError("set finetune.classifier_dropout to 0.")
  if not adapter.strict:
    raise ValueError("step parity needs a strict adapter (torch_adapters.adapter(...)).")
  torch_model = adapter.model
  state = trainer.init_state(adapter.converted_params(trainer))
  optimizer, schedule = torch_optim.torch_optimizer(config.optimizer, torch_model,
                                                    config.train.steps)
  # Eval mode: no dropout anywhere, also where the config has no say (AlbertSOPHead's
  # classifier_dropout_prob; encoderx's sentence head has no dropout).
  torch_model.eval()
  step_fn = trainer.train_step(0)
  losses, norms = [], []
  for step, batch in enumerate(batches):
    prepared = trainer.prepared_batch(batch, step)
    _, loss_key = trainer_lib.step_keys(trainer_lib.run_rng(config.train.seed), step)
    hf_loss, hf_norm = torch_optim.torch_step(
        torch_model, optimizer, schedule, config.optimizer.clip_norm,
        lambda: adapter.loss(adapter.inputs(prepared), loss_key))  # pylint: disable=cell-var-from-loop
    state, metrics = step_fn(state, trainer.device_batch(feeding.host_batch(
        trainer, batch, config.data.seq_length)))  # as the loop feeds it
    metrics = jax.device_get(metrics)
    losses.append((float(metrics["loss"]), hf_loss))
    norms.append((float(metrics["grad_norm"]), hf_norm))
  ours, theirs = adapter.state_dicts(trainer, jax.device_get(state.params))
  diffs = {name: float(np.abs(value - theirs[name]).max()) for name, value in ours.items()}
  return Parity(np.array(losses), np.array(norms), diffs)
