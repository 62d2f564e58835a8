"""RoBERTa: configs, the position offset, dynamic masking, pretraining (parity with
Hugging Face: test_roberta_parity.py)."""
import jax
import numpy as np
import pytest

from encoderx import errors
from encoderx import config as config_lib
from encoderx import train
from encoderx import configs
from encoderx.data import bpe_vocabulary, tasks
from encoderx.train import trainer as trainer_lib

ONE_DEVICE = jax.devices()[:1]


def test_configs_have_the_paper_sizes_and_recipe():
  base = config_lib.validate(configs.get("roberta:base"))
  assert (base.model.num_layers, base.model.hidden_size, base.model.num_heads) == (12, 768, 12)
  assert (base.model.vocab_size, base.model.embeddings.max_positions) == (50265, 514)
  assert (base.model.embeddings.position_offset, base.model.embeddings.type_vocab_size) == (2, 1)
  assert base.data.vocab.kind == "byte_bpe" and base.data.builder == "full_sentences"
  assert base.data.seq_length == 512 and tuple(base.objective.names) == ("mlm",)
  assert (base.train.batch_size, base.train.steps) == (8192, 500_000)
  assert base.train.batch_size % base.train.grad_accum_steps == 0
  optimizer = base.optimizer
  assert (optimizer.learning_rate, optimizer.b2, optimizer.eps) == (6e-4, 0.98, 1e-6)
  assert (optimizer.weight_decay, optimizer.warmup_steps) == (0.01, 24_000)
  tiny = config_lib.validate(configs.get("roberta:tiny"))
  vocabulary = tasks.build_vocabulary(tiny.data.vocab)
  assert vocabulary.vocab_size == 8000 and vocabulary.pad_id == 1
  assert tiny.model.embeddings.position_offset == vocabulary.pad_id + 1  # Hugging Face's numbering
  assert tiny.data.seq_length + 2 == tiny.model.embeddings.max_positions


def test_positions_plus_offset_must_fit_the_table():
  config = configs.get("roberta:base")
  config.model.embeddings.max_positions = 512
  with pytest.raises(errors.ConfigError,
                     match=r"data\.seq_length.*512 \+ model\.embeddings\.position_offset=2 "
                           r"exceeds model\.embeddings\.max_positions=512"):
    config_lib.validate(config)
  config.model.embeddings.position_offset = -1
  with pytest.raises(errors.ConfigError, match=r"model\.embeddings\.position_offset"):
    config_lib.validate(config)
  pairs = configs.get("roberta:tiny")  # one token type cannot embed segment B
  pairs.data.builder, pairs.objective.names = "sentence_pairs", ("mlm", "nsp")
  with pytest.raises(errors.ConfigError, match=r"model\.embeddings\.type_vocab_size"):
    config_lib.validate(pairs)


# --- training ---------------------------------------------------------------------------
def _small(config):
  config.model.hidden_size, config.model.intermediate_size = 64, 128
  config.data.seq_length, config.model.embeddings.max_positions = 64, 66
  config.data.shuffle_buffer, config.data.document_pool = 200, 50
  config.objective.mlm.max_predictions = 10
  config.train.batch_size = config.eval.batch_size = 8
  config.eval.batches = 2
  config.checkpoint.async_save = False
  return config


def _austen_rows(vocabulary, lines, length):
  """<s> line </s> rows, padded with <pad>: a batch without the example builder."""
  rows = [[vocabulary.cls_id] + vocabulary.encode(line)[:length - 2] + [vocabulary.sep_id]
          for line in lines]
  input_ids = np.full([len(rows), length], vocabulary.pad_id, np.int32)
  for index, row in enumerate(rows):
    input_ids[index, :len(row)] = row
  real = input_ids != vocabulary.pad_id
  return {"input_ids": input_ids, "token_type_ids": np.zeros_like(input_ids),
          "segment_ids": real.astype(np.int32),
          "positions": np.where(real, np.arange(length), 0).astype(np.int32)}


def test_masks_are_dynamic_per_step_and_repeat_for_the_same_step(austen_lines):
  config = _small(configs.get("roberta:tiny"))
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  vocabulary = trainer.method.vocabulary
  assert isinstance(vocabulary, bpe_vocabulary.ByteLevelBpeVocabulary)
  # prepared_batch is the train step's masking: same function, same run key.
  np.testing.assert_array_equal(np.asarray(trainer.init_state().rng),
                                np.asarray(trainer_lib.run_rng(config.train.seed)))
  batch = _austen_rows(vocabulary, austen_lines(8), config.data.seq_length)
  # Step 37: the same example one epoch later (with 37 batches an epoch).
  prepared = {step: trainer.prepared_batch(batch, step) for step in (0, 1, 37)}
  again = trainer.prepared_batch(batch, 0)
  for name in prepared[0]:
    np.testing.assert_array_equal(prepared[0][name], again[name], err_msg=name)
  for step in (1, 37):
    assert np.mean(prepared[0]["masked_positions"] != prepared[step]["masked_positions"]) > 0.5
    assert (prepared[0]["input_ids"] != prepared[step]["input_ids"]).any()
  for masked in prepared.values():
    chosen = np.take_along_axis(batch["input_ids"], masked["masked_positions"], axis=1)
    weights = masked["masked_weights"] > 0
    assert weights.sum() > 8 and not set(chosen[weights].tolist()) & set(
        vocabulary.special_ids)
    assert (masked["input_ids"] == vocabulary.mask_id).sum() > 0.5 * weights.sum()


def _pretrain(config, tmp_path):
  config.train.steps, config.train.log_every = 60, 1
  config.optimizer.learning_rate, config.optimizer.warmup_steps = 3e-3, 5
  return train.run(config, str(tmp_path), show_progress=False, devices=ONE_DEVICE)


def test_roberta_tiny_pretrains_a_few_steps_and_the_loss_falls(tmp_path):
  result = _pretrain(_small(configs.get("roberta:tiny")), tmp_path)
  history = result["history"]
  assert history[-1]["step"] == 60 and "nsp_loss" not in history[0]
  last = np.mean([h["mlm_loss"] for h in history[-10:]])
  assert last < history[0]["mlm_loss"] - 1.5, (history[0]["mlm_loss"], last)
  assert set(result["eval"]) >= {"mlm_loss", "mlm_accuracy", "mlm_perplexity"}
