"""The documentation: README.md (the front page), docs/ (the MkDocs site) and CHANGELOG.md.

Each check is a function returning every problem it finds as "file:line: what is wrong",
so that a failing test lists all of them at once:
- the site builds with `mkdocs build --strict` (broken links and anchors fail it too);
- every relative link and #anchor resolves, as GitHub and MkDocs render the pages;
- every `python -m encoderx.X` written in README.md and docs/ names a module that exists;
- every `configs/NAME.py[:VARIANT]` written there is a file, and VARIANT one of its
  `VARIANTS` (configs/finetune.py's argument is "TASK[,data=DIR]": TASK is checked);
- README.md stays a front page (at most README_MAX_LINES lines);
- every `encoderx/PATH` and `encoderx.MODULE[.NAME]` named in the pages and in the
  docstrings and comments of the code (encoderx/, configs/, launch/, tests/) exists: a
  file or folder (or the prefix of files a command writes), a module and a name it defines.

docs/migration.md maps old names to new ones in tables whose first cell is the old name:
those first cells are not checked for existing modules and configs (the rest is).
"""
from __future__ import annotations

import ast
import importlib.util
import io
import pathlib
import re
import subprocess
import sys
import tokenize
import unicodedata

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
MIGRATION_PAGE = REPO / "docs" / "migration.md"

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HTML_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
MODULE_COMMAND = re.compile(r"python3?\s+-m\s+(encoderx(?:\.[A-Za-z_]\w*)+)")
CONFIG_REFERENCE = re.compile(r"(?<![\w/.])configs/([A-Za-z_]\w*)\.py(?::([A-Za-z_]\w*))?")
PATH_REFERENCE = re.compile(r"(?<![\w/.-])encoderx/((?:[\w-]+/)*[\w.-]*[\w-])")
NAME_REFERENCE = re.compile(r"(?<![\w/.-])encoderx((?:\.[A-Za-z_]\w*)+)")
# Dotted names that are no module's: a run directory's lock file (workdir.LOCK_NAME) and
# gin's full names of config fields (gin_config.py).
NOT_MODULE_NAMES = ("encoderx.lock", "encoderx.config.")
PLACEHOLDER = re.compile(r"[A-Z]+")  # encoderx.X, encoderx.tools.NAME
IMPORT_LINE = re.compile(r"\s*(from|import)\s")


def documentation_files() -> list[pathlib.Path]:
  """README.md, CHANGELOG.md and every page under docs/."""
  files = [REPO / "README.md", REPO / "CHANGELOG.md"]
  return files + sorted((REPO / "docs").rglob("*.md"))


def user_facing_files() -> list[pathlib.Path]:
  """What users copy commands from: README.md and docs/ (CHANGELOG.md is history)."""
  return [REPO / "README.md"] + sorted((REPO / "docs").rglob("*.md"))


def _where(path: pathlib.Path, number: int) -> str:
  return f"{path.relative_to(REPO)}:{number}"


def _lines(path: pathlib.Path) -> list[tuple[int, str, bool]]:
  """(line number, text, inside a fenced code block) for each line of `path`."""
  result, fenced = [], False
  for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
    if FENCE.match(line):
      result.append((number, line, True))
      fenced = not fenced
      continue
    result.append((number, line, fenced))
  return result


def _plain_heading(text: str) -> str:
  """A heading's text as rendered: code spans' contents, links' texts, no images/HTML."""
  text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
  text = INLINE_CODE.sub(lambda match: match.group(2), text)
  return re.sub(r"<[^>]+>", "", text).strip()


def github_slug(text: str) -> str:
  """GitHub's anchor for a heading: lowercase, punctuation dropped, each space a '-'."""
  text = _plain_heading(text).lower()
  text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
  return text.replace(" ", "-")


def mkdocs_slug(text: str) -> str:
  """MkDocs' anchor (Python-Markdown's toc.slugify): ASCII, punctuation dropped, runs of
  spaces and '-' one '-'."""
  text = unicodedata.normalize("NFKD", _plain_heading(text))
  text = text.encode("ascii", "ignore").decode("ascii")
  text = re.sub(r"[^\w\s-]", "", text).strip().lower()
  return re.sub(r"[-\s]+", "-", text)


