"""XLNet-Large (Yang et al. 2019): 24 layers, 1024 hidden, 16 heads, 4096 inner; the
paper's pretraining recipe (its appendix A.3): batch 8192 rows of 512 tokens for 500K
steps, Adam at lr 4e-4 after 40K warmup steps then linear decay, epsilon 1e-6, weight
decay 0.01, dropout 0.1 (none inside the feed-forward), K = 6; data and memory as
configs/xlnet_base.py. Layers are scanned and rematerialized, compute is bfloat16.
The memory (method state) holds 8192 x 24 x 384 x 1024 values, 155 GB in bfloat16,
sharded with the batch over the data-parallel devices.
"""
from encoderx.configs import xlnet_base


def get_config():
  config = xlnet_base.get_config()
  config.model.hidden_size = 1024
  config.model.num_layers = 24
  config.model.num_heads = 16
  config.model.intermediate_size = 4096
  config.model.scan_layers = True
  config.model.remat = True
  config.optimizer.learning_rate = 4e-4
  config.optimizer.warmup_steps = 40_000
  config.train.steps = 500_000
  config.train.batch_size = 8192
  return config
