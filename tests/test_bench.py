"""The benchmark's measures: the FLOP formula against XLA's count, the ahead-of-time
compiled step, MFU and the training-loop comparison, the accelerator path on CPU
(encoderx/tools/speed/bench.py and its parts)."""
import dataclasses
import functools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import tiny_hf  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
from conftest import xla_flags_with_devices
from encoderx import config as config_lib
from encoderx.train import trainer as trainer_lib
from encoderx.data import pipeline
from encoderx.data import tagging
from encoderx.methods import registry as method_registry
from encoderx.models import model_config
from encoderx.tools.speed import (accelerator, bench, bench_models, finetune_steps, flops,
                                  op_profile, timing, train_steps)
from encoderx.tools.quality import finetune_compare


_BATCHES = {}  # (task, length, batch size) -> a training batch: one pipeline start each


def _batch(config, batch_size):
  task = bench_models.pretraining_task(config)
  key = (task.name, config.data.seq_length, batch_size)
  if key not in _BATCHES:
    (_BATCHES[key],) = pipeline.take_batches(task, "train", config.data.seq_length,
                                             batch_size, 1)
  return _BATCHES[key]


def _small_measures(monkeypatch):
  """The bench's machine peak from a 256-square matmul (not 2,048), its pipeline timed
  over the batches the steps use (not 40): what a row computes is the same."""
  quick_peak = functools.partial(timing.measure_matmul_peak, size=256)
  monkeypatch.setattr(bench, "measure_matmul_peak", quick_peak)
  monkeypatch.setattr(accelerator, "measure_matmul_peak", quick_peak)
  monkeypatch.setattr(bench_models, "PIPELINE_MIN_BATCHES", 1)


def _compiled(config, batch_size=8, abstract_state=False):
  """(trainer, state, batch, the compiled step, its cost); the state only as shapes (no
  initialization run) with abstract_state: XLA's count needs the shapes alone."""
  trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
  state = (trainer.abstract_state_with_shardings() if abstract_state
           else trainer.init_state())
  batch = _batch(config, batch_size)
  step, cost = trainer.compile_train_step(state, trainer.device_batch(batch))
  return trainer, state, batch, step, cost


@pytest.mark.parametrize("model_name", ["bert_mini", "albert_tiny", "electra_tiny",
                                        "spanbert_tiny", "eurobert_tiny"])
def test_flop_formula_matches_xla_count(model_name):
  """The formula from the config (encoderx/tools/speed/flops.py) is within 10% of the FLOPs XLA
  counts in the compiled step, which also counts elementwise ops and the optimizer (a
  larger share the smaller the model): BERT's layers, ALBERT's shared layers and
  factorized embeddings, ELECTRA's generator, SpanBERT's SBO head, EuroBERT's gated
  feed-forward and grouped-query attention."""
  config = bench_models.build_config(model_name, 8)
  trainer, _, _, _, cost = _compiled(config, abstract_state=True)
  formula = bench_models.model_flops_per_token(config, trainer.method)
  xla = cost.flops / (8 * config.data.seq_length)
  assert formula <= xla < 1.10 * formula, (formula, xla)


def test_head_on_every_position_costs_more():
  config = bench_models.build_config("bert_small", 8)
  model = trainer_lib.Trainer(config, devices=jax.devices()[:1]).method.model_config
  gathered = flops.training_flops_per_token(model, 128, 20)
  every = flops.training_flops_per_token(model, 128, 128)
  head = 6 * (512 * 512 + 512 * model.vocab_size)
  assert every - gathered == pytest.approx(head * (128 - 20) / 128)
  # The scores of the padding rows (model.vocab_multiple) are computed: counted.
  padded = dataclasses.replace(model, vocab_multiple=128)  # 8,000 -> 8,064 rows
  assert (flops.training_flops_per_token(padded, 128, 20) - gathered
          == pytest.approx(6 * 512 * 64 * 20 / 128))


def test_local_layers_count_the_attention_of_their_band():
  """A local layer's queries see window + 1 keys (|i - j| <= window / 2), not the whole
  row: ModernBERT-base's sizes at 1,024 tokens, local in two layers of three."""
  config = bench_models.build_config("modernbert_base_1024", 1)
  model = model_config.ModelConfig.from_config(config.model, vocab_size=50368)
  every_layer_global = model.replace(attention=dict(window=0))
  local_layers = sum(not model.is_global_layer(i) for i in range(model.num_layers))
  assert local_layers == 14
  assert (flops.encoder_flops_per_token(every_layer_global, 1024)
          - flops.encoder_flops_per_token(model, 1024)
          == 12 * (1024 - 129) * 768 * local_layers)
  # At a row no longer than the band, a local layer sees the whole row as a global one.
  assert (flops.encoder_flops_per_token(model, 128)
          == flops.encoder_flops_per_token(every_layer_global, 128))


