"""The released V4.1 checkpoint format: FP8/FP4 weight codecs, the tensor manifest, validation
and loading (dequantized to dense tensors on CPU). Imports torch, never sglang."""