def anchors(path: pathlib.Path) -> dict[str, set[str]]:
  """The anchors of a page as each renderer makes them ({"github": ..., "mkdocs": ...}),
  repeated headings numbered as each numbers them (GitHub '-1', MkDocs '_1')."""
  found = {"github": set(), "mkdocs": set()}
  for renderer, slug, separator in (("github", github_slug, "-"),
                                    ("mkdocs", mkdocs_slug, "_")):
    for _, line, fenced in _lines(path):
      if fenced:
        continue
      for html_id in HTML_ID.findall(line):
        found[renderer].add(html_id)
      match = HEADING.match(line)
      if not match:
        continue
      base, count = slug(match.group(2)), 0
      name = base
      while name in found[renderer]:
        count += 1
        name = f"{base}{separator}{count}"
      found[renderer].add(name)
  return found


def links(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line number, target) of every link and image outside code."""
  result = []
  for number, line, fenced in _lines(path):
    if fenced:
      continue
    line = INLINE_CODE.sub(lambda match: " " * len(match.group(0)), line)
    result.extend((number, target) for target in INLINE_LINK.findall(line))
    definition = REFERENCE_DEFINITION.match(line)
    if definition:
      result.append((number, definition.group(1)))
  return result


def broken_links(paths: list[pathlib.Path]) -> list[str]:
  """Every relative link whose file does not exist or whose #anchor no heading makes."""
  problems, anchor_cache = [], {}
  for path in paths:
    for number, target in links(path):
      where = _where(path, number)
      if not target or SCHEME.match(target) or target.startswith("//"):
        continue
      if target.startswith("/"):
        problems.append(f"{where}: '{target}' is an absolute path; link relatively")
        continue
      file_part, _, anchor = target.partition("#")
      linked = (path.parent / file_part).resolve() if file_part else path
      if not linked.exists():
        problems.append(f"{where}: '{target}': {file_part} does not exist")
        continue
      if not anchor:
        continue
      if linked.suffix != ".md" or not linked.is_file():
        problems.append(f"{where}: '{target}': an anchor into a file that is not a page")
        continue
      if linked not in anchor_cache:
        anchor_cache[linked] = anchors(linked)
      for renderer, names in anchor_cache[linked].items():
        if anchor not in names:
          problems.append(f"{where}: '{target}': no heading of {linked.relative_to(REPO)} "
                          f"has the anchor '#{anchor}' on {renderer}")
  return problems


def _checked_text(path: pathlib.Path, line: str) -> str:
  """The part of a line whose names must exist: all of it, except the first cell of a
  table row in docs/migration.md (the old name)."""
  if path == MIGRATION_PAGE and line.lstrip().startswith("|"):
    cells = line.strip().strip("|").split("|", 1)
    return cells[1] if len(cells) > 1 else ""
  return line


def module_exists(name: str) -> bool:
  """Whether `python -m name` has something to run: a module, or a package with a
  __main__."""
  try:
    spec = importlib.util.find_spec(name)
    if spec is None:
      return False
    if spec.submodule_search_locations is not None:
      return importlib.util.find_spec(f"{name}.__main__") is not None
    return True
  except (ImportError, ValueError):
    return False


def missing_modules(paths: list[pathlib.Path]) -> list[str]:
  """Every `python -m encoderx.X` whose module does not exist."""
  problems, known = [], {}
  for path in paths:
    for number, line, _ in _lines(path):
      for name in MODULE_COMMAND.findall(_checked_text(path, line)):
        if name not in known:
          known[name] = module_exists(name)
        if not known[name]:
          problems.append(f"{_where(path, number)}: python -m {name}: no such module")
  return problems