def test_pytorch_flops_count_the_head_where_hugging_face_runs_it():
  """Hugging Face's BERT scores every position against the vocabulary; ModernBERT's
  pretraining class, built with sparse prediction, only the masked ones: the bench
  counts PyTorch's FLOPs as encoderx's there (equal work)."""
  counted = {}
  for name in ("bert_tiny", "modernbert_tiny"):
    config = config_lib.validate(bench_models.build_config(name, 8))
    method = method_registry.build(config)
    every = train_steps.torch_scores_every_position(method)
    counted[name] = (bench_models.model_flops_per_token(config, method, every),
                     bench_models.model_flops_per_token(config, method))
  assert counted["bert_tiny"][0] > counted["bert_tiny"][1]
  assert counted["modernbert_tiny"][0] == counted["modernbert_tiny"][1]


def test_pytorch_is_fed_batches_masked_at_the_training_rate():
  """ModernBERT masks 30% of the tokens in training and 15% in evaluation: PyTorch is fed
  the batches as the train step masks them (Trainer.prepared_batch), so its sparse
  prediction scores as many positions as encoderx's head (on 1053c76's code, fed the
  evaluation's masks, it scored half)."""
  config = bench_models.build_config("modernbert_tiny", 4)
  trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
  batch = _batch(trainer.config, 4)
  (fed,) = train_steps.prepared_batches(trainer, [batch])
  evaluated = jax.jit(trainer.method.prepare)(batch, jax.random.key(0))
  masked = lambda prepared: float(np.sum(prepared["masked_weights"]))
  assert masked(fed) == pytest.approx(config.objective.mlm.rate * batch["input_ids"].size,
                                      rel=0.05)
  assert masked(fed) > 1.8 * masked(evaluated)


def test_compiled_step_computes_what_the_jitted_step_does(tiny_config):
  config = tiny_config()
  trainer, state, batch, compiled, cost = _compiled(config, batch_size=4)
  assert cost.flops > 0 and cost.temp_bytes > 0 and "GFLOP" in cost.describe()
  jitted = trainer.train_step(0)
  copy = jax.tree_util.tree_map(lambda x: x.copy(), state)  # the steps donate the state
  state_a, metrics_a = compiled(state, trainer.device_batch(batch))
  state_b, metrics_b = jitted(copy, trainer.device_batch(batch))
  for a, b in zip(jax.tree_util.tree_leaves((state_a, metrics_a)),
                  jax.tree_util.tree_leaves((state_b, metrics_b))):
    np.testing.assert_array_equal(a, b)


def test_interleaved_steps_take_turns_and_are_timed_each():
  """Round i runs step i of each framework, the order reversed every other round, the
  warm-up rounds too; each timed step's own wall time is kept."""
  calls = []

  def quick(index):
    calls.append(("quick", index))

  def slow(index):
    calls.append(("slow", index))
    time.sleep(0.02)

  quick_times, slow_times = timing.time_interleaved([quick, slow], warmup=2, steps=3)
  assert calls == [("quick", 0), ("slow", 0), ("slow", 1), ("quick", 1), ("quick", 2),
                   ("slow", 2), ("slow", 3), ("quick", 3), ("quick", 4), ("slow", 4)]
  assert len(quick_times) == len(slow_times) == 3
  assert min(slow_times) >= 0.02 > max(quick_times)


def test_published_peaks_by_device_kind():
  assert accelerator.published_peak("NVIDIA H100 80GB HBM3") == 989e12
  assert accelerator.published_peak("TPU v5 lite") == 197e12
  assert accelerator.published_peak("cpu") is None


