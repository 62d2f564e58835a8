"""Training parity with Hugging Face PyTorch: the same weights, batches, masks and
optimizer, step for step.

    trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
    torch_model = hf.hf_model(trainer.method.model_config, family, head)  # initial weights
    result = step_parity(trainer, torch_model, batches)
    result.losses      # [steps, 2]: (encoderx, Hugging Face) loss of every step
    result.grad_norms  # [steps, 2]: the global gradient norm before clipping
    result.param_diff  # max |encoderx - Hugging Face| over every weight after the last step

encoderx trains with its own train step (`Trainer.train_step`: masking inside, loss,
gradients, clipping, optimizer); Hugging Face trains the PyTorch class on the batches as
that step masks them (`Trainer.prepared_batch`: the masks are drawn once, by encoderx,
with the step's key) with labels in Hugging Face's form (-100 where nothing is
predicted), the class's own loss, `torch.nn.utils.clip_grad_norm_`, and an optimizer
built from the same `config.optimizer` (`torch_optimizer`): torch.optim.AdamW with
transformers' `get_linear_schedule_with_warmup` and the weight-decay groups of
transformers' Trainer (no decay for biases and LayerNorm modules), or for LAMB an exact
PyTorch reimplementation (`Lamb`: torch has none). The comparison script
(encoderx/tools/compare.py) trains Hugging Face with the same pieces.

A family of the pretrain method needs nothing more (a sentence head adds its HF class's
label argument to `SENTENCE_LABELS`); another method passes its own loss, conversion and
export: ELECTRA's (`electra_pair`, `electra_loss_fn`, `electra_params`,
`electra_state_dicts`) train HF's generator and discriminator with shared embeddings on
tokens sampled with the train step's own key; XLNet's (`xlnet_lm_head_model`,
`xlnet_loss_fn`) feed XLNetLMHeadModel encoderx's targets and factorization orders
(`xlnet_inputs`) and carry HF's `mems` from step to step as encoderx its memory.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np
import torch

from encoderx import trainer as trainer_lib
from encoderx.export import hf

# The HF pretraining class's argument for the sentence objective's labels.
SENTENCE_LABELS = {"BertForPreTraining": "next_sentence_label",
                   "AlbertForPreTraining": "sentence_order_label"}
IGNORED = -100  # Hugging Face's label for positions nothing is predicted at


def mlm_labels(batch: dict) -> np.ndarray:
  """[batch, length] int64: the original token at every masked position, -100 elsewhere
  (encoderx's masked_positions / masked_ids / masked_weights in HF's form)."""
  labels = np.full(batch["input_ids"].shape, IGNORED, np.int64)
  rows, slots = np.nonzero(np.asarray(batch["masked_weights"]) > 0)
  positions = np.asarray(batch["masked_positions"])[rows, slots]
  if len(set(zip(rows.tolist(), positions.tolist()))) != len(rows):
    raise ValueError("a position is masked twice; HF labels hold one target per token.")
  labels[rows, positions] = np.asarray(batch["masked_ids"])[rows, slots]
  return labels


def hf_inputs(batch: dict) -> dict:
  """A prepared (masked) encoderx batch -> the PyTorch model's keyword arguments.

  Rows must hold one sequence each (segment_ids 0 or 1): Hugging Face's attention mask
  cannot keep packed sequences apart. HF derives positions itself (from 0, or RoBERTa's
  from input_ids), which must be encoderx's `positions`."""
  segments = np.asarray(batch["segment_ids"])
  if segments.max() > 1:
    raise ValueError("rows pack several sequences; Hugging Face cannot keep them apart.")
  positions = np.asarray(batch["positions"])
  if np.any((positions != np.arange(positions.shape[1])) & (segments > 0)):
    raise ValueError("positions do not count from 0 in every row.")
  return {"input_ids": torch.tensor(np.asarray(batch["input_ids"]), dtype=torch.long),
          "attention_mask": torch.tensor(segments, dtype=torch.long),
          "token_type_ids": torch.tensor(np.asarray(batch["token_type_ids"]),
                                         dtype=torch.long)}


