"""Tiny model directories as Hugging Face saves them, for tests that start from `hf:DIR`:
a BERT (random weights, the bundled wordpiece vocabulary; test_glue, test_retrieval) and
a ModernBERT or EuroBERT with a fast tokenizer of its bundled vocabulary (test_export,
test_embedding_recipes)."""
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


# Tiny models of the families that ship tokenizer.json, as transformers initializes them:
# ModernBERT's second layer local (a window of 16), EuroBERT's two heads sharing one
# key-value head; the thetas of the tiny configs, which a rotary run keeps (a context
# extension sets its own). The token ids are the bundled vocabulary's.
def modernbert_config(vocabulary, **changes):
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.ModernBertConfig(**{**dict(
      vocab_size=vocabulary.vocab_size, hidden_size=32, intermediate_size=64,
      num_hidden_layers=3, num_attention_heads=2, local_attention=16,
      global_attn_every_n_layers=2, max_position_embeddings=128, initializer_range=0.2,
      global_rope_theta=10_000.0, local_rope_theta=10_000.0,  # modernbert:tiny's (phase 1)
      pad_token_id=vocabulary.pad_id, bos_token_id=vocabulary.cls_id,
      eos_token_id=vocabulary.sep_id, cls_token_id=vocabulary.cls_id,
      sep_token_id=vocabulary.sep_id), **changes})


def eurobert_config(vocabulary, **changes):
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.EuroBertConfig(**{**dict(
      vocab_size=vocabulary.vocab_size, hidden_size=32, intermediate_size=64,
      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
      max_position_embeddings=128, initializer_range=0.2, rope_theta=250_000.0,
      pad_token_id=vocabulary.pad_id, bos_token_id=vocabulary.cls_id,
      eos_token_id=vocabulary.sep_id, mask_token_id=vocabulary.mask_id), **changes})


SAVED = {"modernbert": ("ModernBertForMaskedLM", modernbert_config),
         "eurobert": ("EuroBertForMaskedLM", eurobert_config)}


def save_tiny_family(family: str, directory: str, **changes):
  """Writes a tiny model of the family (perturbed) and a fast tokenizer of its bundled
  vocabulary into `directory` with transformers' save_pretrained; returns the vocabulary."""
  from encoderx import configs  # pylint: disable=g-import-not-at-top
  from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
  from encoderx.hf import tokenizer_files  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from export_checks import perturbed  # pylint: disable=g-import-not-at-top
  hf_class, hf_config = SAVED[family]
  vocabulary = tasks.VOCABULARIES["byte_bpe"](configs.get(f"{family}:tiny").data.vocab)
  torch.manual_seed(0)
  perturbed(getattr(transformers, hf_class)(hf_config(vocabulary, **changes))
            ).save_pretrained(directory)
  names = tokenizer_files.TOKENIZER_JSON_LAYOUTS[vocabulary.layout]
  transformers.PreTrainedTokenizerFast(
      tokenizer_object=tokenizer_files.fast_tokenizer(vocabulary),
      **{names[role]: token for role, token in vocabulary.ROLES.items()}
  ).save_pretrained(directory)
  return vocabulary