def test_accelerator_path_runs_on_cpu(capsys, interpreted_kernels, monkeypatch):
  """--device=gpu|tpu's functions (bf16 steps, the fused attention choosing XLA here; MFU
  against a peak) run here on CPU, a tiny model standing in for BERT-base; and the rows
  of --attention_kernels=pallas, the kernel interpreted here. Without attention dropout
  and one warm-up step: the rows with the config's dropout (each kernel's) are
  tests/test_launch.py's gpu_bench runs, through these functions."""
  monkeypatch.setattr(accelerator, "ACCELERATOR_WARMUP_STEPS", 1)
  _small_measures(monkeypatch)
  rows = accelerator.accelerator_rows(["bert_tiny"], (64,), batch_size=2, steps=1,
                                      with_torch=False, attention_dropouts=(0.0,),
                                      attention_kernels=("auto", "pallas"))
  assert [row["model"] for row in rows] == [
      "bert_tiny @64, attention dropout 0", "bert_tiny @64, attention dropout 0, pallas kernel"]
  for row in rows:
    assert row["mfu"] > 0 and row["jax_tokens_per_second"] > 0
  printed = bench.report.table("accelerator", rows)
  assert "MFU" in printed and "%" in printed.splitlines()[2]
  assert "measured bf16 matmul" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_prints_mfu_and_the_training_loop(capsys, monkeypatch):
  _small_measures(monkeypatch)
  bench.main(["--models=bert_tiny", "--steps=1", "--batch_size=4", "--skip_padding",
              "--train_loop_steps=4"])
  out = capsys.readouterr().out
  assert "machine peak:" in out and "MFU" in out and "torch MFU" in out
  assert "encoderx / pytorch, step by step: median" in out  # timed side by side
  assert "loop / bench" in out
  loop_line = out.split("loop / bench")[1].splitlines()[2]
  assert float(loop_line.split()[-1]) > 0


def test_the_modern_rows_build_and_run_a_step_beside_pytorch(capsys, monkeypatch):
  """modernbert_tiny, eurobert_tiny and ModernBERT-base's sizes at 128 and 1,024 tokens
  (all in the default set, the base rows at the batch the host holds) build their configs
  and run one timed step of each framework."""
  assert {"modernbert_tiny", "eurobert_tiny", "modernbert_base", "modernbert_base_1024"} <= (
      set(bench.parse_args([]).models))
  assert [bench_models.batch_size(m, 32) for m in ("bert_tiny", "modernbert_base",
                                                   "modernbert_base_1024")] == [32, 16, 2]
  assert bench_models.batch_size("modernbert_base_1024", 1) == 1
  assert bench.parse_args(["--models=modernbert_base_1024"]).models == [
      "modernbert_base_1024"]
  base = bench_models.build_config("modernbert_base_1024", 2)
  assert (base.data.seq_length, base.model.num_layers, base.model.hidden_size) == (
      1024, 22, 768)
  assert base.objective.mlm.max_predictions >= 0.3 * 1024  # 30% masked, as at 128
  assert bench_models.build_config("modernbert_base", 2).data.seq_length == 128
  # the base sizes change one field of model.attention (its window); the group's other
  # fields stay, and the configs validate (the accelerator row's too)
  for config in (base, accelerator.accelerator_config("modernbert_base", 8192, 1)):
    config_lib.validate(config)
    assert (config.model.attention.window, config.model.attention.variant) == (
        128, "standard")
  _small_measures(monkeypatch)
  bench.main(["--models=modernbert_tiny,eurobert_tiny", "--steps=1", "--batch_size=2",
              "--skip_padding"])
  out = capsys.readouterr().out
  for name in ("modernbert_tiny", "eurobert_tiny"):
    assert f"\n{name}:" in out
  assert out.count("encoderx / pytorch, step by step") == 2  # PyTorch beside each


def test_accelerator_lengths_flag():
  assert bench.parse_args(["--device=gpu", "--lengths=512,128"]).lengths == [512, 128]
  assert bench.parse_args(["--device=gpu"]).lengths == list(accelerator.ACCELERATOR_LENGTHS)
  assert bench.parse_args(["--device=gpu", "--attention_kernels=auto,pallas"]
                          ).attention_kernels == ["auto", "pallas"]
  for bad in ("--lengths=512,x", "--lengths=4", "--attention_kernels=auto,triton"):
    with pytest.raises(SystemExit):
      bench.parse_args(["--device=gpu", bad])


