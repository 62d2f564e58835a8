"""The house: encoderx's declared layers, read from the imports of its code.

Imports go down the layers, never up, and no modules import each other in a circle; the
measuring tools are apart from what a run needs; no library module imports configs/;
launch/'s scripts are entries over the top layers (the commands and the tools); no test
module imports another's private helpers (shared ones live in a helper module such as
tests/finetune_cases.py, or in conftest.py); no module of encoderx, launch/ or tests/
grows past about 500 lines. Every import counts, at the top of a module or inside a
function.
"""
import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "encoderx"

# (layer, the top-level modules and packages of encoderx in it), bottom first: a module may
# import its own layer and the layers below.
LAYERS = (
    ("leaves", ("errors", "files", "checksum", "host_allocator", "moved")),
    ("building blocks", ("models", "objectives", "data", "evaluation", "optim", "sharding",
                         "distributed")),
    ("methods", ("methods",)),
    ("conversion", ("hf",)),
    ("core of a run", ("config", "checkpoint", "workdir", "sources", "initialize")),
    ("trainer, loop and command line", ("train", "cli", "gin_config")),
    ("commands", ("export", "embed", "preprocess", "glue", "retrieval", "average", "mine",
                  "__main__")),
    ("measuring tools", ("tools",)),
)
LAYER_OF = {name: index for index, (_, names) in enumerate(LAYERS) for name in names}
MOST_LINES = 550
# What launch/'s scripts may import of encoderx: entries over the commands and the tools.
LAUNCH_LAYERS = ("commands", "measuring tools")
LAUNCH = REPO / "launch"
TESTS = REPO / "tests"


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(REPO).with_suffix("").parts
  if parts[0] == "configs":  # installed as encoderx.configs
    parts = ("encoderx",) + parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path
           for path in [*PACKAGE.rglob("*.py"), *(REPO / "configs").glob("*.py")]}


def _target(module: str) -> str | None:
  """The encoderx module an import names (a name imported from a package may be one of
  its modules), or None outside encoderx."""
  if module in MODULES:
    return module
  parent = module.rpartition(".")[0]
  return parent if parent in MODULES else None


def _imported(path: pathlib.Path, package: str = "") -> set[str]:
  """Every module (or module.name) the code of `path` imports; relative imports from
  `package`."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: from the package's own
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([base] if base else []))
      found.update(f"{base}.{alias.name}" for alias in node.names)
  return found


def _encoderx_targets(found: set[str]) -> set[str]:
  targets = {_target(module) for module in found if module.startswith("encoderx")}
  return {target for target in targets if target}


def imports(name: str) -> set[str]:
  """The encoderx modules `name` imports, anywhere in its code."""
  path = MODULES[name]
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  return _encoderx_targets(_imported(path, package)) - {name}


GRAPH = {name: imports(name) for name in MODULES}


def _layer(module: str) -> int:
  top = module.split(".")[1] if module.count(".") else "__init__"
  return LAYER_OF.get(top, -1)


def test_every_module_has_a_layer():
  unplaced = sorted(m for m in MODULES if m != "encoderx" and m.split(".")[1] != "configs"
                    and _layer(m) < 0)
  assert "encoderx.configs.bert" in MODULES
  assert not unplaced, f"modules in no layer of tests/test_layers.py: {unplaced}"


def test_imports_go_down_the_layers():
  upward = [f"{name} ({LAYERS[_layer(name)][0]}) imports {target} "
            f"({LAYERS[_layer(target)][0]})"
            for name, targets in GRAPH.items() for target in sorted(targets)
            if _layer(name) >= 0 and _layer(target) > _layer(name)]
  assert not upward, "\n".join(upward)


def _cycles() -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm)."""
  index, low, on_stack, stack, components = {}, {}, set(), [], []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for target in GRAPH[node]:
      if target not in index:
        visit(target)
        low[node] = min(low[node], low[target])
      elif target in on_stack:
        low[node] = min(low[node], index[target])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        components.append(sorted(component))

  for node in sorted(GRAPH):
    if node not in index:
      visit(node)
  return components


def test_no_modules_import_each_other_in_a_circle():
  assert not _cycles(), _cycles()


def test_the_cycle_finder_finds_a_circle(monkeypatch):
  monkeypatch.setitem(GRAPH, "encoderx.errors", {"encoderx.files"})
  monkeypatch.setitem(GRAPH, "encoderx.files", {"encoderx.errors"})
  assert ["encoderx.errors", "encoderx.files"] in _cycles()


