"""Moving one tensor's bytes into an output, in the kernel where they pass through unchanged."""

from __future__ import annotations

import errno
import os
from typing import BinaryIO

from .errors import TensorBytesSizeMismatchError
from .tensor import LazyTensor

CHUNK = 8 << 20  # 8 MiB, like Burn's windowed writes
_ZEROS = bytes(4096)
_kernel_copy_ok = hasattr(os, "copy_file_range")


def write_zeros(sink: BinaryIO, n: int) -> None:
    while n > 0:
        k = min(n, len(_ZEROS))
        write_all(sink, memoryview(_ZEROS)[:k])
        n -= k


def write_tensor(sink: BinaryIO, tensor: LazyTensor) -> None:
    """Append the tensor's bytes to `sink`; exactly `tensor.nbytes` bytes or an error."""
    if tensor.nbytes and tensor.span is not None and _copy_in_kernel(sink, tensor):
        return
    data = tensor.data()
    try:
        for start in range(0, len(data), CHUNK):
            write_all(sink, data[start : start + CHUNK])
    finally:
        data.release()


def write_all(sink: BinaryIO, chunk: memoryview) -> None:
    """Write everything: a raw (unbuffered) file may accept only part of a large write."""
    while len(chunk):
        n = sink.write(chunk)
        if n is None:  # buffered writers write everything
            return
        chunk = chunk[n:]


def _copy_in_kernel(sink: BinaryIO, tensor: LazyTensor) -> bool:
    """copy_file_range from the source file; False when the kernel or filesystem can't."""
    global _kernel_copy_ok
    if not _kernel_copy_ok:
        return False
    try:
        out_fd = sink.fileno()
    except (AttributeError, OSError):
        return False
    span = tensor.span
    assert span is not None
    sink.flush()
    done = 0
    while done < span.length:
        try:
            n = os.copy_file_range(span.fd, out_fd, span.length - done, span.offset + done)
        except OSError as e:
            if done == 0 and e.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                         errno.EBADF, errno.EPERM):
                _kernel_copy_ok = e.errno not in (errno.ENOSYS,)
                return False
            raise
        if n == 0:
            raise TensorBytesSizeMismatchError(
                f"source ended after {done} of {span.length} bytes", file=tensor.origin, tensor=tensor.name
            )
        done += n
    return True
