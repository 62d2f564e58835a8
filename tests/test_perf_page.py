"""python -m encoderx.tools.figures.perf_page: docs/performance.md's tables from the bench's JSON
records (encoderx/tools/figures/report.py), the newest record of each table and device, every
row with its date, commit, device, malloc and command, the page's prose kept."""
import json
import re
import subprocess
import types

import pytest

from conftest import REPO
from encoderx.tools.speed import bench, timing, train_steps
from encoderx.tools.figures import perf_page, report

PROSE = "# Performance\n\nHow to read the figures: compare the same device only.\n\n"


def _record(device: str, date: str, tokens_per_second: float, model="bert_tiny") -> dict:
  """A train_steps record with one row, as the bench writes it (report.record)."""
  row = {"model": model, "batch_size": 4, "params": 4.4e6, "jax_ms": 12.5,
         "jax_tokens_per_second": tokens_per_second, "mfu": 0.05, "torch_ms": 25.0,
         "torch_tokens_per_second": tokens_per_second / 2, "torch_mfu": 0.07,
         "jax_over_torch": 2.0, "paired_median": 2.01, "paired_min": 1.9,
         "paired_max": 2.2, "pipeline_headroom": 12.0}
  record = report.record("train_steps", [row], "encoderx.tools.speed.bench",
                         ["--models=" + model, "--steps=1"], device=device,
                         peak_flops=1e11, tables={"padding": [
                             {"builder": "sentence_pairs", "padding_at_128": 0.02,
                              "padding_at_512": 0.4}]})
  record["date"] = date
  return record


def _write(directory, name: str, record: dict):
  directory.mkdir(exist_ok=True)
  (directory / name).write_text(json.dumps(record))


def _generate(tmp_path) -> str:
  page = tmp_path / "performance.md"
  assert perf_page.main([f"--figures={tmp_path / 'figures'}", f"--page={page}"]) == 0
  return page.read_text()


def _table_rows(text: str, title: str) -> list[str]:
  table = text.split(f"### {title}")[1].split("\n\n")[1]
  return table.splitlines()[2:]


@pytest.mark.slow
def test_a_bench_run_json_renders_a_row_with_its_provenance(tmp_path):
  """A 1-step bench run's --json: the figures as numbers with what they were measured
  on; the generated page's row carries its date, commit, device and command."""
  path = tmp_path / "figures" / "cpu.json"
  argv = ["--models=bert_tiny", "--steps=1", "--batch_size=4", "--skip_padding",
          f"--json={path}"]
  bench.main(argv)
  record = json.loads(path.read_text())
  head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                        text=True, check=True).stdout.strip()
  assert record["kind"] == "train_steps" and record["commit"].startswith(head)
  assert record["command"] == "python -m encoderx.tools.speed.bench " + " ".join(argv)
  assert ("AVX" in record["device"] and "cores" in record["device"]
          and record["malloc"] in ("system", "tcmalloc", "jemalloc", "mimalloc"))
  assert record["peak_gflops"] > 0 and record["date"][4] == "-"
  (row,) = record["rows"]
  assert row["model"] == "bert_tiny" and row["jax_tokens_per_second"] > 0
  assert row["jax_over_torch"] > 0 and row["paired_median"] > 0 and 0 < row["mfu"] < 1
  assert record["tables"]["pipeline"][0]["examples_per_second"] > 0

  page = _generate(tmp_path)
  (line,) = _table_rows(page, report.TABLES["train_steps"].title)
  cells = [cell.strip() for cell in line.strip("|").split(" | ")]
  assert cells[0] == "bert_tiny"
  assert record["date"][:10] in cells and record["device"] in cells
  assert f"`{head[:10]}`" in line and f"`{record['command']}`" in cells
  assert f"{row['jax_over_torch']:.2f}x" in cells
  assert "Input pipeline" in page


def test_a_step_under_one_example_a_second_shows_its_rate_and_the_headroom_it_makes():
  """ModernBERT-base's sizes at 1,024 tokens on 2 CPU cores: 2 examples a 15 s step
  beside a pipeline of 8,638 examples/s. The step's examples/s is shown with significant
  digits (0.13, not 0), and the headroom, the one over the other, agrees with the two
  figures shown (to their rounding), with thousands separators."""
  figures = train_steps.ModelFigures(
      "modernbert_base_1024", batch_size=2, seq_length=1024,
      jax_timing=timing.StepTiming([15.0, 15.03], num_params=149_660_000),
      cost=types.SimpleNamespace(flops=2e12), flops_per_token=1e9)
  row = train_steps.model_row(figures, 2.5e11, pipeline_rate=8638.4)
  header, _, line = report.table("train_steps", [row]).splitlines()
  shown = dict(zip(re.split(r"\s{2,}", header), re.split(r"\s{2,}", line)))
  assert shown["step ex/s"] == "0.13" and shown["pipe ex/s"] == "8,638"
  assert re.fullmatch(r"\d{2},\d{3}\.\dx", shown["headroom"]), shown["headroom"]
  assert row["pipeline_headroom"] == pytest.approx(8638.4 / row["step_examples_per_second"])
  step, pipe = float(shown["step ex/s"]), float(shown["pipe ex/s"].replace(",", ""))
  headroom = float(shown["headroom"].rstrip("x").replace(",", ""))
  assert headroom == pytest.approx(pipe / step, rel=0.05)


