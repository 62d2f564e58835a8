"""encoderx against Hugging Face at an equal budget: the same data and steps, each side
trained its own way, scored alike."""
