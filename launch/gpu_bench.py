"""encoderx.tools.bench's accelerator rows on a GPU host whose image has jax, PyTorch and
transformers but not the text stack (tensorflow, tensorflow-text, seqio): NVIDIA's JAX
containers, for one, and the GPU machines this project is lent, which have no network.

    # where the text stack is installed: record the bench's batches and vocabulary facts
    python launch/gpu_bench.py record DIR [PLAN] [--batch_size=32]
    # on the GPU host, with DIR copied there (encoderx importable, e.g. PYTHONPATH=.)
    python launch/gpu_bench.py all DIR --out=OUT [--budget_s=480]
    python launch/gpu_bench.py rows DIR bert_large@512,bert_base@128 [--dropouts=0,config]
        [--kernels=xla,auto]
    python launch/gpu_bench.py profile DIR bert_large@512 [--dropouts=0] [--trace_out=D]
    python launch/gpu_bench.py tune [--shape=32,512,16,64]

PLAN is `size@length[:batch]`, comma-separated: a size of BERT_ACCELERATOR_SIZES or a
bench model (`modernbert_base`), its length, its batch (default --batch_size); the
default plan is ALL_PLAN. `all` is the issue's one device run: the rows of the plan
(ALL_PLAN: BERT-large at 512 with the config's attention dropout and without, then
ModernBERT-base at 8,192 tokens, 4 rows of packed documents), each with Hugging Face
PyTorch beside it; the first item's train step with contraction.py's kernel gradients
against jax's order; a profile of the first item's step with dropout, in that order,
each part skipped once --budget_s has passed. It writes OUT/gpu_bench.json (report.py's
record: the rows, the contraction table, the kernels' times) and OUT/traces/.

`rows` prints the table of `python -m encoderx.tools.bench --device=gpu` (the same functions:
encoderx's jitted train step, Hugging Face PyTorch with SDPA and bf16 autocast beside it)
and first checks cuDNN's fused attention against XLA's on the device, and encoderx's
Pallas attention with dropout against its XLA reference, then times the attentions
(unless every row is --kernels=xla). `profile` traces a few encoderx steps
(jax.profiler) and sums the GPU's time by kernel. `tune` times the attention kernel's
tilings (no recordings needed) and prints the fastest.

What stands in for the text stack, and only here: tensorflow, tensorflow_text, seqio and
tensorflow_datasets are import-time stand-ins (any attribute, call or base class is
accepted, nothing runs), `tasks.build_vocabulary` returns the recorded facts (size, mask
id, special ids: all the model and objectives read of it), the corpus checks are skipped,
and the batches are the recorded ones, which the real pipeline made. Everything timed is
the bench's own code.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import importlib.abc
import importlib.machinery
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import types

import numpy as np

TEXT_STACK = ("tensorflow", "tensorflow_text", "seqio", "tensorflow_datasets")
VOCABULARY_FILE = "vocabulary.json"  # {the config's data.vocab.path: its facts}
STEPS = 10
ALL_PLAN = "bert_large@512:32,modernbert_base@8192:4"


# --- the text stack's stand-ins (rows and profile only) ---------------------------------
class _StandInBase:
  """The base a class gets in place of a stood-in module's class."""

  def __init__(self, *args, **kwargs):
    pass


class _StandIn:
  """Any attribute of a stood-in module, at import time."""

  def __init__(self, *args, **kwargs):
    pass

  def __call__(self, *args, **kwargs):
    return _StandIn()

  def __getattr__(self, name):
    return _StandIn()

  def __mro_entries__(self, bases):
    return (_StandInBase,)

  def __iter__(self):
    return iter(())


class _StandInModule(types.ModuleType):
  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return _StandIn()


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  def find_spec(self, name, path, target=None):
    if name.split(".")[0] in TEXT_STACK:
      return importlib.machinery.ModuleSpec(name, self, is_package=True)
    return None

  def create_module(self, spec):
    module = _StandInModule(spec.name)
    module.__path__ = []
    return module

  def exec_module(self, module):
    pass


