"""Offline preprocessing: text files or a TFDS dataset -> files of a config's pretraining
examples, written once and streamed by runs (`data.preprocessed=DIR`); the command:
preprocess/__main__.py.

    from encoderx import preprocess
    manifest = preprocess.run(config, "DIR", copies=1)

The work is one unit per (split, length, copy, input shard): an input shard (a text file,
a file of the TFDS dataset) runs through the config's seqio Task (sentence breaking,
tokenization, the example builder: sentence pairs, packed sentences, ...) exactly as a
run that streams the text would in epoch `copy`, and its examples go to one ArrayRecord
file (encoderx/data/example_files.py). Units run in parallel over `workers` processes
with a progress bar; `manifest.json` is written last, with the vocabulary's hash, the
builder and its options, the lengths and every file's example count, and a run checks it
against its own config. An interrupted run is continued by the same command: finished
files are kept (each is written under a temporary name and renamed when complete).

XLNet's row streams (method xlnet) are built for the rows each process of the training
run reads, train.batch_size / `processes` (XLNet's bsz_per_host); the manifest records
them with reuse_len and bi_data, and a run checks them.

Lengths: every length the config trains at (data.seq_length, and train.long_seq_length
when train.long_fraction is set). Copies (BERT's dupe_factor): epoch e of a run reads
copy e % copies of the training examples, so pairs change between epochs as they do when
the text is streamed; evaluation reads one copy of the held-out examples.

`write_unit(config, output, unit)` is a pure function of its arguments; a cluster runner
(Apache Beam, say) would map it over `plan(...)` and then call `write_manifest`. Beam is
not wired here: apache-beam 2.77 requires protobuf < 7, and the pinned TensorFlow 2.21
stack uses protobuf 7.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import time

import ml_collections

from encoderx import config as config_lib
from encoderx import errors
from encoderx import files as files_lib
from encoderx.data import corpus, example_files, pipeline, tasks

PLAN = "plan.json"  # what an unfinished output directory is being written for


@dataclasses.dataclass(frozen=True)
class Unit:
  """One output file: input shard `shard` of `shards` (`source`) of `split`, built at
  `seq_length` as epoch `copy` of a stream would build it."""
  split: str
  seq_length: int
  copy: int
  shard: int
  shards: int
  source: str

  @property
  def file(self) -> str:
    return example_files.shard_file(self.split, self.seq_length, self.copy, self.shard,
                                   self.shards)


def source_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config whose Task reads the raw corpus shard by shard (what is preprocessed)."""
  source = ml_collections.ConfigDict(config.to_dict())
  source.data.streaming, source.data.preprocessed = True, ""
  return source


def source_task(config: ml_collections.ConfigDict, processes: int = 1):
  """The config's seqio Task on the raw corpus (XLNet's row streams as each of
  `processes` processes reads them)."""
  return tasks.register_pretraining_task(source_config(config), process_count=processes)


def plan(config: ml_collections.ConfigDict, copies: int) -> list[Unit]:
  """Every unit of work, in order: split, length, copy, shard."""
  task = source_task(config)
  units = []
  for split in tasks.SPLITS:
    names = task.source.list_shards(split)
    for seq_length in example_files.sequence_lengths(config):
      for copy in range(copies if split == "train" else 1):
        units += [Unit(split, seq_length, copy, index, len(names), str(name))
                  for index, name in enumerate(names)]
  return units


def write_unit(config: ml_collections.ConfigDict, output: str, unit: Unit,
               features: dict, processes: int = 1) -> int:
  """Writes one unit's examples to its file, records laid out as `features` says (a file
  already complete is kept); returns their number."""
  path = os.path.join(output, unit.file)
  if os.path.exists(path):
    return example_files.count_records(path)
  task = source_task(config, processes)
  shards = pipeline.stream_shards(task, unit.split, unit.seq_length, config.train.seed)
  examples = shards[unit.shard].open(unit.copy, 0)
  return example_files.write_records(
      path, (example_files.encode(example, features) for example in examples))


def record_features(config: ml_collections.ConfigDict, seq_length: int,
                    processes: int = 1) -> dict:
  """The record layout at `seq_length`: the Task's output features, shapes and dtypes."""
  task = source_task(config, processes)
  dataset = pipeline.build_dataset(task, "train", seq_length, False, 0, None)
  return example_files.feature_spec(dataset.element_spec)


def _description(config, copies: int, processes: int = 1) -> dict:
  """What an output directory is written for (its plan, then its manifest's header)."""
  data = config.data
  if data.tfds_name:
    source = {"tfds_name": data.tfds_name, "tfds_text_key": data.tfds_text_key,
              "splits": {"train": data.tfds_train_split, "validation": data.tfds_eval_split}}
  else:
    source = {"files": tasks.corpus_files(data), "document_marker": data.document_marker,
              "sentence_per_line": data.sentence_per_line,
              "invalid_utf8": data.invalid_utf8,
              "eval_every_nth_document": data.eval_every_nth_document}
  streams = {"processes": processes} if tasks.builds_streams(config) else {}
  return {"format": example_files.FORMAT,
          "examples": example_files.examples_description(
              config, tasks.examples_options(config, processes)),
          "source": source, "seed": config.train.seed, "copies": copies, **streams}


