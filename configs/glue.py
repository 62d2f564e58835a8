"""GLUE sweep recipes for `python -m encoderx.glue` (its --recipe): the grid, the seeds
and the fine-tuning fields of every run (encoderx/glue/sweep.py `config_section`
declares and documents each field).

    python -m encoderx.glue --init_from=hf:MODEL_DIR --output=runs/glue --data=GLUE_DIR \
        --recipe=configs/glue.py:bert

default   BERT's set-up with a small grid: learning rate 2e-5 or 5e-5, batch 32, 3
          epochs, 10% warmup then linear decay, weight decay 0.01, Adam eps 1e-6, length
          128 (each batch cut to 32, 64 or 96 when its longest example fits), seeds
          0, 1, 2 (2 x 3 runs a task).
bert      BERT's GLUE grid (Devlin et al. 2019, section 4.1): learning rate 5e-5, 4e-5,
          3e-5 or 2e-5, batch 32, 3 epochs, length 128, the rest as `default`; 5 seeds
          (BERT reports one run per task; the median of 5 is RoBERTa's and ELECTRA's way).
roberta   RoBERTa's GLUE grid (Liu et al. 2019, appendix table 10): learning rate 1e-5,
          2e-5 or 3e-5, batch 16 or 32, 10 epochs, 6% warmup, weight decay 0.1, Adam b2
          0.98 and eps 1e-6, length 512, the first-token ([CLS]) representation through
          the pooler as fairseq's classification head does (dense + tanh), median over 5
          seeds. 18 runs a task x 10 epochs: the paper's cost.
"""
from encoderx import glue
from encoderx.configs import common

VARIANTS = ("default", "bert", "roberta")


def get_config(arg: str = "default"):
  variant, _ = common.parse_arg(arg, VARIANTS)
  recipe = glue.config_section()
  if variant == "bert":
    recipe.learning_rates = (5e-5, 4e-5, 3e-5, 2e-5)
    recipe.seeds = (0, 1, 2, 3, 4)
  elif variant == "roberta":
    recipe.learning_rates = (1e-5, 2e-5, 3e-5)
    recipe.batch_sizes = (16, 32)
    recipe.epochs = (10.0,)
    recipe.warmup_fraction = 0.06
    recipe.weight_decay = 0.1
    recipe.adam_b2 = 0.98
    recipe.seq_length = 512
    recipe.length_buckets = (64, 128, 256)
    recipe.seeds = (0, 1, 2, 3, 4)
  recipe.lock()
  return recipe
