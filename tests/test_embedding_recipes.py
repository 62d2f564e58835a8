"""configs/embedding.py's recipe for each family (bert, modernbert, eurobert): each trains
2 steps from a tiny Hugging Face model of its family and exports a sentence-transformers
directory that SentenceTransformer loads with the recipe's pooling and prompts, giving
encoderx's embeddings."""
import json

import jax
import numpy as np
import pytest

from encoderx import configs, embed, export, train

sentence_transformers = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")
ONE_DEVICE = jax.devices()[:1]
TEXTS = ["A man is playing a guitar.", "A woman is slicing an onion.",
         "The cat sat on the mat by the door."]
# sentence-transformers' 1_Pooling/config.json field each recipe's pooling sets.
POOLING_MODES = {"mean": "pooling_mode_mean_tokens", "first_token": "pooling_mode_cls_token"}


def tiny_base(family: str, directory) -> str:
  """hf:DIR of a tiny model of `family` as transformers saves one, with its tokenizer."""
  import tiny_hf  # pylint: disable=g-import-not-at-top
  if family == "bert":
    return tiny_hf.save_tiny_bert(directory, transformers.BertModel)
  tiny_hf.save_tiny_family(family, str(directory))
  return f"hf:{directory}"


def recipe_config(family: str, tmp_path):
  """The family's recipe from a tiny model: 2 steps of 8 rows at length 32 (chunks of 4
  where the recipe caches gradients), evaluated and saved at step 2."""
  from finetune_cases import pairs_file, stsb_subset  # pylint: disable=g-import-not-at-top
  config = configs.get(f"embedding:{family}")
  config.init_from = tiny_base(family, tmp_path / "base")
  config.finetune.train_file = pairs_file(tmp_path, rows=16)
  config.finetune.dev_file = stsb_subset(tmp_path, "dev.tsv", 16)
  config.data.seq_length = 32
  config.train.steps, config.train.batch_size = 2, 8
  if config.contrastive.cache_chunk_size:
    config.contrastive.cache_chunk_size = 4
  config.optimizer.warmup_steps = 1
  config.train.log_every = 1
  config.eval.every_steps = config.checkpoint.every_steps = 2
  config.eval.batch_size = 16
  config.checkpoint.async_save = False
  return config


@pytest.mark.parametrize("family", ["bert", "modernbert", "eurobert"])
def test_each_familys_recipe_trains_and_exports_to_sentence_transformers(family, tmp_path):
  config = recipe_config(family, tmp_path)
  pooling, prompts = config.finetune.pooling, dict(config.contrastive.prompts)
  result = train.run(config, str(tmp_path / "run"), show_progress=False, devices=ONE_DEVICE)
  assert result["step"] == 2 and np.isfinite(result["history"][-1]["contrastive_loss"])

  output = tmp_path / "st"
  export.export_sentence_transformers(str(tmp_path / "run"), str(output))
  model = sentence_transformers.SentenceTransformer(str(output), device="cpu")
  assert type(model[0].auto_model).__name__.lower().startswith(family)
  settings = json.loads((output / "1_Pooling" / "config.json").read_text())
  assert settings[POOLING_MODES[pooling]] and sum(
      v for k, v in settings.items() if k.startswith("pooling_mode")) == 1, settings
  assert {k: v for k, v in model.prompts.items() if v} == {k: v for k, v in prompts.items() if v}

  embedder = embed.Embedder(str(tmp_path / "run"))  # the run's own pooling and prompts
  for name in ("query", "document"):
    np.testing.assert_allclose(model.encode(TEXTS, prompt_name=name if prompts[name] else None),
                               embedder(TEXTS, prompt_name=name), atol=1e-5)
