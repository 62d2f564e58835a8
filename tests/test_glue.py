"""The GLUE command (encoderx/glue/): GLUE's file layouts and TFDS's glue/* read into
one form, the official metrics against scikit-learn / scipy / hand computations, the
table's medians, and sweeps over a miniature GLUE (tests/glue_files.py) that score
exactly as the single-task methods run by hand, and resume where they stopped."""
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
import transformers
from scipy import stats
from sklearn import metrics as sk_metrics

import glue_files
import tiny_hf
from conftest import xla_flags_with_devices
from encoderx import configs, glue, train
from encoderx.data import glue as glue_data
from encoderx.evaluation import glue as glue_metrics
from encoderx.evaluation import scores

ONE_DEVICE = jax.devices()[:1]
REPO = pathlib.Path(__file__).resolve().parent.parent


def _needs_corpora():
  for corpus in (glue_files.ROTTEN_TOMATOES, glue_files.STSB):
    if not (corpus / "train.tsv").exists():
      pytest.skip(f"the shared corpus {corpus} is not there")


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
  _needs_corpora()
  return glue_files.write_glue(tmp_path_factory.mktemp("glue"), train_rows=64, dev_rows=32)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
  """A tiny BERT saved as Hugging Face saves one (random weights, the bundled vocabulary):
  the encoder every sweep here starts from."""
  return tiny_hf.save_tiny_bert(tmp_path_factory.mktemp("hf"),
                                transformers.BertForPreTraining)


def _recipe(**changes):
  recipe = configs.get("glue:default")
  recipe.learning_rates, recipe.batch_sizes, recipe.epochs = (1e-3,), (8,), (1.0,)
  recipe.seq_length, recipe.eval_batch_size = 32, 16
  recipe.checkpoint_every_steps, recipe.shuffle_buffer = 4, 1000
  for field, value in changes.items():
    recipe[field] = value
  return recipe


# --- files and datasets ------------------------------------------------------------------
def test_every_layout_reads_to_its_texts_and_label_names(glue_dir):
  read = {name: glue_data.read_directory(task, str(glue_dir))
          for name, task in glue_data.TASKS.items()}
  assert {name: list(splits) for name, splits in read.items()}["mnli"] == [
      "train", "dev_matched", "dev_mismatched"]
  cola = read["cola"]["train"]  # no header; label 0 / 1 in the second column
  assert (cola.texts[4], cola.labels[3], cola.labels[4]) == (
      glue_files.SENTENCES[4], "acceptable", "unacceptable")
  assert not cola.pairs
  mrpc = read["mrpc"]["dev"]
  assert (mrpc.texts[1], mrpc.pairs[1], mrpc.labels[:2]) == (
      glue_files.SENTENCES[1], glue_files.SENTENCES[2], ["not_equivalent", "equivalent"])
  sst = read["sst2"]["train"]  # rotten_tomatoes, in SST-2's layout
  corpus = glue_files.shared_rows(glue_files.ROTTEN_TOMATOES / "train.tsv", 64)
  assert sst.texts == [text for _, text in corpus]
  assert sst.labels == [("negative", "positive")[int(label)] for label, _ in corpus]
  sts = read["stsb"]["dev"]
  corpus = glue_files.shared_rows(glue_files.STSB / "dev.tsv", 32)
  assert (sts.labels, sts.texts, sts.pairs) == tuple(map(list, zip(*corpus)))
  assert read["mnli"]["dev_mismatched"].pairs[0] == glue_files.SENTENCES[7]
  assert read["qqp"]["train"].labels[:3] == ["duplicate", "not_duplicate", "not_duplicate"]
  assert read["rte"]["train"].labels[:2] == ["not_entailment", "entailment"]
  assert read["qnli"]["dev"].texts[0] == "The cat sat on the mat?"


def test_the_methods_form_holds_the_same_examples(glue_dir, tmp_path):
  splits = glue_data.read_directory(glue_data.TASKS["mrpc"], str(glue_dir))
  files = glue_data.write_examples(splits, str(tmp_path))
  lines = pathlib.Path(files["dev"]).read_text().splitlines()
  assert lines[0] == "label\ttext\ttext_pair"
  assert lines[2] == f"equivalent\t{glue_files.SENTENCES[1]}\t{glue_files.SENTENCES[2]}"
  assert len(lines) == 13


