"""Embedding models (method `contrastive`): an encoder trained on (anchor, positive[,
negatives]) rows by sentence-transformers' MultipleNegativesRankingLoss over the global
batch (docs/guides/embeddings.md):

    python -m encoderx.train \
        --config=configs/embedding.py:VARIANT[,data=DATA_DIR][,retrieval=BEIR_DIR] \
        --workdir=runs/embedding --init_from=hf:MODEL_DIR   # or a pretraining work directory

DATA_DIR holds train.tsv (columns anchor, positive and optionally negative or
negative_1, negative_2 ...; or set finetune.train_file to a .jsonl file with those keys)
and dev.tsv, STS pairs with columns score, text_a, text_b (e.g. ../shared/corpora/stsb's
dev.tsv), scored by the Spearman correlation of their cosines, which keeps the best
checkpoint. BEIR_DIR, a retrieval set in BEIR's layout (contrastive.dev_retrieval, its
dev split), is ranked at each evaluation too, and its nDCG@10 keeps the best checkpoint
instead.

tiny    the tiny model's sizes (2 layers, 128 wide), 50 steps of 32 rows at length 32:
        a demonstration on two CPU cores.
mnrl    from a released encoder (e.g. --init_from=hf:all-MiniLM-L6-v2), mean pooling,
        scale 20, AdamW at 2e-5 with 10% warmup, batch 128 at length 128 (256 texts a
        step, 127 in-batch negatives each plus the hard negatives), best dev Spearman kept.
cached  mnrl at a global batch of 4,096 rows with gradient caching in chunks of 32
        (contrastive.cache_chunk_size, sentence-transformers' CachedMNRL default): the
        activations of 32 rows at a time; the dev set in batches of 64. From
        all-MiniLM-L6-v2 at 64 tokens it trains in 3.3 GB on a CPU host (the
        embeddings guide); on a pod, raise the chunk to a multiple of the devices.
crops   mnrl on pairs made from unlabelled text instead of train.tsv: two random crops
        of each document (Contriever; contrastive.pairs_from="crops"), new each epoch,
        of the bundled Austen chapters (set data.files, data.document_marker for yours).

A recipe for each family, from that family's released encoder (--init_from=hf:DIR; the
run takes its sizes and tokenizer), with what the family's published embedding models use:

bert        sentence-transformers' own BERT-family models (all-MiniLM-L6-v2,
            all-mpnet-base-v2: their model cards and 1_Pooling/config.json): mean pooling,
            normalized, no prompts, length 128, AdamW at 2e-5 with warmup, the mnrl recipe.
modernbert  nomic-ai/modernbert-embed-base (its model card and sentence-transformers files):
            mean pooling, normalized, the prompts "search_query: " before queries and
            "search_document: " before documents; length 512; AdamW at 8e-5, the rate
            ModernBERT's own sentence-transformers example (examples/train_st.py of
            AnswerDotAI/ModernBERT, as we recall it: not re-checked here) trains with, over a
            batch of 512 rows by gradient caching in chunks of 32 (CachedMNRL's mini-batch).
            Alibaba-NLP/gte-modernbert-base pools the first token ([CLS]) instead and uses
            no prompts: --config.finetune.pooling=first_token and empty prompts give it.
eurobert    no embedding model of EuroBERT's authors is published; transformers' EuroBERT
            classifier pools 'bos', 'mean' or 'late' (per-token logits averaged, default),
            and only 'bos' and 'mean' give one sentence vector. Mean is chosen: EuroBERT
            is pretrained by MLM alone, so its first token (<|begin_of_text|>) was never
            trained to summarize the text, and mean is sentence-transformers' default.
            Length 512, AdamW at 2e-5, no prompts, a batch of 512 rows by gradient caching
            in chunks of 32.

Sources: model cards and sentence-transformers files of the models named, read through a
search of stored pages (Alibaba-NLP/gte-modernbert-base's card: last_hidden_state[:, 0];
keras-hub's ModernBertTextEmbedder page: modernbert-embed-base mean + normalized with
search_query/search_document prompts, gte-modernbert-base [CLS]); transformers'
models/eurobert/configuration_eurobert.py (classifier_pooling).
"""
import os

from encoderx.configs import common
from encoderx.data import resources

VARIANTS = ("tiny", "mnrl", "cached", "crops", "bert", "modernbert", "eurobert")


def get_config(arg: str = "mnrl"):
  variant, options = common.parse_arg(arg, VARIANTS, data="", retrieval="")
  config = common.default_config()
  config.method = "contrastive"
  if options["data"]:
    config.finetune.train_file = os.path.join(options["data"], "train.tsv")
    config.finetune.dev_file = os.path.join(options["data"], "dev.tsv")
  config.finetune.text_column = "text_a"  # the dev file's STS pairs
  config.finetune.text_pair_column = "text_b"
  config.finetune.label_column = "score"
  config.finetune.pooling = "mean"
  config.contrastive.scale = 20.0
  config.data.shuffle_buffer = 100_000
  config.optimizer.weight_decay = 0.01
  config.train.log_every = 20
  config.eval.batches = 0  # the whole dev file
  config.eval.batch_size = 256
  config.eval.best_metric = "spearman"
  config.checkpoint.keep = 2
  config = RECIPES[variant](config)
  if options["retrieval"]:
    config.contrastive.dev_retrieval = options["retrieval"]
    config.eval.best_metric = "ndcg@10"
  return config


def mnrl(config):
  config.data.seq_length = 128
  config.optimizer.learning_rate = 2e-5
  config.optimizer.warmup_steps = 100
  config.train.steps = 1_000
  config.train.batch_size = 128
  config.eval.every_steps = 100
  config.checkpoint.every_steps = 100
  return config


def cached(config):
  config = mnrl(config)
  config.train.batch_size = 4_096
  config.contrastive.cache_chunk_size = 32
  config.eval.batch_size = 64
  config.optimizer.warmup_steps = 10
  config.train.steps = 100
  config.train.log_every = 5
  config.eval.every_steps = 20
  config.checkpoint.every_steps = 20
  return config


def crops(config):
  config = mnrl(config)
  config.finetune.train_file = ""  # the rows are made from data.files
  config.contrastive.pairs_from = "crops"
  config.data.files = resources.BUNDLED_CORPUS
  config.data.document_marker = common.AUSTEN_CHAPTERS
  return config


def tiny(config):
  common.tiny_sizes(config)
  config.data.seq_length = 32
  config.data.shuffle_buffer = 10_000
  config.optimizer.learning_rate = 1e-4
  config.optimizer.warmup_steps = 5
  config.train.steps = 50
  config.train.batch_size = 32
  config.train.log_every = 5
  config.eval.every_steps = 25
  config.eval.batch_size = 64
  config.checkpoint.every_steps = 25
  return config


def bert(config):
  return mnrl(config)  # sentence-transformers' recipe is BERT's: mean pooling, no prompts


def _long_cached(config, learning_rate):
  """Length 512, a batch of 512 rows in gradient-cached chunks of 32."""
  config = mnrl(config)
  config.data.seq_length = 512
  config.optimizer.learning_rate = learning_rate
  config.train.batch_size = 512
  config.contrastive.cache_chunk_size = 32
  return config


def modernbert(config):
  config = _long_cached(config, 8e-5)
  config.contrastive.prompts.query = "search_query: "
  config.contrastive.prompts.document = "search_document: "
  return config


def eurobert(config):
  return _long_cached(config, 2e-5)


RECIPES = {"tiny": tiny, "mnrl": mnrl, "cached": cached, "crops": crops, "bert": bert,
           "modernbert": modernbert, "eurobert": eurobert}
