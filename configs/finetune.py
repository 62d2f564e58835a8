"""Fine-tuning a pretrained encoder on labelled examples: the tasks' recipes (BERT's unless
said), each from a run's or a Hugging Face model's weights, whose sizes and vocabulary the
run takes:

    python -m encoderx.train --config=configs/finetune.py:TASK[,data=DATA_DIR] \
        --workdir=runs/TASK --init_from=hf:MODEL_DIR   # or a pretraining work directory

classify    sequence classification (single sentences, or pairs with
            finetune.text_pair_column): AdamW at 5e-5, 10% warmup then linear decay, batch
            32, dropout 0.1 on the pooled [CLS], best dev accuracy kept. DATA_DIR holds
            train.tsv and dev.tsv with columns `label` and `text` (e.g.
            ../shared/corpora/rotten_tomatoes).
similarity  sentence-pair regression (STS-B), BERT's GLUE recipe: a linear score on the
            pooled [CLS] of [CLS] A [SEP] B [SEP], mean squared error, AdamW at 2e-5 with
            10% warmup, batch 32, 3 epochs, best dev Spearman kept. DATA_DIR holds train.tsv
            and dev.tsv with columns score, text_a, text_b (e.g. ../shared/corpora/stsb).
tag         token classification (NER), BERT's CoNLL-2003 recipe at length 128: AdamW at
            5e-5, 10% warmup, batch 32, dropout 0.1 before the tagger, the first word piece
            of each word labelled, dev sentences longer than the length scored in windows
            of whole words, best dev entity F1 kept. DATA_DIR holds train.txt and
            dev.txt in CoNLL columns (token ... tag; a blank line between sentences), e.g.
            ../shared/corpora/conll2003; or --config.data.tfds_name=conll2003:1.0.0
            (features tokens and ner).
qa          extractive question answering (SQuAD v1.1; v2.0 with qa.version_2=True), BERT's
            run_squad.py recipe: 384-token windows with a 128-token document stride,
            questions cut at 64 tokens, answers at most 30 tokens from the 20 best starts
            and ends, AdamW at 3e-5 with 10% warmup, batch 32, 2 epochs (SQuAD v1.1's 88k
            questions). DATA_DIR holds train.json and dev.json in SQuAD's format; or
            --config.data.tfds_name=squad/v1.1:3.0.0. --predict=dev.json writes
            predictions.json, the official script's input.
simcse      SimCSE sentence embeddings (Gao et al., 2021), unsupervised by default: each
            training sentence twice through dropout, in-batch negatives, temperature 0.05,
            AdamW at 3e-5, batch 64, sequences of 32 tokens, mean pooling; best dev Spearman
            (cosine similarity of the two embeddings against the STS score) kept.
            --config.simcse.kind=supervised trains on the rows' (text_a, text_b) pairs as
            positives instead. DATA_DIR holds train.tsv (sentences in text_a and text_b)
            and dev.tsv (STS pairs with a score), e.g. ../shared/corpora/stsb; embed with
            `python -m encoderx.embed --init_from=runs/simcse --input=FILE --output=FILE.npy`.
rerank      a cross-encoder reranker (sentence-transformers' CrossEncoder): [CLS] query
            [SEP] document [SEP] through the encoder, one logit on the pooled [CLS];
            listwise by default (the positive's softmax cross-entropy among it and its hard
            negatives, on 10 * sigmoid(logits)), or rerank.loss=binary / margin_mse /
            listnet (docs/guides/embeddings.md); AdamW at 2e-5 with 10% warmup, batch 32
            rows, sequences of 128 tokens, best dev nDCG@10 kept. DATA_DIR holds train.tsv
            (query, positive, negative) and dev.tsv (query, positive, negative_1 ..
            negative_4); rerank with `python -m encoderx.retrieval ... --rerank_with=RUN`.
"""
import os

from encoderx.configs import common

VARIANTS = ("classify", "similarity", "tag", "qa", "simcse", "rerank")
# The training and dev files in DATA_DIR.
DATA_FILES = {"classify": ("train.tsv", "dev.tsv"), "similarity": ("train.tsv", "dev.tsv"),
              "tag": ("train.txt", "dev.txt"), "qa": ("train.json", "dev.json"),
              "simcse": ("train.tsv", "dev.tsv"), "rerank": ("train.tsv", "dev.tsv")}


