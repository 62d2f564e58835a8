"""ELECTRA-Base (Clark et al., 2020): BERT-base's encoder as the discriminator, trained to
detect the tokens a generator a third its width replaced.

The paper's recipe (Table 6; google-research/electra configure_pretraining.py, whose
commented-out "base" settings these are): discriminator 12 layers / 768 hidden / 12 heads /
FFN 3072 with 768-wide embeddings; generator of the same depth at 1/3 the width (256
hidden, 4 heads, FFN 1024: HF's electra-base-generator), sharing the embeddings and their
LayerNorm (it projects them to 256); sequences of 512 tokens throughout, at most
int((0.15 + 0.005) x 512) = 79 masked; loss MLM + 50 x BCE; AdamW at lr 2e-4 with 10k
warmup steps then linear decay, batch 256 for 766k steps (the released "Base++" ran 4M);
bf16 compute. See configs/electra_small.py for the rest of the recipe.
"""
from encoderx.configs import electra_small


def get_config():
  config = electra_small.get_config()
  config.rtd.generator_width = 1 / 3
  config.model.embedding_size = 768
  config.model.hidden_size = 768
  config.model.num_heads = 12
  config.model.intermediate_size = 3072
  config.model.dtype = "bfloat16"
  config.data.seq_length = 512
  config.objective.mlm.max_predictions = 79
  config.optimizer.learning_rate = 2e-4
  config.train.steps = 766_000
  config.train.batch_size = 256
  return config
