"""python -m encoderx.plot draws a real run's training and held-out curves."""
import jax
import numpy as np
import pytest

from encoderx import plot, train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A 4-step tiny BERT run evaluated at steps 2 and 4 (its TensorBoard logs)."""
  import conftest  # pylint: disable=g-import-not-at-top  (tests/ is on sys.path)
  config = conftest._tiny_config()  # pylint: disable=protected-access
  config.model.num_layers = 1
  config.train.steps = 4
  config.eval.every_steps = 2
  config.eval.batches = 1
  config.checkpoint.every_steps = 100
  workdir = tmp_path_factory.mktemp("run")
  result = train.run(config, str(workdir), show_progress=False, devices=jax.devices()[:1])
  return workdir, result


def test_curves_are_the_logged_metrics(run_dir):
  workdir, result = run_dir
  found = plot.curves(str(workdir), "mlm_loss")
  steps, values = found["train"]
  np.testing.assert_array_equal(steps, [h["step"] for h in result["history"]])
  np.testing.assert_allclose(values, [h["mlm_loss"] for h in result["history"]], rtol=1e-6)
  held_out_steps, held_out = found["held-out"]
  np.testing.assert_array_equal(held_out_steps, [2, 4])
  assert held_out[-1] == pytest.approx(result["eval"]["mlm_loss"], rel=1e-6)


def test_cli_overlays_runs_into_a_png(run_dir, tmp_path):
  workdir, _ = run_dir
  output = tmp_path / "curves" / "bert.png"
  assert plot.main([str(workdir), str(workdir), f"--output={output}",
                    "--labels=first,second"]) == 0
  assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  assert matplotlib.image.imread(str(output)).shape[:2] == (600, 960)


def test_a_missing_metric_or_log_is_named(run_dir, tmp_path, capsys):
  workdir, _ = run_dir
  assert plot.main([str(workdir), f"--output={tmp_path / 'x.png'}",
                    "--metric=no_such"]) == 2
  assert "no metric 'no_such'" in capsys.readouterr().err
  assert plot.main([str(tmp_path), f"--output={tmp_path / 'x.png'}"]) == 2
  assert "no tensorboard/ directory" in capsys.readouterr().err
  assert not (tmp_path / "x.png").exists()
