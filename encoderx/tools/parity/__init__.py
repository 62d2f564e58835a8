"""The same numbers as the reference implementations, on the same weights and inputs, and
the PyTorch counterparts of encoderx's methods and optimizers that the tools share."""