def _import_encoderx():
  """encoderx.configs as setup.py installs it, when running from a checkout."""
  if "encoderx.configs" not in sys.modules:
    try:
      import encoderx.configs  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
      import configs  # pylint: disable=g-import-not-at-top
      sys.modules["encoderx.configs"] = configs
  # The bench first: it tells jax not to reserve the GPU's memory, before jax starts.
  import encoderx.tools.bench  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from encoderx import tools  # pylint: disable=g-import-not-at-top
  return tools


def _import_encoderx_without_text_stack():
  """encoderx.tools (the bench's parts imported), with the text stack stood in for
  (`_StandInFinder`)."""
  sys.meta_path.insert(0, _StandInFinder())
  return _import_encoderx()


def bench_on_recordings(directory: str):
  """encoderx.tools (the bench's parts) with the text stack stood in for and the
  recordings of `directory` as its vocabulary and batches."""
  tools = _import_encoderx_without_text_stack()
  from encoderx.data import pipeline, tasks  # pylint: disable=g-import-not-at-top
  from encoderx.methods import pretrain  # pylint: disable=g-import-not-at-top
  with open(os.path.join(directory, VOCABULARY_FILE)) as f:
    facts = json.load(f)

  def recorded_vocabulary(vocab_config):
    if vocab_config.path not in facts:
      raise SystemExit(f"no recorded vocabulary {vocab_config.path} in {directory}")
    known = facts[vocab_config.path]
    return types.SimpleNamespace(vocab_size=known["vocab_size"], mask_id=known["mask_id"],
                                 special_ids=tuple(known["special_ids"]))

  tasks.build_vocabulary = recorded_vocabulary
  pretrain.validate_data = lambda config, *args, **kwargs: None

  def recorded_batches(family, split, length, batch_size, count, seed=0):
    del split, seed
    path = os.path.join(directory, _batches_file(family, length))
    if not os.path.exists(path):
      raise SystemExit(f"no recorded batches of {family} at length {length} in "
                       f"{directory}")
    arrays = np.load(path)
    batches = collections.defaultdict(dict)
    for key in arrays.files:
      index, name = key.split("/")
      batches[int(index)][name] = arrays[key]
    recorded = [batches[i] for i in sorted(batches)]
    if len(recorded) < count or recorded[0]["input_ids"].shape[0] < batch_size:
      raise SystemExit(f"{path} holds {len(recorded)} batches of "
                       f"{recorded[0]['input_ids'].shape[0]}; {count} of {batch_size} "
                       "are needed: record more")
    return [{k: v[:batch_size] for k, v in b.items()} for b in recorded[:count]]

  pipeline.take_batches = recorded_batches
  # What take_batches is given in place of a Task: the family, whose batches it reads.
  tools.bench_models.pretraining_task = lambda config: config.model.family
  return tools


def _batches_file(family: str, length: int) -> str:
  return f"batches_{family}_{length}.npz"


# --- record -----------------------------------------------------------------------------
def record(directory: str, plan) -> None:
  """Each plan item's batches (its family's data config at its length, its batch size)
  and each vocabulary's facts, written to `directory`."""
  tools = _import_encoderx()
  from encoderx.data import pipeline, tasks  # pylint: disable=g-import-not-at-top
  warmup = tools.accelerator.ACCELERATOR_WARMUP_STEPS
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, VOCABULARY_FILE)
  facts = {}
  if os.path.exists(path):
    with open(path) as f:
      facts = json.load(f)
  for size, length, batch in plan:
    config = tools.accelerator.accelerator_config(size, length, batch)
    batches = pipeline.take_batches(tools.bench_models.pretraining_task(config), "train",
                                    length, batch, 1 + warmup + STEPS)
    np.savez(os.path.join(directory, _batches_file(config.model.family, length)),
             **{f"{i}/{k}": v for i, b in enumerate(batches) for k, v in b.items()})
    vocabulary = tasks.build_vocabulary(config.data.vocab)
    facts[config.data.vocab.path] = dict(
        vocab_size=int(vocabulary.vocab_size), mask_id=int(vocabulary.mask_id),
        special_ids=[int(i) for i in vocabulary.special_ids])
    print(f"recorded {config.model.family} at {length}: {1 + warmup + STEPS} batches of "
          f"{batch}", flush=True)
  with open(path, "w") as f:
    json.dump(facts, f)
  print(f"recorded in {directory}; vocabularies {facts}")


