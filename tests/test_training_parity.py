"""Training parity: encoderx's train step and Hugging Face PyTorch, started from the same
(converted) weights and fed the same batches with the same masks, give the same loss and
gradient norm at every step and the same weights at the end
(encoderx/tools/parity/step_parity.py, on the shared PyTorch adapters of
encoderx/tools/parity/torch_adapters.py).

Tolerances (fp32, dropout off). The two compute the same sums in different orders. The
loss agrees to ~1e-7 relative (float32's resolution; observed <= 6e-7 at every step).
The gradient norm agrees to ~1e-4: the difference sits in the tied word embeddings'
gradient (8,000 x 32 entries, each a sum over every prediction of softmax probability x
transformed hidden state, in another order), whose norm differs by up to 1e-4 relative
while each entry is within 2.4e-7 and every other weight's gradient norm agrees to ~1e-6
(measured at step 0 of bert_tiny); observed <= 4e-5 for BERT and RoBERTa, <= 6e-5 for
XLNet, <= 1.5e-4 for ALBERT. Bounds: loss 1e-5 and gradient norm 5e-4 relative at every
step, weights 1e-4 absolute after 20 steps (observed ~2e-6; the steps move weights by
~1e-2, and a weight-decay mask wrong on one LayerNorm would move its scale by ~2e-3 at
the weight decay of 0.1 set here).
"""
import pathlib

import jax
import numpy as np
import pytest
import torch

from encoderx import configs
from encoderx.train import trainer as trainer_lib
from encoderx.data import pipeline
from encoderx.hf import engine
from encoderx.tools.parity import step_parity, torch_adapters, torch_optim

STEPS = 20
LOSS_RTOL, GRAD_NORM_RTOL, PARAM_ATOL = 1e-5, 5e-4, 1e-4

# (config, HF class head): BertForPreTraining (MLM + NSP, AdamW), RobertaForMaskedLM
# (MLM, positions from 2, one token type), AlbertForPreTraining (shared layers, factorized
# embedding, MLM + SOP, LAMB against torch_optim.Lamb), DebertaV2ForMaskedLM (disentangled
# attention in log buckets, whole-word n-gram masking; without the enhanced mask
# decoder, which HF's class does not have).
# RoBERTa and DeBERTa (AdamW, like BERT; their forward parity is tested on its own) are
# ModernBertForMaskedLM (rotary, a global then a local layer (a window of 64), GeGLU, no
# biases; sparse_prediction, as ModernBERT trains: the decoder runs on the masked
# positions only, the same mean) and EuroBertForMaskedLM (RMSNorm, grouped-query
# attention, SwiGLU, an untied decoder), each on rows of one document with padding
# (HF's attention mask; transformers 5 runs ModernBERT padded, it no longer unpads),
# AdamW in place of ModernBERT's StableAdamW (parity_config).
# RoBERTa and DeBERTa (AdamW, like BERT; their forward parity is tested on its own) are
# marked slow: each case costs ~30 s of CPU, mostly compiling; so do ModernBERT and
# EuroBERT (~20-30 s each).
CASES = [("bert:tiny", "pretraining"),
         pytest.param("roberta:tiny", "mlm", marks=pytest.mark.slow),
         ("albert:tiny", "pretraining"),
         pytest.param("deberta:tiny", "mlm", marks=pytest.mark.slow),
         pytest.param("modernbert:tiny", "mlm", marks=pytest.mark.slow),
         pytest.param("eurobert:tiny", "mlm", marks=pytest.mark.slow)]


def parity_config(tiny_config, name: str):
  config = tiny_config(name)
  config.model.hidden_dropout = 0.0
  config.model.attention.dropout = 0.0
  config.train.steps = STEPS
  config.optimizer.warmup_steps = 4  # then linear decay to 0 at step 20
  config.optimizer.clip_norm = 1.2  # below the first steps' gradient norms (~1.4-2.7)
  config.optimizer.weight_decay = 0.1  # large enough to show a wrong decay mask
  config.model.heads.enhanced_mask_decoder = False
  # PyTorch's side (torch_optim.torch_optimizer) has AdamW and LAMB with warmup then
  # linear decay: ModernBERT's StableAdamW on a warmup-stable-decay schedule becomes
  # AdamW on that; and one batch size (take_batches), not ModernBERT's warmup of sizes.
  if config.optimizer.name not in ("adamw", "lamb"):
    config.optimizer.name = "adamw"
  config.optimizer.schedule, config.optimizer.decouple_lr = "linear", False
  config.train.batch_size_schedule = ()
  if config.data.builder == "full_sentences":  # RoBERTa's rows may span two documents,
    config.data.builder = "doc_sentences"      # which HF's attention mask cannot separate
    config.data.packing = "greedy"  # best_fit packs several documents into a row
  return config