def pretraining_loss(torch_model, batch: dict, key=None):
  """The HF class's own loss on a prepared batch: MLM (+ NSP / SOP when the class has a
  sentence head), each a mean over its predictions, as encoderx's. (`key`: the train
  step's loss key, which this loss does not need.)"""
  del key
  kwargs = hf_inputs(batch)
  kwargs["labels"] = torch.from_numpy(mlm_labels(batch))
  sentence = SENTENCE_LABELS.get(type(torch_model).__name__)
  if sentence:
    kwargs[sentence] = torch.tensor(np.asarray(batch["sentence_label"]), dtype=torch.long)
  return torch_model(**kwargs).loss


# --- the optimizer, in PyTorch --------------------------------------------------------
def decay_groups(torch_model) -> tuple[list, list]:
  """(parameters weight decay applies to, the others): transformers' Trainer rule, no
  decay for biases and the parameters of LayerNorm modules (trainer.py
  get_decay_parameter_names); encoderx names its own (optim.decay_mask)."""
  no_decay = set()
  for module in torch_model.modules():
    if isinstance(module, torch.nn.LayerNorm):
      no_decay.update(id(p) for p in module.parameters(recurse=False))
  decay, other = [], []
  for name, parameter in torch_model.named_parameters():  # tied ones once
    (other if name.endswith("bias") or id(parameter) in no_decay else decay).append(parameter)
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


def torch_step(torch_model, optimizer, schedule, clip_norm: float, loss_fn: Callable,
               batch: dict, key=None) -> tuple[float, float]:
  """One HF training step on a prepared batch: (loss, gradient norm before clipping)."""
  optimizer.zero_grad()
  loss = loss_fn(torch_model, batch, key)
  loss.backward()
  parameters = [p for p in torch_model.parameters() if p.grad is not None]
  if clip_norm > 0:
    norm = torch.nn.utils.clip_grad_norm_(parameters, clip_norm)
  else:
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters]))
  optimizer.step()
  schedule.step()
  return float(loss.detach()), float(norm)


# --- step parity ----------------------------------------------------------------------
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


def converted_params(trainer, torch_model) -> dict:
  """The HF model's weights as the trainer's parameters (export/hf.py's rules)."""
  config = trainer.method.model_config
  head = hf.head_of_class(config.family, type(torch_model).__name__)
  params, _, _ = hf.import_state_dict(torch_model.state_dict(), config, config.family, head)
  hf.check_tree(params, trainer.abstract_state.params)
  return params


def exported_state_dicts(trainer, params, torch_model) -> tuple[dict, dict]:
  """(the trainer's parameters as the HF class's state dict, the HF model's), numpy."""
  config = trainer.method.model_config
  head = hf.head_of_class(config.family, type(torch_model).__name__)
  return (hf.to_hf(params, config, config.family, head),
          {k: v.detach().numpy() for k, v in torch_model.state_dict().items()})


