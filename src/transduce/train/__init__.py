"""Training (Section 5): loss, learning-rate schedule, the training loop, checkpoint averaging."""
