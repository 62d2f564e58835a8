"""The glue command: the GLUE dev table of an encoder (glue/sweep.py).

    python -m encoderx.glue --init_from=RUN_DIR|hf:DIR --output=DIR \
        (--data=GLUE_DIR | --tfds [--tfds_data_dir=DIR]) \
        [--tasks=cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte] [--seeds=0,1,2] \
        [--recipe=configs/glue.py:bert] ['--recipe.learning_rates=(2e-5,3e-5)'] \
        [--keep_checkpoints]

Prints the table and writes it to OUTPUT/results.md and OUTPUT/results.json; run again,
the same command resumes an interrupted sweep.
"""
from __future__ import annotations

import importlib.util
import os

from absl import flags

from encoderx import cli, glue
from encoderx.data import glue as glue_data
from encoderx.evaluation import glue as glue_metrics

FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  result = glue.sweep(FLAGS.init_from, FLAGS.output, FLAGS.recipe,
                      tasks=FLAGS.tasks.split(",") if FLAGS.tasks else None,
                      seeds=FLAGS.seeds or None, data_dir=FLAGS.data,
                      use_tfds=FLAGS.tfds, tfds_data_dir=FLAGS.tfds_data_dir,
                      keep_checkpoints=FLAGS.keep_checkpoints)
  if result["stopped"]:
    print(f"stopped in {result['stopped']} (its checkpoint saved); run the same command "
          "again to resume the sweep.")
    return
  print(glue_metrics.markdown(result["table"]), end="")
  print(f"wrote {os.path.join(FLAGS.output, 'results.md')} and results.json")


def define_flags() -> None:
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("init_from", None, "The encoder: a run's work directory or hf:DIR.")
  flags.DEFINE_string("output", None, "The sweep's directory: its runs, data and tables.")
  flags.DEFINE_string("data", "", "A directory in GLUE's layout (CoLA/train.tsv, ...).")
  flags.DEFINE_bool("tfds", False, "Read TFDS's glue/<task> instead of --data.")
  flags.DEFINE_string("tfds_data_dir", "", "TFDS's data directory (default its own).")
  flags.DEFINE_string("tasks", "", "Comma-separated tasks (default: the recipe's, all "
                      "eight): " + ",".join(glue_data.TASKS))
  flags.DEFINE_string("seeds", "", "Comma-separated seeds (default: the recipe's).")
  # configs/glue.py, installed as encoderx.configs.glue: found, not imported (no library
  # module imports the configs), so that --recipe.<field> works without --recipe.
  recipes = importlib.util.find_spec("encoderx.configs").submodule_search_locations[0]
  config_flags.DEFINE_config_file(
      "recipe", f"{os.path.join(recipes, 'glue.py')}:default", "The sweep's recipe, e.g. "
      "configs/glue.py:bert (default: configs/glue.py:default); --recipe.<field>=<value> "
      "overrides a field.", lock_config=True)
  flags.DEFINE_bool("keep_checkpoints", False, "Keep each finished run's checkpoints.")
  flags.mark_flags_as_required(["init_from", "output"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