def _start(output: str, description: dict) -> None:
  """Claims `output` for `description` (with the lengths to write), or continues an
  unfinished run of the same."""
  if os.path.exists(os.path.join(output, example_files.MANIFEST)):
    raise errors.ConfigError(
        f"'{output}' already holds preprocessed examples (its {example_files.MANIFEST}); "
        "nothing was changed. Choose another directory.", argument="output")
  os.makedirs(output, exist_ok=True)
  plan_path = os.path.join(output, PLAN)
  if os.path.exists(plan_path):
    with open(plan_path, encoding="utf-8") as handle:
      if json.load(handle) != json.loads(json.dumps(description)):
        raise errors.ConfigError(
            f"'{output}' holds an unfinished preprocessing of another config or number "
            "of copies; nothing was changed. Continue it with its own config, or choose "
            "another directory.", argument="output")
  else:
    files_lib.write_atomically(plan_path, json.dumps(description, indent=2))


def write_manifest(config, output: str, copies: int, units: list[Unit], counts: list[int],
                   features: dict, processes: int = 1) -> dict:
  """The manifest of finished units (`counts` in the order of `units`; `features`:
  {seq_length: record layout}); raises CorpusError for a split without examples."""
  manifest = {**_description(config, copies, processes), "lengths": {}}
  for unit, count in zip(units, counts):
    length = manifest["lengths"].setdefault(str(unit.seq_length), {
        "features": features[unit.seq_length], "splits": {}})
    split = length["splits"].setdefault(unit.split, {"examples": 0, "copies": []})
    while len(split["copies"]) <= unit.copy:
      split["copies"].append([])
    split["copies"][unit.copy].append({"file": unit.file, "examples": count,
                                       "source": unit.source})
    split["examples"] += count
  for seq_length, length in manifest["lengths"].items():
    for name, split in length["splits"].items():
      if not split["examples"]:
        raise corpus.CorpusError(
            f"the {name} split yields no example at length {seq_length} (every "
            f"{config.data.eval_every_nth_document}th document of each file is held out; "
            "a file with fewer documents holds none out). Add documents or files, or "
            "lower data.eval_every_nth_document.")
  files_lib.write_atomically(os.path.join(output, example_files.MANIFEST),
                             json.dumps(manifest, indent=1))
  os.remove(os.path.join(output, PLAN))
  return manifest


def _write_unit(arguments) -> int:
  return write_unit(*arguments)


def _check_processes(config, processes: int) -> None:
  """`processes`: the process count of the training run (XLNet's rows per process)."""
  if processes == 1:
    return
  if not tasks.builds_streams(config):
    raise errors.ConfigError(
        f"{processes} processes, but only XLNet's row streams depend on the processes "
        "that read them; these examples serve any number. Leave it at 1.",
        argument="processes")
  batch, bi_data = config.train.batch_size, config.objective.plm.bi_data
  if processes < 1 or batch % processes or (bi_data and batch // processes % 2):
    raise errors.ConfigError(
        f"{processes} processes do not split train.batch_size={batch} into "
        f"{'an even' if bi_data else 'a whole'} number of rows per process"
        + (" (bi_data reads half of them backwards)." if bi_data else ".")
        + " Give the process count of the run that will train on the examples.",
        argument="processes")


def run(config: ml_collections.ConfigDict, output: str, copies: int = 1,
        workers: int | None = None, show_progress: bool = True, processes: int = 1) -> dict:
  """Preprocesses `config`'s corpus into `output` (see the module doc); returns the
  manifest. `workers` processes (default: one per CPU core; 1: this process); XLNet's
  row streams for a run of `processes` processes."""
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  config = config_lib.validate(config)
  if copies < 1:
    raise errors.ConfigError(f"copies must be at least 1, got {copies}.", argument="copies")
  _check_processes(config, processes)
  if config.data.preprocessed:
    errors.fail("data.preprocessed", "is set: preprocessing reads data.files or "
                    "data.tfds_name, and writes to --output.")
  example_files.check_local(output, "--output")
  output = str(files_lib.path(output))
  lengths = example_files.sequence_lengths(config)
  _start(output, {**_description(config, copies, processes), "lengths": lengths})
  units = plan(config, copies)
  features = {n: record_features(config, n, processes) for n in lengths}
  workers = max(1, min(workers or os.cpu_count() or 1, len(units)))
  counts = [0] * len(units)
  started = time.perf_counter()
  with tqdm(total=len(units), unit="file", desc="preprocess", disable=not show_progress,
            dynamic_ncols=True) as bar:
    def done(index, count):
      counts[index] = count
      bar.update(1)
      rate = sum(counts) / (time.perf_counter() - started)
      bar.set_postfix(examples=f"{sum(counts):,}", ex_s=f"{rate:,.0f}")

    if workers == 1:
      for index, unit in enumerate(units):
        done(index, write_unit(config, output, unit, features[unit.seq_length], processes))
    else:
      context = multiprocessing.get_context("spawn")  # TensorFlow does not survive fork
      with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(_write_unit, (config, output, unit,
                                             features[unit.seq_length], processes)): index
                   for index, unit in enumerate(units)}
        for future in concurrent.futures.as_completed(futures):
          done(futures[future], future.result())
  return write_manifest(config, output, copies, units, counts, features, processes)

