"""`python -m encoderx` is `python -m encoderx.train`."""
from encoderx import cli
from encoderx.train import __main__ as train_command

train_command.define_flags()
cli.run(train_command.main)
