"""The readers on files written here in the exact on-disk formats, and the real offline datasets."""
import gzip
import pickle
import struct

import numpy as np
import pytest
import torch

from lambda_gelu_lab import data


def write_idx(path, array: np.ndarray, compress=False):
    codes = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D}
    header = struct.pack(">HBB", 0, codes[array.dtype], array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.tobytes()
    with (gzip.open if compress else open)(path, "wb") as f:
        f.write(payload)


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("dtype", [np.uint8, ">i4", ">f4"])
def test_idx_round_trip(tmp_path, compress, dtype):
    a = (np.arange(2 * 3 * 5) * 7 % 251).reshape(2, 3, 5).astype(dtype)
    path = tmp_path / ("a.idx" + (".gz" if compress else ""))
    write_idx(path, a, compress)
    b = data.read_idx(path)
    assert b.shape == a.shape and np.array_equal(b, a)


def test_idx_errors(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01\x00\x00\x00\x01\x00")
    with pytest.raises(data.DataError, match="not an IDX file"):
        data.read_idx(tmp_path / "bad")
    a = np.zeros((4, 2), np.uint8)
    write_idx(tmp_path / "short", a)
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-3])
    with pytest.raises(data.DataError, match="header says \\(4, 2\\)"):
        data.read_idx(tmp_path / "short")


def _fake_fmnist(directory, n_train=30, n_test=10):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(directory / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), True)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8))


def test_fashion_mnist_from_a_data_dir(tmp_path):
    _fake_fmnist(tmp_path)
    s = data.load_fashion_mnist(tmp_path, val_size=5)
    assert s.x_train.shape == (25, 1, 28, 28) and s.x_val.shape == (5, 1, 28, 28) and s.x_test.shape == (10, 1, 28, 28)
    assert s.y_train.dtype == torch.int64 and s.num_classes == 10


def test_fashion_mnist_missing_says_how_to_get_it(tmp_path):
    with pytest.raises(data.DataError, match="dataset-fashion-mnist.*--data-dir"):
        data.load_fashion_mnist(tmp_path / "nowhere")
    with pytest.raises(data.DataError, match="has no train-images-idx3-ubyte"):
        data.load_fashion_mnist(tmp_path)


def _write_cifar_batch(path, n, label_key=b"labels", seed=0):
    rng = np.random.default_rng(seed)
    batch = {b"batch_label": b"testing", b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
             label_key: list(rng.integers(0, 10, n).tolist()), b"filenames": [b"x.png"] * n}
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)
    return batch


def test_cifar10_layout(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batches = [_write_cifar_batch(folder / f"data_batch_{i}", 4, seed=i) for i in range(1, 6)]
    _write_cifar_batch(folder / "test_batch", 3, seed=9)
    x, y = data.read_cifar_batch(folder / "data_batch_2")
    assert x.shape == (4, 3, 32, 32) and np.array_equal(x.reshape(4, -1), batches[1][b"data"])
    assert y.tolist() == batches[1][b"labels"]
    s = data.load_cifar(tmp_path, 10, val_size=5)
    assert s.x_train.shape == (15, 3, 32, 32) and s.x_val.shape[0] == 5 and s.x_test.shape[0] == 3
    assert abs(float(torch.cat([s.x_train, s.x_val]).mean())) < 1e-4  # normalised with train statistics


def test_cifar100_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    _write_cifar_batch(folder / "train", 6, label_key=b"fine_labels")
    _write_cifar_batch(folder / "test", 2, label_key=b"fine_labels")
    s = data.load_cifar(tmp_path, 100, val_size=2)
    assert s.num_classes == 100 and s.x_train.shape == (4, 3, 32, 32)


def test_cifar_reader_refuses_code_and_missing_files(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    with open(tmp_path / "evil", "wb") as f:
        pickle.dump({b"data": Evil()}, f)
    with pytest.raises(data.DataError, match="refusing to load builtins.print"):
        data.read_cifar_batch(tmp_path / "evil")
    with pytest.raises(data.DataError, match="CIFAR-10 files missing"):
        data.load_cifar(tmp_path, 10)


@pytest.mark.slow
def test_real_offline_datasets():
    s = data.load_mnist1d()
    assert s.x_train.shape == (3600, 40) and s.x_test.shape == (1000, 40)
    train = torch.cat([s.x_train, s.x_val]).double()
    assert abs(float(train.mean())) < 1e-6 and abs(float(train.std()) - 1) < 1e-6  # standardised
    for name, n, classes in (("breast_cancer", 569, 2), ("wine", 178, 3)):
        t = data.load_sklearn_tabular(name)
        assert len(t.x_train) + len(t.x_val) + len(t.x_test) == n and t.num_classes == classes
        assert abs(float(t.x_train.mean())) < 1e-5  # standardised with train statistics
        # stratified: every class in every split
        assert all(len(torch.unique(y)) == classes for y in (t.y_train, t.y_val, t.y_test))


def test_real_fashion_mnist_is_installed():
    """CI installs Debian's dataset-fashion-mnist; this is the full dataset, not a sample."""
    s = data.load_fashion_mnist()
    assert s.x_train.shape == (55000, 1, 28, 28) and s.x_val.shape == (5000, 1, 28, 28)
    assert s.x_test.shape == (10000, 1, 28, 28)
    assert torch.bincount(s.y_test).tolist() == [1000] * 10


@pytest.mark.slow
def test_stdlib_sentences_are_prose_and_held_out_by_file():
    from lambda_gelu.hf import stdlib_sentences
    train, held = stdlib_sentences()
    assert len(train) > 5000 and len(held) > 300
    assert not set(train) & set(held) and len(set(train)) == len(train)
    assert all(6 <= len(s.split()) <= 60 for s in train + held)


def test_prose_sentences_keep_sentences_of_words_and_drop_code_and_fragments():
    from lambda_gelu.hf.text import prose_sentences
    text = ("Return the sum of the two numbers given.  Too short here. X = f(a[0], b[1]) + g(c, d) * h(e) / 2 and k.\n"
            "It wraps\n  across lines of one paragraph!\n\nA new paragraph starts with these eight words here.")
    assert prose_sentences(text) == ["Return the sum of the two numbers given.",
                                     "It wraps across lines of one paragraph!",
                                     "A new paragraph starts with these eight words here."]


@pytest.mark.parametrize("load", [data.load_mnist1d, lambda: data.load_sklearn_tabular("wine"), data.load_fashion_mnist],
                         ids=["mnist1d", "wine", "fashion-mnist"])
@pytest.mark.slow
def test_data_does_not_depend_on_the_loading_process_thread_count(load):
    """A run's data must be the same bits however many threads the process that loaded it had: the
    sweep loads it in the main process (default threads) for --workers N, and with --threads T when
    it trains in-process. mnist1d's float32 mean and std once summed in a thread-dependent order."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = load()
        torch.set_num_threads(4)
        four = load()
    finally:
        torch.set_num_threads(before)
    for field in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
        assert torch.equal(getattr(one, field), getattr(four, field)), field
