"""pipesgd: data-parallel training that hides gradient communication behind computation.

The PyTorch front end is :mod:`pipesgd.torch` (Horovod's API: ``import pipesgd.torch as hvd``).
This package is built by the project's CMake for Debian's ``/usr/bin/python3`` and its torch; the
native part, ``pipesgd._C``, is the C++ library API (include/pipesgd) through pybind11.
"""

import torch as _torch  # loads LibTorch's libraries before the extension that links them

from pipesgd._C import CommError, CommTimeoutError, DataError, PeerFailedError, available_methods

__all__ = ["CommError", "CommTimeoutError", "DataError", "PeerFailedError", "available_methods"]
