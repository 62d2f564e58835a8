"""`python -m encoderx` is `python -m encoderx.train`."""
from encoderx.train import cli

cli()
