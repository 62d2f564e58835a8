"""The input pipeline at corpus scale: start-up, memory and resume against corpus size,
and examples/s per core for each example builder.

    python -m encoderx.tools.data.bench_data [--scales=1,8,64] [--workdir=DIR] [--on_the_fly]
        [--skip_builders | --skip_scales] [--workers=N] [--json=FILE]

1. Corpora 1x, 8x, 64x the bundled one: copy r of each bundled novel, its chapters in an
   order drawn from r, is one file (3 files per 1x, 1.5 MB). Each is preprocessed for
   bert_tiny (sentence pairs at 128) with `encoderx.preprocess` (its wall time is shown).
2. For each corpus and source (preprocessed examples; the text streamed file by file;
   with --on_the_fly, the text read whole as small corpora are), a fresh process (after
   its imports) measures:
     start-up  seconds from building the Task (and checking the data, as a run does) to
               the first batch
     memory    the process's peak resident memory (MB) after 50 batches of 32
     resume    seconds from a position late in the first epoch (what a checkpoint taken
               there holds) to the batch after it, in another fresh process
   The resumed position of a stream costs the same work at every scale: the epoch's last
   shard (in its shard order) of each of the three novels is open with RESUME_LEFT
   examples left, together more than a shuffle window, and every other shard is read. So
   resuming opens three files of the same text and refills one window from them, whatever
   the corpus size. (A position a fixed fraction into the epoch leaves different examples
   in its open shards at each scale, so its window needed 4 shards at one scale and 8 at
   another: it measured where the position fell, not the corpus size.) The text read
   whole resumes RESUME_FRACTION into the first epoch, replaying the epoch up to there.
   The three should stay flat (within 1.5x) from 1x to 64x for the streamed sources; the
   table prints each one's ratio 64x / 1x (largest / smallest scale).
3. For each example builder (one tiny config each; XLNet's row streams for 32 rows), on
   the 1x corpus, in a process held to one CPU core: examples/s building examples from
   the text (sentence breaking, tokenization, the builder), and examples/s streaming the
   preprocessed examples, over every training example of the corpus, file after file.
   Opening a file (its tf.data iterator; the first also traces the Task) is not counted;
   its first example is: a file is one group of documents, so that example waits for the
   whole file to be tokenized and built.

Every figure depends on what else runs on the machine; the header prints the load, and
each row of the scale table the 1-minute load average after its measurements.

--json=FILE also writes both tables as numbers, with the date, commit, device, malloc
and command (encoderx/tools/figures/report.py), for docs/performance.md (tools/perf_page.py).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from encoderx import configs
from encoderx.data import corpus, resources

BATCH_SIZE = 32
SEQ_LENGTH = 128
MEMORY_BATCHES = 50  # batches pulled before the peak resident memory is read
RESUME_FRACTION = 0.9  # how far into the first epoch the text read whole resumes
RESUME_LEFT = 800  # examples left in each shard open at a streamed resumed position
# One config per example builder (and per sentence objective of the pair builder).
BUILDER_CONFIGS = {"sentence_pairs (nsp)": "bert:tiny", "sentence_pairs (sop)": "albert:tiny",
                   "full_sentences": "roberta:tiny", "doc_sentences": "spanbert:tiny",
                   "xlnet_streams": "xlnet:tiny"}
SOURCES = ("preprocessed", "text stream", "on the fly")
COPY_PREFIX = "copy%03d-"  # a corpus file's name: this prefix, then the novel's file name


# --- corpora ------------------------------------------------------------------------------
def write_corpus(directory: str, scale: int) -> list[str]:
  """`scale` copies of the bundled corpus, each novel's chapters shuffled per copy."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  config = configs.get("bert:tiny")
  corpus_format = corpus.CorpusFormat(config.data.document_marker)
  novels = {os.path.basename(path): list(corpus.documents_of_file(path, corpus_format))
            for path in resources.bundled_corpus_files()}
  os.makedirs(directory, exist_ok=True)
  paths = []
  for copy in range(scale):
    for name, chapters in novels.items():
      path = os.path.join(directory, f"{COPY_PREFIX % copy}{name}")
      if not os.path.exists(path):
        order = np.random.default_rng(copy).permutation(len(chapters))
        text = "".join(f"CHAPTER {number + 1}\n\n" + "\n\n".join(chapters[index]) + "\n\n"
                       for number, index in enumerate(order))
        with open(path + ".partial", "w", encoding="utf-8") as handle:
          handle.write(text)
        os.replace(path + ".partial", path)
      paths.append(path)
  return paths