@pytest.mark.parametrize("task,file,content,message", [
    ("rte", "RTE/train.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n"
     "1\ta\tb\n", r"RTE/train.tsv' line 3 has 3 fields; the header has 4"),
    ("cola", "CoLA/train.tsv", "gj04\t1\t\tGood.\ngj04\t0\t*\tBad\textra\n",
     r"CoLA/train.tsv' line 2 has 5 fields; GLUE's CoLA rows have 4"),
    ("mnli", "MNLI/train.tsv", "sentence1\tsentence2\tgold_label\na\tb\tentailment\n"
     "a\tb\t-\n", r"MNLI/train.tsv' line 3: label '-' is not one of 'entailment'"),
    ("stsb", "STS-B/train.tsv", "sentence1\tsentence2\tscore\na\tb\t4.2\na\tb\tfive\n",
     r"STS-B/train.tsv' line 3: score 'five' is not a number"),
    ("qqp", "QQP/train.tsv", "id\tquestion1\tquestion2\tlabel\n1\ta\tb\t0\n",
     r"QQP/train.tsv': the header \(line 1\) has no column 'is_duplicate'"),
    ("sst2", "SST-2/dev.tsv", None, r"GLUE task sst2: '.*SST-2/dev.tsv' is missing"),
])
def test_a_malformed_row_or_a_missing_split_names_the_file_and_row(
    tmp_path, task, file, content, message):
  path = tmp_path / file
  path.parent.mkdir(parents=True)
  if content is None:  # the train split is there, the dev split is not
    path.with_name("train.tsv").write_text("sentence\tlabel\nGood.\t1\n")
  else:
    path.write_text(content)
  with pytest.raises(glue_data.GlueDataError, match=message):
    glue_data.read_directory(glue_data.TASKS[task], str(tmp_path))


def test_the_command_stops_on_bad_data_with_one_line(glue_dir, tiny_bert, tmp_path):
  """(With a recipe field overridden without --recipe: the default recipe's fields are
  flags too.)"""
  bad = tmp_path / "glue"
  shutil.copytree(glue_dir / "RTE", bad / "RTE")
  with open(bad / "RTE" / "dev.tsv", "a", encoding="utf-8") as f:
    f.write("99\tonly two\n")
  process = subprocess.run(
      [sys.executable, "-m", "encoderx.glue", f"--init_from={tiny_bert}",
       f"--output={tmp_path / 'out'}", f"--data={bad}", "--tasks=rte",
       "--recipe.learning_rates=(1e-3,)"],
      capture_output=True, text=True, cwd=REPO, check=False)
  assert process.returncode == 2, process.stderr
  assert process.stderr.strip().splitlines()[-1] == (
      f"encoderx: error: '{bad}/RTE/dev.tsv' line 14 has 2 fields; the header has 4.")