def get_config(arg: str = "classify"):
  task, options = common.parse_arg(arg, VARIANTS, data="")
  config = common.default_config()
  config.method = task
  if options["data"]:
    train_file, dev_file = DATA_FILES[task]
    config.finetune.train_file = os.path.join(options["data"], train_file)
    config.finetune.dev_file = os.path.join(options["data"], dev_file)
  config.optimizer.weight_decay = 0.01
  config.train.batch_size = 32
  config.train.log_every = 20
  config.eval.batches = 0  # the whole dev file
  config.eval.batch_size = 64
  config.checkpoint.keep = 2
  return RECIPES[task](config)


def classify(config):
  config.finetune.text_column = "text"
  config.finetune.label_column = "label"
  config.data.seq_length = 64
  config.data.shuffle_buffer = 20_000
  config.optimizer.learning_rate = 5e-5
  config.optimizer.warmup_steps = 70
  config.train.steps = 700  # about 2 epochs of 10,808 examples at batch 32
  config.eval.every_steps = 100
  config.eval.best_metric = "accuracy"
  config.checkpoint.every_steps = 100
  return config


def similarity(config):
  config.finetune.text_column = "text_a"
  config.finetune.text_pair_column = "text_b"
  config.finetune.label_column = "score"
  config.data.seq_length = 128
  config.data.shuffle_buffer = 10_000
  config.optimizer.learning_rate = 2e-5
  config.optimizer.warmup_steps = 54
  config.train.steps = 540  # 3 epochs of 5,749 pairs at batch 32
  config.eval.every_steps = 90
  config.eval.best_metric = "spearman"
  config.checkpoint.every_steps = 90
  return config


def tag(config):
  config.finetune.text_column = "tokens"  # the TFDS features, when data.tfds_name is set
  config.finetune.label_column = "ner"
  config.data.seq_length = 128
  config.data.shuffle_buffer = 20_000
  config.optimizer.learning_rate = 5e-5
  config.optimizer.warmup_steps = 130
  config.train.steps = 1_300  # about 3 epochs of 14,041 sentences at batch 32
  config.eval.every_steps = 200
  config.eval.best_metric = "f1"
  config.checkpoint.every_steps = 200
  return config


def qa(config):
  config.data.tfds_train_split = "train"
  config.data.tfds_eval_split = "validation"
  config.data.seq_length = 384
  config.data.shuffle_buffer = 20_000
  config.optimizer.learning_rate = 3e-5
  config.optimizer.warmup_steps = 550
  config.train.steps = 5_500  # about 2 epochs of 88k windows at batch 32
  config.train.log_every = 50
  config.eval.every_steps = 0  # at the end: the whole dev set takes a while
  config.eval.best_metric = "f1"
  config.checkpoint.every_steps = 500
  return config


def simcse(config):
  config.finetune.text_column = "text_a"
  config.finetune.text_pair_column = "text_b"
  config.finetune.label_column = "score"
  config.finetune.pooling = "mean"
  config.simcse.kind = "unsupervised"
  config.simcse.temperature = 0.05
  config.data.seq_length = 32
  config.data.shuffle_buffer = 20_000
  config.optimizer.learning_rate = 3e-5
  config.optimizer.warmup_steps = 0
  config.optimizer.weight_decay = 0.0
  config.train.steps = 170  # an epoch of the 10.9k distinct STS-B train sentences
  config.train.batch_size = 64
  config.train.log_every = 10
  config.eval.every_steps = 50
  config.eval.batch_size = 128
  config.eval.best_metric = "spearman"
  config.checkpoint.every_steps = 50
  return config


def rerank(config):
  config.finetune.text_column = "query"
  config.finetune.text_pair_column = "positive"
  config.finetune.label_column = "label"  # binary's 0/1
  config.rerank.loss = "listwise"
  config.rerank.negative_columns = ("negative",)
  config.rerank.dev_negative_columns = tuple(f"negative_{i}" for i in range(1, 5))
  config.data.seq_length = 128
  config.data.shuffle_buffer = 20_000
  config.optimizer.learning_rate = 2e-5
  config.optimizer.warmup_steps = 100
  config.train.steps = 1_000
  config.eval.every_steps = 200
  config.eval.best_metric = "ndcg@10"
  config.checkpoint.every_steps = 200
  return config


RECIPES = {"classify": classify, "similarity": similarity, "tag": tag, "qa": qa,
           "simcse": simcse, "rerank": rerank}