# --- rows -------------------------------------------------------------------------------
def _attention_inputs(shape=(8, 512, 16, 64)):
  """Heads [batch, length, heads, head_dim] in bf16 (BERT-large's by default) over
  padded rows: q, k, v, segment ids."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  keys = jax.random.split(jax.random.key(1), 4)
  query, key, value = (jax.random.normal(k, shape, jnp.bfloat16) for k in keys[:3])
  lengths = jax.random.randint(keys[3], (shape[0],), shape[1] // 5, shape[1] + 1)
  segment_ids = (jnp.arange(shape[1])[None] < lengths[:, None]).astype(jnp.int32)
  return query, key, value, segment_ids


def chained_ms(attention, inputs, backward: bool, chain: int = 20, runs: int = 5
               ) -> float:
  """Milliseconds a call of `attention(q, k, v, segment_ids)` (with `backward`, its
  forward and the gradients of q, k and v) takes on the device: `chain` calls in one jit,
  each feeding the next, so that no dispatch or sync is timed; the fastest of `runs`."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  _, key, value, segment_ids = inputs

  def call(q):
    if not backward:
      return attention(q, key, value, segment_ids)
    loss = lambda q, k, v: jnp.sum(attention(q, k, v, segment_ids).astype(jnp.float32)
                                   ** 2)
    dq, dk, dv = jax.grad(loss, (0, 1, 2))(q, key, value)
    return (dq + dk + dv).astype(q.dtype)

  run = jax.jit(lambda q: jax.lax.fori_loop(0, chain, lambda i, q: call(q), q))
  jax.block_until_ready(run(inputs[0]))
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    jax.block_until_ready(run(inputs[0]))
    times.append(time.perf_counter() - start)
  return 1e3 * min(times) / chain


def outputs_and_gradients(attention, inputs) -> list:
  """`attention(q, k, v, segment_ids)`'s output and the gradients of q, k and v of the
  sum of its squares over the real (unpadded) rows of `inputs` (`_attention_inputs`)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  query, key, value, segment_ids = inputs
  real = segment_ids[:, :, None, None] > 0

  def loss(q, k, v):
    out = attention(q, k, v, segment_ids)
    return jnp.sum(jnp.where(real, out.astype(jnp.float32), 0) ** 2), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(
      query, key, value)
  return [out, *grads]


def relative_errors(got: list, want: list, segment_ids) -> list[float]:
  """Relative errors of each of `got` (`outputs_and_gradients`) against `want`'s, over
  the real rows."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  real = segment_ids[:, :, None, None] > 0

  def relative_error(a, b):
    a, b = (jnp.where(real, x, 0).astype(jnp.float32) for x in (a, b))
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
  return [relative_error(a, b) for a, b in zip(got, want)]


def _compare_attention(title: str, candidate, reference, shape=(8, 512, 16, 64)) -> None:
  """Prints the relative errors of `candidate`'s output and gradients against
  `reference`'s, over heads of `shape` (`_attention_inputs`)."""
  inputs = _attention_inputs(shape)
  errors = relative_errors(outputs_and_gradients(candidate, inputs),
                           outputs_and_gradients(reference, inputs), inputs[3])
  print(f"{title}, relative error: "
        + ", ".join(f"{n} {e:.1e}" for n, e in zip(("out", "dq", "dk", "dv"), errors)),
        flush=True)