def step_parity(trainer, torch_model, batches: list[dict],
                hf_loss: Callable = pretraining_loss, convert: Callable = converted_params,
                export: Callable = exported_state_dicts) -> Parity:
  """Trains encoderx (`trainer`'s train step) and `torch_model` (a HF class of the
  config's family, holding the initial weights of both) on `batches`, one step each,
  and records loss and gradient norm of both at every step and the weights at the end.

  The trainer's config must turn dropout off (the two draw different dropout masks).
  Masks are drawn by encoderx for each step (Trainer.prepared_batch) and given to HF;
  `hf_loss(torch_model, prepared_batch, loss_key)` gets the step's loss key too (the
  key the method's loss draws from, e.g. ELECTRA's samples). `convert(trainer,
  torch_model)` gives the initial parameters, `export(trainer, params, torch_model)` the
  two state dicts compared at the end.
  """
  config = trainer.config
  model_config = trainer.method.model_config
  if model_config.hidden_dropout or model_config.attention_dropout:
    raise ValueError("set model.hidden_dropout and model.attention_dropout to 0.")
  state = trainer.init_state(convert(trainer, torch_model))
  optimizer, schedule = torch_optimizer(config.optimizer, torch_model, config.train.steps)
  # Eval mode: no dropout anywhere, also where the config has no say (AlbertSOPHead's
  # classifier_dropout_prob; encoderx's sentence head has no dropout).
  torch_model.eval()
  step_fn = trainer.train_step(0)
  losses, norms = [], []
  for step, batch in enumerate(batches):
    prepared = trainer.prepared_batch(batch, step)
    _, loss_key = trainer_lib.step_keys(trainer_lib.run_rng(config.train.seed), step)
    hf_loss_value, hf_norm = torch_step(torch_model, optimizer, schedule,
                                        config.optimizer.clip_norm, hf_loss, prepared,
                                        loss_key)
    state, metrics = step_fn(state, trainer.device_batch(batch))
    metrics = jax.device_get(metrics)
    losses.append((float(metrics["loss"]), hf_loss_value))
    norms.append((float(metrics["grad_norm"]), hf_norm))
  ours, theirs = export(trainer, jax.device_get(state.params), torch_model)
  diffs = {name: float(np.abs(value - theirs[name]).max()) for name, value in ours.items()}
  return Parity(np.array(losses), np.array(norms), diffs)


# --- ELECTRA: generator and discriminator ---------------------------------------------
class ElectraPair(torch.nn.Module):
  """ElectraForMaskedLM (generator) and ElectraForPreTraining (discriminator) sharing
  one embeddings module (tokens, positions, types, LayerNorm), as ELECTRA's models and
  encoderx's rtd.embedding_sharing='shared'; each keeps its own projection."""

  def __init__(self, generator, discriminator):
    super().__init__()
    self.generator, self.discriminator = generator, discriminator
    discriminator.electra.embeddings = generator.electra.embeddings


def electra_pair(trainer) -> ElectraPair:
  """Freshly initialized HF generator and discriminator of the electra method's sizes."""
  method = trainer.method
  return ElectraPair(hf.hf_model(method.generator_config, "electra", "mlm"),
                     hf.hf_model(method.model_config, "electra", "pretraining"))


def electra_params(trainer, pair: ElectraPair) -> dict:
  method = trainer.method
  generator, _, _ = hf.import_state_dict(pair.generator.state_dict(),
                                         method.generator_config, "electra", "mlm")
  discriminator, _, _ = hf.import_state_dict(pair.discriminator.state_dict(),
                                             method.model_config, "electra", "pretraining")
  params = method.with_transferable_params({"generator": generator}, discriminator)
  params = jax.tree_util.tree_map(np.asarray, params)
  hf.check_tree(params, trainer.abstract_state.params)
  return params


def electra_state_dicts(trainer, params, pair: ElectraPair) -> tuple[dict, dict]:
  method = trainer.method
  ours = {f"generator.{k}": v for k, v in hf.to_hf(
      params["generator"], method.generator_config, "electra", "mlm").items()}
  ours.update({f"discriminator.{k}": v for k, v in hf.to_hf(
      method.transferable_params(params), method.model_config, "electra",
      "pretraining").items()})
  return ours, {k: v.detach().numpy() for k, v in pair.state_dict().items()}


