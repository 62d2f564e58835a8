"""XLNet (Yang et al., 2019): permutation language modelling (method 'xlnet') with
two-stream relative attention over a memory of the previous segments, SentencePiece,
GELU, no absolute positions or token types in the input.

    --config=configs/xlnet.py:VARIANT

tiny   base's recipe at bert tiny's sizes and length 128 on the bundled text with the bundled
       SentencePiece vocabulary: rows whose first 64 tokens continue the previous step's, a
       memory of 96 tokens, orders permuting blocks of 64, 22 prediction slots (1/6 of 128),
       bidirectional data; bert tiny's optimizer and schedule.
base   12 layers, 768 hidden, 12 heads, 3072 inner. XLNet's pretraining recipe (zihangdai/
       xlnet README and train.py / data_utils.py flags): rows of 512 tokens whose first 256
       continue the row of the step before (reuse_len), a memory of 384 tokens per layer,
       factorization orders permuting blocks of 256 tokens (perm_size), the last 1/6 of each
       order predicted (K = 6, 85 predictions per row) as spans of 1 to 5 words,
       bidirectional data (half the rows read backwards), a 32,000-piece vocabulary,
       dropout 0.1, Adam with epsilon 1e-6 and weight decay 0.01, linear decay; batch and
       schedule BERT-base's (256 rows for 1M steps, lr 1e-4 after 10k warmup steps), the
       setting of the paper's XLNet-Base comparisons with BERT. Point data.vocab.path at a
       32,000-piece model from `python -m encoderx.data.sentencepiece_vocabulary --size
       32000 --cased`.
large  24 layers, 1024 hidden, 16 heads, 4096 inner; the paper's recipe (appendix A.3):
       batch 8192 rows of 512 tokens for 500K steps, Adam at lr 4e-4 after 40K warmup steps
       then linear decay, K = 6; data and memory as base. Layers are scanned and
       rematerialized, compute is bfloat16. The memory (method state) holds 8192 x 24 x 384
       x 1024 values, 155 GB in bfloat16, sharded with the batch over the data-parallel
       devices.
"""
from encoderx.configs import bert, common
from encoderx.data import resources

VARIANTS = ("tiny", "base", "large")


def use_xlnet(config):
  """The model fields and method every XLNet shares."""
  config.method = "xlnet"
  config.model.family = "xlnet"  # Hugging Face's XLNetLMHeadModel on export
  config.model.attention.variant = "two_stream_relative"
  config.model.embeddings.position = "none"  # relative positions, in the attention
  config.model.embeddings.type_vocab_size = 0  # segments enter the attention only
  config.model.embeddings.layer_norm = False
  config.data.vocab.kind = "sentencepiece"
  config.data.vocab.path = resources.BUNDLED_SENTENCEPIECE_VOCAB  # replace with a 32k model
  return config


def get_config(arg: str = "tiny"):
  variant, _ = common.parse_arg(arg, VARIANTS)
  if variant == "tiny":
    config = use_xlnet(bert.get_config("tiny"))
    plm = config.objective.plm
    plm.num_predict = 22
    plm.reuse_len, plm.mem_len, plm.perm_size = 64, 96, 64
    plm.bi_data = True
    return config
  config = use_xlnet(common.default_config())
  config.model.vocab_size = 32000
  config.model.vocab_multiple = 128  # 32,000 = 250 x 128: no padding rows needed
  config.model.hidden_size = 768
  config.model.num_layers = 12
  config.model.num_heads = 12
  config.model.intermediate_size = 3072
  config.model.dtype = "bfloat16"
  config.data.vocab.lower_case = False  # xlnet-base-cased
  config.data.seq_length = 512
  config.data.document_pool = 10_000  # documents per document set (memory restarts)
  plm = config.objective.plm
  plm.partial_prediction_k, plm.num_predict, plm.max_span_words = 6, 85, 5
  plm.reuse_len, plm.mem_len, plm.perm_size = 256, 384, 256
  plm.bi_data = True
  config.optimizer.learning_rate = 1e-4
  config.optimizer.warmup_steps = 10_000
  config.optimizer.eps = 1e-6
  config.optimizer.weight_decay = 0.01
  config.train.steps = 1_000_000
  config.train.batch_size = 256
  if variant == "large":
    common.large_sizes(config)
    config.optimizer.learning_rate = 4e-4
    config.optimizer.warmup_steps = 40_000
    config.train.steps = 500_000
    config.train.batch_size = 8192
  return config
