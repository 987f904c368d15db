"""Using a trained model: sentence embeddings, text generation and predictions from any run, checkpoint, export
directory or prepared model (``python main.py embed | generate | predict --ckpt_path REF``)."""