def electra_loss_fn(trainer) -> Callable:
  """hf_loss of the electra method (joint training): the generator's MLM loss, then the
  discriminator's binary cross-entropy on the batch with tokens sampled from the
  generator's logits, drawn with the step's sample key as encoderx's train step draws
  them (methods/electra.py `loss`, objectives/rtd.py `sample`), weighted as the config."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from encoderx.objectives import rtd  # pylint: disable=g-import-not-at-top
  method = trainer.method
  if trainer.config.rtd.training != "joint":
    raise ValueError("electra_loss_fn follows rtd.training='joint' (one update).")

  def loss(pair: ElectraPair, batch: dict, key):
    _, sample_key, _ = jax.random.split(key, 3)
    inputs = hf_inputs(batch)
    generated = pair.generator(**inputs, labels=torch.from_numpy(mlm_labels(batch)))
    logits = np.take_along_axis(generated.logits.detach().numpy(),
                                np.asarray(batch["masked_positions"])[..., None], 1)
    sampled = rtd.sample(jnp.asarray(logits), sample_key)
    corrupted = jax.device_get(rtd.replace_with_samples(
        {k: jnp.asarray(v) for k, v in batch.items()}, sampled))
    discriminated = pair.discriminator(
        **{**inputs, "input_ids": torch.tensor(corrupted["input_ids"], dtype=torch.long)},
        labels=torch.tensor(corrupted["rtd_labels"], dtype=torch.long))
    return method.mlm_weight * generated.loss + method.rtd_lambda * discriminated.loss

  return loss


# --- XLNet: permutation masks and memory ----------------------------------------------
def xlnet_lm_head_model(trainer):
  """A freshly initialized XLNetLMHeadModel of the xlnet method's sizes, keeping the
  memory as encoderx does: the reused part of each row (reuse_len) in a cache of mem_len
  tokens, and with bi_data its second half of the rows positioned backwards."""
  method = trainer.method
  return hf.hf_model(method.model_config, "xlnet", "pretraining", bi_data=method.bi_data,
                     mem_len=method.mem_len or None,
                     reuse_len=method.plm_config.reuse_len if method.mem_len else None)


def xlnet_inputs(batch: dict) -> dict:
  """A prepared xlnet batch -> XLNetLMHeadModel's keyword arguments: perm_mask (1: may
  not see; the query stream's visibility, which the content stream widens by itself as
  HF's does), target_mapping ([batch, predictions, length] one-hot, zero for unused
  slots) and labels ([batch, predictions], -100 for unused slots)."""
  inputs = hf_inputs(batch)
  positions = np.asarray(batch["target_positions"])
  used = np.asarray(batch["target_weights"]) > 0
  mapping = np.zeros(positions.shape + (batch["input_ids"].shape[1],), np.float32)
  rows, slots = np.nonzero(used)
  mapping[rows, slots, positions[rows, slots]] = 1.0
  labels = np.where(used, np.asarray(batch["target_ids"]), IGNORED).astype(np.int64)
  inputs.update(perm_mask=torch.tensor(~np.asarray(batch["perm_visible"]),
                                       dtype=torch.float32),
                target_mapping=torch.from_numpy(mapping), labels=torch.from_numpy(labels))
  return inputs


def xlnet_loss_fn(trainer) -> Callable:
  """hf_loss of the xlnet method: XLNetLMHeadModel's own loss (the mean cross-entropy of
  the predictions, as encoderx's) on encoderx's targets and orders, with HF's `mems`
  carried from step to step (detached by HF) as encoderx carries its memory. HF's cache
  has no per-slot validity: where encoderx's memory holds invalid slots (before it
  fills) HF's is shorter, which only works while every row starts its stream together
  (step 0) and no row holds padding in its reused part."""
  method = trainer.method
  carried = {"mems": None}

  def loss(torch_model, batch: dict, key=None):
    del key
    if method.bi_data:
      half = len(batch["input_ids"]) // 2
      if list(np.asarray(batch["reversed"]) > 0) != [False] * half + [True] * half:
        raise ValueError("HF's bi_data reads the second half of the rows backwards.")
    starts = np.asarray(batch["stream_start"]) > 0
    if starts.all():
      carried["mems"] = None
    elif starts.any():
      raise ValueError("some rows start a new stream: HF's mems cannot forget per row.")
    reused = np.asarray(batch["segment_ids"])[:, :method.plm_config.reuse_len]
    if method.mem_len and (reused == 0).any():
      raise ValueError("padding in the reused part: HF's mems would attend to it.")
    outputs = torch_model(**xlnet_inputs(batch), mems=carried["mems"],
                          use_mems=bool(method.mem_len))
    carried["mems"] = outputs.mems if method.mem_len else None
    return outputs.loss

  return loss