def config_variants(config_file: pathlib.Path) -> tuple[str, ...] | None:
  """The file's top-level `VARIANTS`: read without importing it when it is a literal,
  else from the imported module (None if the file has none)."""
  tree = ast.parse(config_file.read_text(encoding="utf-8"), filename=str(config_file))
  for node in tree.body:
    targets = (node.targets if isinstance(node, ast.Assign)
               else [node.target] if isinstance(node, ast.AnnAssign) else [])
    if any(isinstance(target, ast.Name) and target.id == "VARIANTS" for target in targets):
      try:
        return tuple(ast.literal_eval(node.value))
      except ValueError:
        break
  else:
    return None
  spec = importlib.util.spec_from_file_location(f"_docs_check_{config_file.stem}", config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return tuple(module.VARIANTS)


def missing_configs(paths: list[pathlib.Path]) -> list[str]:
  """Every `configs/NAME.py` that is not a file, and every `configs/NAME.py:VARIANT`
  whose VARIANT is not among the file's VARIANTS."""
  problems, variants = [], {}
  for path in paths:
    for number, line, _ in _lines(path):
      for name, variant in CONFIG_REFERENCE.findall(_checked_text(path, line)):
        where, config_file = _where(path, number), REPO / "configs" / f"{name}.py"
        if not config_file.is_file():
          problems.append(f"{where}: configs/{name}.py does not exist")
          continue
        if not variant:
          continue
        if config_file not in variants:
          variants[config_file] = config_variants(config_file)
        if variants[config_file] is None:
          problems.append(f"{where}: configs/{name}.py:{variant}: the file defines no "
                          "VARIANTS")
        elif variant not in variants[config_file]:
          problems.append(f"{where}: configs/{name}.py:{variant}: not one of its VARIANTS "
                          f"{variants[config_file]}")
  return problems


def reference_files() -> list[pathlib.Path]:
  """Where encoderx's files and modules are named: the code's docstrings and comments and
  the pages, less the history (CHANGELOG.md) and the old names (moved.py, migration.md)."""
  old_names = (REPO / "CHANGELOG.md", REPO / "encoderx" / "moved.py", MIGRATION_PAGE)
  files = [path for folder in ("encoderx", "configs", "launch", "tests")
           for path in sorted((REPO / folder).rglob("*.py"))]
  files += sorted(REPO.glob("*.md")) + sorted((REPO / "encoderx").rglob("*.md"))
  return [path for path in files + sorted((REPO / "docs").rglob("*.md"))
          if path not in old_names]


def commentary(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line number, text) of what names files in `path`: a page's lines, a Python file's
  docstrings and comments (its strings are code: the old names a test tries, say)."""
  text = path.read_text(encoding="utf-8")
  if path.suffix != ".py":
    return list(enumerate(text.splitlines(), 1))
  if not any(PATH_REFERENCE.search(line) or NAME_REFERENCE.search(line)
             for line in text.splitlines() if not IMPORT_LINE.match(line)):
    return []  # parsing is most of the check's time: only where a name may be
  found = []
  for node in ast.walk(ast.parse(text, filename=str(path))):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      docstring = ast.get_docstring(node, clean=False)
      if docstring is not None:
        first = node.body[0].lineno
        found.extend((first + offset, line) for offset, line in enumerate(docstring.splitlines()))
  found.extend((token.start[0], token.string)
               for token in tokenize.generate_tokens(io.StringIO(text).readline)
               if token.type == tokenize.COMMENT)
  return found


def _module_file(parts: list[str]) -> pathlib.Path | None:
  """The file of module encoderx.PARTS (encoderx.configs is configs/), None if none."""
  folder = REPO / "configs" if parts[:1] == ["configs"] else REPO / "encoderx"
  rest = parts[1:] if parts[:1] == ["configs"] else parts
  if not rest:
    return folder / "__init__.py"
  base = folder.joinpath(*rest)
  return next((file for file in (base.with_suffix(".py"), base / "__init__.py")
               if file.is_file()), None)


def defined_names(module_file: pathlib.Path) -> set[str]:
  """The names a module defines or imports at its top level."""
  names = set()
  for node in ast.parse(module_file.read_text(encoding="utf-8")).body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      names.update(target.id for target in targets if isinstance(target, ast.Name))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
  return names


def stale_references(paths: list[pathlib.Path]) -> list[str]:
  """Every encoderx/PATH that is no file, folder or prefix of files, and every
  encoderx.MODULE.NAME whose module does not exist or does not define NAME."""
  problems, names = [], {}
  for path in paths:
    for number, line in commentary(path):
      where = _where(path, number)
      for reference in PATH_REFERENCE.findall(line):
        target = REPO / "encoderx" / reference
        if any(PLACEHOLDER.fullmatch(part.split(".")[0]) for part in reference.split("/")):
          continue
        if not target.exists() and not (target.parent.is_dir()
                                        and any(target.parent.glob(f"{target.name}*"))):
          problems.append(f"{where}: encoderx/{reference}: no such file or folder")
      for reference in NAME_REFERENCE.findall(line):
        dotted = f"encoderx{reference}"
        if dotted.startswith(NOT_MODULE_NAMES):
          continue
        parts = reference.strip(".").split(".")
        known = max(count for count in range(len(parts) + 1) if _module_file(parts[:count]))
        if known == len(parts) or PLACEHOLDER.fullmatch(parts[known]):
          continue
        module_file = _module_file(parts[:known])
        if module_file not in names:
          names[module_file] = defined_names(module_file)
        if parts[known] not in names[module_file]:
          module = ".".join(["encoderx", *parts[:known]])
          problems.append(f"{where}: {dotted}: {module} has no module or name "
                          f"'{parts[known]}'")
  return problems


def readme_length_problems(path: pathlib.Path = REPO / "README.md") -> list[str]:
  count = len(path.read_text(encoding="utf-8").splitlines())
  if count > README_MAX_LINES:
    return [f"{path.name} has {count} lines, more than {README_MAX_LINES}: move guidance "
            "into docs/ and history into CHANGELOG.md"]
  return []


def mkdocs_build_problems(site_dir: pathlib.Path) -> list[str]:
  """`mkdocs build --strict` into `site_dir`; its output when it fails."""
  result = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
  if result.returncode == 0:
    return []
  return [f"mkdocs build --strict exited {result.returncode}:\n{result.stdout}{result.stderr}"]


def _report(problems: list[str]) -> str:
  return f"{len(problems)} problem(s):\n" + "\n".join(problems)


def test_the_site_builds_strictly(tmp_path):
  if importlib.util.find_spec("mkdocs") is None:
    pytest.skip("mkdocs is not installed (it is in the test extra: pip install -e '.[test]')")
  problems = mkdocs_build_problems(tmp_path / "site")
  assert not problems, _report(problems)


def test_relative_links_and_anchors_resolve():
  problems = broken_links(documentation_files())
  assert not problems, _report(problems)


def test_documented_commands_name_existing_modules():
  problems = missing_modules(user_facing_files())
  assert not problems, _report(problems)


def test_documented_configs_exist():
  problems = missing_configs(user_facing_files())
  assert not problems, _report(problems)


def test_files_and_modules_named_in_docstrings_comments_and_pages_exist():
  problems = stale_references(reference_files())
  assert not problems, _report(problems)


def test_readme_is_a_front_page():
  problems = readme_length_problems()
  assert not problems, _report(problems)


# The checks' own rules, on small pages written here.


def test_slugs_follow_github_and_mkdocs():
  assert github_slug("Data at corpus scale") == "data-at-corpus-scale"
  assert mkdocs_slug("Data at corpus scale") == "data-at-corpus-scale"
  heading = "Starting from weights: `--init_from`"
  assert github_slug(heading) == "starting-from-weights---init_from"
  assert mkdocs_slug(heading) == "starting-from-weights-init_from"
  assert github_slug("[Masking](x.md) units / spans") == "masking-units--spans"
  assert mkdocs_slug("[Masking](x.md) units / spans") == "masking-units-spans"


def test_the_checks_find_what_is_broken(tmp_path, monkeypatch):
  monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "bert.py").write_text("VARIANTS = ('tiny', 'base')\n")
  (tmp_path / "configs" / "finetune.py").write_text(
      "TASKS = {'classify': 1, 'qa': 2}\nVARIANTS = tuple(TASKS)\n")
  (tmp_path / "configs" / "plain.py").write_text("def get_config():\n  pass\n")
  (tmp_path / "other.md").write_text("# A title\n\n## Some section: `code`\n\n"
                                     "## Pairs / spans\n")
  page = tmp_path / "page.md"
  page.write_text(
      "# Page\n\n"
      "[ok](other.md#a-title) [bad anchor](other.md#nothing) [gone](missing.md)\n"
      "[code](other.md#some-section-code) [self](#page) [web](https://example.com)\n"
      "[github only](other.md#pairs--spans)\n"
      "`[in code](missing.md)`\n\n"
      "```bash\n"
      "python -m encoderx.train --config=configs/bert.py:tiny\n"
      "python -m encoderx.no_such_command --config=configs/bert.py:huge\n"
      "python -m encoderx.train --config=configs/finetune.py:classify,data=DIR\n"
      "python -m encoderx.train --config=configs/finetune.py:tag,data=DIR\n"
      "python -m encoderx.train --config=configs/gone.py --config=configs/plain.py:x\n"
      "[not a link](missing.md)\n"
      "```\n")
  problems = broken_links([page])
  assert len(problems) == 4, problems
  assert any("#nothing" in problem and "page.md:3" in problem for problem in problems)
  assert any("missing.md does not exist" in problem for problem in problems)
  # ' / ' is '--' on GitHub and '-' on MkDocs: a link must work on both.
  assert [problem for problem in problems if "#pairs--spans" in problem] == [
      "page.md:5: 'other.md#pairs--spans': no heading of other.md has the anchor "
      "'#pairs--spans' on mkdocs"]
  modules = missing_modules([page])
  assert modules == ["page.md:10: python -m encoderx.no_such_command: no such module"]
  configs = missing_configs([page])
  assert len(configs) == 4, configs
  assert any("bert.py:huge" in problem for problem in configs)
  assert any("finetune.py:tag" in problem for problem in configs)
  assert any("configs/gone.py does not exist" in problem for problem in configs)
  assert any("plain.py:x: the file defines no VARIANTS" in problem for problem in configs)


def test_the_migration_pages_old_names_are_not_checked(tmp_path, monkeypatch):
  module = sys.modules[__name__]
  monkeypatch.setattr(module, "REPO", tmp_path)
  monkeypatch.setattr(module, "MIGRATION_PAGE", tmp_path / "docs" / "migration.md")
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "bert.py").write_text("VARIANTS = ('tiny',)\n")
  (tmp_path / "docs").mkdir()
  rows = ("| old | new |\n|---|---|\n"
          "| `configs/bert_tiny.py` | `configs/bert.py:tiny` |\n"
          "| `python -m encoderx.old_tool` | `python -m encoderx.train` |\n"
          "| `configs/gone.py` | `configs/bert.py:huge` |\n")
  (tmp_path / "docs" / "migration.md").write_text(rows)
  (tmp_path / "docs" / "other.md").write_text(rows)
  assert missing_configs([tmp_path / "docs" / "migration.md"]) == [
      "docs/migration.md:5: configs/bert.py:huge: not one of its VARIANTS ('tiny',)"]
  assert missing_modules([tmp_path / "docs" / "migration.md"]) == []
  assert len(missing_configs([tmp_path / "docs" / "other.md"])) == 3
  assert len(missing_modules([tmp_path / "docs" / "other.md"])) == 1


def test_stale_references_are_found_in_docstrings_comments_and_pages(tmp_path, monkeypatch):
  module = sys.modules[__name__]
  monkeypatch.setattr(module, "REPO", tmp_path)
  monkeypatch.setattr(module, "MIGRATION_PAGE", tmp_path / "docs" / "migration.md")
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "migration.md").write_text("`encoderx.old` is now `encoderx.real`\n")
  (tmp_path / "docs" / "page.md").write_text("See encoderx/FAMILY.py and encoderx/old.py.\n")
  (tmp_path / "encoderx" / "data" / "resources").mkdir(parents=True)
  (tmp_path / "encoderx" / "__init__.py").write_text("")
  (tmp_path / "encoderx" / "data" / "__init__.py").write_text("")
  (tmp_path / "encoderx" / "data" / "resources" / "vocab.model").write_text("")
  (tmp_path / "encoderx" / "real.py").write_text("def thing():\n  pass\n")
  (tmp_path / "encoderx" / "user.py").write_text(
      '"""Reads encoderx/real.py, encoderx/gone.py and encoderx/data/resources/vocab\n'
      'through encoderx.real.thing, encoderx.real.nothing, encoderx.gone and encoderx.X."""\n'
      'OLD = "encoderx/in_a_string.py encoderx.in_a_string"\n'
      '# encoderx/data/ and encoderx/data/also_gone.py\n')
  assert stale_references(reference_files()) == [
      "encoderx/user.py:1: encoderx/gone.py: no such file or folder",
      "encoderx/user.py:2: encoderx.real.nothing: encoderx.real has no module or name "
      "'nothing'",
      "encoderx/user.py:2: encoderx.gone: encoderx has no module or name 'gone'",
      "encoderx/user.py:4: encoderx/data/also_gone.py: no such file or folder",
      "docs/page.md:1: encoderx/old.py: no such file or folder"]
