"""How fast encoderx trains, against Hugging Face PyTorch: the bench and its parts."""
