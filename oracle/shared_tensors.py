"""Hand a candidate's output tensors to the trusted side without copying them through files or pickle.

On a GPU an output stays in device memory: the candidate's worker exports its CUDA allocation as an IPC
handle (the same mechanism `torch.multiprocessing` uses to share CUDA tensors), and the trusted reference
process maps that memory and copies it at once into memory of its own. On a CPU the worker writes the raw
bytes into a file in a memory-backed folder the oracle made for it, and the trusted side maps the file
read-only and copies it. Either way the descriptor that crosses the pipe is a `SharedTensor` of plain
values (JSON), checked field by field before anything is opened: a malformed or hostile descriptor is a
`ShareError`, never code run in the trusted process.

The copy is the snapshot the verdict is made from. A candidate that writes to its output after handing it
over cannot change a verdict already being made from the copy; one that writes while the copy is taken is
caught by `import_tensor`'s second look (the copy must still equal the live memory).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
              torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
}
MAX_DIMS = 16
_REF_COUNTER = re.compile(r"^/torch_[0-9A-Za-z_]{1,80}$")
_FILE_NAME = re.compile(r"^o_[0-9]{1,9}\.bin$")


class ShareError(Exception):
    """A shared tensor that cannot be imported; the message says why, in terms a model can act on."""


@dataclass(frozen=True)
class SharedTensor:
    """Where one output tensor lives, and how to view it. `ipc` for CUDA memory, `file` for a CPU file."""

    dtype: str
    shape: list[int]
    stride: list[int]
    offset: int  # in elements, within the storage
    storage_bytes: int
    file: str | None = None  # CPU: a file name inside the worker's share folder
    ipc: dict[str, Any] | None = None  # CUDA: the fields of `UntypedStorage._share_cuda_()`, bytes as hex

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": self.shape, "stride": self.stride, "offset": self.offset,
                "storage_bytes": self.storage_bytes, "file": self.file, "ipc": self.ipc}

    @classmethod
    def from_json(cls, data: Any) -> "SharedTensor":
        """Validate every field: the data came from an untrusted process."""
        if not isinstance(data, dict):
            raise ShareError("an output descriptor is not an object")
        dtype = data.get("dtype")
        if dtype not in DTYPES:
            raise ShareError(f"output dtype {str(dtype)[:30]!r} is not supported")
        shape, strides = data.get("shape"), data.get("stride")
        if not (_ints(shape) and _ints(strides) and len(shape) == len(strides) <= MAX_DIMS):
            raise ShareError("an output's shape or strides are malformed")
        offset, size = data.get("offset"), data.get("storage_bytes")
        if not (_ints([offset, size])):
            raise ShareError("an output's offset or size is malformed")
        file, ipc = data.get("file"), data.get("ipc")
        if (file is None) == (ipc is None):
            raise ShareError("an output descriptor must name exactly one of a file and an IPC handle")
        if file is not None and not (isinstance(file, str) and _FILE_NAME.match(file)):
            raise ShareError("an output's file name is malformed")
        if ipc is not None:
            _check_ipc(ipc)
        return cls(dtype, list(shape), list(strides), offset, size, file, ipc)

    @property
    def nbytes_needed(self) -> int:
        """Bytes of storage the view reaches (from the start of the storage)."""
        if any(s == 0 for s in self.shape):
            return 0
        last = self.offset + sum((n - 1) * st for n, st in zip(self.shape, self.stride))
        return (last + 1) * DTYPES[self.dtype].itemsize


def _ints(values: Any) -> bool:
    return isinstance(values, list) and all(type(v) is int and 0 <= v < 2**62 for v in values)


def _check_ipc(ipc: Any) -> None:
    if not isinstance(ipc, dict):
        raise ShareError("an output's IPC handle is malformed")
    try:
        ok = (type(ipc["device"]) is int and 0 <= ipc["device"] < 64
              and all(isinstance(ipc[k], str) and len(ipc[k]) <= 512 for k in ("handle", "event_handle"))
              and bytes.fromhex(ipc["handle"]) and type(ipc["storage_offset_bytes"]) is int
              and type(ipc["ref_counter_offset"]) is int and isinstance(ipc["event_sync"], bool)
              and isinstance(ipc["ref_counter"], str) and _REF_COUNTER.match(ipc["ref_counter"]))
        bytes.fromhex(ipc["event_handle"])
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise ShareError("an output's IPC handle is malformed")


# ---------------------------------------------------------------- the worker's side


def export_tensor(t: torch.Tensor, share_dir: Path | None, number: int) -> SharedTensor:
    """Describe `t` for the trusted side; the caller keeps `t` alive until the trusted side has answered."""
    dtype = str(t.dtype).removeprefix("torch.")
    if t.device.type == "cuda":
        storage = t.untyped_storage()
        (device, handle, size, offset_bytes, ref_counter, ref_offset, event_handle, event_sync) = storage._share_cuda_()
        ipc = {"device": int(device), "handle": bytes(handle).hex(), "storage_offset_bytes": int(offset_bytes),
               "ref_counter": ref_counter.decode() if isinstance(ref_counter, bytes) else str(ref_counter),
               "ref_counter_offset": int(ref_offset), "event_handle": bytes(event_handle or b"").hex(),
               "event_sync": bool(event_sync)}
        return SharedTensor(dtype, list(t.shape), list(t.stride()), t.storage_offset(), int(size), ipc=ipc)
    if share_dir is None:
        raise ShareError("no share folder for CPU outputs")
    dense = t.detach().contiguous()
    name = f"o_{number}.bin"
    data = dense.reshape(-1).view(torch.uint8) if dense.numel() else torch.empty(0, dtype=torch.uint8)
    with open(share_dir / name, "wb") as f:
        f.write(memoryview(data.numpy()))
    return SharedTensor(dtype, list(dense.shape), list(dense.stride()), 0, data.numel(), file=name)


# ---------------------------------------------------------------- the trusted side


def import_tensor(desc: SharedTensor, share_dir: Path | None) -> torch.Tensor:
    """A copy, in this process's memory, of the tensor `desc` describes; checked after the copy that the
    live memory did not change while it was taken. On the device it was on; on the host when the device
    has no room for it."""
    if desc.nbytes_needed > desc.storage_bytes:
        raise ShareError("an output's view reaches past its storage")
    dtype = DTYPES[desc.dtype]
    opened = _open_cuda(desc, dtype) if desc.ipc is not None else _open_file(desc, dtype, share_dir)
    with opened as live:
        try:
            try:
                copy = live.clone()
                changed = live.numel() and not torch.equal(_bits(copy), _bits(live))
            except torch.OutOfMemoryError:
                # The device is full of other processes' memory (an H100's compile workers left 1.6 GB): the
                # copy and its second look on the host, rather than a verdict the candidate did not earn.
                torch.cuda.empty_cache()
                copy = live.to("cpu", copy=True)
                changed = live.numel() and not torch.equal(_bits(copy), _bits(live.to("cpu", copy=True)))
        finally:
            # No view of the mapping may outlive it, not even in the frame of an exception's traceback:
            # the mapping is closed on the way out, and a look at the view then reads unmapped memory.
            del live
        if changed:
            raise ShareError("the output changed while the oracle was reading it: the forward pass must be "
                             "finished (every stream synchronised) when it returns")
    return copy


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits, so that NaN equals NaN in the second look."""
    if not (t.dtype.is_floating_point or t.dtype.is_complex):
        return t
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.uint8).view(
        {2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}[t.element_size()])


