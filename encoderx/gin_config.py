"""gin: the second syntax of the one config schema (encoderx/config.py: default_config).

Every group of config fields is a gin configurable named by its path, and its fields are
the configurable's parameters; the fields at the top (method, init_from) belong to
`config`. A gin file starts from the defaults, or from a config file it names (the
same files `--config` takes, so no config has a second copy in gin):

    base.config = 'configs/bert.py:base'     # optional: a config file and its argument
    config.method = 'pretrain'
    model.hidden_size = 768
    data.vocab.path = '/data/vocab.txt'
    objective.names = ('mlm', 'sop')
    train.steps = %STEPS          # gin's macros, includes and comments work as usual
    STEPS = 100000

`encoderx.config.model.hidden_size` (the full name) and `vocab.kind` (a unique suffix)
name the same fields. A name that is no field fails with the message a misspelt
`--config.<field>` gives. Bindings are applied on top of the base config (`base.config`,
or `--config`: not both), in order: gin files, then `--gin_bindings`.

    python -m encoderx.gin_config configs/bert.py:base   # prints it as gin bindings
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import re
import sys
import tokenize

import gin
import ml_collections

from encoderx import errors
from encoderx import config as config_lib

ROOT = "config"  # the configurable of the fields at the top of the schema
BASE = "base"  # the configurable naming the config file the bindings start from
_MODULE = "encoderx"
_UNSET = object()  # a parameter no binding set
_CONFIGURABLES: dict[str, object] = {}  # group path ("" for the top) -> its configurable


def _groups(node: ml_collections.ConfigDict, prefix: str = ""):
  """(path, leaf field names) of every group of fields, the top first ("")."""
  yield prefix, [k for k in node.keys() if not isinstance(node[k], ml_collections.ConfigDict)]
  for key in node.keys():
    if isinstance(node[key], ml_collections.ConfigDict):
      yield from _groups(node[key], f"{prefix}{key}.")


def _base(config: str = ""):
  return config


def _register() -> None:
  """One gin configurable per group of fields, returning the fields bound in gin, and
  `base` (the config file to start from)."""
  if _CONFIGURABLES:
    return
  _CONFIGURABLES[BASE] = gin.external_configurable(_base, name=BASE, module=_MODULE)
  for prefix, fields in _groups(config_lib.default_config()):
    path = prefix.rstrip(".")

    def bound(**values):
      return {name: value for name, value in values.items() if value is not _UNSET}

    bound.__signature__ = inspect.Signature(
        [inspect.Parameter(f, inspect.Parameter.KEYWORD_ONLY, default=_UNSET) for f in fields])
    bound.__name__ = path or ROOT
    # Full names encoderx.config[.<path>]: "model" and "config.model" both select a group.
    name = f"{ROOT}.{path}" if path else ROOT
    _CONFIGURABLES[path] = gin.external_configurable(bound, name=name, module=_MODULE)


def _group_of(selector: str) -> str | None:
  """A gin selector ("vocab", "data.vocab", "encoderx.config.data.vocab") -> its group's
  path ("data.vocab"; "" for the top), None if it selects no group."""
  for path in _CONFIGURABLES:
    if path == BASE:
      continue
    full = f"{_MODULE}.{ROOT}" + (f".{path}" if path else "")
    if full == selector or full.endswith(f".{selector}"):
      return path
  return None


def _field(binding_key: str) -> str:
  """'scope/data.vocab.kid' -> 'data.vocab.kid': the config field a binding names."""
  key = binding_key.split("/")[-1]
  selector, _, parameter = key.rpartition(".")
  group = _group_of(selector)
  if group is None:  # no such group: the name as written, less the root's prefixes
    for prefix in (f"{_MODULE}.", f"{ROOT}."):
      key = key.removeprefix(prefix)
    return key
  return f"{group}.{parameter}" if group else parameter


def _user_error(error: Exception, files, bindings) -> errors.ConfigError:
  """gin's error (several lines: the problem, then where) -> one line, the same as a
  misspelt --config.<field> for a name that is no field."""
  text = str(error)
  # gin ends its message with the offending statement: "  In file ..., line N\n    <line>".
  statement = re.search(r"^\s*([\w./]+)\s*=", text.strip().splitlines()[-1])
  if re.match(r"(No configurable matching|Configurable '.*' doesn't have a parameter)", text):
    if statement:
      message = config_lib.unknown_field(_field(statement.group(1)))
      if message:
        return errors.ConfigError(message)
  where = f" (gin files {', '.join(files)}; bindings {list(bindings)})"
  return errors.ConfigError("gin: " + " ".join(text.split()) + where)


def config_file(spec: str) -> ml_collections.ConfigDict:
  """'configs/bert.py:tiny' (a config file, relative to the working directory, and its
  argument) -> its get_config(argument), as `--config` loads it."""
  path, _, argument = spec.partition(":")
  if not os.path.isfile(path):
    errors.fail(f"{BASE}.config", f"no config file '{path}' (looked from {os.getcwd()}).")
  module_spec = importlib.util.spec_from_file_location("encoderx_gin_base_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(argument) if argument else module.get_config()


def apply(config: ml_collections.ConfigDict | None, files=(), bindings=()
          ) -> ml_collections.ConfigDict:
  """A copy of the base config with the fields bound by the gin `files`, then `bindings`
  (statements such as "train.steps = 10"). The base is `config` (from --config), or the
  file the bindings name as `base.config`, or the defaults; raises ConfigError (one line)
  for both bases at once, a name that is no field, a value of the wrong type, or a file
  that gin cannot read or parse."""
  _register()
  for path in files:
    if not os.path.isfile(path):
      errors.fail("--gin_file", f"no gin file '{path}' (looked from {os.getcwd()}).")
  gin.clear_config()
  try:
    gin.parse_config_files_and_bindings(list(files), list(bindings), finalize_config=False)
    values = {path: configurable() for path, configurable in _CONFIGURABLES.items()}
    # A scoped binding ("eval/train.steps = 1") would be parsed and never read.
    scoped = re.findall(r"^(\S+/)(\S+) = ", gin.config_str(), flags=re.MULTILINE)
  except (ValueError, TypeError, SyntaxError, OSError, tokenize.TokenError) as error:
    raise _user_error(error, files, bindings) from None
  finally:
    gin.clear_config()
  if scoped:
    scope, binding = scoped[0]
    raise errors.ConfigError(f"gin scopes are not part of the config schema: bind "
                             f"'{binding}' without the scope '{scope}'.")
  base = values.pop(BASE)
  if base and config is not None:
    errors.fail(f"{BASE}.config", f"names {base!r}, but --config gave the base config "
                "too.", "Give one of them.")
  if base:
    config = config_file(base)
  elif config is None:
    config = config_lib.default_config()
  config = config.copy_and_resolve_references()
  for path, fields in values.items():
    group = config
    for part in path.split(".") if path else ():
      group = group[part]
    for name, value in fields.items():
      field = f"{path}.{name}" if path else name
      if isinstance(group[name], tuple) and isinstance(value, list):
        value = tuple(value)  # gin writes [a, b] or (a, b); the schema's sequences are tuples
      try:
        group[name] = value
      except (TypeError, ValueError):
        errors.fail(field, f"gin binds {value!r}, not of type "
                        f"{type(group[name]).__name__}.")
  config.lock()  # as the ml_collections configs are: a misspelt field fails
  return config


def _leaves(node: ml_collections.ConfigDict, prefix: str = ""):
  for key in node.keys():
    if isinstance(node[key], ml_collections.ConfigDict):
      yield from _leaves(node[key], f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", node[key]


def to_gin(config: ml_collections.ConfigDict) -> str:
  """The gin bindings of every field of `config` that differs from the defaults, one a
  line in the schema's order (`apply(default_config(), bindings=...)` gives `config`)."""
  defaults = dict(_leaves(config_lib.default_config()))
  lines = []
  for field, value in _leaves(config):
    if value != defaults[field]:
      selector, _, name = field.rpartition(".")
      lines.append(f"{selector or ROOT}.{name} = {value!r}")
  lines.sort(key=lambda line: not line.startswith(f"{ROOT}."))  # the method first
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
  """python -m encoderx.gin_config CONFIG.py[:ARG]: prints the config as gin bindings."""
  if len(argv) != 2:
    sys.exit("usage: python -m encoderx.gin_config CONFIG.py[:ARG]  (prints the config as "
             "gin bindings)")
  try:
    config = config_file(argv[1])
  except errors.UserError as error:
    sys.exit(f"encoderx: error: {error}")
  sys.stdout.write(f"# {argv[1]} as gin bindings: the fields it sets that differ from the "
                   "defaults.\n" + to_gin(config))


if __name__ == "__main__":
  main(sys.argv)
