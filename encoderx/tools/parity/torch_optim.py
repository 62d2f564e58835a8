"""encoderx's optimizers in PyTorch, and one Hugging Face training step.

    optimizer, schedule = torch_optimizer(config.optimizer, torch_model, total_steps)
    loss, grad_norm = torch_step(torch_model, optimizer, schedule, clip_norm,
                                 lambda: adapter.loss(adapter.inputs(prepared), key))

`torch_optimizer` is what the parity tests and compare train Hugging Face with: built from
the same `config.optimizer` as encoderx's (optim.py): torch.optim.AdamW with transformers'
`get_linear_schedule_with_warmup` and the weight-decay groups of transformers' Trainer (no
decay for biases and LayerNorm modules), or for LAMB an exact PyTorch reimplementation
(`Lamb`: torch has none). `adamw` is the bench's: plain torch.optim.AdamW over every
parameter at the config's rate, what a PyTorch pretraining step does by default.
"""
from __future__ import annotations

from typing import Callable

import torch


def decay_groups(torch_model) -> tuple[list, list]:
  """(parameters weight decay applies to, the others): transformers' Trainer rule
  (Trainer.get_decay_parameter_names: not biases, not nn.LayerNorm modules' parameters,
  not parameters named for a norm, e.g. EuroBERT's RMSNorm weights), and not encoderx's
  optim.NOT_DECAYED (a contrastive run's logit_scale, which open_clip leaves undecayed
  too); encoderx names its own (optim.decay_mask)."""
  import transformers  # pylint: disable=g-import-not-at-top
  from encoderx import optim  # pylint: disable=g-import-not-at-top
  decayed = set(transformers.Trainer.get_decay_parameter_names(None, torch_model))
  decay, other = [], []
  for name, parameter in torch_model.named_parameters():  # tied ones once
    kept = name in decayed and name.rpartition(".")[2] not in optim.NOT_DECAYED
    (decay if kept else other).append(parameter)
  return decay, other


class Lamb(torch.optim.Optimizer):
  """LAMB in PyTorch, step for step what encoderx's optim.lamb (optax) computes: Adam's
  bias-corrected update, + weight_decay x w, times the trust ratio ||w|| / ||update|| (1
  when either is 0), decay and ratio only in groups with `adapt`, times the learning rate.

  As google-research/albert lamb_optimizer.py LAMBOptimizer.apply_gradients (and You et
  al. 2019, Algorithm 2), except that ALBERT's code leaves out Adam's bias correction
  (which, under the trust ratio, weighs the decay term; outside it, for biases and
  LayerNorms, scales the first steps by sqrt(1 - b2^t) / (1 - b1^t)).
  """

  def __init__(self, groups: list[dict], lr: float, betas: tuple[float, float],
               eps: float):
    super().__init__(groups, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0,
                                  adapt=False))

  @torch.no_grad()
  def step(self, closure=None):
    del closure
    for group in self.param_groups:
      (b1, b2), eps = group["betas"], group["eps"]
      for p in group["params"]:
        state = self.state[p]
        if not state:
          state.update(count=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
        state["count"] += 1
        count, m, v = state["count"], state["m"], state["v"]
        m.mul_(b1).add_(p.grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
        update = (m / (1 - b1 ** count)) / ((v / (1 - b2 ** count)).sqrt() + eps)
        ratio = 1.0
        if group["adapt"]:
          update = update + group["weight_decay"] * p
          w_norm, u_norm = p.norm(), update.norm()
          ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm,
                              torch.ones_like(w_norm))
        p.sub_(group["lr"] * ratio * update)


def torch_optimizer(optimizer_config, torch_model, total_steps: int):
  """(optimizer, LambdaLR schedule) for the HF model from encoderx's `config.optimizer`:
  the same peak rate, warmup then linear decay to 0 at total_steps
  (transformers.get_linear_schedule_with_warmup, = optim.learning_rate_schedule), betas,
  eps, weight decay and decay groups."""
  import transformers  # pylint: disable=g-import-not-at-top
  decay, other = decay_groups(torch_model)
  c = optimizer_config
  if c.name == "adamw":
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": c.weight_decay},
         {"params": other, "weight_decay": 0.0}],
        lr=c.learning_rate, betas=(c.b1, c.b2), eps=c.eps)
  elif c.name == "lamb":
    optimizer = Lamb([{"params": decay, "weight_decay": c.weight_decay, "adapt": True},
                      {"params": other, "weight_decay": 0.0, "adapt": False}],
                     lr=c.learning_rate, betas=(c.b1, c.b2), eps=c.eps)
  else:
    raise ValueError(f"no PyTorch optimizer for optimizer.name={c.name!r}")
  schedule = transformers.get_linear_schedule_with_warmup(optimizer, c.warmup_steps,
                                                          total_steps)
  return optimizer, schedule


def adamw(optimizer_config, parameters) -> torch.optim.AdamW:
  """The bench's optimizer: torch.optim.AdamW over `parameters` with the config's rate,
  betas, eps and weight decay on every parameter (PyTorch has no LAMB: ALBERT's PyTorch
  step runs AdamW too)."""
  c = optimizer_config
  return torch.optim.AdamW(parameters, lr=c.learning_rate, betas=(c.b1, c.b2), eps=c.eps,
                           weight_decay=c.weight_decay)


def torch_step(torch_model, optimizer, schedule, clip_norm: float,
               compute_loss: Callable[[], torch.Tensor]) -> tuple[float, float]:
  """One HF training step: (the loss `compute_loss()` gives, the gradient norm before
  clipping), then clipping to `clip_norm` (none if 0), the optimizer's step and the
  schedule's."""
  optimizer.zero_grad()
  loss = compute_loss()
  loss.backward()
  parameters = [p for p in torch_model.parameters() if p.grad is not None]
  if clip_norm > 0:
    norm = torch.nn.utils.clip_grad_norm_(parameters, clip_norm)
  else:
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters]))
  optimizer.step()
  schedule.step()
  return float(loss.detach()), float(norm)
