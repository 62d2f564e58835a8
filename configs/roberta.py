"""RoBERTa (Liu et al., 2019): BERT's encoder with byte-level BPE, positions from 2 (after
the padding id, as fairseq and Hugging Face number them: 512 tokens need 514 position
rows), one token type, and MLM only (no NSP) on FULL-SENTENCES rows: packed whole
sentences crossing document boundaries (`data.builder = "full_sentences"`), masks drawn
anew at every step (dynamic masking).

    --config=configs/roberta.py:VARIANT

tiny  base's family choices at bert tiny's size (2 x 128) with the bundled 8,000-token
      byte-level BPE vocabulary, on the bundled text: a few minutes on two CPU cores.
base  12 layers, 768 hidden, 12 heads; a 50,265-token vocabulary (GPT-2's). The paper's
      recipe (Table 9): batch 8K sequences for 500K steps, Adam with peak lr 6e-4, beta2
      0.98, eps 1e-6, weight decay 0.01, 24K warmup steps then linear decay, no gradient
      clipping, dropout 0.1. The 8,192-sequence batch is reached by accumulation:
      `train.grad_accum_steps = 4` adds up the gradients of 4 micro-batches of 2,048
      sequences, 32 per chip on a v4-128 slice (64 chips). The update equals one step on
      the whole batch (tested); on a smaller slice raise grad_accum_steps to keep 32
      sequences per chip (16 on a v4-32). Point data.files (or data.tfds_name) at your
      corpus and data.vocab.path at a directory holding roberta-base's vocab.json and
      merges.txt (or one trained with `python -m encoderx.data.bpe_vocabulary`).
"""
from encoderx.configs import common
from encoderx.data import resources

VARIANTS = ("tiny", "base")


def get_config(arg: str = "tiny"):
  variant, _ = common.parse_arg(arg, VARIANTS)
  config = common.default_config()
  config.model.family = "roberta"
  config.model.vocab_size = 50265
  config.model.vocab_multiple = 128  # 50,304 rows: splits over a tensor axis
  config.model.hidden_size = 768
  config.model.num_layers = 12
  config.model.num_heads = 12
  config.model.intermediate_size = 3072
  config.model.embeddings.max_positions = 514
  config.model.embeddings.position_offset = 2
  config.model.embeddings.type_vocab_size = 1
  config.model.norm.eps = 1e-5
  config.model.dtype = "bfloat16"
  config.data.vocab.kind = "byte_bpe"
  config.data.vocab.path = resources.BUNDLED_BPE_VOCAB  # replace with roberta-base's files
  config.data.builder = "full_sentences"
  config.data.seq_length = 512
  config.objective.names = ("mlm",)
  config.objective.mlm.max_predictions = 80  # 15% of 510 tokens is 77
  config.train.steps = 500_000
  config.train.batch_size = 8192
  config.train.grad_accum_steps = 4
  config.optimizer.learning_rate = 6e-4
  config.optimizer.warmup_steps = 24_000
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.98
  config.optimizer.eps = 1e-6
  config.optimizer.weight_decay = 0.01
  config.optimizer.clip_norm = 0.0
  if variant == "tiny":
    common.bundled_demo(common.tiny_sizes(config))
    config.model.vocab_size = 0  # the vocabulary's: 8,000
    config.model.vocab_multiple = 1  # unpadded, as the recorded reference runs
    config.model.embeddings.max_positions = 130  # 128 + position_offset 2
    config.model.dtype = "float32"
    config.optimizer.b2 = 0.98
    config.optimizer.clip_norm = 1.0
    config.train.grad_accum_steps = 1
  return config
