"""Real datasets, read offline, as in-memory tensors split into train / validation / test.

Readers for the standard on-disk formats (IDX for MNIST/Fashion-MNIST, the python pickles of
CIFAR-10/100) plus the generators and bundles that ship with packages (MNIST-1D, scikit-learn).
The validation split is carved from the training data; the test split is only for final numbers.
"""
from __future__ import annotations

import gzip
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)  # where Debian's dataset-fashion-mnist puts it
FASHION_MNIST_MEAN, FASHION_MNIST_STD = 0.2860, 0.3530


class DataError(RuntimeError):
    """A dataset is missing or malformed; the message says what to do."""


@dataclass
class Splits:
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


# --- IDX (MNIST, Fashion-MNIST) --------------------------------------------------------------

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (optionally gzipped): magic 0x0000, a type byte, a rank byte, big-endian dims."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read IDX file {path}: {e}") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or raw[3] == 0:
        raise DataError(f"{path} is not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    rank = raw[3]
    header = 4 + 4 * rank
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw[4:header], dtype=">u4"))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(f"{path}: IDX header says {dims} ({expected} bytes of data) but the file has "
                        f"{len(raw) - header}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def _find_idx(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    raise DataError(f"{directory} has no {stem}[.gz]")


def load_fashion_mnist(data_dir: str | os.PathLike | None = None, val_size: int = 5000) -> Splits:
    """Fashion-MNIST, 60k train (the last ``val_size`` of them held out) and 10k test, normalised."""
    candidates = [Path(data_dir)] if data_dir else [Path(d) for d in FASHION_MNIST_DIRS]
    directory = next((d for d in candidates if d.is_dir()), None)
    if directory is None:
        raise DataError(f"Fashion-MNIST not found in {', '.join(map(str, candidates))}: install the Debian "
                        "package dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or pass "
                        "--data-dir DIR with train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                        "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (optionally .gz)")
    arrays = {stem: read_idx(_find_idx(directory, stem)) for stem in (
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
    x, y = arrays["train-images-idx3-ubyte"], arrays["train-labels-idx1-ubyte"]
    xt, yt = arrays["t10k-images-idx3-ubyte"], arrays["t10k-labels-idx1-ubyte"]
    if len(x) != len(y) or len(xt) != len(yt) or x.shape[1:] != (28, 28):
        raise DataError(f"{directory}: images and labels disagree ({x.shape}, {y.shape}, {xt.shape}, {yt.shape})")

    def images(a):
        return (torch.from_numpy(a.astype(np.float32) / 255.0) - FASHION_MNIST_MEAN).div_(FASHION_MNIST_STD).unsqueeze(1)

    def labels(a):
        return torch.from_numpy(a.astype(np.int64))

    n = len(x) - val_size
    return Splits("fashion-mnist", images(x[:n]), labels(y[:n]), images(x[n:]), labels(y[n:]),
                  images(xt), labels(yt), 10)


# --- CIFAR-10/100 python pickles ---------------------------------------------------------------

class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles the CIFAR batches (dicts of bytes, lists and numpy arrays) and nothing else."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy", "ndarray"), ("numpy", "dtype"),
                ("_codecs", "encode")}  # how Python 3's protocol 2 spells bytes

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR batch file → (N, 3, 32, 32) uint8 images, (N,) int64 labels (fine labels for CIFAR-100)."""
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
    except (OSError, EOFError, pickle.UnpicklingError) as e:
        raise DataError(f"cannot read CIFAR batch {path}: {e}") from e
    if not isinstance(batch, dict) or b"data" not in batch:
        raise DataError(f"{path} is not a CIFAR python batch (no b'data' key)")
    label_key = b"labels" if b"labels" in batch else b"fine_labels"
    if label_key not in batch:
        raise DataError(f"{path} has no b'labels' or b'fine_labels'")
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    labels = np.asarray(batch[label_key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) != len(labels):
        raise DataError(f"{path}: expected data (N, 3072) and N labels, got {data.shape} and {labels.shape}")
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar(root: str | os.PathLike, num_classes: int = 10, val_size: int = 5000) -> Splits:
    """CIFAR-10 (``cifar-10-batches-py``) or CIFAR-100 (``cifar-100-python``) from the python pickles."""
    root = Path(root)
    if num_classes == 10:
        folder = root / "cifar-10-batches-py" if (root / "cifar-10-batches-py").is_dir() else root
        train_files = [folder / f"data_batch_{i}" for i in range(1, 6)]
        test_files = [folder / "test_batch"]
    elif num_classes == 100:
        folder = root / "cifar-100-python" if (root / "cifar-100-python").is_dir() else root
        train_files, test_files = [folder / "train"], [folder / "test"]
    else:
        raise ValueError(f"CIFAR has 10 or 100 classes, not {num_classes}")
    missing = [str(p) for p in train_files + test_files if not p.is_file()]
    if missing:
        raise DataError(f"CIFAR-{num_classes} files missing: {', '.join(missing)}")
    x, y = map(np.concatenate, zip(*(read_cifar_batch(p) for p in train_files)))
    xt, yt = read_cifar_batch(test_files[0])
    mean = x.reshape(len(x), 3, -1).mean(axis=(0, 2)).reshape(1, 3, 1, 1) / 255.0
    std = x.reshape(len(x), 3, -1).std(axis=(0, 2)).reshape(1, 3, 1, 1) / 255.0

    def images(a):
        return torch.from_numpy(((a / 255.0 - mean) / std).astype(np.float32))

    n = len(x) - val_size
    return Splits(f"cifar-{num_classes}", images(x[:n]), torch.from_numpy(y[:n]), images(x[n:]),
                  torch.from_numpy(y[n:]), images(xt), torch.from_numpy(yt), num_classes)


# --- generated and bundled data ------------------------------------------------------------------

def load_mnist1d(val_size: int = 400) -> Splits:
    """MNIST-1D (4000 train / 1000 test sequences of length 40), generated offline by ``mnist1d``."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as e:
        raise DataError("MNIST-1D needs the mnist1d package: pip install 'lambda-gelu[lab]'") from e
    d = make_dataset(get_dataset_args())  # generates locally; never the downloading get_dataset
    # Standardised in float64 by numpy, then rounded once to float32. torch's float32 mean and std sum in an
    # order that depends on its thread count, so the data's last bits (and every run trained on it) depended
    # on how many threads the process that loaded it had: --workers 1 and --workers 2 trained different runs
    x64 = np.asarray(d["x"], dtype=np.float64)
    mean, std = x64.mean(), x64.std(ddof=1)
    x, xt = (torch.from_numpy(((np.asarray(a, dtype=np.float64) - mean) / std).astype(np.float32))
             for a in (x64, d["x_test"]))
    y, yt = torch.tensor(d["y"], dtype=torch.int64), torch.tensor(d["y_test"], dtype=torch.int64)
    n = len(x) - val_size
    return Splits("mnist1d", x[:n], y[:n], x[n:], y[n:], xt, yt, 10)


def load_sklearn_tabular(name: str, split_seed: int = 0) -> Splits:
    """scikit-learn's bundled ``breast_cancer`` or ``wine``: fixed stratified 60/20/20 split, standardised
    with the training statistics."""
    try:
        from sklearn import datasets
        from sklearn.model_selection import train_test_split
    except ImportError as e:
        raise DataError("tabular tasks need scikit-learn: pip install 'lambda-gelu[lab]'") from e
    loaders = {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine}
    if name not in loaders:
        raise ValueError(f"unknown tabular dataset {name!r}; known: {', '.join(loaders)}")
    x, y = loaders[name](return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, stratify=y, random_state=split_seed)
    x_tr, x_va, y_tr, y_va = train_test_split(x_tr, y_tr, test_size=0.25, stratify=y_tr, random_state=split_seed)
    mean, std = x_tr.mean(0), x_tr.std(0) + 1e-8

    def t(a, b):
        return torch.tensor((a - mean) / std, dtype=torch.float32), torch.tensor(b, dtype=torch.int64)

    return Splits(name, *t(x_tr, y_tr), *t(x_va, y_va), *t(x_te, y_te), int(y.max()) + 1)


def load_stdlib_bytes(context: int = 64, train_bytes: int = 1 << 20, eval_bytes: int = 1 << 17) -> Splits:
    """Byte-level language modelling on the running interpreter's own standard library source.

    Files (``*.py`` under the stdlib directory, site-packages excluded) are split by a hash of their
    relative path — 80% train, 10% validation, 10% test — so no file leaks across splits. Each
    split is the concatenation of its files, cut into non-overlapping windows of ``context + 1``
    bytes: x is a window's first ``context`` bytes, y the next byte at every position. The corpus
    depends on the Python version, which the report records.
    """
    import hashlib
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    if not files:
        raise DataError(f"no standard-library sources under {root}")
    parts: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    for p in files:
        rel = p.relative_to(root).as_posix()
        bucket = int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 10
        parts[0 if bucket >= 2 else bucket + 1].append(p.read_bytes() + b"\n\n")

    def windows(chunks: list[bytes], limit: int):
        stream = b"".join(chunks)[:limit]
        n = len(stream) // (context + 1)
        a = torch.frombuffer(bytearray(stream[:n * (context + 1)]), dtype=torch.uint8).long().view(n, context + 1)
        return a[:, :-1].contiguous(), a[:, 1:].contiguous()

    (x, y), (xv, yv), (xt, yt) = windows(parts[0], train_bytes), windows(parts[1], eval_bytes), windows(parts[2], eval_bytes)
    return Splits("python-stdlib-bytes", x, y, xv, yv, xt, yt, 256)