def check_fused_attention() -> None:
  """cuDNN's attention against XLA's on this device (bf16, padded rows, BERT-large's
  heads): relative error of the outputs and of the three gradients."""
  import jax  # pylint: disable=g-import-not-at-top
  from encoderx.models import attention, masks  # pylint: disable=g-import-not-at-top
  query, key, _, _ = _attention_inputs()
  print("fused attention:", attention.fused_implementation(query, key, None), flush=True)

  def dot_product_attention(implementation):
    return lambda q, k, v, segment_ids: jax.nn.dot_product_attention(
        q, k, v, mask=masks.padding_and_packing_mask(segment_ids),
        implementation=implementation)
  _compare_attention("cuDNN against XLA (bf16, padded rows)",
                     dot_product_attention("cudnn"), dot_product_attention("xla"))


def _kernel(rate: float, dropout_key, tiling=None):
  """encoderx's Pallas attention at `rate` (`tiling`: the default unless given): compiled
  on GPU, interpreted elsewhere (the tests)."""
  import jax  # pylint: disable=g-import-not-at-top
  from encoderx.models import flash_attention  # pylint: disable=g-import-not-at-top
  return lambda q, k, v, segment_ids: flash_attention.flash_attention(
      q, k, v, segment_ids, rate, dropout_key, tiling=tiling,
      interpret=jax.default_backend() != "gpu")


TIMED_SHAPES = ((32, 512, 16, 64), (32, 128, 16, 64))  # BERT-large's heads at 512, 128


def attention_times(shapes=TIMED_SHAPES) -> None:
  """Forward and forward + backward times (`chained_ms`) of XLA's attention with
  dropout 0.1, cuDNN's without dropout and encoderx's kernel with dropout 0.1 and 0,
  over BERT-large's heads at 512 and 128 (batch 32, bf16, padded rows)."""
  import jax  # pylint: disable=g-import-not-at-top
  from encoderx.models import attention, masks  # pylint: disable=g-import-not-at-top
  dropout_key = jax.random.key(5)
  candidates = {
      "XLA, dropout 0.1": lambda q, k, v, s: attention.attend(
          q, k, v, masks.padding_and_packing_mask(s), None, 0.1, dropout_key),
      "cuDNN, no dropout": lambda q, k, v, s: attention.attend(
          q, k, v, masks.padding_and_packing_mask(s)),
      "encoderx's kernel, dropout 0.1": _kernel(0.1, dropout_key),
      "encoderx's kernel, dropout 0": _kernel(0.0, None)}
  for shape in shapes:
    inputs = _attention_inputs(shape)
    print(f"attention over {shape} [batch, length, heads, head_dim], ms a call "
          "(chained in one jit):", flush=True)
    for name, candidate in candidates.items():
      print(f"  {name:32s} forward {chained_ms(candidate, inputs, False):.3f}, forward + "
            f"backward {chained_ms(candidate, inputs, True):.3f}", flush=True)


def check_flash_attention(shape=(8, 512, 16, 64), timed_shapes=TIMED_SHAPES) -> None:
  """encoderx's Pallas kernel with attention dropout 0.1 against the same computation in
  XLA (`flash_attention.reference_attention`: the same dropout bits), then the
  attention's times over `timed_shapes` (`attention_times`)."""
  import jax  # pylint: disable=g-import-not-at-top
  from encoderx.models import flash_attention  # pylint: disable=g-import-not-at-top
  dropout_key = jax.random.key(5)
  _compare_attention(
      "Pallas flash attention against XLA, dropout 0.1 (bf16, padded rows)",
      _kernel(0.1, dropout_key),
      lambda *inputs: flash_attention.reference_attention(*inputs, 0.1, dropout_key),
      shape)
  attention_times(timed_shapes)


# --- tune -------------------------------------------------------------------------------
# (block, warps, stages) tried for each kernel: the forward's with the default backward,
# then the backward's with the fastest forward.
FORWARD_TILINGS = tuple((block, warps, stages) for block in (64, 128) for warps in (4, 8)
                        for stages in (2, 3))
