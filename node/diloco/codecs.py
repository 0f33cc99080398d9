"""The compressors of pseudo-gradient chunks by name: the setting ``[diloco] quant`` (with
``[diloco] sparse_k``) and the roster's wire name (``int8``, ``fp32``, ``sparse-<k>``).
The codecs are in ``node/diloco/quant.py`` (the interface, int8, fp32) and
``node/diloco/sparse.py``."""

from __future__ import annotations

import torch

from node.diloco.quant import Compressor, Fp32, Int8
from node.diloco.sparse import DEFAULT_K, Sparse
from protocol.errors import Reason, WireError

SETTINGS = ("int8", "fp32", "sparse")  # the values of ``[diloco] quant``


def compressor(name: str, sparse_k: int | None = None) -> Compressor:
    """The compressor a setting names (``sparse_k``: the sparse codec's entries per block),
    or one by its wire name (``sparse-64``); ``ValueError`` for another name."""
    if name == "int8":
        return Int8()
    if name == "fp32":
        return Fp32()
    if name == "sparse":
        return Sparse(DEFAULT_K if sparse_k is None else sparse_k)
    if name.startswith("sparse-") and name[7:].isdigit():
        return Sparse(int(name[7:]))
    raise ValueError(f"unknown encoding {name!r} (one of {SETTINGS}, or sparse-<k>)")


def wire_size(encoding: str, n: int) -> int:
    """Bytes of one encoded chunk of ``n`` values in the encoding named ``encoding``."""
    return compressor(encoding).wire_size(n)


def encode(x: torch.Tensor, encoding: str) -> bytes:
    """The wire bytes of flat fp32 ``x`` in the encoding named ``encoding``."""
    return compressor(encoding).encode(x)


def decode(data: bytes, encoding: str, n: int) -> torch.Tensor:
    """``decode`` of the encoding named ``encoding``; ``WireError`` if malformed or unknown."""
    try:
        codec = compressor(encoding)
    except ValueError as exc:
        raise WireError(Reason.MALFORMED, str(exc)) from exc
    return codec.decode(data, n)