@pytest.mark.parametrize("preset, expected", [(None, "false"), ("true", "true")])
def test_bench_leaves_gpu_memory_to_pytorch_unless_told_otherwise(preset, expected):
  """jax reserves 75% of a GPU's memory at its first use unless told not to; the bench
  runs PyTorch beside it, so it tells it not to, and a user's own setting stands."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
  if preset is not None:
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = preset
  out = subprocess.run(
      [sys.executable, "-c", "import os, encoderx.tools.speed.bench; "
       "print(os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'])"],
      env=env, capture_output=True, text=True, check=True).stdout
  assert out.split()[-1] == expected


# --- the host allocator ----------------------------------------------------------------
def _tcmalloc_path() -> str | None:
  listed = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
  paths = [line.split("=>")[-1].strip() for line in listed.splitlines()
           if "libtcmalloc_minimal.so.4 " in line]
  return paths[0] if paths else None


def _allocator_named_in(ld_preload: str | None) -> str:
  env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
  if ld_preload:
    env["LD_PRELOAD"] = ld_preload
  return subprocess.run([sys.executable, "-c", "from encoderx import host_allocator; "
                         "print(host_allocator.name())"], env=env, capture_output=True,
                        text=True, check=True).stdout.strip()


def test_the_allocator_in_use_is_named():
  """What the bench prints and the training loop checks: glibc's malloc unless another
  is preloaded, which launch/setup.sh does with tcmalloc."""
  assert _allocator_named_in(None) == "system"
  tcmalloc = _tcmalloc_path()
  if tcmalloc is None:
    # launch/setup.sh installs it wherever it runs as root with apt (CI): there, missing
    # is a failure of the set-up; elsewhere the library may be absent.
    assert not (os.geteuid() == 0 and shutil.which("apt-get")), (
        "libtcmalloc-minimal4 is missing although launch/setup.sh runs as root with apt")
    pytest.skip("libtcmalloc-minimal4 is not installed, and this is not root with apt "
                "(launch/setup.sh installs it there)")
  assert _allocator_named_in(tcmalloc) == "tcmalloc"


@pytest.mark.parametrize("platform,allocator,warned", [
    ("cpu", "system", True), ("cpu", "tcmalloc", False), ("gpu", "system", False)])
def test_a_cpu_run_on_glibc_malloc_is_warned(monkeypatch, caplog, platform, allocator,
                                             warned):
  from encoderx import host_allocator  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(host_allocator, "name", lambda: allocator)
  with caplog.at_level("WARNING", logger="encoderx"):
    assert host_allocator.warn_if_slow_for(platform) is warned
  assert ("LD_PRELOAD=libtcmalloc_minimal.so.4" in caplog.text) is warned


def _first_sentences(source, target, count):
  """The first `count` sentences of a CoNLL file."""
  lines = []
  for line in source.read_text(encoding="utf-8").splitlines(keepends=True):
    lines.append(line)
    if not line.strip() and sum(1 for kept in lines if not kept.strip()) == count:
      break
  target.write_text("".join(lines), encoding="utf-8")


@pytest.mark.slow
def test_the_finetune_rows_pad_each_side_its_own_way_and_time_whole_runs(tmp_path):
  """--finetune: encoderx cut to its length buckets, every row at 64, PyTorch padded to
  each batch's longest, on the same batches; a whole run of each side end to end. From a
  tiny BERT saved as Hugging Face saves one (--finetune_init): the rows' padding and
  report do not depend on the encoder's size, and the released MiniLM's 6 layers of 384
  cost a minute of steps and compilation here."""
  import transformers  # pylint: disable=g-import-not-at-top
  init_from = tiny_hf.save_tiny_bert(tmp_path / "hf", transformers.BertModel)
  conll = pathlib.Path(finetune_steps.DEFAULT_CORPORA) / "conll2003"
  if not (conll / "train.txt").exists():
    pytest.skip(f"the CoNLL-2003 corpus is not at {conll}")
  (tmp_path / "conll2003").mkdir()
  _first_sentences(conll / "train.txt", tmp_path / "conll2003" / "train.txt", 40)
  _first_sentences(conll / "dev.txt", tmp_path / "conll2003" / "dev.txt", 4)
  record = tmp_path / "finetune.json"
  bench.main(["--finetune", "--models=tag_conll2003", "--steps=1", "--batch_size=4",
              f"--finetune_init={init_from}", f"--finetune_data={tmp_path}",
              "--finetune_end_to_end_steps=1", f"--json={record}"])
  content = json.loads(record.read_text())
  (row,) = content["rows"]
  assert content["kind"] == "finetune" and row["case"] == "tag_conll2003"
  assert row["jax_full_tokens"] == 4 * finetune_steps.SEQ_LENGTH
  assert 0 < row["real_tokens"] <= row["torch_tokens"] <= row["jax_tokens"] <= row[
      "jax_full_tokens"]
  assert row["jax_over_torch"] == pytest.approx(row["torch_ms"] / row["jax_ms"])
  (whole,) = content["tables"]["finetune_end_to_end"]
  assert whole["steps"] == 1 and whole["jax_seconds"] > 0 and whole["torch_seconds"] > 0


def test_finetune_compare_scores_tags_over_every_word_and_over_the_words_that_fit():
  sentence = tagging.Sentence(1, ["Anne", "went", "to", "Bath"], ["B-PER", "O", "O", "B-LOC"])
  word_ids = [None, 0, 1, 1, None]  # "went" in two pieces; "to" and "Bath" cut off
  predicted = finetune_compare.word_predictions(word_ids, np.array([0, 1, 0, 2, 0]), 4,
                                                ["O", "B-PER", "B-LOC"])
  assert predicted == ["B-PER", "O", None, None]  # a word's first piece decides
  scores = finetune_compare.tag_scores([sentence], [predicted])
  assert scores["f1_seen_words"] == 1.0  # Bath's entity dropped with its word
  assert scores["f1"] == pytest.approx(2 / 3)  # Bath's entity missed: P 1, R 1/2


def test_the_finetune_rows_name_a_missing_corpus():
  with pytest.raises(finetune_steps.FinetuneBenchError, match="nowhere/conll2003 is not"):
    finetune_steps.case_config("tag_conll2003", "hf:unused", "/nowhere")
  with pytest.raises(finetune_steps.FinetuneBenchError, match="nowhere/stsb is not"):
    finetune_steps.case_config("embed_stsb", "hf:unused", "/nowhere")
  with pytest.raises(SystemExit):
    bench.parse_args(["--finetune", "--models=bert_tiny"])  # not a fine-tuning case


def test_an_embedding_rows_views_are_each_padded_to_their_own_longest():
  """sentence-transformers pads each column of texts to its own longest: the PyTorch
  side of the embed_stsb row is fed each view (prefix) cut to its own longest text."""
  def view(length):
    real = np.arange(64) < np.asarray([[length], [3]])
    return {"input_ids": np.where(real, 7, 0), "token_type_ids": np.zeros([2, 64], int),
            "segment_ids": real.astype(int), "positions": np.where(real, np.arange(64), 0)}
  batch = {**view(10), **{"pair_" + name: value for name, value in view(25).items()}}
  cut = finetune_steps.padded_to_the_longest(batch, ("", "pair_"))
  assert {name: value.shape[1] for name, value in cut.items()} == {
      **{name: 10 for name in view(1)}, **{"pair_" + name: 25 for name in view(1)}}
  plain = finetune_steps.padded_to_the_longest(batch)  # one longest for the whole batch
  assert {value.shape[1] for value in plain.values()} == {25}


# --- the op profile ---------------------------------------------------------------------
def test_op_profile_sums_op_time_by_kind_and_counts_ops_running_at_once():
  events = [(0, 10, "ynn_fusion.3"), (5, 15, "copy_bitcast_fusion"), (20, 30, "ynn_fusion.12")]
  assert op_profile.time_by_kind(events) == {"ynn_fusion": 20, "copy_bitcast_fusion": 10}
  # 0-5 one op, 5-10 two, 10-15 one, 15-20 none, 20-30 one.
  assert op_profile.concurrency(events) == {0: 5, 1: 20, 2: 5}


def test_op_profile_traces_a_bench_models_cpu_step_by_op(tmp_path):
  """The command turns XLA:CPU's per-op trace events on itself (a fresh process: the flag
  is read when jax starts its CPU client) and finds the step's matmuls."""
  env = {**os.environ, "XLA_FLAGS": xla_flags_with_devices(None)}
  out = subprocess.run(
      [sys.executable, "-m", "encoderx.tools.speed.op_profile", "--model=bert_tiny",
       "--batch_size=2", "--steps=1", "--top=50", f"--trace_out={tmp_path}"],
      env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  summary = next(line for line in lines if line.startswith("op time"))
  shares = [int(share) for share in re.findall(r"(\d+)%", summary)]
  assert len(shares) == 3 and abs(sum(shares) - 100) <= 2
  kinds = [line.split()[-1] for line in lines if line.startswith("  ")]
  # The matmuls: YNNPACK's or XNNPACK's fusions, or Eigen's dots, as XLA:CPU chose.
  assert any(name.startswith(("ynn_fusion", "xnn_fusion", "dot")) for name in kinds), kinds
