"""The contrastive method's retrieval dev evaluation (against `encoderx.retrieval` on the
run's checkpoint) and its batches without a text twice (data/no_duplicates.py, as
sentence-transformers' NoDuplicatesBatchSampler)."""
import numpy as np
import pytest

from encoderx.data import no_duplicates
from test_contrastive import method_config, run
from test_retrieval import DOCS, write_beir

QUERIES = {"q1": "Who was rich?", "q2": "Who walked in the rain?", "q3": "A letter",
           "q4": "A crowded ball"}
QRELS = [("q1", "d1", 2), ("q1", "d5", 1), ("q2", "d2", 1), ("q3", "d3", 1),
         ("q4", "d4", 1), ("q4", "d1", 0)]


def retrieval_config(tmp_path):
  config = method_config(tmp_path)
  config.contrastive.dev_retrieval = str(write_beir(tmp_path / "beir", QUERIES, QRELS,
                                                    split="dev"))
  config.eval.best_metric = "ndcg@10"
  return config


def test_retrieval_dev_scores_equal_the_retrieval_library_on_the_checkpoint(tmp_path):
  from encoderx import embed, retrieval  # pylint: disable=g-import-not-at-top
  from encoderx.data import beir  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  config = retrieval_config(tmp_path)  # STS pairs and the retrieval set both
  # On 8 devices: the texts' rows sharded and padded as every evaluation batch is.
  result = run(config, tmp_path / "run", jax.devices())
  assert {"spearman", "pearson", "ndcg@10", "recall@100", "mrr@10"} <= set(result["eval"])
  embedder = embed.Embedder(str(tmp_path / "run"), pooling="mean", normalize=True,
                            max_length=config.data.seq_length, batch_size=4)
  expected = retrieval.evaluate(embedder, beir.read_directory(
      config.contrastive.dev_retrieval, "dev"))
  for metric in ("ndcg@10", "recall@100", "mrr@10"):
    assert result["eval"][metric] == pytest.approx(expected[metric], abs=1e-6), metric
  assert 0 < result["eval"]["ndcg@10"] < 1  # a ranking that is neither perfect nor empty
  from encoderx.export import model_card  # pylint: disable=g-import-not-at-top
  step, kept = model_card.best_metrics(str(tmp_path / "run"))  # best/, kept by ndcg@10
  assert step == config.train.steps and kept["ndcg@10"] == result["eval"]["ndcg@10"]


def test_the_recipes_retrieval_argument_keeps_the_best_checkpoint_by_ndcg(tmp_path):
  from encoderx import configs  # pylint: disable=g-import-not-at-top
  assert configs.get("embedding:mnrl").eval.best_metric == "spearman"
  config = configs.get(f"embedding:mnrl,data={tmp_path},retrieval={tmp_path / 'beir'}")
  assert config.contrastive.dev_retrieval == str(tmp_path / "beir")
  assert config.eval.best_metric == "ndcg@10"
  assert config.finetune.dev_file == str(tmp_path / "dev.tsv")  # STS pairs scored beside


def test_a_retrieval_set_alone_is_the_dev_split(tmp_path):
  from encoderx.methods import contrastive  # pylint: disable=g-import-not-at-top
  config = retrieval_config(tmp_path)
  config.finetune.dev_file = ""
  config.contrastive.prompts.query, config.contrastive.prompts.document = "q: ", "d: "
  contrastive.Contrastive.validate(config)
  columns = contrastive.Contrastive(config).dev_columns()
  texts = len(QUERIES) + len(DOCS)
  assert list(columns["dev_text"]) == list(range(texts))
  assert columns["text"][0] == "q: Who was rich?"
  assert columns["text"][len(QUERIES)] == "d: Emma Emma Woodhouse was handsome, clever and rich."


@pytest.mark.parametrize("change, field, problem", [
    (lambda c: setattr(c.eval, "batches", 2), "eval.batches", "whole corpus"),
    (lambda c: setattr(c.contrastive, "dev_retrieval", "/no/such/dir"),
     "contrastive.dev_retrieval", "not a directory"),
    (lambda c: setattr(c.finetune, "dev_file", "") or setattr(c.eval, "best_metric",
                                                              "spearman"),
     "eval.best_metric", "not evaluated"),
    (lambda c: setattr(c.finetune, "length_buckets", (16,)) or setattr(
        c.finetune, "group_by_length", True), "no_duplicates", "regroup"),
])
def test_bad_dev_settings_are_refused_in_one_line(tmp_path, change, field, problem):
  from encoderx import errors  # pylint: disable=g-import-not-at-top
  from encoderx.methods import contrastive  # pylint: disable=g-import-not-at-top
  config = retrieval_config(tmp_path)
  change(config)
  with pytest.raises(errors.ConfigError, match=problem) as error:
    contrastive.Contrastive.validate(config)
  assert field in str(error.value) and "\n" not in str(error.value)


def repeated_rows(directory, rows=64):
  """Unique anchors; each positive text in 4 rows, each negative in 2."""
  path = directory / "repeated.tsv"
  path.write_text("anchor\tpositive\tnegative\n" + "".join(
      f"anchor {i}\ttopic {i % 16}\tother {i % 32}\n" for i in range(rows)),
                  encoding="utf-8")
  return str(path)


def epoch_batches(config, seed):
  """The token rows of each batch of the first epoch: [batches][rows of anchor,
  positive, negative]."""
  from encoderx.data import pipeline  # pylint: disable=g-import-not-at-top
  from encoderx.methods import contrastive  # pylint: disable=g-import-not-at-top
  method, size = contrastive.Contrastive(config), config.train.batch_size
  batches = pipeline.take_batches(method.task(), "train", config.data.seq_length, size,
                                  64 // size, seed=seed)
  return [[(tuple(b["input_ids"][i]), tuple(b["pair_input_ids"][i]),
            tuple(b["negative1_input_ids"][i])) for i in range(size)] for b in batches]


def has_duplicates(batch) -> bool:
  texts = [text for row in batch for text in row]
  return len(texts) != len(set(texts))


def test_batches_hold_no_text_twice_and_every_row_once_an_epoch(tmp_path):
  config = method_config(tmp_path, batch=8)
  config.finetune.train_file = repeated_rows(tmp_path)
  batches = epoch_batches(config, seed=3)
  assert not any(has_duplicates(batch) for batch in batches)
  anchors = [row[0] for batch in batches for row in batch]
  assert len(anchors) == len(set(anchors)) == 64  # each row once in the epoch
  assert epoch_batches(config, seed=3) == batches  # the seed's order
  assert epoch_batches(config, seed=4) != batches
  config.contrastive.no_duplicates = False  # the shuffled order repeats texts
  assert any(has_duplicates(batch) for batch in epoch_batches(config, seed=3))


def test_duplicates_are_deferred_and_the_order_is_a_permutation():
  texts = [(f"a{i}", f"t{i % 16}", f"o{i % 32}") for i in range(64)]
  order = no_duplicates.batch_order(texts, 4, seed=1)
  assert sorted(order) == list(range(64))
  assert no_duplicates.duplicated_batches(texts, order, 4) == 0
  shuffled = list(np.random.default_rng(1).permutation(64))
  assert no_duplicates.duplicated_batches(texts, shuffled, 4) > 0
  # Too few distinct texts: every row is still in the order, the last batches repeat.
  same = [("a", "b")] * 10
  assert sorted(no_duplicates.batch_order(same, 4, seed=0)) == list(range(10))