BACKWARD_TILINGS = tuple((block, warps, stages) for block in (32, 64) for warps in (4, 8)
                         for stages in (1, 2, 3))


def tune(shape, forward_tilings=FORWARD_TILINGS, backward_tilings=BACKWARD_TILINGS,
         chain: int = 20, runs: int = 5):
  """encoderx's kernel (attention dropout 0.1) over heads of `shape` [batch, length,
  heads, head_dim]: each forward tiling timed with the default backward, then each
  backward tiling with the fastest forward (`chained_ms`), each checked against the XLA
  reference (a tiling whose errors pass 2e-2 is not chosen). Prints and returns the
  fastest `flash_attention.Tiling`; `flash_attention.default_tiling` is where a new one
  goes."""
  import jax  # pylint: disable=g-import-not-at-top
  from encoderx.models import flash_attention  # pylint: disable=g-import-not-at-top
  dropout_key = jax.random.key(5)
  inputs = _attention_inputs(shape)
  want = outputs_and_gradients(  # the reference's, once for all candidates
      lambda *x: flash_attention.reference_attention(*x, 0.1, dropout_key), inputs)
  default = flash_attention.default_tiling(shape[3])
  print(f"tuning the attention kernel over {shape} [batch, length, heads, head_dim]; the "
        f"default: {default}", flush=True)

  def measure(tiling):
    """(forward ms, forward + backward ms), or None if it fails or errs."""
    kernel = _kernel(0.1, dropout_key, tiling)
    try:
      error = max(relative_errors(outputs_and_gradients(kernel, inputs), want,
                                  inputs[3]))
      forward, both = (chained_ms(kernel, inputs, backward, chain, runs)
                       for backward in (False, True))
    except Exception as e:  # pylint: disable=broad-except
      print(f"  {tiling}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
      return None
    print(f"  {tiling}: forward {forward:.3f}, forward + backward {both:.3f} ms; "
          f"relative error {error:.1e}", flush=True)
    return (forward, both) if error < 2e-2 else None

  def fastest(tilings, which):
    times = {t: measure(t) for t in tilings}
    times = {t: m[which] for t, m in times.items() if m is not None}
    if not times:
      raise SystemExit("no tiling ran correctly")
    return min(times, key=times.get)

  best = fastest([dataclasses.replace(default, block=block, forward_warps=warps,
                                      forward_stages=stages,
                                      backward_block=min(default.backward_block, block))
                  for block, warps, stages in forward_tilings], 0)
  best = fastest([dataclasses.replace(best, backward_block=block, backward_warps=warps,
                                      backward_stages=stages)
                  for block, warps, stages in backward_tilings if block <= best.block], 1)
  print(f"fastest: {best}", flush=True)
  return best


def rows(tools, plan, dropouts, kernels, with_torch: bool) -> list[dict]:
  import jax  # pylint: disable=g-import-not-at-top
  if jax.default_backend() == "gpu":
    check_fused_attention()
    if set(kernels) != {"xla"}:
      try:  # the kernel's first compile on a GPU: report a failure, keep the rows
        check_flash_attention()
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()
  table = []
  for (size, length, batch), dropout, kernel in itertools.product(plan, dropouts, kernels):
    start = time.perf_counter()
    try:  # one failing row (memory, say, or the kernel's compile) must not lose others
      table += tools.accelerator.accelerator_rows([size], [length], batch, STEPS,
                                                  with_torch, [dropout], [kernel])
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()
    print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
  print("\n" + tools.report.table("accelerator", table), flush=True)
  return table


# --- profile ----------------------------------------------------------------------------
def kernel_times(trace_path: str, steps: int, top: int = 40) -> list[dict]:
  """The GPU's busy time per step, by kernel, from a perfetto trace of `steps` steps
  (printed; returned as rows of the `top` kernels)."""
  with gzip.open(trace_path) as f:
    events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  process = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
  kernels = [e for e in events if e.get("ph") == "X" and "GPU" in process.get(e["pid"], "")]
  if not kernels:
    print("no GPU kernels in the trace")
    return []
  totals = collections.Counter()
  for e in kernels:
    totals[e["name"][:100]] += e["dur"]
  busy = sum(totals.values())
  print(f"\nGPU busy {busy / 1e3 / steps:.1f} ms per step, {len(totals)} kernels:")
  for name, duration in totals.most_common(top):
    print(f"  {duration / 1e3 / steps:8.2f} ms  {100 * duration / busy:5.1f}%  {name}")
  return [{"kernel": name, "ms_per_step": duration / 1e3 / steps,
           "share": duration / busy} for name, duration in totals.most_common(top)]


def profile(tools, plan, dropouts, kernels, trace_out: str | None) -> list[dict]:
  """Traces and sums by kernel the steps of each plan item (rows of every kernel's time,
  named by the item)."""
  import jax  # pylint: disable=g-import-not-at-top
  from encoderx.data import pipeline  # pylint: disable=g-import-not-at-top
  found = []
  for size, length, batch in plan:
    for dropout, kernel in itertools.product(dropouts, kernels):
      config = tools.accelerator.accelerator_config(size, length, batch, dropout, kernel)
      batches = pipeline.take_batches(config.model.family, "train", length, batch, 8)
      stepper, _, cost = tools.train_steps.encoderx_stepper(config, batches)
      times = tools.timing.time_steps(stepper.run_step,
                                      tools.accelerator.ACCELERATOR_WARMUP_STEPS, STEPS)
      print(f"\n{size} @{length}, attention dropout {config.model.attention.dropout:g}, "
            f"{kernel} kernel (prng {jax.config.jax_default_prng_impl}): compile "
            f"{cost.compile_seconds:.0f} s, step median "
            f"{1e3 * statistics.median(times):.1f} ms", flush=True)
      trace_dir = tempfile.mkdtemp(prefix="encoderx_trace_")  # one trace in it
      traced = 5
      with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for index in range(traced):
          stepper.run_step(index)
      (path,) = glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True)
      if trace_out:
        os.makedirs(trace_out, exist_ok=True)
        shutil.copy(path, os.path.join(trace_out,
                                       f"{size}_{length}_{dropout}_{kernel}.json.gz"))
      item = f"{size} @{length}, attention dropout {config.model.attention.dropout:g}"
      found += [{"item": item, **row} for row in kernel_times(path, traced)]
  return found