def test_tfds_glue_reads_its_features_and_label_names(tmp_path):
  """TFDS's glue builder with mock examples (tfds.testing.mock_data: its features from
  the builder's code, random values; nothing downloaded)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    mnli = glue_data.read_tfds(glue_data.TASKS["mnli"], str(tmp_path))
    stsb = glue_data.read_tfds(glue_data.TASKS["stsb"], str(tmp_path))
    reference = list(tfds.as_numpy(tfds.builder("glue/mnli", data_dir=str(tmp_path))
                                   .as_dataset(split="validation_mismatched")))
  assert list(mnli) == ["train", "dev_matched", "dev_mismatched"]
  assert [len(s) for s in mnli.values()] == [6, 6, 6]
  mismatched = mnli["dev_mismatched"]
  assert mismatched.texts == [r["premise"].decode() for r in reference]
  assert mismatched.pairs == [r["hypothesis"].decode() for r in reference]
  names = ("entailment", "neutral", "contradiction")
  assert mismatched.labels == [names[r["label"]] for r in reference]
  assert all(isinstance(float(score), float) for score in stsb["dev"].labels)
  assert mismatched.source == "glue/mnli[validation_mismatched]"


# --- metrics -----------------------------------------------------------------------------
def test_classification_metrics_against_scikit_learn_and_by_hand():
  labels = np.array([1, 1, 1, 0, 0, 0, 1, 0, 1, 1])
  predictions = np.array([1, 0, 1, 0, 1, 0, 1, 0, 1, 1])
  # tp 5, fn 1, fp 1, tn 3
  tp, fn, fp, tn = 5, 1, 1, 3
  mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  got = scores.classification_metrics(labels, predictions, 2)
  assert got == pytest.approx({"accuracy": 0.8, "f1": 2 * tp / (2 * tp + fp + fn),
                               "mcc": mcc}, abs=1e-12)
  assert got["mcc"] == pytest.approx(sk_metrics.matthews_corrcoef(labels, predictions))
  assert got["f1"] == pytest.approx(sk_metrics.f1_score(labels, predictions))
  three = np.array([0, 1, 2, 2, 1, 0]), np.array([0, 2, 2, 2, 1, 1])
  assert scores.classification_metrics(*three, 3)["accuracy"] == pytest.approx(4 / 6)


def test_correlations_against_scipy_and_by_hand():
  rng = np.random.default_rng(0)
  gold = rng.uniform(0, 5, 50)
  predicted = gold + rng.normal(0, 1, 50)
  got = scores.correlations(predicted, gold)
  centered = predicted - predicted.mean(), gold - gold.mean()
  pearson = (centered[0] @ centered[1]) / np.sqrt((centered[0] ** 2).sum()
                                                  * (centered[1] ** 2).sum())
  ranks = [np.argsort(np.argsort(x)).astype(float) for x in (predicted, gold)]  # no ties
  spearman = np.corrcoef(*ranks)[0, 1]
  assert got == pytest.approx({"pearson": pearson, "spearman": spearman}, abs=1e-12)
  assert got["spearman"] == pytest.approx(stats.spearmanr(predicted, gold).statistic)


def test_the_table_takes_medians_over_seeds_and_the_best_grid_point():
  def run(task, lr, seed, **metrics):
    split = {"accuracy": "dev_matched"} if task == "mnli" else {}
    by_split = {}
    for key, value in metrics.items():
      name, _, which = key.partition("__")
      by_split.setdefault(which or split.get(name, "dev"), {})[name] = value
    return {"task": task, "seed": seed, "metrics": by_split,
            "point": {"learning_rate": lr, "batch_size": 32, "epochs": 3.0}}
  runs = [run("mrpc", 2e-5, s, f1=f, accuracy=a)
          for s, f, a in ((0, 0.80, 0.70), (1, 0.90, 0.75), (2, 0.86, 0.60))]
  runs += [run("mrpc", 5e-5, s, f1=f, accuracy=a)
           for s, f, a in ((0, 0.70, 0.70), (1, 0.95, 0.95), (2, 0.85, 0.65))]
  runs += [run("mnli", 2e-5, s, accuracy__dev_matched=m, accuracy__dev_mismatched=mm)
           for s, m, mm in ((1, 0.5, 0.4), (0, 0.7, 0.6))]
  table = glue_metrics.summarize(runs)
  mrpc = table["tasks"]["mrpc"]
  # 2e-5: medians F1 0.86, acc 0.70 -> 0.78; 5e-5: 0.85, 0.70 -> 0.775
  assert mrpc["name"] == "lr2e-05_bs32_ep3"
  assert mrpc["metrics"]["F1"] == {"median": 0.86, "values": [0.80, 0.90, 0.86]}
  assert mrpc["score"] == pytest.approx(0.78)
  mnli = table["tasks"]["mnli"]
  assert mnli["seeds"] == [0, 1]  # by seed; an even count: the mean of the middle two
  assert mnli["metrics"]["m acc"]["median"] == pytest.approx(0.6)
  assert mnli["metrics"]["mm acc"]["values"] == [0.6, 0.4]
  assert table["average"] == pytest.approx((0.78 + 0.55) / 2)
  text = glue_metrics.markdown(table)
  assert "| MRPC | F1 | 86.0 | 80.0 90.0 86.0 | 0,1,2 | lr2e-05_bs32_ep3 |" in text
  assert "| MRPC F1/acc | MNLI m acc/mm acc | average |" in text
  assert "| 86.0/70.0 | 60.0/50.0 | 66.5 |" in text


# --- sweeps ------------------------------------------------------------------------------
def _by_hand(variant, data, seed, recipe, steps, workdir, tiny_bert):
  """The single-task method as a user runs it: configs/finetune.py:VARIANT,data=DIR with
  the recipe's fields on the command line."""
  config = configs.get(f"finetune:{variant},data={data}")
  config.init_from = tiny_bert
  config.data.seq_length, config.data.shuffle_buffer = recipe.seq_length, recipe.shuffle_buffer
  config.optimizer.learning_rate = recipe.learning_rates[0]
  config.optimizer.warmup_steps = int(recipe.warmup_fraction * steps)
  config.optimizer.eps = recipe.adam_eps
  config.train.steps, config.train.batch_size, config.train.seed = (
      steps, recipe.batch_sizes[0], seed)
  config.finetune.length_buckets = recipe.length_buckets
  config.eval.every_steps, config.eval.batch_size = 0, recipe.eval_batch_size
  return train.run(config, str(workdir), show_progress=False, devices=ONE_DEVICE)["eval"]


