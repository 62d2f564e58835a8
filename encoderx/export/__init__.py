"""The export command (python -m encoderx.export; writer.py)."""
