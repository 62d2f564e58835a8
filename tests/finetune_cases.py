"""The fine-tuning tests' data and configs, shared by the tests of each task method
(test_finetune, test_qa, test_similarity, test_tagging), by those that run several
(test_buckets, test_export, test_modernbert_finetune) and by the embedding tests
(test_contrastive, test_embedding_recipes, test_distributed): small files cut from the
shared corpora (a test that needs an absent corpus skips), SQuAD JSON, and each method's
config at the tiny model's sizes with a few steps."""
import json
import pathlib

import pytest

from conftest import REPO, _tiny_config  # pylint: disable=g-bad-import-order
from encoderx import configs

CORPORA = REPO.parent / "shared" / "corpora"
ROTTEN_TOMATOES = CORPORA / "rotten_tomatoes"
STSB = CORPORA / "stsb"
CONLL = CORPORA / "conll2003"
LABELS = ("O", "B-LOC", "B-PER", "I-PER", "B-MISC")
QUESTIONS = [
    ("Anne Elliot walked to Bath with Lady Russell in the winter, and all the way they "
     "talked of Kellynch Hall and of the Musgroves at Uppercross.",
     [("1", "Who walked to Bath?", "Anne Elliot", 0), ("2", "Where did she walk?", "Bath", 22),
      ("3", "With whom?", "Lady Russell", 32)]),
    ("Captain Wentworth wrote a letter at the White Hart.",
     [("4", "Who wrote?", "Captain Wentworth", 0), ("5", "What did he write?", "a letter", 24),
      ("6", "Where did he write?", "the White Hart", 36)]),
]


# --- data -------------------------------------------------------------------------------
def needs_rotten_tomatoes():
  if not (ROTTEN_TOMATOES / "train.tsv").exists():
    pytest.skip(f"the rotten_tomatoes corpus is not at {ROTTEN_TOMATOES}")


def small_tsv(directory: pathlib.Path, name: str, rows: int, offset: int = 0) -> str:
  """The first `rows` examples of a rotten_tomatoes split (after `offset`)."""
  lines = (ROTTEN_TOMATOES / name).read_text(encoding="utf-8").splitlines()
  path = directory / name
  path.write_text("\n".join([lines[0]] + lines[1 + offset:1 + offset + rows]) + "\n")
  return str(path)


def stsb_subset(directory: pathlib.Path, name: str, rows: int) -> str:
  if not (STSB / name).exists():
    pytest.skip(f"the stsb corpus is not at {STSB}")
  lines = (STSB / name).read_text(encoding="utf-8").splitlines()[:rows + 1]
  path = directory / name
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return str(path)


def pairs_file(directory: pathlib.Path, rows: int = 64) -> str:
  """STS-B training pairs scored >= 4 as (anchor, positive), and a hard negative: the
  next pair's positive."""
  if not (STSB / "train.tsv").exists():
    pytest.skip(f"the stsb corpus is not at {STSB}")
  lines = (STSB / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
  pairs = [line.split("\t")[1:] for line in lines if float(line.split("\t")[0]) >= 4]
  pairs = pairs[:rows]
  path = directory / "pairs.tsv"
  path.write_text("anchor\tpositive\tnegative\n" + "".join(
      f"{a}\t{p}\t{pairs[(i + 1) % len(pairs)][1]}\n" for i, (a, p) in enumerate(pairs)),
                  encoding="utf-8")
  return str(path)


def conll_subset(directory: pathlib.Path, name: str, sentences: int) -> str:
  blocks = (CONLL / name).read_text(encoding="utf-8").split("\n\n")[:sentences]
  path = directory / name
  path.write_text("\n\n".join(blocks) + "\n")
  return str(path)


def squad_json(path, questions, version_2=False):
  paragraphs = [{"context": context, "qas": [
      {"id": qid, "question": question,
       "answers": [{"text": text, "answer_start": start}] if text else [],
       **({"is_impossible": not text} if version_2 else {})}
      for qid, question, text, start in qas]} for context, qas in questions]
  path.write_text(json.dumps({"version": "1.1", "data": [
      {"title": "t", "paragraphs": paragraphs}]}, indent=1))
  return str(path)


# --- configs ----------------------------------------------------------------------------
def _tiny_sizes(config):
  """`config` with the tiny model's sizes (conftest's shrunk bert_tiny)."""
  for field in ("num_layers", "hidden_size", "num_heads", "intermediate_size"):
    config.model[field] = _tiny_config().model[field]
  return config


def shrunk(config):
  """`config` at the tiny model's sizes, 4 steps of 8 at length 32, evaluated and saved
  every 2."""
  _tiny_sizes(config)
  config.data.seq_length = 32
  config.train.steps, config.train.batch_size = 4, 8
  config.optimizer.warmup_steps = 1
  config.eval.every_steps, config.eval.batch_size = 2, 16
  config.checkpoint.every_steps, config.checkpoint.async_save = 2, False
  config.train.log_every = 1
  return config


def classify_config(tmp_path, init_from="", train_rows=256, dev_rows=100):
  config = configs.get("finetune:classify")
  config.finetune.train_file = small_tsv(tmp_path, "train.tsv", train_rows)
  config.finetune.dev_file = small_tsv(tmp_path, "dev.tsv", dev_rows)
  config.init_from = init_from
  config.data.seq_length = 32
  config.train.steps, config.train.batch_size = 6, 8
  config.optimizer.warmup_steps = 1
  config.eval.every_steps, config.eval.batch_size = 3, 16
  config.checkpoint.every_steps, config.checkpoint.async_save = 3, False
  config.train.log_every = 1
  return config


def qa_config(train_file="", dev_file=""):
  config = _tiny_sizes(configs.get("finetune:qa"))
  config.finetune.train_file, config.finetune.dev_file = train_file, dev_file
  config.data.seq_length = 20  # short windows: each context is read in several
  config.qa.max_query_length, config.qa.doc_stride = 8, 4
  config.train.steps, config.train.batch_size = 3, 4
  config.optimizer.warmup_steps = 1
  config.eval.batch_size = 8
  config.checkpoint.every_steps, config.checkpoint.async_save = 3, False
  config.train.log_every = 1
  return config


def simcse_config(tmp_path, mode):
  config = shrunk(configs.get("finetune:simcse"))
  config.simcse.kind = mode
  config.finetune.train_file = stsb_subset(tmp_path, "train.tsv", 48)
  config.finetune.dev_file = stsb_subset(tmp_path, "dev.tsv", 40)
  return config


def tag_config(train_file, dev_file):
  config = shrunk(configs.get("finetune:tag"))
  config.finetune.train_file, config.finetune.dev_file = train_file, dev_file
  return config
