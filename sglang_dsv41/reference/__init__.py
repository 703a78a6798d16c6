"""The oracle: the whole V4.1 model over a full sequence, no cache (`ReferenceModel`)."""

from sglang_dsv41.reference.model import ReferenceModel, load_reference

__all__ = ["ReferenceModel", "load_reference"]