def novel_of(path: str) -> str:
  """The bundled novel a file of `write_corpus` is a copy of."""
  return os.path.basename(path)[len(COPY_PREFIX % 0):]


def corpus_config(spec: str, corpus_dir: str, preprocessed: str = "",
                  streaming: bool = False):
  config = configs.get(spec)
  config.data.files = os.path.join(corpus_dir, "*.txt")
  config.data.seq_length = SEQ_LENGTH
  config.data.streaming, config.data.preprocessed = streaming, preprocessed
  config.train.batch_size = BATCH_SIZE
  return config


def preprocess_corpus(spec: str, corpus_dir: str, output: str, workers: int) -> float:
  """Preprocesses (unless done before); returns the wall time (0 if it was done)."""
  from encoderx import preprocess  # pylint: disable=g-import-not-at-top
  from encoderx.data import example_files  # pylint: disable=g-import-not-at-top
  if os.path.exists(os.path.join(output, example_files.MANIFEST)):
    return 0.0
  start = time.perf_counter()
  preprocess.run(corpus_config(spec, corpus_dir), output, workers=workers,
                 show_progress=False)
  return time.perf_counter() - start


# --- measurements, each in a fresh process ------------------------------------------------
def _task_and_check(config):
  """What a run does before its first batch: the method's data check, then the Task."""
  from encoderx.methods import registry  # pylint: disable=g-import-not-at-top
  pretraining = registry.build(config)
  pretraining.check_data()
  return pretraining.task()


def _resume_position(config, task, manifest_directory: str) -> dict:
  """The resumed position, as a checkpoint taken there holds (see the module doc)."""
  from encoderx.data import pipeline  # pylint: disable=g-import-not-at-top
  if not pipeline.is_streamed(task):
    examples = sum(1 for _ in pipeline.build_dataset(task, "train", SEQ_LENGTH, False, 0,
                                                     None))
    return {"epoch": 0, "batch": int(RESUME_FRACTION * examples / BATCH_SIZE)}
  state = _stream_state_at_last_novels(config, manifest_directory)
  return {"stream": {"parent_window_start_state": state, "window_index": 1000,
                     "pos_in_window": 0}}


def _stream_state_at_last_novels(config, manifest_directory: str) -> dict:
  """The stream's state late in epoch 0 where resuming costs the same at every scale: the
  epoch's last shard of each novel open, RESUME_LEFT examples left in each, every other
  shard read. Shard sizes come from the preprocessed manifest of the same corpus (its
  copy 0 is the text stream's epoch 0)."""
  from encoderx.data import example_files, shard_stream  # pylint: disable=g-import-not-at-top
  manifest = example_files.read_manifest(manifest_directory)
  shards = manifest["lengths"][str(SEQ_LENGTH)]["splits"]["train"]["copies"][0]
  order = shard_stream.shard_order(len(shards), config.train.seed, 0, shuffle=True)
  last_place = {}  # novel -> its last place in the order
  for place, index in enumerate(order):
    last_place[novel_of(shards[index]["source"])] = place
  counts = {place: shards[order[place]]["examples"] for place in last_place.values()}
  left = sum(min(count, RESUME_LEFT) for count in counts.values())
  if left < config.data.shuffle_buffer + (shard_stream.PREFETCH_BATCHES + 1) * BATCH_SIZE:
    raise ValueError(f"the open shards hold {left} examples, less than a window "
                     f"({config.data.shuffle_buffer}) and the batches read from it: raise "
                     "RESUME_LEFT")
  opened = [[place, max(0, counts[place] - RESUME_LEFT)] for place in sorted(counts)]
  return {"epoch": 0, "next": len(order), "open": opened, "turn": 0, "empty_epoch": 0}


