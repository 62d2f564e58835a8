"""python -m encoderx.tools.figures.plot: curves from TensorBoard logs as training writes
them (clu's default writer, as encoderx/train/loop.py; tests/test_training.py also reads a real
run's)."""
import matplotlib.image
import numpy as np
import pytest
from clu import metric_writers

from encoderx.tools.figures import plot


def write_run(directory, train_losses, eval_losses):
  """A run directory whose tensorboard/ holds mlm_loss every step and eval/mlm_loss
  every 2 steps, written by the writer train/loop.py uses."""
  writer = metric_writers.create_default_writer(str(directory / "tensorboard"))
  for step, loss in enumerate(train_losses, start=1):
    writer.write_scalars(step, {"mlm_loss": loss, "loss": loss + 0.7})
    if step % 2 == 0:
      writer.write_scalars(step, {"eval/mlm_loss": eval_losses[step // 2 - 1]})
  writer.close()
  return directory


@pytest.fixture
def runs(tmp_path):
  return [write_run(tmp_path / "a", [9.0, 8.5, 8.1, 7.9], [8.6, 8.0]),
          write_run(tmp_path / "b", [9.1, 8.7, 8.4, 8.2], [8.8, 8.3])]


def test_curves_are_the_logged_values(runs):
  found = plot.curves(str(runs[0]), "mlm_loss")
  np.testing.assert_array_equal(found["train"][0], [1, 2, 3, 4])
  np.testing.assert_allclose(found["train"][1], [9.0, 8.5, 8.1, 7.9], rtol=1e-6)
  np.testing.assert_array_equal(found["held-out"][0], [2, 4])
  np.testing.assert_allclose(found["held-out"][1], [8.6, 8.0], rtol=1e-6)
  assert set(plot.curves(str(runs[0]), "loss")) == {"train"}  # evaluation has no 'loss'


def test_cli_overlays_runs_into_a_png(runs, tmp_path):
  output = tmp_path / "curves" / "tiny.png"
  assert plot.main([*map(str, runs), f"--output={output}", "--labels=first,second"]) == 0
  assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert matplotlib.image.imread(str(output)).shape[:2] == (600, 960)


def test_a_missing_metric_or_log_is_named_and_nothing_written(runs, tmp_path, capsys):
  output = tmp_path / "x.png"
  assert plot.main([str(runs[0]), f"--output={output}", "--metric=no_such"]) == 2
  assert "no metric 'no_such'" in capsys.readouterr().err
  assert plot.main([str(runs[0]), str(tmp_path), f"--output={output}"]) == 2
  assert "no tensorboard/ directory" in capsys.readouterr().err
  assert not output.exists()


def test_consecutive_runs_follow_one_another(runs, tmp_path):
  """--consecutive (a recipe's phases): the second run's steps come after the first's."""
  figure = plot.plot([str(r) for r in runs], str(tmp_path / "phases.png"), consecutive=True)
  lines = {line.get_label(): line.get_xdata() for line in figure.axes[0].get_lines()
           if not line.get_label().startswith("_")}
  np.testing.assert_array_equal(lines["a (train)"], [1, 2, 3, 4])
  np.testing.assert_array_equal(lines["b (train)"], [5, 6, 7, 8])
  np.testing.assert_array_equal(lines["b (held-out)"], [6, 8])
