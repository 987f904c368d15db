"""Side-by-side benchmarks of ptm_app against the transformers Trainer and a bare PyTorch loop (``make bench``)."""
