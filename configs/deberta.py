"""DeBERTa (He et al., 2021), the v2 architecture: disentangled attention (content->content
plus c2p and p2c relative terms) over log-bucketed relative positions, absolute positions
only in the enhanced mask decoder before the MLM head, no token types, LayerNorm eps 1e-7,
SentencePiece with DeBERTa's special pieces, MLM over whole-word n-grams (n <= 3) on
packed rows of whole sentences. DeBERTa-v3 trains the same encoder by replaced-token
detection.

    --config=configs/deberta.py:VARIANT

tiny     bert tiny's sizes and schedule (2 x 128, 1,000 steps of 32 x 128) with DeBERTa's
         model and data choices: relative positions in log buckets (64 rows each side,
         distances beyond 32 shrunk up to 128: base's 256 / 512 at this length's scale) and
         the bundled SentencePiece vocabulary with DeBERTa's layout (cased).
base     microsoft/DeBERTa's experiments/language_model/deberta_base.json (as released for
         DeBERTa-v3-base, whose discriminator is this encoder): 12 layers, 768 hidden, 12
         heads, FFN 3072, 256 log buckets up to 512, position terms projected by the
         content key/query projections (share_att_key), a 128,100-row SentencePiece
         vocabulary (deberta-v3's spm.model: 128,000 pieces, [MASK] after them). The recipe
         of its mlm.sh deberta-base: 80 predictions per 512-token row, Adam (lr 1e-4, beta2
         0.999, eps 1e-6, weight decay 0.01, clipping at 1.0), 10k warmup steps then linear
         decay, batch 256 for 1M steps. Point data.vocab.path at deberta-v3's spm.model (or
         one from `python -m encoderx.data.sentencepiece_vocabulary --layout deberta
         --cased`).
v3_tiny  tiny's encoder as the discriminator, trained as v3_base is.
v3_base  DeBERTa-v3-base ("DeBERTaV3: Improving DeBERTa using ELECTRA-Style Pre-Training
         with Gradient-Disentangled Embedding Sharing"): base's encoder trained by
         replaced-token detection (method 'electra') with microsoft/DeBERTa's RTD settings
         (apps/tasks/rtd_task.py, experiments/language_model/rtd.sh): a generator of half
         the discriminator's depth at the same width, loss MLM + rtd_lambda 10 x BCE,
         gradient-disentangled embedding sharing (the discriminator's word embedding is
         stop_gradient(the generator's) + its own delta, initialized at zero), decoupled
         training (the generator's update, then the discriminator's on the batch the
         generator corrupted, each with its own optimizer state). The generator keeps the
         enhanced mask decoder; the discriminator's replaced-token head does not use it.
"""
from encoderx.configs import bert, common
from encoderx.data import resources

VARIANTS = ("tiny", "base", "v3_tiny", "v3_base")


def deberta_choices(config):
  """What makes a config DeBERTa (v2): its attention, positions, vocabulary and MLM."""
  config.model.family = "deberta-v2"
  config.model.attention.variant = "disentangled"
  config.model.embeddings.position = "none"
  config.model.heads.enhanced_mask_decoder = True
  config.model.embeddings.type_vocab_size = 0
  config.model.norm.eps = 1e-7
  config.data.vocab.kind = "sentencepiece"
  config.data.vocab.layout = "deberta"
  config.data.vocab.path = resources.BUNDLED_DEBERTA_SENTENCEPIECE_VOCAB
  config.data.vocab.lower_case = False
  config.data.vocab.strip_accents = False
  config.data.builder = "full_sentences"
  config.objective.names = ("mlm",)
  config.objective.mlm.unit = "ngram"  # DeBERTa's mlm.sh: --max_ngram 3
  return config


def use_deberta_v3(config):
  """DeBERTa-v3's replaced-token detection on a DeBERTa config."""
  config.method = "electra"
  config.objective.names = ("mlm",)
  config.rtd.generator_depth = 0.5
  config.rtd.generator_width = 1.0
  config.rtd.rtd_lambda = 10.0
  config.rtd.embedding_sharing = "gdes"
  config.rtd.training = "decoupled"
  return config


def get_config(arg: str = "tiny"):
  variant, _ = common.parse_arg(arg, VARIANTS)
  size = variant.removeprefix("v3_")
  if size == "tiny":
    config = deberta_choices(bert.get_config("tiny"))
    config.model.attention.position_buckets = 64
    config.model.attention.max_relative_positions = 128
    config.objective.mlm.max_predictions = 24  # 15% of 128 plus room for the last n-gram
  else:
    config = deberta_choices(common.default_config())
    config.model.vocab_size = 128100
    config.model.vocab_multiple = 128  # 128,128 rows: splits over a tensor axis
    config.model.hidden_size = 768
    config.model.num_layers = 12
    config.model.num_heads = 12
    config.model.intermediate_size = 3072
    config.model.embeddings.max_positions = 512
    config.model.attention.relative_terms = ("c2p", "p2c")
    config.model.attention.position_buckets = 256
    config.model.attention.max_relative_positions = 512
    config.model.attention.share_att_key = True
    config.model.dtype = "bfloat16"
    config.data.seq_length = 512
    config.objective.mlm.max_predictions = 80
    config.train.steps = 1_000_000
    config.train.batch_size = 256
    config.optimizer.learning_rate = 1e-4
    config.optimizer.warmup_steps = 10_000
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 0.01
    config.optimizer.clip_norm = 1.0
  return use_deberta_v3(config) if variant.startswith("v3_") else config
