"""encoderx/tools/parity/torch_adapters.py: the one set of PyTorch counterparts of the training
methods, found by method (and family), that the bench, compare and the parity tests share
(tests/test_training_parity.py holds them to encoderx's step; here: the registry, and
that each adapter the bench uses trains on a bench batch)."""
import types

import jax
import numpy as np
import pytest
import torch

from encoderx import config as config_lib
from encoderx.data import pipeline
from encoderx.methods import registry
from encoderx.train import trainer as trainer_lib
from encoderx.tools.speed import bench_models, train_steps
from encoderx.tools.parity import torch_adapters

# The bench's models with a PyTorch column, and the adapter and HF class each gets.
BENCH_ADAPTERS = [("bert_tiny", "Pretraining", "BertForPreTraining"),
                  ("roberta_tiny", "Pretraining", "RobertaForMaskedLM"),
                  ("albert_tiny", "Pretraining", "AlbertForPreTraining"),
                  ("deberta_tiny", "Pretraining", "DebertaV2ForMaskedLM"),
                  ("electra_tiny", "Electra", "ElectraPair"),
                  ("xlnet_tiny", "XLNet", "XLNetLMHeadModel"),
                  ("modernbert_tiny", "Pretraining", "ModernBertForMaskedLM"),
                  ("eurobert_tiny", "Pretraining", "EuroBertForMaskedLM")]


def _method(model_name: str, batch_size: int = 4):
  config = bench_models.build_config(model_name, batch_size)
  return config, registry.build(config_lib.validate(config))


def _trainer(config):
  return trainer_lib.Trainer(config, devices=jax.devices()[:1])


def _stand_in(name: str, family: str):
  return types.SimpleNamespace(name=name, model_config=types.SimpleNamespace(family=family),
                               config=None)


def test_a_method_without_an_adapter_is_named_with_the_ones_there_are():
  with pytest.raises(torch_adapters.NoAdapterError) as raised:
    torch_adapters.adapter(_stand_in("qa", "bert"))
  message = str(raised.value)
  assert "no PyTorch adapter for method 'qa' with model family 'bert'" in message
  assert all(f"{name} (" in message
             for name in ("pretrain", "electra", "xlnet", "classify", "similarity", "tag"))
  # A method that spans families has adapters for some: DeBERTa-v3's RTD has none.
  with pytest.raises(torch_adapters.NoAdapterError, match="'electra' with model family "
                     "'deberta-v2'"):
    torch_adapters.adapter_class(_stand_in("electra", "deberta-v2"))


def test_spanbert_has_no_adapter_and_the_bench_says_why(capsys):
  _, method = _method("spanbert_tiny")
  with pytest.raises(torch_adapters.NoAdapterError, match="no SpanBERT pretraining class"):
    torch_adapters.adapter(method)
  assert "SpanBERT" in train_steps.torch_refusal(method)
  assert train_steps.torch_refusal(_method("bert_tiny")[1]) is None


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


@pytest.mark.parametrize("model_name,adapter_name,hf_class", BENCH_ADAPTERS)
def test_each_bench_adapter_trains_on_a_bench_batch(model_name, adapter_name, hf_class,
                                                   capfd):
  """The bench's way (not strict, batches as encoderx's `prepare` makes them, train
  mode): a finite loss at two steps in a row (XLNet's second with the first's mems), and
  gradients for the weights. The models' special-token ids are the vocabulary's."""
  trainer = _trainer(bench_models.build_config(model_name, 4))
  config, method = trainer.config, trainer.method
  batches = pipeline.take_batches(bench_models.pretraining_task(config), "train",
                                  config.data.seq_length, 4, 2)
  torch.manual_seed(0)
  adapter = torch_adapters.adapter(method, strict=False)
  assert type(adapter).__name__ == adapter_name
  assert type(adapter.model).__name__ == hf_class
  adapter.model.train()
  for prepared in train_steps.prepared_batches(trainer, batches):
    adapter.model.zero_grad()
    loss = adapter.loss(adapter.inputs(prepared))
    assert loss.ndim == 0 and np.isfinite(loss.item()) and loss.item() > 0
    loss.backward()
  with_gradient = [p for p in adapter.model.parameters() if p.grad is not None]
  assert len(with_gradient) > 0.9 * len(list(adapter.model.parameters()))
  if model_name in ("modernbert_tiny", "eurobert_tiny"):  # SDPA, no token types
    assert adapter.model.config._attn_implementation == "sdpa"  # pylint: disable=protected-access
    assert "token_type_ids" not in adapter.inputs(prepared).kwargs
  if model_name == "modernbert_tiny":
    assert adapter.model.config.sparse_prediction
  if model_name == "eurobert_tiny":  # the run's vocabulary's, not the released model's
    assert adapter.model.config.mask_token_id == method.vocabulary.mask_id < 8000
    assert "mask_token_id" not in capfd.readouterr().err  # transformers' warning
  if model_name == "xlnet_tiny":
    assert adapter.mems is not None and len(adapter.mems) == method.model_config.num_layers
  if model_name == "electra_tiny":  # one embeddings module, counted once
    pair = adapter.model
    assert pair.discriminator.electra.embeddings is pair.generator.electra.embeddings
    assert adapter.num_params < sum(p.numel() for model in (pair.generator,
                                                             pair.discriminator)
                                    for p in model.parameters())


def test_electra_samples_with_the_train_steps_key_when_strict(tiny_config):
  """Given the step's loss key, ELECTRA's discriminator reads the tokens encoderx's own
  sampler draws (objectives/rtd.py), the same for the same key."""
  trainer = _trainer(tiny_config("electra:tiny"))
  config, method = trainer.config, trainer.method
  (batch,) = pipeline.take_batches(method.task(), "train", config.data.seq_length,
                                   config.train.batch_size, 1)
  (prepared,) = train_steps.prepared_batches(trainer, [batch])
  torch.manual_seed(0)
  adapter = torch_adapters.adapter(method)
  adapter.model.eval()
  inputs = adapter.inputs(prepared)
  key = jax.random.key(3)
  first, again = adapter.loss(inputs, key), adapter.loss(inputs, key)
  assert np.isfinite(first.item()) and first.item() == pytest.approx(again.item())
