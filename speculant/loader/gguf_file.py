"""A small, fast reader for the GGUF container (llama.cpp's model file format, version 2 and 3).

`gguf.GGUFReader` builds a Python object per array element, which takes seconds on a 49k-token
vocabulary. Here scalar arrays become numpy arrays, string arrays one Python list, and tensor data
stays in a copy-on-write memory map until a tensor is asked for.

Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 KV count; the KVs
(string key, u32 type, value); the tensor infos (string name, u32 n_dims, u64 dims[n_dims] with
the fastest-varying first, u32 ggml type, u64 offset into the data section); then, aligned to
`general.alignment` (default 32), the data section.
"""

from __future__ import annotations

import mmap
import pathlib
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from speculant.loader.errors import CheckpointError

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
# GGUF value type -> (struct format, numpy dtype) for the fixed-size types.
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "?"),
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy / PyTorch order: slowest-varying first (reverse of GGUF dims)
    ggml_type: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    """Parsed metadata and tensor infos of one GGUF file, with its data memory-mapped."""

    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path)
        try:
            with open(self.path, "rb") as f:
                # ACCESS_COPY: writable pages (torch wants writable buffers), never written back.
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except FileNotFoundError:
            raise CheckpointError(self.path, "no such file") from None
        except ValueError:  # mmap of an empty file
            raise CheckpointError(self.path, "empty file") from None
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, ValueError, IndexError) as exc:
            raise CheckpointError(self.path, f"corrupt or truncated GGUF header ({exc})") from None

    def _parse(self) -> None:
        if self._map[:4] != _MAGIC:
            raise CheckpointError(self.path, f"not a GGUF file (magic {bytes(self._map[:4])!r})")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", self._map, 4)
        if version not in (2, 3):
            raise CheckpointError(self.path, f"unsupported GGUF version {version}")
        self._pos = 24
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._u32())
        infos = [self._tensor_info() for _ in range(n_tensors)]
        alignment = int(self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        data_start = -(-self._pos // alignment) * alignment
        for name, shape, ggml_type, offset in infos:
            self.tensors[name] = self._checked_info(name, shape, ggml_type, data_start + offset)

    def _checked_info(
        self, name: str, shape: tuple[int, ...], type_id: int, offset: int
    ) -> TensorInfo:
        try:
            ggml_type = GGMLQuantizationType(type_id)
        except ValueError:
            raise CheckpointError(self.path, f"unknown ggml type {type_id}", name) from None
        block_size, type_size = GGML_QUANT_SIZES[ggml_type]
        if shape and shape[-1] % block_size:
            raise CheckpointError(
                self.path, f"row of {shape[-1]} not a multiple of {block_size}", name
            )
        nbytes = int(np.prod(shape, dtype=np.int64)) // block_size * type_size
        if offset + nbytes > len(self._map):
            raise CheckpointError(
                self.path,
                f"truncated: data ends at byte {offset + nbytes}, file has {len(self._map)}",
                name,
            )
        return TensorInfo(name, shape, ggml_type, offset, nbytes)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a uint8 array viewing the memory map (no copy)."""
        info = self.tensors[name]
        return np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    # ---- primitive readers; each advances self._pos ----

    def _u32(self) -> int:
        (value,) = struct.unpack_from("<I", self._map, self._pos)
        self._pos += 4
        return value

    def _u64(self) -> int:
        (value,) = struct.unpack_from("<Q", self._map, self._pos)
        self._pos += 8
        return value

    def _string(self) -> str:
        length = self._u64()
        end = self._pos + length
        if end > len(self._map):
            raise ValueError(f"string of {length} bytes runs past the end of the file")
        text = self._map[self._pos : end].decode("utf-8")
        self._pos = end
        return text

    def _value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self._string()
        if value_type == _ARRAY:
            return self._array(self._u32(), self._u64())
        if value_type not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {value_type}")
        fmt = _SCALARS[value_type][0]
        (value,) = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _array(self, item_type: int, count: int) -> np.ndarray | list:
        if item_type == _STRING:
            return self._string_array(count)
        if item_type == _ARRAY:
            return [self._array(self._u32(), self._u64()) for _ in range(count)]
        dtype = np.dtype(_SCALARS[item_type][1])
        values = np.frombuffer(self._map, dtype=dtype, count=count, offset=self._pos).copy()
        self._pos += count * dtype.itemsize
        return values

    def _string_array(self, count: int) -> list[str]:
        # The hot loop for vocabularies (150k entries): locals and unpack_from only.
        data, pos, unpack = self._map, self._pos, struct.Struct("<Q").unpack_from
        out = []
        append = out.append
        for _ in range(count):
            (length,) = unpack(data, pos)
            pos += 8
            append(data[pos : pos + length].decode("utf-8", errors="replace"))
            pos += length
        if pos > len(data):
            raise ValueError("string array runs past the end of the file")
        self._pos = pos
        return out

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        n_dims = self._u32()
        dims = struct.unpack_from(f"<{n_dims}Q", self._map, self._pos)
        self._pos += 8 * n_dims
        ggml_type = self._u32()
        offset = self._u64()
        return name, tuple(int(d) for d in reversed(dims)), ggml_type, offset