def side_by_side(config, head: str | None = None):
  """(step_parity's Parity, the adapter): STEPS of config's method (one device) and of
  its PyTorch adapter (torch_adapters.adapter(method, head), initialized from torch seed
  0, whose weights both start from) on the method's first STEPS training batches; torch
  on one thread (tiny models: threads only contend on a shared machine)."""
  trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
  torch.manual_seed(0)
  adapter = torch_adapters.adapter(trainer.method, head)
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    return step_parity.step_parity(trainer, adapter, train_batches(trainer, config)), adapter
  finally:
    torch.set_num_threads(threads)


def check(result: step_parity.Parity, config, name: str, loss_drop: float = 0.05,
          loss_rtol: float = LOSS_RTOL) -> None:
  loss_diff, norm_diff = result.relative(result.losses), result.relative(result.grad_norms)
  print(f"\n{name}, {STEPS} steps ({config.optimizer.name}): loss "
        f"{result.losses[0, 1]:.4f} -> {result.losses[-1, 1]:.4f}; max relative diff "
        f"loss {loss_diff.max():.1e}, grad norm {norm_diff.max():.1e}; weights max abs "
        f"diff {result.param_diff:.1e}")
  print("  per step loss rel diff", np.array2string(loss_diff, precision=1))
  print("  per step grad norm rel diff", np.array2string(norm_diff, precision=1))
  assert loss_diff.max() <= loss_rtol, loss_diff
  assert norm_diff.max() <= GRAD_NORM_RTOL, norm_diff
  worst = max(result.param_diffs, key=result.param_diffs.get)
  assert result.param_diff <= PARAM_ATOL, (worst, result.param_diff)
  # It trained, and clipped (gradient norms above clip_norm) at some steps at least.
  assert result.losses[-5:, 1].mean() < result.losses[:5, 1].mean() - loss_drop
  assert (result.grad_norms[:, 1] > config.optimizer.clip_norm).any()


def train_batches(trainer, config):
  return pipeline.take_batches(trainer.method.task(), "train", config.data.seq_length,
                               config.train.batch_size, STEPS)


@pytest.mark.parametrize("name,head", CASES)
def test_loss_grad_norm_and_weights_match_hugging_face_step_for_step(tiny_config, name,
                                                                     head):
  config = parity_config(tiny_config, name)
  result, adapter = side_by_side(config, head)
  assert isinstance(adapter, torch_adapters.Pretraining)
  check(result, config, f"{name} vs HF {type(adapter.model).__name__}")


@pytest.mark.slow
def test_electra_generator_and_discriminator_match_hugging_face_step_for_step(tiny_config):
  """ElectraForMaskedLM + ElectraForPreTraining sharing their embeddings, trained jointly
  on MLM + 50 x RTD; the discriminator reads tokens sampled with encoderx's key from
  HF's generator logits (equal to encoderx's within ~1e-6, so the draws agree)."""
  config = parity_config(tiny_config, "electra:tiny")
  result, adapter = side_by_side(config)
  assert isinstance(adapter.model, torch_adapters.ElectraPair)
  check(result, config, "electra_tiny vs HF ElectraForMaskedLM + ElectraForPreTraining")


def test_mlm_labels_put_each_target_at_its_position():
  batch = {"input_ids": np.zeros((2, 6), np.int32),
           "masked_positions": np.array([[1, 4, 0], [5, 0, 0]], np.int32),
           "masked_ids": np.array([[7, 9, 0], [3, 0, 0]], np.int32),
           "masked_weights": np.array([[1, 1, 0], [1, 0, 0]], np.float32)}
  np.testing.assert_array_equal(torch_adapters.mlm_labels(batch),
                                [[-100, 7, -100, -100, 9, -100],
                                 [-100, -100, -100, -100, -100, 3]])


