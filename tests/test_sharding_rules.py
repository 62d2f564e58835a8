"""config.mesh.rules: the logical-axis rules as a config field, and the report of the
dimensions a mesh does not divide."""
import logging

import flax
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from encoderx import errors
from encoderx import config as config_lib, gin_config, sharding
from encoderx.train import trainer as trainer_lib
from encoderx.methods import registry as method_registry
from encoderx.data import pipeline, tasks
from encoderx.models import embeddings

ONE_DEVICE = jax.devices()[:1]


def _embedding(trainer):
  specs = trainer.state_shardings.params["encoder_model"]["embeddings"]
  return specs["word_embeddings"]["embedding"].spec


def test_default_rules_are_todays():
  config = config_lib.default_config()
  # ConfigDict sorts its keys; each logical name has one rule, so order is moot.
  assert (dict(sharding.rules_from_config(config.mesh.rules))
          == dict(sharding.LOGICAL_AXIS_RULES))


def test_a_changed_rule_changes_the_parameters_sharding(tiny_config):
  config = tiny_config()
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  config.model.vocab_size = 8008
  assert _embedding(trainer_lib.Trainer(config)) == PartitionSpec("tensor", "fsdp")
  config.mesh.rules.embed = ""
  config.mesh.rules.vocab = "data,tensor"
  assert _embedding(trainer_lib.Trainer(config)) == PartitionSpec(("data", "tensor"),
                                                                  None)


@pytest.mark.parametrize("name,value,message", [
    ("embed", "tensr",
     "mesh.rules.embed': 'tensr' is not a mesh axis (data, fsdp, tensor)"),
    ("vocab", "data,fsd", "mesh.rules.vocab': 'fsd' is not a mesh axis")])
def test_a_misspelt_mesh_axis_is_a_config_error(tiny_config, name, value, message):
  config = tiny_config()
  config.mesh.rules[name] = value
  with pytest.raises(errors.ConfigError, match=message.replace("(", r"\(")
                     .replace(")", r"\)")):
    config_lib.validate(config)


def test_an_unknown_logical_name_is_a_config_error(tiny_config):
  config = tiny_config()
  config.mesh.rules.unlock()
  config.mesh.rules.embedd = "fsdp"
  with pytest.raises(errors.ConfigError, match="mesh.rules.embedd"):
    config_lib.validate(config)


def test_an_undivided_vocabulary_is_reported(tiny_config, caplog):
  config = tiny_config()
  config.model.vocab_size = 8001  # does not split in two
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  with caplog.at_level(logging.WARNING):
    trainer = trainer_lib.Trainer(config)
  unsplit, bias = trainer.unsplit_dimensions  # the word embedding, the output bias
  assert bias.path == ".params['mlm_head']['output_bias']"
  assert (unsplit.dimension, unsplit.size, unsplit.axes, unsplit.axes_size) == (
      0, 8001, ("tensor",), 2)
  assert ("sharding: .params['encoder_model']['embeddings']['word_embeddings']"
          "['embedding']: dimension 0 (8001) does not divide over mesh axes tensor (2); "
          "it is kept whole on every device (its optimizer state too)") in caplog.text
  assert _embedding(trainer) == PartitionSpec(None, "fsdp")
  config.model.vocab_multiple = 128  # 8,001 tokens in 8,064 rows: split, nothing reported
  padded = trainer_lib.Trainer(config)
  assert not padded.unsplit_dimensions
  assert _embedding(padded) == PartitionSpec("tensor", "fsdp")
  assert padded.abstract_state.params["mlm_head"]["output_bias"].shape == (8064,)


@pytest.mark.parametrize("name", ["spanbert:tiny", "xlnet:tiny", "deberta:v3_tiny"])
def test_the_vocabulary_params_by_name_are_those_with_a_vocab_axis(tiny_config, name):
  """What export, import and --init_from resize (embeddings.is_vocabulary_param) is
  every parameter with a 'vocab' axis: the word embedding, the MLM, SBO and PLM biases,
  and DeBERTa-v3's GDES delta of the word embedding."""
  method = method_registry.build(config_lib.validate(tiny_config(name)))
  specs = flax.traverse_util.flatten_dict(flax.linen.get_partition_spec(
      jax.eval_shape(method.init, jax.random.key(0))["params"]))
  by_axis = {path for path, spec in specs.items() if "vocab" in tuple(spec)}
  assert {path for path in specs if embeddings.is_vocabulary_param(path)} == by_axis
  heads = {path[0] for path in by_axis if path[-1] == "output_bias"}
  assert heads == {"spanbert:tiny": {"mlm_head", "sbo_head"}, "xlnet:tiny": {"plm_head"},
                   "deberta:v3_tiny": {"generator"}}[name]
  if name == "deberta:v3_tiny":
    assert ("discriminator", "embedding_deltas", "word_embeddings") in by_axis


def test_altered_rules_train_as_one_device_does(tiny_config):
  config = tiny_config()
  config.model.vocab_size = 8008
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  config.mesh.rules.embed = "tensor"
  config.mesh.rules.vocab = "fsdp"
  config.mesh.rules.activation_batch = "data"
  task = tasks.register_pretraining_task(config)
  batches = pipeline.take_batches(task, "train", config.data.seq_length,
                                  config.train.batch_size, 2, seed=11)
  sharded = trainer_lib.Trainer(config)
  assert _embedding(sharded) == PartitionSpec("fsdp", "tensor")
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 1, 1
  single = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  losses = []
  for trainer in (sharded, single):
    state, step = trainer.init_state(), trainer.train_step(0)
    losses.append([])
    for batch in batches:
      state, metrics = step(state, trainer.device_batch(batch))
      losses[-1].append(float(metrics["loss"]))
  np.testing.assert_allclose(losses[0], losses[1], atol=1e-5, rtol=0)


def test_a_gin_binding_sets_a_rule():
  config = gin_config.apply(config_lib.default_config(),
                            bindings=["mesh.rules.embed = ''",
                                      "mesh.rules.mlp = 'fsdp,tensor'"])
  assert config.mesh.rules.embed == "" and config.mesh.rules.mlp == "fsdp,tensor"
  again = gin_config.apply(config_lib.default_config(),
                           bindings=[gin_config.to_gin(config)])
  assert again.to_json_best_effort() == config.to_json_best_effort()
