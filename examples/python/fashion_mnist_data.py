"""Puts Fashion-MNIST where torchvision's datasets.FashionMNIST looks for it, without downloading.

torchvision (0.14 here) reads the four IDX files, uncompressed and under their upstream names
without the ".gz", from <root>/<dataset class name>/raw/:

    <root>/FashionMNIST/raw/train-images-idx3-ubyte
    <root>/FashionMNIST/raw/train-labels-idx1-ubyte
    <root>/FashionMNIST/raw/t10k-images-idx3-ubyte
    <root>/FashionMNIST/raw/t10k-labels-idx1-ubyte

(datasets.MNIST would look in <root>/MNIST/raw/ for the same names). With download=False it raises
"Dataset not found" when any is missing. prepare() fills that directory from a local copy, by
default Debian's dataset-fashion-mnist package (/usr/share/datasets/fashion-mnist/, the same names
gzipped). Several ranks may call it at once: each writes its own temporary file and renames it into
place with os.replace, which is atomic, so a reader never sees a partial file and concurrent writers
just replace one complete copy by another.
"""
import gzip
import os
import shutil
import socket
import struct

DEFAULT_SOURCE = "/usr/share/datasets/fashion-mnist"
FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _idx_is_complete(path):
    """True if PATH is an IDX file (ubyte data) whose size matches its header."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header = f.read(4)
            if len(header) != 4 or header[0] != 0 or header[1] != 0 or header[2] != 0x08:
                return False
            dims = struct.unpack(">" + "I" * header[3], f.read(4 * header[3]))
    except (OSError, struct.error):
        return False
    count = 1
    for d in dims:
        count *= d
    return size == 4 + 4 * len(dims) + count


def prepare(root, source=DEFAULT_SOURCE, dataset_class="FashionMNIST"):
    """Makes sure <root>/<dataset_class>/raw/ holds the four uncompressed IDX files; returns root.

    Each file is taken from SOURCE, gzipped (NAME.gz) or plain (NAME). Files already in place and
    complete are left alone.
    """
    raw = os.path.join(root, dataset_class, "raw")
    os.makedirs(raw, exist_ok=True)
    for name in FILES:
        dest = os.path.join(raw, name)
        if _idx_is_complete(dest):
            continue
        plain, packed = os.path.join(source, name), os.path.join(source, name + ".gz")
        if os.path.exists(packed):
            opener, src = gzip.open, packed
        elif os.path.exists(plain):
            opener, src = open, plain
        else:
            raise FileNotFoundError(
                f"{name}(.gz) not found in {source}: install Debian's dataset-fashion-mnist "
                f"package or pass the directory holding the IDX files")
        # Rank-local name: the host and pid make it unique among concurrent writers.
        tmp = f"{dest}.tmp-{socket.gethostname()}-{os.getpid()}"
        try:
            with opener(src, "rb") as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            if not _idx_is_complete(tmp):
                raise ValueError(f"{src} is not a complete IDX file")
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return root