def test_compare_scores_as_the_objective_does():
  """encoderx.tools.quality.pretrain_compare scores both frameworks' logits with one numpy
  function; it gives the MLM objective's own sums."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from encoderx.tools.quality import pretrain_compare  # pylint: disable=g-import-not-at-top
  from encoderx.objectives import base  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 4, 50)).astype(np.float32) * 3
  batch = {"masked_ids": rng.integers(0, 50, (3, 4)).astype(np.int32),
           "masked_weights": np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], np.float32)}
  batch["masked_ids"][1, :2] = logits[1, :2].argmax(-1)  # some right
  terms = base.classification_terms(jnp.asarray(logits), jnp.asarray(batch["masked_ids"]),
                                    jnp.asarray(batch["masked_weights"]))
  np.testing.assert_allclose(pretrain_compare.score(logits, batch),
                             [terms["loss_sum"], terms["correct"], terms["count"]], rtol=1e-5)
  assert pretrain_compare.score(logits, batch)[1] >= 2


@pytest.mark.slow
def test_xlnet_matches_hugging_face_step_for_step(tiny_config):
  """XLNetLMHeadModel fed encoderx's targets and factorization orders (perm_mask,
  target_mapping, labels), bidirectional data (HF's bi_data halves) and the memory: HF's
  `mems` carried between steps as encoderx carries its own (the reused 32 tokens of
  each row, 48 kept). The same bounds (module docstring): observed loss <= 3.4e-7,
  gradient norm <= 6e-5, weights 2.4e-6. At step 0 every weight's gradient norm agrees
  within 1e-6 (in float64); the global norms' 1e-5 is torch's float32 norm of the 8000 x
  32 embedding gradient, 2.1e-5 off its float64 value (JAX's: 1.6e-8). The memory is
  under test: fed no mems, HF's loss moves only ~2e-6 (attention is near uniform at
  init), but its gradient norm by ~2e-4 and its weights by 4e-3 within 4 steps."""
  config = parity_config(tiny_config, "xlnet:tiny")
  result, adapter = side_by_side(config)
  assert adapter.method.mem_len and adapter.method.bi_data  # both under test
  assert type(adapter.model).__name__ == "XLNetLMHeadModel"
  check(result, config, "xlnet_tiny vs HF XLNetLMHeadModel")


def test_xlnet_weight_decay_leaves_out_what_hugging_faces_trainer_does(tiny_config):
  """encoderx's decay mask (optim.decay_mask), carried to HF's names by the conversion,
  and torch_optim.decay_groups both decay exactly what transformers' Trainer decays in
  XLNetLMHeadModel: not the r_w / r_r / r_s biases, lm_loss.bias and the LayerNorms;
  mask_emb, seg_embed, the word embedding and every kernel."""
  import transformers  # pylint: disable=g-import-not-at-top
  from encoderx import optim  # pylint: disable=g-import-not-at-top
  trainer = trainer_lib.Trainer(parity_config(tiny_config, "xlnet:tiny"),
                                devices=jax.devices()[:1])
  adapter = torch_adapters.adapter(trainer.method)
  torch_model = adapter.model
  params = adapter.converted_params(trainer)
  mask = jax.tree_util.tree_map(lambda m, p: np.full(np.shape(p), m),
                                optim.decay_mask(params), params)
  ours = {name for name, value in engine.to_hf(mask, trainer.method.model_config, "xlnet",
                                               "pretraining").items() if value.all()}
  theirs = set(transformers.Trainer.get_decay_parameter_names(None, torch_model))
  assert ours == theirs - {"lm_loss.weight"}, (ours ^ theirs)  # tied: word_embedding
  decay, _ = torch_optim.decay_groups(torch_model)
  names = {id(p): name for name, p in torch_model.named_parameters()}
  assert {names[id(p)] for p in decay} == theirs - {"lm_loss.weight"}
  assert {"transformer.mask_emb", "transformer.layer.0.rel_attn.seg_embed"} <= ours
  assert not any("bias" in name or "layer_norm" in name for name in ours)


# --- fine-tuning ---------------------------------------------------------------------------
CORPORA = pathlib.Path(__file__).resolve().parent.parent.parent / "shared" / "corpora"
# method -> (corpus, training file, rows or sentences read from it)
FINE_TUNING = {"classify": ("rotten_tomatoes", "train.tsv"),
               "similarity": ("stsb", "train.tsv"), "tag": ("conll2003", "train.txt")}


def finetune_parity_config(tmp_path, method: str):
  """configs/finetune.py:METHOD on the first 200 examples of its shared corpus, a fresh
  encoder at tiny_config's sizes, dropout off (the head's too)."""
  from conftest import _tiny_config  # pylint: disable=g-import-not-at-top
  corpus, name = FINE_TUNING[method]
  source = CORPORA / corpus / name
  if not source.exists():
    pytest.skip(f"the shared corpus {source} is not there")
  text = source.read_text(encoding="utf-8")
  kept = ("\n\n".join(text.split("\n\n")[:200]) if method == "tag"
          else "\n".join(text.splitlines()[:201]))
  (tmp_path / name).write_text(kept + "\n", encoding="utf-8")
  config = configs.get(f"finetune:{method}")
  config.finetune.train_file = config.finetune.dev_file = str(tmp_path / name)
  for field in ("num_layers", "hidden_size", "num_heads", "intermediate_size"):
    config.model[field] = _tiny_config().model[field]
  config.model.hidden_dropout = config.model.attention.dropout = 0.0
  config.finetune.classifier_dropout = 0.0
  config.data.seq_length, config.train.batch_size = 32, 8
  config.train.steps = STEPS
  config.optimizer.learning_rate = 1e-3  # a fresh tiny encoder: learning shows in 20 steps
  config.optimizer.warmup_steps = 4
  config.optimizer.clip_norm = FINE_TUNING_CLIP[method]
  config.optimizer.weight_decay = 0.1
  return config


# How far the loss falls in 20 steps at least (classify: rotten_tomatoes from a fresh
# 2-layer encoder stays near ln 2; the weights' bound still shows the steps agree).
LOSS_DROP = {"classify": 0.0, "similarity": 0.05, "tag": 0.05}
# Below some steps' gradient norms (observed: classify 0.02-0.87, similarity and tag
# above their bounds in the first steps).
FINE_TUNING_CLIP = {"classify": 0.25, "similarity": 10.0, "tag": 2.0}


@pytest.mark.parametrize("method", sorted(FINE_TUNING))
def test_fine_tuning_matches_hugging_faces_task_classes_step_for_step(tmp_path, method):
  """classify against BertForSequenceClassification (2 labels), similarity against it
  with one output (problem_type='regression': MSE), tag against
  BertForTokenClassification (the 9 CoNLL tags; -100 on all but each word's first
  piece); the same bounds as pretraining's."""
  config = finetune_parity_config(tmp_path, method)
  result, adapter = side_by_side(config)
  assert isinstance(adapter, torch_adapters.FineTuning)
  check(result, config, f"{method} vs HF {type(adapter.model).__name__} "
        f"({adapter.model.config.num_labels} outputs)", LOSS_DROP[method])


def test_fine_tuning_weight_decay_leaves_out_what_hugging_faces_trainer_does(tmp_path):
  """encoderx's decay mask on a classifier (optim.decay_mask, carried to HF's names)
  decays exactly what transformers' Trainer decays in BertForSequenceClassification:
  every kernel and embedding (the pooler's and the classifier's included), no bias and
  no LayerNorm."""
  import transformers  # pylint: disable=g-import-not-at-top
  from encoderx import optim  # pylint: disable=g-import-not-at-top
  trainer = trainer_lib.Trainer(finetune_parity_config(tmp_path, "classify"),
                                devices=jax.devices()[:1])
  adapter = torch_adapters.adapter(trainer.method)
  params = adapter.converted_params(trainer)
  mask = jax.tree_util.tree_map(lambda m, p: np.full(np.shape(p), m),
                                optim.decay_mask(params), params)
  ours = {name for name, value in engine.to_hf(mask, trainer.method.model_config, "bert",
                                               "sequence_classification").items()
          if value.all()}
  theirs = set(transformers.Trainer.get_decay_parameter_names(None, adapter.model))
  assert ours == theirs, ours ^ theirs
  assert {"classifier.weight", "bert.pooler.dense.weight"} <= ours
