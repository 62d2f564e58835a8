"""Task metrics computed on the host from predictions (entity F1, SQuAD EM/F1)."""
