"""Hugging Face ``config.json`` readers: dense and mixture-of-experts architectures."""