# --- all --------------------------------------------------------------------------------
def run_all(tools, plan, out: str, budget_s: float, with_torch: bool = True) -> None:
  """The rows, the contraction comparison and the profile (see the module doc) of `plan`
  (ALL_PLAN: its first item has both dropouts, the contraction and the profile), each
  part started only while the budget lasts; OUT/gpu_bench.json after each part."""
  import jax  # pylint: disable=g-import-not-at-top
  from encoderx.data import pipeline  # pylint: disable=g-import-not-at-top
  start, tables, rows_found = time.perf_counter(), {}, []
  os.makedirs(out, exist_ok=True)

  def save():
    kind = jax.devices()[0].device_kind
    record_ = tools.report.record("accelerator", rows_found, "", [], kind,
                                  tools.accelerator.published_peak(kind), tables)
    record_["command"] = " ".join(["python launch/gpu_bench.py", *sys.argv[1:]])
    tools.report.write_json(os.path.join(out, "gpu_bench.json"), record_)

  def contraction():
    size, length, batch = plan[0]
    config = tools.accelerator.accelerator_config(size, length, batch)
    batches = pipeline.take_batches(config.model.family, "train", length, batch,
                                    1 + tools.accelerator.ACCELERATOR_WARMUP_STEPS + STEPS)
    tables["kernel_gradient_cost"] = [tools.costs.kernel_gradient_row(
        f"{size} @{length}", config, batches, STEPS,
        tools.accelerator.ACCELERATOR_WARMUP_STEPS)]

  parts = [("first item's rows", lambda: rows_found.extend(
               rows(tools, plan[:1], [None, 0.0], ["auto"], with_torch))),
           ("the other items' rows", lambda: rows_found.extend(
               rows(tools, plan[1:], [None], ["auto"], with_torch))),
           ("contraction", contraction),
           ("profile", lambda: tables.__setitem__("gpu_kernels", profile(
               tools, plan[:1], [None], ["auto"], os.path.join(out, "traces"))))]
  for name, part in parts:
    elapsed = time.perf_counter() - start
    if elapsed > budget_s:
      print(f"\n{name}: skipped, {elapsed:.0f} s of the {budget_s:.0f} s budget spent",
            flush=True)
      continue
    print(f"\n== {name} ({elapsed:.0f} s in)", flush=True)
    try:
      part()
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()
    save()
  print(f"\nall: {time.perf_counter() - start:.0f} s; wrote {out}/gpu_bench.json", flush=True)