@contextlib.contextmanager
def _open_cuda(desc: SharedTensor, dtype: torch.dtype) -> Iterator[torch.Tensor]:
    ipc = desc.ipc or {}
    try:
        storage = torch.UntypedStorage._new_shared_cuda(
            ipc["device"], bytes.fromhex(ipc["handle"]), desc.storage_bytes, ipc["storage_offset_bytes"],
            ipc["ref_counter"].encode(), ipc["ref_counter_offset"], bytes.fromhex(ipc["event_handle"]) or None,
            ipc["event_sync"])
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ShareError(f"the output's CUDA memory could not be opened ({str(exc).splitlines()[0][:120]})") from None
    yield torch.empty(0, dtype=dtype, device=f"cuda:{ipc['device']}").set_(storage, desc.offset, desc.shape, desc.stride)


@contextlib.contextmanager
def _open_file(desc: SharedTensor, dtype: torch.dtype, share_dir: Path | None) -> Iterator[torch.Tensor]:
    if share_dir is None or desc.file is None:
        raise ShareError("a CPU output without a share folder")
    try:
        fd = os.open(share_dir / desc.file, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ShareError(f"the output file could not be opened ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != desc.storage_bytes:
            raise ShareError("the output file is not what its descriptor says")
        if desc.storage_bytes == 0:
            yield torch.empty(desc.shape, dtype=dtype)
            return
        # Private and writable: torch wants a writable buffer; nothing written reaches the file.
        mapped = mmap.mmap(fd, desc.storage_bytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    flat = torch.frombuffer(mapped, dtype=torch.uint8)
    try:
        yield flat.view(dtype).as_strided(desc.shape, desc.stride, desc.offset)
    finally:
        del flat
        mapped.close()
