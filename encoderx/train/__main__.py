"""The train command: a run of the config's method in a work directory.

    python -m encoderx.train --config=configs/bert.py:tiny --workdir=runs/tiny \
        [--config.train.steps=200] [--resume] [--init_from=RUN_DIR | hf:HF_DIR] \
        [--predict=FILE [--predict_output=FILE]]
    python -m encoderx.train --config=... --compile_only   (what each train step needs)
    python -m encoderx.train --gin_file=my_run.gin --workdir=runs/tiny \
        [--gin_bindings='train.steps = 200']   (the same schema in gin: gin_config.py)

Writes to the work directory: config.json, TensorBoard metrics (train/ and eval/ under
tensorboard/), orbax checkpoints (checkpoints/) and, when config.eval.best_metric is set,
the parameters of the best evaluation (best/). Progress is a bar with step, loss, the
method's accuracies and tokens/s; the run ends with a held-out evaluation.

SIGINT (Ctrl-C) or SIGTERM (preemption) stops the run at the next step boundary after
saving a checkpoint (a run of several processes: all of them, at the next log step, after
a signal to any one); `--resume` continues it exactly where it stopped.
"""
from __future__ import annotations

import logging
import os

import jax
from absl import flags

from encoderx import cli, distributed, errors, train
from encoderx.train import progress

FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  logger = logging.getLogger("encoderx")
  if distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                            FLAGS.process_id) and jax.process_index() > 0:
    logger.setLevel(logging.WARNING)  # process 0 reports the run
  with distributed.agreement((errors.UserError,)):  # a per-process flag or gin file
    config = cli.config_from_flags(FLAGS)
  if FLAGS.compile_only:
    from encoderx.train import sizing  # pylint: disable=g-import-not-at-top
    for size in sizing.compile_train_steps(config):
      print(size.describe())
    return
  if not FLAGS.workdir:
    raise errors.UserError("--workdir is required: the directory for the run's "
                           "checkpoints and metrics.")
  if FLAGS.predict:
    count, output = train.predict(config, FLAGS.workdir, FLAGS.predict,
                                  FLAGS.predict_output)
    print(f"wrote {count} predictions to {output}")
    return
  result = train.run(config, FLAGS.workdir, resume=FLAGS.resume,
                     stop_at_step=FLAGS.stop_at_step,
                     allow_config_change=FLAGS.allow_config_change,
                     allow_fresh_start=FLAGS.allow_fresh_start)
  if jax.process_index() > 0:
    return  # process 0 reports
  if result["stopped"]:
    print(f"stopped at step {result['step']}; checkpoint saved in {FLAGS.workdir}. "
          "Continue with the same command and --resume.")
    return
  print(f"held-out evaluation after {result['step']} steps: "
        f"{progress.format_metrics(result['eval'])}")
  print(f"work directory: {FLAGS.workdir} (TensorBoard: tensorboard --logdir "
        f"{os.path.join(FLAGS.workdir, 'tensorboard')})")


def define_flags() -> None:
  cli.define_config_flags()
  flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
  flags.DEFINE_bool("resume", False, "Continue the run whose checkpoints are in --workdir.")
  flags.DEFINE_bool("allow_config_change", False, "With --resume: continue a checkpoint "
                    "even though this config's data or objective fields differ from the "
                    "ones it was trained with (the differences are logged).")
  flags.DEFINE_bool("allow_fresh_start", False, "With --resume: start a new run when the "
                    "work directory holds no checkpoint (instead of stopping).")
  flags.DEFINE_integer("stop_at_step", None, "Stop (with a checkpoint) after this step; "
                       "continue later with --resume.")
  flags.DEFINE_bool("compile_only", False, "Instead of training: compile each phase's "
                    "train step for the config and print XLA's FLOPs and memory per "
                    "device (and whether it fits the device), then stop. Nothing trains "
                    "or is written; --workdir is not needed (train/sizing.py).")
  flags.DEFINE_string("predict", "", "Instead of training: write the predictions of the "
                      "run in --workdir for the examples of this file.")
  flags.DEFINE_string("predict_output", "", "Where --predict writes (default: the "
                      "method's predictions file in --workdir, e.g. predictions.tsv).")
  flags.DEFINE_string("coordinator_address", "", "A run of several processes (GPU / CPU "
                      "clusters; a TPU VM needs none of these): process 0's HOST:PORT; "
                      "default $JAX_COORDINATOR_ADDRESS. encoderx/distributed.py.")
  flags.DEFINE_integer("num_processes", None, "A run of several processes: how many; "
                       "default $JAX_NUM_PROCESSES.")
  flags.DEFINE_integer("process_id", None, "A run of several processes: this one's index, "
                       "0 to num_processes - 1; default $JAX_PROCESS_ID.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
