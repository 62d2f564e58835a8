"""What every `python -m encoderx.*` command shares: flags, the config from flags, logging,
and one-line errors.

    def main(argv): ...                     # a command's body, reading cli.FLAGS
    cli.define_config_flags()               # --config (+ --config.<field>), gin, --init_from
    cli.run(main)                           # parses the flags, runs main

A user error (encoderx/errors.py: a bad config value, corpus, checkpoint, --init_from
source, run to export ...) ends the command with its message on one line and exit status 2;
a failure another process of a multi-process run reported, with status 1 (that process's
log has the traceback). Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys

import ml_collections

from encoderx import config as config_lib
from encoderx import distributed
from encoderx import errors
from encoderx import moved

logger = logging.getLogger("encoderx")


def fail(message: str, status: int = 2):
  print(f"encoderx: error: {message}", file=sys.stderr)
  sys.exit(status)


def _moved(path: str) -> str | None:
  """The config that replaced an old config file's path (any directory prefix; see
  encoderx/moved.py), or None."""
  normalized = os.path.normpath(path).replace(os.sep, "/")
  for old, new in moved.MOVED["config"].items():
    if normalized == old or normalized.endswith("/" + old):
      return normalized[:len(normalized) - len(old)] + new
  return None


def _check_config_file(argument: str) -> None:
  """--config=PATH[:ARG]: the file must exist; an old config's path names its successor."""
  path = argument.removeprefix("--config=").split(":")[0]
  if os.path.isfile(path):
    return
  new_path = _moved(path)
  if new_path:
    fail(f"{path} is now {new_path} (one file per family, the size as its argument; "
         "docs/migration.md).")
  if path.startswith("configs/gin/") or "/configs/gin/" in path:
    fail(f"{path}: the gin copies of the configs are gone; gin reaches the same configs: "
         "write `base.config = 'configs/FAMILY.py:SIZE'` in your gin file "
         "(docs/migration.md).")
  fail(f"no config file '{path}' (looked from {os.getcwd()}).")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a missing or moved config file, a gin file of the old
  configs/gin/, and a bad `--config.<field>` (unknown, renamed) reported in one line
  instead of the traceback ml_collections raises."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  for argument in argv[1:]:
    if argument.startswith("--config="):
      _check_config_file(argument)
    if argument.startswith("--gin_file="):
      path = argument.removeprefix("--gin_file=")
      if not os.path.isfile(path) and "configs/gin/" in path.replace(os.sep, "/"):
        name = os.path.basename(path).removesuffix(".gin")
        config = _moved(f"configs/{name}.py") or "configs/FAMILY.py:SIZE"
        fail(f"{path}: the gin copies of the configs are gone; use --config={config}, or "
             f"a gin file with `base.config = '{config}'` (docs/migration.md).")
  try:
    return flags.FLAGS(argv)
  except (flags.Error, KeyError, AttributeError, TypeError, ValueError) as error:
    overrides = [a[len("--"):].split("=")[0] for a in argv[1:] if a.startswith("--config.")]
    unknown = [config_lib.unknown_field(o.removeprefix("config.")) for o in overrides]
    fail(next((u for u in unknown if u), " ".join(str(error).split())))


def define_config_flags() -> None:
  """--config FILE[:ARG] with --config.<field> overrides, --gin_file, --gin_bindings and
  --init_from: the flags that say what a run is (config_from_flags reads them)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file(
      "config", None, "A config file and its argument, e.g. configs/bert.py:tiny; "
      "--config.<field>=<value> overrides a field.", lock_config=True)
  flags.DEFINE_multi_string("gin_file", None, "A gin file of config bindings "
                            "(encoderx/gin_config.py), applied after --config; repeatable.")
  flags.DEFINE_multi_string("gin_bindings", None, "A gin binding, e.g. "
                            "'train.steps = 100', applied after the gin files; repeatable.")
  flags.DEFINE_string("init_from", "", "Start from the parameters of another run (its work "
                      "or checkpoint directory) or of a Hugging Face model directory "
                      "(hf:DIR); sets config.init_from.")


def config_from_flags(flags_) -> ml_collections.ConfigDict:
  """--config (with its --config.<field> overrides; default: the schema's defaults), then
  the gin files and bindings on top (a gin file may name its base config), then
  --init_from."""
  if flags_.config is None and not flags_.gin_file:
    raise errors.ConfigError("no config: give --config=configs/FAMILY.py:SIZE (e.g. "
                             "configs/bert.py:tiny) or --gin_file=FILE.gin.")
  config = flags_.config
  if flags_.gin_file or flags_.gin_bindings:
    from encoderx import gin_config  # pylint: disable=g-import-not-at-top
    config = gin_config.apply(config, flags_.gin_file or (), flags_.gin_bindings or ())
  if flags_.init_from:
    config.init_from = flags_.init_from
  return config


class _OrbaxFailureLogs(logging.Filter):
  """Drops the tracebacks that orbax (and asyncio, for orbax's tasks) log from background
  threads when a checkpoint cannot be written or read: the same failure reaches the
  command as an exception, which is reported in one line."""

  def filter(self, record):
    return not (record.levelno >= logging.ERROR
                and "orbax" in f"{record.pathname} {record.getMessage()}")


def setup_logging() -> None:
  """encoderx's own INFO lines; warnings only from absl, orbax, clu and TensorFlow (which
  log every save at INFO)."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
  logger.setLevel(logging.INFO)
  for name in ("absl", "asyncio"):
    logging.getLogger(name).addFilter(_OrbaxFailureLogs())


def command_line_message(error: errors.UserError, defined=None) -> str:
  """The error's message with the flags of the arguments it names (its `argument` in
  front, its `remedy` at the end) where the command defines them (`defined`: absl's
  FlagValues, default the command's)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  defined = flags.FLAGS if defined is None else defined
  message = str(error)
  if error.argument and error.argument in defined:
    message = f"--{error.argument}: {message}"
  if error.remedy and error.remedy in defined:
    message = f"{message.removesuffix('.')} (--{error.remedy})."
  return message


@contextlib.contextmanager
def one_line_errors():
  """User errors end the command in one line (status 2); a failure reported by another
  process of the run, status 1."""
  try:
    yield
  except errors.UserError as error:
    fail(command_line_message(error))
  except distributed.ProcessFailed as error:  # another process's log has the traceback
    fail(str(error), status=1)


def run(main) -> None:
  """absl's app.run of `main(argv)` with encoderx's flag parsing, logging and errors."""
  from absl import app  # pylint: disable=g-import-not-at-top

  def wrapped(argv):
    setup_logging()
    with one_line_errors():
      main(argv)

  app.run(wrapped, flags_parser=parse_flags)
