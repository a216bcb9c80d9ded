from speculant.attention.base import AttentionBackend
from speculant.attention.batch import ForwardBatch, SeqInput, build_forward_batch
from speculant.attention.registry import create_backend

__all__ = ["AttentionBackend", "ForwardBatch", "SeqInput", "build_forward_batch", "create_backend"]
