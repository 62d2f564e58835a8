"""What the input pipeline makes (padding, a decoded batch) and how fast it makes it."""