def parse_plan(plan: str, batch_size: int) -> list[tuple[str, int, int]]:
  """'size@length[:batch],...' -> [(size, length, batch)], `batch_size` where an item
  names none."""
  items = []
  for item in plan.split(","):
    size, length = item.split("@")
    length, _, batch = length.partition(":")
    items.append((size, int(length), int(batch) if batch else batch_size))
  return items


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("mode", choices=("record", "all", "rows", "profile", "tune"))
  parser.add_argument("directory", nargs="?",
                      help="the recordings (record, all, rows, profile; not tune)")
  parser.add_argument("plan", nargs="?", default=ALL_PLAN,
                      help="size@length[:batch], comma-separated (record, rows, profile)")
  parser.add_argument("--batch_size", type=int, default=32,
                      help="the batch of plan items that name none")
  parser.add_argument("--out", default=None, help="all: where the JSON and traces go")
  parser.add_argument("--budget_s", type=float, default=480,
                      help="all: no part starts after this many seconds")
  parser.add_argument("--dropouts", default="0,config",
                      help="attention dropouts: numbers, or 'config' for the config's")
  parser.add_argument("--kernels", default="auto",
                      help="model.attention.kernel of each row: auto (on GPU the Pallas "
                      "kernel with attention dropout, cuDNN's without), xla, pallas")
  parser.add_argument("--skip_torch", action="store_true")
  parser.add_argument("--trace_out", default=None, help="profile: copy the traces here")
  parser.add_argument("--shape", default="32,512,16,64",
                      help="tune: the heads' batch,length,heads,head_dim")
  args = parser.parse_args(argv)
  if args.mode != "tune" and args.directory is None:
    parser.error(f"{args.mode} needs the recordings' directory")
  if args.mode == "all" and not args.out:
    parser.error("all needs --out, where its JSON and traces go")
  try:
    args.plan = parse_plan(args.plan, args.batch_size)
  except ValueError:
    parser.error(f"plan: size@length[:batch], comma-separated; got {args.plan!r}")
  args.dropouts = [None if d == "config" else float(d) for d in args.dropouts.split(",")]
  args.kernels = args.kernels.split(",")
  args.shape = tuple(int(n) for n in args.shape.split(","))
  if len(args.shape) != 4:
    parser.error(f"--shape: batch,length,heads,head_dim; got {args.shape}")
  return args


def main(argv=None) -> None:
  args = parse_args(argv)
  if args.mode == "record":
    record(args.directory, args.plan)
    return
  if args.mode == "tune":
    _import_encoderx_without_text_stack()
    tune(args.shape)
    return
  tools = bench_on_recordings(args.directory)
  import jax  # pylint: disable=g-import-not-at-top
  print(f"jax {jax.__version__}, {jax.devices()}", flush=True)
  if args.mode == "all":
    run_all(tools, args.plan, args.out, args.budget_s, not args.skip_torch)
  elif args.mode == "rows":
    rows(tools, args.plan, args.dropouts, args.kernels, not args.skip_torch)
  else:
    profile(tools, args.plan, args.dropouts, args.kernels, args.trace_out)


if __name__ == "__main__":
  main()
