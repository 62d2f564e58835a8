"""Every fine-tuning method (configs/finetune.py: classify, similarity, tag, qa, simcse)
and encoderx.embed from a ModernBERT run: the run's encoder (rotary positions, local
attention, GeGLU, byte-level BPE of ModernBERT's layout) is taken whole (nothing of the
encoder fresh), trains a few steps with finite losses and is evaluated. One tiny
ModernBERT run directory (modernbert:tiny, shrunk) serves every test.

The methods' own tests (test_finetune.py, test_similarity.py, test_tagging.py,
test_qa.py) check what they compute; here, that they run on this family."""
import json
import math
import subprocess
import sys

import jax
import numpy as np
import pytest

from encoderx import embed, train

from conftest import REPO, _tiny_config  # pylint: disable=g-bad-import-order
from finetune_cases import (  # pylint: disable=g-bad-import-order
    CONLL, QUESTIONS, conll_subset, needs_rotten_tomatoes, qa_config, shrunk, simcse_config,
    small_tsv, squad_json, stsb_subset, tag_config)

ONE_DEVICE = jax.devices()[:1]
# The metric each method's evaluation reports.
METRICS = {"classify": "accuracy", "similarity": "spearman", "tag": "f1", "qa": "f1",
           "simcse": "spearman"}


@pytest.fixture(scope="module")
def modernbert_run(tmp_path_factory):
  """A tiny ModernBERT's run (2 layers of 32, a local window of 64), written as train.run
  writes one: config.json and a checkpoint of perturbed initial parameters (export_checks'
  make_run; nothing here needs trained weights, and no train step is compiled for it).
  --init_from of a run train.run wrote: test_recipe.py's context extension."""
  from export_checks import make_run  # pylint: disable=g-import-not-at-top
  config = _tiny_config("modernbert:tiny")
  config.train.steps = 4
  workdir = tmp_path_factory.mktemp("modernbert")
  make_run(config, str(workdir))
  return str(workdir)


def _config(task: str, tmp_path):
  """configs/finetune.py:TASK on a few examples, a few steps."""
  from encoderx import configs  # pylint: disable=g-import-not-at-top
  if task == "classify":
    needs_rotten_tomatoes()
    config = shrunk(configs.get("finetune:classify"))
    config.finetune.train_file = small_tsv(tmp_path, "train.tsv", 32)
    config.finetune.dev_file = small_tsv(tmp_path, "dev.tsv", 16)
  elif task == "similarity":
    config = shrunk(configs.get("finetune:similarity"))
    config.finetune.train_file = stsb_subset(tmp_path, "train.tsv", 32)
    config.finetune.dev_file = stsb_subset(tmp_path, "dev.tsv", 16)
  elif task == "tag":
    if not (CONLL / "train.txt").exists():
      pytest.skip(f"the CoNLL-2003 corpus is not at {CONLL}")
    config = tag_config(conll_subset(tmp_path, "train.txt", 32),
                         conll_subset(tmp_path, "dev.txt", 16))
  elif task == "qa":
    squad = squad_json(tmp_path / "squad.json", QUESTIONS)
    config = qa_config(squad, squad)
  else:
    config = simcse_config(tmp_path, "unsupervised")
  config.train.steps = 2
  config.eval.every_steps = config.checkpoint.every_steps = 2
  return config


@pytest.mark.slow
@pytest.mark.parametrize("task", list(METRICS))
def test_every_method_fine_tunes_from_a_modernbert_run(modernbert_run, task, tmp_path,
                                                       caplog):
  config = _config(task, tmp_path)
  config.init_from = modernbert_run
  workdir = tmp_path / "run"
  with caplog.at_level("INFO", logger="encoderx"):
    result = train.run(config, str(workdir), show_progress=False, devices=ONE_DEVICE)
  # The encoder is ModernBERT's, every weight of it from the run (initialize.merge
  # refuses an encoder parameter the source lacks); the heads start fresh.
  fresh = caplog.text.split("initialized fresh: ")[1].split(";")[0]
  assert "encoder_model/e" not in fresh, fresh
  with open(workdir / "config.json", encoding="utf-8") as f:
    run = json.load(f)
  assert (run["model"]["family"], run["model"]["embeddings"]["position"],
          run["model"]["feed_forward"]["kind"], run["data"]["vocab"]["layout"]) == (
              "modernbert", "rotary", "gated", "bert")
  assert all(math.isfinite(v) for v in result["history"][-1].values()
             if isinstance(v, float))
  assert METRICS[task] in result["eval"], result["eval"]
  print(f"{task} from ModernBERT: {METRICS[task]} {result['eval'][METRICS[task]]:.3f}")


@pytest.mark.slow
def test_embed_from_a_modernbert_run(modernbert_run, tmp_path):
  """`python -m encoderx.embed --init_from=RUN` writes what the library computes."""
  texts = ["It is a truth universally acknowledged.", "Anne walked to Bath.",
           "Captain Wentworth wrote a letter."]
  source = tmp_path / "sentences.txt"
  source.write_text("\n".join(texts) + "\n", encoding="utf-8")
  output = tmp_path / "embeddings.npy"
  completed = subprocess.run(
      [sys.executable, "-m", "encoderx.embed", f"--init_from={modernbert_run}",
       f"--input={source}", f"--output={output}", "--pooling=mean"],
      capture_output=True, text=True, check=False, cwd=REPO)
  assert completed.returncode == 0, completed.stderr[-2000:]
  assert f"wrote {len(texts)} embeddings of 32 dimensions" in completed.stdout
  embedder = embed.Embedder(modernbert_run, pooling="mean", batch_size=1)
  single = np.concatenate([embedder([text]) for text in texts])
  np.testing.assert_allclose(np.load(output), single, atol=1e-4)