def measure(spec: dict) -> dict:
  """Runs in a fresh process: start-up and memory, or resume (spec['what'])."""
  from encoderx.data import pipeline  # pylint: disable=g-import-not-at-top
  config = corpus_config("bert:tiny", spec["corpus"], spec.get("preprocessed", ""),
                         spec.get("streaming", False))
  if spec["what"] == "resume":
    task = _task_and_check(config)
    position = _resume_position(config, task, spec["manifest"])
    start = time.perf_counter()
    batches = pipeline.batch_iterator(task, "train", SEQ_LENGTH, BATCH_SIZE,
                                      seed=config.train.seed, position=position)
    next(batches)
    seconds = time.perf_counter() - start
    batches.close()
    return {"resume": seconds}
  start = time.perf_counter()
  task = _task_and_check(config)
  batches = pipeline.batch_iterator(task, "train", SEQ_LENGTH, BATCH_SIZE,
                                    seed=config.train.seed)
  next(batches)
  seconds = time.perf_counter() - start
  for _ in range(MEMORY_BATCHES):
    next(batches)
  memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  batches.close()
  return {"start-up": seconds, "memory": memory}


def measure_builder(spec: dict) -> dict:
  """Runs in a fresh process held to one core: examples/s building from the text and
  streaming the preprocessed examples, for one builder's config."""
  os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
  from encoderx.data import pipeline, tasks  # pylint: disable=g-import-not-at-top
  config_spec = BUILDER_CONFIGS[spec["builder"]]
  rates = {}
  for name, config in (
      ("build", corpus_config(config_spec, spec["corpus"], streaming=True)),
      ("read", corpus_config(config_spec, spec["corpus"],
                             preprocessed=spec["preprocessed"]))):
    task = tasks.register_pretraining_task(config)
    count, seconds = 0, 0.0
    for shard in pipeline.stream_shards(task, "train", SEQ_LENGTH, 0):
      examples = shard.open(0, 0)  # opening a shard is not throughput; its first example is
      start = time.perf_counter()
      count += sum(1 for _ in examples)
      seconds += time.perf_counter() - start
    rates[name] = count / seconds
  return rates


