"""Checks of EAGLE-3 draft checkpoints against the patched SGLang that will load them."""