def test_only_the_tools_import_configs_and_nothing_imports_the_tools():
  configs = sorted(name for name, targets in GRAPH.items() if name.startswith("encoderx.")
                   and name.split(".")[1] not in ("tools", "configs")
                   and any(t.startswith("encoderx.configs") for t in targets))
  assert not configs, f"library modules importing configs/: {configs}"
  tools = sorted(name for name, targets in GRAPH.items() if _layer(name) >= 0
                 and _layer(name) != LAYER_OF["tools"]
                 and any(t.startswith("encoderx.tools") for t in targets))
  assert not tools, f"modules outside tools/ importing the tools: {tools}"


def launch_imports_below_the_top(paths) -> list[str]:
  """Imports of encoderx below LAUNCH_LAYERS (or outside every layer) in `paths`."""
  allowed = {LAYER_OF[name] for layer, names in LAYERS if layer in LAUNCH_LAYERS
             for name in names}
  return [f"{path.name} imports {target} ({LAYERS[_layer(target)][0]})"
          for path in paths for target in sorted(_encoderx_targets(_imported(path)))
          if not target.startswith("encoderx.configs") and _layer(target) not in allowed]


def test_launch_scripts_are_entries_over_the_commands_and_the_tools(tmp_path):
  assert not launch_imports_below_the_top(sorted(LAUNCH.glob("*.py")))
  below = tmp_path / "below.py"
  below.write_text("import os\nfrom encoderx.tools.speed import bench\n"
                   "def main():\n  from encoderx.models import attention\n")
  assert launch_imports_below_the_top([below]) == [
      "below.py imports encoderx.models.attention (building blocks)"]


def private_test_imports(paths) -> list[str]:
  """Private names (`_name`) a test module of `paths` takes from another test module
  (test_*.py): what two test modules share belongs in a helper module or conftest.py."""
  found = []
  for path in paths:
    tree = ast.parse(path.read_text())
    modules = {}  # a test module imported whole -> the name it is bound to
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom):
        source = (node.module or "").rpartition(".")[2]
        names = [alias.name for alias in node.names]
        if source.startswith("test_"):
          found += [f"{path.name}: {name} from {source}" for name in names
                    if name.startswith("_")]
        else:
          modules.update({alias.asname or alias.name: alias.name for alias in node.names
                          if alias.name.startswith("test_")})
      elif isinstance(node, ast.Import):
        modules.update({alias.asname or alias.name: alias.name for alias in node.names
                        if alias.name.rpartition(".")[2].startswith("test_")})
    found += [f"{path.name}: {node.attr} of {modules[node.value.id]}"
              for node in ast.walk(tree) if isinstance(node, ast.Attribute)
              and isinstance(node.value, ast.Name) and node.value.id in modules
              and node.attr.startswith("_")]
  return found


def test_no_test_module_imports_another_ones_private_helpers(tmp_path):
  assert not private_test_imports(sorted(TESTS.glob("test_*.py")))
  borrowing = tmp_path / "test_borrowing.py"
  borrowing.write_text("from test_qa import QUESTIONS, _qa_config\n"
                       "from tests import test_faults as faults\nfaults._flip_bytes(1)\n")
  assert private_test_imports([borrowing]) == [
      "test_borrowing.py: _qa_config from test_qa",
      "test_borrowing.py: _flip_bytes of test_faults"]


SIZED = {**{name: path for name, path in MODULES.items()},
         **{str(path.relative_to(REPO)): path
            for path in [*LAUNCH.glob("*.py"), *TESTS.glob("*.py")]}}


@pytest.mark.parametrize("name", sorted(SIZED))
def test_no_module_is_over_about_500_lines(name):
  lines = len(SIZED[name].read_text().splitlines())
  assert lines <= MOST_LINES, f"{SIZED[name]}: {lines} lines; one job per module"


COMMANDS = ("train", "export", "embed", "preprocess", "glue", "retrieval", "average",
            "mine")


def _defines_flags(path: pathlib.Path) -> bool:
  """Whether the module defines absl flags or reads them (flags.DEFINE_*, FLAGS)."""
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Attribute) and node.attr.startswith("DEFINE"):
      return True
    if isinstance(node, ast.Name) and node.id == "FLAGS":
      return True
  return False


def test_every_command_is_flags_over_a_library():
  """One way in: a command is a package whose __main__.py holds its flags (define_flags,
  main), over library modules that define and read none; cli.py is what they share."""
  for command in COMMANDS:
    entry = PACKAGE / command / "__main__.py"
    assert entry.is_file(), f"python -m encoderx.{command} has no {entry}"
    defined = {node.name for node in ast.parse(entry.read_text()).body
               if isinstance(node, ast.FunctionDef)}
    assert {"define_flags", "main"} <= defined, f"{entry}: {sorted(defined)}"
  library = sorted(str(path.relative_to(REPO)) for name, path in MODULES.items()
                   if _layer(name) >= 0 and _layer(name) != LAYER_OF["tools"]
                   and path.name != "__main__.py" and name != "encoderx.cli"
                   and _defines_flags(path))
  assert not library, f"library modules with flags of a command: {library}"