def test_a_newer_record_of_the_same_device_replaces_its_rows(tmp_path):
  figures = tmp_path / "figures"
  _write(figures, "cpu-a-old.json", _record("CPU A, AVX-512, 2 cores",
                                            "2026-01-01T00:00:00+00:00", 12345))
  _write(figures, "cpu-b.json", _record("CPU B, AVX2, 8 cores",
                                        "2026-01-02T00:00:00+00:00", 33333))
  text = _generate(tmp_path)
  rows = _table_rows(text, report.TABLES["train_steps"].title)
  assert len(rows) == 2 and "12,345" in rows[0] and "33,333" in rows[1]
  assert "2.01x (1.90x .. 2.20x)" in rows[0]  # the step-by-step ratio
  # A newer file for device A (an older name: the date decides) replaces A's rows only,
  # in every table it holds.
  _write(figures, "cpu-a-0-new.json", _record("CPU A, AVX-512, 2 cores",
                                              "2026-03-01T00:00:00+00:00", 24680))
  text = _generate(tmp_path)
  rows = _table_rows(text, report.TABLES["train_steps"].title)
  assert len(rows) == 2 and "24,680" in rows[0] and "33,333" in rows[1]
  assert "12,345" not in text and "2026-03-01" in rows[0]
  padding = _table_rows(text, report.TABLES["padding"].title)
  assert len(padding) == 2 and "2026-03-01" in padding[0] and "2.0%" in padding[0]
  assert "`cpu-a-0-new.json`, `cpu-b.json`" in text


def test_a_cpu_named_without_its_generation_gives_way_to_a_newer_record_naming_it(
    tmp_path):
  """Records before 2026-11-29 named a CPU without its family and model: a newer record
  of the same name with them replaces the rows of the models it measured again, and
  the old record's other models stay; an older one replaces nothing, and a record of
  another family keeps its own rows."""
  figures = tmp_path / "figures"
  old = _record("AMD EPYC, AVX-512, 2 cores", "2026-01-01T00:00:00+00:00", 13579)
  old["rows"].append({**old["rows"][0], "model": "xlnet_tiny"})
  _write(figures, "cpu-old.json", old)
  _write(figures, "cpu-zen5.json", _record("AMD EPYC (family 26, model 2), AVX-512, 2 cores",
                                           "2026-02-01T00:00:00+00:00", 24680))
  _write(figures, "cpu-zen4.json", _record("AMD EPYC (family 25, model 17), AVX-512, 2 cores",
                                           "2025-12-01T00:00:00+00:00", 35791))
  rows = _table_rows(_generate(tmp_path), report.TABLES["train_steps"].title)
  assert len(rows) == 3 and "35,791" in rows[0] and "24,680" in rows[1]  # by device name
  assert rows[2].startswith("| xlnet_tiny ") and "13,579" in rows[2]
  old["date"] = "2026-03-01T00:00:00+00:00"
  _write(figures, "cpu-old.json", old)
  rows = _table_rows(_generate(tmp_path), report.TABLES["train_steps"].title)
  assert len(rows) == 4 and sum("13,579" in row for row in rows) == 2


def test_the_prose_above_the_marker_is_kept_and_a_page_gets_the_marker(tmp_path):
  _write(tmp_path / "figures", "cpu.json", _record("CPU A, AVX2, 2 cores",
                                                   "2026-01-01T00:00:00+00:00", 5000))
  page = tmp_path / "performance.md"
  page.write_text(PROSE + perf_page.MARKER + "\n\nan old table\n")
  first = _generate(tmp_path)
  assert first.startswith(PROSE + perf_page.MARKER + "\n")
  assert "an old table" not in first and "5,000" in first
  assert _generate(tmp_path) == first  # regenerating changes nothing
  # A page without the marker keeps all of its text and gets the marker at its end.
  page.write_text(PROSE)
  assert _generate(tmp_path).startswith(PROSE + perf_page.MARKER)
  # No page yet: one is created with an introduction.
  page.unlink()
  created = _generate(tmp_path)
  assert created.startswith("# Performance") and perf_page.MARKER in created
  assert "5,000" in created.split(perf_page.MARKER)[1]


def test_the_device_names_the_cpus_family_and_model_numbers():
  """Two hosts with one model name ("AMD EPYC" in a virtual machine) are different devices
  in the records where /proc/cpuinfo tells their generations apart."""
  try:
    cpuinfo = open("/proc/cpuinfo", encoding="utf-8").read()
  except OSError:
    pytest.skip("no /proc/cpuinfo")
  family = re.search(r"^cpu family\s*:\s*(\S+)", cpuinfo, re.M)
  model = re.search(r"^model\s*:\s*(\S+)", cpuinfo, re.M)
  if not (family and model):
    pytest.skip("/proc/cpuinfo names no family and model")
  description = report.cpu_description()
  assert f"(family {family.group(1)}, model {model.group(1)})," in description, description
  assert re.search(r", (AVX-512|AVX2|no AVX2), \d+ cores$", description), description
