"""The errors a user's input causes, and the checks that raise them.

Every error that comes from what the user gave (a config value, a corpus, a vocabulary,
labelled data, a work directory, a checkpoint, an --init_from source, a run to export, weights
to convert) derives from `UserError`. Every command prints its message in one line and
exits with status 2 (encoderx/cli.py); anything else is a bug and keeps its traceback.

A leaf: this module imports nothing of encoderx, so that any module may raise these.
"""
from __future__ import annotations


class UserError(Exception):
  """What the user gave cannot work; the message says what was wrong and what to do.

  The message speaks of values, not of flags: an error about one argument of a library
  call names it in `argument` ('init_from'), and in `remedy` another argument whose
  setting would avoid it (a class's own, or given when raised); a command puts its flags
  for them around the message (cli.command_line_message)."""
  argument = ""
  remedy = ""

  def __init__(self, message: str = "", argument: str | None = None,
               remedy: str | None = None):
    super().__init__(message)
    if argument is not None:
      self.argument = argument
    if remedy is not None:
      self.remedy = remedy


class ConfigError(UserError, ValueError):
  """A config value that cannot work; the message names the field."""


def fail(field: str, problem: str, fix: str = ""):
  """Raises ConfigError naming the config field (or, for '--name', the flag)."""
  what = f"flag {field}" if field.startswith("--") else f"config field '{field}'"
  raise ConfigError(f"{what}: {problem}" + (f" {fix}" if fix else ""))


def check_choice(field: str, value, choices) -> None:
  if value not in choices:
    fail(field, f"{value!r} is not one of {', '.join(map(repr, choices))}.")


def check_positive(config, *fields: str) -> None:
  """Each dotted field of `config` ('train.steps') must be > 0."""
  for field in fields:
    value = config
    for part in field.split("."):
      value = value[part]
    if value <= 0:
      fail(field, f"must be positive, got {value}.")


def check_fraction(field: str, value: float) -> None:
  """A rate in [0, 1)."""
  if not 0.0 <= value < 1.0:
    fail(field, f"must be in [0, 1), got {value}.")


def check_tfds_name(name: str, field: str = "data.tfds_name") -> None:
  """seqio and encoderx read a TFDS dataset at an explicit version."""
  if ":" not in name:
    fail(field, f"{name!r} lacks a version, which seqio requires.",
         f"Write e.g. '{name}:1.0.0' (tfds.builder(name).version).")