# One sweep of every task through the command line, shared by the two tests below: the
# recipe's fields that differ from configs/glue.py:default, as flags and as a recipe.
CLI_RECIPE = {"max_steps": 2, "seq_length": 32, "learning_rates": (1e-3,),
              "batch_sizes": (8,), "length_buckets": (24,), "shuffle_buffer": 1000}


@pytest.fixture(scope="module")
def cli_sweep(glue_dir, tiny_bert, tmp_path_factory):
  """All eight tasks, seed 0, 2 steps each, through `python -m encoderx.glue` (its
  checkpoints kept): (the process, its output directory)."""
  output = tmp_path_factory.mktemp("cli") / "sweep"
  flags = [f"--recipe.{field}={value}".replace(" ", "") for field, value in CLI_RECIPE.items()]
  # On one device, as the runs by hand (8 would shard the dev loss's sum: its last bits).
  env = {**os.environ, "XLA_FLAGS": xla_flags_with_devices(None)}
  process = subprocess.run(
      [sys.executable, "-m", "encoderx.glue", f"--init_from={tiny_bert}",
       f"--output={output}", f"--data={glue_dir}", "--seeds=0",
       f"--recipe={REPO / 'configs' / 'glue.py'}:default", *flags, "--keep_checkpoints"],
      capture_output=True, text=True, cwd=REPO, check=False, env=env)
  assert process.returncode == 0, process.stderr[-3000:]
  return process, output


def _cli_recipe():
  recipe = configs.get("glue:default")
  for field, value in CLI_RECIPE.items():
    recipe[field] = value
  return recipe


