"""The one served cached attention path, imported in one place (the CUDA attention class and
the replay-tail backend members use it; a move of the path is a change of this line)."""

from sglang_dsv41.serving.attention import attention_layer

__all__ = ["attention_layer"]
