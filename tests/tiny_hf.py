"""A tiny BERT directory as Hugging Face saves one (random weights, the bundled
wordpiece vocabulary), for tests that start from `hf:DIR` (test_glue, test_retrieval)."""
import pathlib
import shutil

from encoderx.data import resources


def save_tiny_bert(directory: pathlib.Path, model_class, **fields) -> str:
  """Saves `model_class` (e.g. transformers.BertModel) of a 2 x 32 BertConfig (with
  `fields`, e.g. num_labels=1) into `directory` with vocab.txt and a lower-casing
  tokenizer config; returns "hf:DIR"."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  vocab = resources.resolve("bundled:austen-wordpiece")
  torch.manual_seed(0)
  model_class(transformers.BertConfig(
      vocab_size=sum(1 for _ in open(vocab, encoding="utf-8")), hidden_size=32,
      num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
      max_position_embeddings=64, **fields)).save_pretrained(directory)
  shutil.copy(vocab, directory / "vocab.txt")
  (directory / "tokenizer_config.json").write_text('{"do_lower_case": true}')
  return f"hf:{directory}"