@pytest.mark.slow
def test_a_sweep_scores_exactly_as_the_single_task_methods_by_hand(cli_sweep, tiny_bert,
                                                                    tmp_path):
  """SST-2 (rotten_tomatoes) and STS-B from the miniature GLUE through encoderx.glue,
  and the same corpora's rows through configs/finetune.py's classify and similarity
  variants run by hand with the same seed (batches cut to the same length buckets):
  the same dev figures, exactly. (That another seed gives other figures: the resumed
  sweep's seeds 0 and 1 below.)"""
  _, output = cli_sweep
  recipe = _cli_recipe()
  results = json.loads((output / "results.json").read_text())
  steps = 2  # recipe.max_steps, under 1 epoch of 64 examples at batch 8
  sources = {"sst2": ("classify", glue_files.ROTTEN_TOMATOES, "dev"),
             "stsb": ("similarity", glue_files.STSB, "dev")}
  records = [r for r in results["runs"] if r["task"] in sources]
  assert len(records) == 2
  for record in records:
    variant, corpus, split = sources[record["task"]]
    data = tmp_path / f"{record['task']}-data"
    data.mkdir()
    for name, rows in (("train.tsv", 64), ("dev.tsv", 32)):
      lines = (corpus / name).read_text(encoding="utf-8").splitlines()[:rows + 1]
      (data / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert record["steps"] == steps
    by_hand = _by_hand(variant, data, record["seed"], recipe, steps,
                       tmp_path / f"hand-{record['task']}-{record['seed']}", tiny_bert)
    assert record["metrics"][split] == by_hand, record["task"]
  table = results["table"]
  assert table["tasks"]["stsb"]["metrics"]["Spearman"]["values"] == [
      r["metrics"]["dev"]["spearman"] for r in records if r["task"] == "stsb"]
  assert "| STS-B | Pearson |" in (output / "results.md").read_text()


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_where_it_stopped(glue_dir, tiny_bert, tmp_path,
                                                       caplog):
  """A finished run is read back, not trained again; a run stopped at step 3 of 8
  continues from its checkpoint to the figures of a straight run; new seeds run."""
  recipe = _recipe(seeds=(0,), tasks="sst2")
  straight = glue.sweep(tiny_bert, str(tmp_path / "straight"), recipe,
                        data_dir=str(glue_dir), show_progress=False, devices=ONE_DEVICE)
  # The returned table is the one written; the checkpoints go once a run has finished.
  table = json.loads((tmp_path / "straight" / "results.json").read_text())["table"]
  assert table == json.loads(json.dumps(straight["table"]))
  assert not (tmp_path / "straight" / "runs" / "sst2" / "lr0.001_bs8_ep1" / "seed0"
              / "checkpoints").exists()
  output = str(tmp_path / "sweep")
  prepared = glue.prepare_data(["sst2"], output, str(glue_dir))
  (run,) = glue.plan(["sst2"], [0], recipe, output)
  config = glue.run_config(recipe, glue_data.TASKS["sst2"], prepared["sst2"][0], run.point,
                           0, tiny_bert, prepared["sst2"][1])
  stopped = train.run(config, run.directory, stop_at_step=3, show_progress=False,
                      devices=ONE_DEVICE)
  assert stopped["stopped"] and stopped["step"] == 3
  resumed = glue.sweep(tiny_bert, output, recipe, data_dir=str(glue_dir),
                       show_progress=False, devices=ONE_DEVICE)
  assert resumed["runs"][0]["metrics"] == straight["runs"][0]["metrics"]
  result_file = pathlib.Path(run.directory) / glue.RESULT_FILE
  written = result_file.stat().st_mtime_ns
  with caplog.at_level("INFO", logger="encoderx"):
    again = glue.sweep(tiny_bert, output, recipe, seeds=[0, 1], data_dir=str(glue_dir),
                       show_progress=False, devices=ONE_DEVICE)
  assert "sst2 lr0.001_bs8_ep1 seed 0: finished before" in caplog.text
  assert result_file.stat().st_mtime_ns == written
  assert [r["seed"] for r in again["runs"]] == [0, 1]
  assert again["runs"][0] == resumed["runs"][0]
  assert again["runs"][1]["metrics"] != again["runs"][0]["metrics"]  # the seed matters
  with pytest.raises(glue.GlueError, match=r"holds a sweep with other settings "
                     r"\(recipe.learning_rates\)"):
    glue.sweep(tiny_bert, output, _recipe(learning_rates=(2e-3,)), data_dir=str(glue_dir),
               show_progress=False, devices=ONE_DEVICE)


@pytest.mark.slow
def test_every_task_of_the_miniature_glue_reaches_the_table(cli_sweep, tiny_bert, tmp_path):
  """All eight layouts through the command line: MNLI evaluated on its matched and
  mismatched sets (the latter equal to scoring the run's own predictions), the table
  printed and written."""
  process, output = cli_sweep
  assert "| CoLA MCC | SST-2 acc | MRPC F1/acc | STS-B Pearson/Spearman | QQP F1/acc | " \
         "MNLI m acc/mm acc | QNLI acc | RTE acc | average |" in process.stdout
  results = json.loads((output / "results.json").read_text())
  assert list(results["table"]["tasks"]) == list(glue_data.TASKS)
  (mnli,) = [r for r in results["runs"] if r["task"] == "mnli"]
  assert set(mnli["metrics"]) == {"dev_matched", "dev_mismatched"}
  directory = output / "runs" / "mnli" / "lr0.001_bs8_ep3" / "seed0"
  recipe = _cli_recipe()
  files = {split: str(output / "data" / "mnli" / f"{split}.tsv")
           for split in ("train", "dev_matched", "dev_mismatched")}
  config = glue.run_config(recipe, glue_data.TASKS["mnli"], files,
                           glue.grid(recipe)[0], 0, tiny_bert, 30)
  mismatched = str(output / "data" / "mnli" / "dev_mismatched.tsv")
  count, predictions = train.predict(config, str(directory), mismatched,
                                     str(tmp_path / "mm.tsv"), devices=ONE_DEVICE)
  rows = [line.split("\t") for line in pathlib.Path(predictions).read_text().splitlines()[1:]]
  assert count == 9
  assert mnli["metrics"]["dev_mismatched"]["accuracy"] == pytest.approx(
      np.mean([row[3] == row[5] for row in rows]))