def _in_fresh_process(function: str, spec: dict) -> dict:
  result = subprocess.run(
      [sys.executable, "-m", "encoderx.tools.data.bench_data", f"--{function}", json.dumps(spec)],
      capture_output=True, text=True, check=False)
  if result.returncode:
    raise RuntimeError(f"{function} {spec} failed:\n{result.stderr[-3000:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


# --- the report ---------------------------------------------------------------------------
def scale_rows(workdir: str, scales: list[int], sources: list[str], workers: int
               ) -> list[dict]:
  rows = []
  for scale in scales:
    corpus_dir = os.path.join(workdir, f"corpus-x{scale}")
    files = write_corpus(corpus_dir, scale)
    megabytes = sum(os.path.getsize(f) for f in files) / 2**20
    output = os.path.join(workdir, f"bert_tiny-x{scale}")
    seconds = preprocess_corpus("bert:tiny", corpus_dir, output, workers)
    print(f"corpus x{scale}: {len(files)} files, {megabytes:.0f} MB"
          + (f", preprocessed in {seconds:.0f} s" if seconds else ""), flush=True)
    base = {"corpus": corpus_dir, "manifest": output}
    variants = {"preprocessed": {"preprocessed": output}, "text stream": {"streaming": True},
                "on the fly": {}}
    for source in sources:
      spec = {**base, **variants[source]}
      opened = _in_fresh_process("measure", {**spec, "what": "start"})
      resumed = _in_fresh_process("measure", {**spec, "what": "resume"})
      row = {"source": source, "corpus": f"x{scale} ({megabytes:.0f} MB)",
             "start-up s": opened["start-up"], "memory MB": opened["memory"],
             "resume s": resumed["resume"], "load": os.getloadavg()[0]}
      print(f"  {source}: start-up {row['start-up s']:.2f} s, memory "
            f"{row['memory MB']:.0f} MB, resume {row['resume s']:.2f} s (load average "
            f"{row['load']:.2f})", flush=True)
      rows.append(row)
  return rows


def format_scale_rows(rows: list[dict]) -> list[dict]:
  """Figures as text, and per source the ratio of the largest corpus to the smallest."""
  table = []
  measures = ("start-up s", "memory MB", "resume s")
  for source in dict.fromkeys(row["source"] for row in rows):
    mine = [row for row in rows if row["source"] == source]
    for row in mine:
      table.append({"source": source, "corpus": row["corpus"],
                    **{m: f"{row[m]:.2f}" if m != "memory MB" else f"{row[m]:.0f}"
                       for m in measures}, "load": f"{row['load']:.1f}"})
    if len(mine) > 1:
      ratios = {m: mine[-1][m] / max(mine[0][m], 1e-9) for m in measures}
      table.append({"source": source, "corpus": "largest / smallest",
                    **{m: f"{r:.2f}x" + ("" if r <= 1.5 else " (not flat)")
                       for m, r in ratios.items()}, "load": ""})
  return table


def builder_rows(workdir: str, workers: int) -> list[dict]:
  corpus_dir = os.path.join(workdir, "corpus-x1")
  write_corpus(corpus_dir, 1)
  rows = []
  for builder, config_spec in BUILDER_CONFIGS.items():
    output = os.path.join(workdir, f"{config_spec.replace(':', '_')}-x1")
    seconds = preprocess_corpus(config_spec, corpus_dir, output, workers)
    rates = _in_fresh_process("measure_builder", {"builder": builder, "corpus": corpus_dir,
                                                  "preprocessed": output})
    config = configs.get(config_spec)
    rows.append({"builder": builder, "vocabulary": config.data.vocab.kind,
                 "build_examples_per_second": rates["build"],
                 "read_examples_per_second": rates["read"],
                 "preprocess_seconds": seconds})  # 0: preprocessed by an earlier run
    print(f"  {builder}: build {rates['build']:,.0f}, read {rates['read']:,.0f} "
          "examples/s per core", flush=True)
  return rows


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--scales", default="1,8,64",
                      help="corpus sizes, in copies of the bundled corpus")
  parser.add_argument("--workdir", default="",
                      help="where corpora and preprocessed examples go (kept, and reused "
                      "by the next run); default: a temporary directory, removed")
  parser.add_argument("--on_the_fly", action="store_true",
                      help="also measure the text read whole (start-up and resume grow "
                      "with the corpus: slow at 64x)")
  parser.add_argument("--skip_builders", action="store_true",
                      help="skip the per-builder examples/s table")
  parser.add_argument("--skip_scales", action="store_true",
                      help="skip the corpus-size table (measure the builders only)")
  parser.add_argument("--workers", type=int, default=None,
                      help="preprocessing processes (default: one per CPU core)")
  parser.add_argument("--json", default="", metavar="FILE",
                      help="also write the tables as numbers, with the date, commit, "
                      "device, malloc and this command, to FILE")
  parser.add_argument("--measure", help=argparse.SUPPRESS)
  parser.add_argument("--measure_builder", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  args.scales = sorted({int(s) for s in args.scales.split(",") if s.strip()})
  if not args.scales or min(args.scales) < 1:
    parser.error("--scales takes positive integers, e.g. 1,8,64")
  return args


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parse_args(argv)
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.set_verbosity(absl_logging.ERROR)
  for function in ("measure", "measure_builder"):
    if getattr(args, function):  # a measurement in its own process
      print(json.dumps(globals()[function](json.loads(getattr(args, function)))))
      return
  workdir = args.workdir or tempfile.mkdtemp(prefix="encoderx-bench-data-")
  print(f"encoderx bench_data: batch {BATCH_SIZE} x length {SEQ_LENGTH}, in {workdir}\n"
        f"  host: {os.cpu_count()} CPU core(s), load average {os.getloadavg()[0]:.2f} "
        "(other processes on the host skew every figure)", flush=True)
  from encoderx.tools.figures import report  # pylint: disable=g-import-not-at-top
  sources = list(SOURCES if args.on_the_fly else SOURCES[:2])
  tables = {}
  try:
    if not args.skip_scales:
      tables["data_scales"] = scale_rows(workdir, args.scales, sources, args.workers)
      print("\n" + report.format_table(format_scale_rows(tables["data_scales"])))
    if not args.skip_builders:
      print("\nexamples/s per core, bundled corpus (x1), length 128:", flush=True)
      tables["data_builders"] = builder_rows(workdir, args.workers)
      print("\n" + report.table("data_builders", tables["data_builders"]))
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  if args.json and tables:
    kind, *others = tables
    report.write_json(args.json, report.record(
        kind, tables[kind], "encoderx.tools.data.bench_data", argv,
        tables={other: tables[other] for other in others}))


if __name__ == "__main__":
  main()
