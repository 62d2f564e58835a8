"""Training methods, one module each (see encoderx/method.py for the interface and the
registry that loads them by name)."""
