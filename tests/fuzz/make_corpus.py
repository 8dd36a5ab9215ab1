#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/: a handful of
# small valid files and typical invalid ones per target (a few KiB each). The same content on
# every run, not the same bytes (HDF5 stores object times): after changing it, commit only the
# files that changed in content. Needs python3-h5py and python3-numpy.
#   python3 tests/fuzz/make_corpus.py [OUT_DIR]   (default: tests/fuzz/corpus beside this file)
import gzip
import io
import os
import shutil
import struct
import sys
import tempfile
import zlib

import h5py
import numpy as np

SEP = b"\n--dptrain-fuzz-next-file--\n"  # fuzz::kSeparator in fuzz_util.h
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def h5bytes(build, libver=None):
    """Runs build(h5py.File) on a fresh file and returns its bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "f.h5")
        kw = {"libver": libver} if libver else {}
        with h5py.File(p, "w", **kw) as f:
            build(f)
        with open(p, "rb") as f:
            return f.read()


# ---------------------------------------------------------------------------------------------
# config: TOML text, then optionally "%%" and one --set item per line.
def config():
    for name in ("linear.toml", "fmnist_cnn.toml", "mlp_layers.toml"):
        with open(os.path.join(ROOT, "configs", name), "rb") as f:
            put("config", "valid_" + name, f.read())
    put("config", "minimal.toml", b'[data]\ntrain = "synthetic"\n[model]\nname = "linear"\n')
    put("config", "sets.toml",
        b'[data]\ntrain = "synthetic"\n[model]\nname = "mlp"\n%%\ntrain.lr=0.1\n'
        b'train.nesterov=true\ndata.mean=[0.5]\ndata.std=[0.25]\nmemory.limit=2GiB\n'
        b'data.train="/d/x.h5"\n')
    put("config", "layers.toml",
        b'[data]\ntrain = "synthetic"\n[model]\nclasses = 3\nlayers = [\n'
        b'  {type = "conv2d", out = 4, kernel = 3, pad = 1},\n  {type = "relu"},\n'
        b'  {type = "maxpool", kernel = 2},\n  {type = "dropout", p = 0.25},\n'
        b'  {type = "flatten"},\n  {type = "linear", out = 3, name = "fc"},\n]\n')
    put("config", "bad_unknown_key.toml", b'[train]\nlrr = 0.1\n')
    put("config", "bad_type.toml", b'[data]\ntrain = "synthetic"\n[train]\nlr = "fast"\n')
    put("config", "bad_range.toml",
        b'[data]\ntrain = "synthetic"\n[model]\nname = "linear"\n%%\ntrain.global_batch=0\n'
        b'train.lr=-1\n')
    put("config", "bad_syntax.toml", b'[train\nlr = = 0.1\n"unterminated\n')
    put("config", "bad_set.toml", b'%%\nmodel.layers=[]\nnodot\n=1\ntrain.lr\n')
    # Regression: a --set string that is not UTF-8 was accepted and broke the ToToml round trip.
    put("config", "regress_set_invalid_utf8.toml",
        b'[data]\ntrain = "synthetic"\n[model]\nname = "mlp"\n%%\ndata.train=\x01\xe3\xe3"/d/x.h5"\n')


# ---------------------------------------------------------------------------------------------
# hdf5_dataset: one HDF5 file.
def dataset_file(images, labels, classes=None, mean=None, std=None, chunks=None, libver=None,
                 images_name="images", labels_name="labels"):
    def build(f):
        f.create_dataset(images_name, data=images, chunks=chunks)
        if labels is not None:
            f.create_dataset(labels_name, data=labels)
        if classes is not None:
            f.attrs["classes"] = classes
        if mean is not None:
            f.attrs["mean"] = np.asarray(mean, np.float32)
        if std is not None:
            f.attrs["std"] = np.asarray(std, np.float32)
    return h5bytes(build, libver)


def hdf5_dataset():
    rng = np.random.default_rng(7)
    u8 = rng.integers(0, 256, (4, 1, 3, 3), dtype=np.uint8)
    f32 = rng.random((3, 2, 2, 2), dtype=np.float32)
    lab = np.array([0, 1, 2, 1], np.int32)
    valid = dataset_file(u8, lab, classes=np.int64(3), chunks=(2, 1, 3, 3), libver="latest")
    put("hdf5_dataset", "u8_chunked_latest.h5", valid)
    put("hdf5_dataset", "u8_contiguous_v0.h5", dataset_file(u8, lab.astype(np.uint8)))
    put("hdf5_dataset", "f32_meanstd.h5",
        dataset_file(f32, np.array([1, 0, 1], np.int64), classes=np.int64(2), mean=[0.5, 0.5],
                     std=[0.25, 0.25], chunks=(1, 2, 2, 2), libver="latest"))
    put("hdf5_dataset", "rank3.h5",
        dataset_file(u8[:, 0], lab, libver="latest"))
    nan = f32.copy()
    nan[1, 1, 0, 1] = np.nan
    put("hdf5_dataset", "bad_nan.h5", dataset_file(nan, np.array([0, 0, 0]), libver="latest"))
    put("hdf5_dataset", "bad_label.h5",
        dataset_file(u8, np.array([0, 1, 7, -1], np.int32), classes=np.int64(3), libver="latest"))
    put("hdf5_dataset", "bad_dtype.h5",
        dataset_file(u8.astype(np.int16), lab, libver="latest"))
    put("hdf5_dataset", "bad_n_mismatch.h5", dataset_file(u8, lab[:3], libver="latest"))
    put("hdf5_dataset", "bad_no_labels.h5", dataset_file(u8, None, libver="latest"))
    put("hdf5_dataset", "bad_classes_attr.h5",
        dataset_file(u8, lab, classes=np.array([3.5, 2.0]), libver="latest"))
    put("hdf5_dataset", "bad_truncated.h5", valid[: len(valid) * 2 // 3])

    # Regression (tests/unit/hdf5_dataset_errors_test.cc reads these too): shapes far larger than
    # the file. HDF5 reads never-written storage as fill values, so a 2 KiB file can declare
    # terabytes; validation used to size its buffers by the declared shape.
    def sparse(f, img_shape, lab_shape, chunks=None, compression=None):
        f.create_dataset("images", shape=img_shape, dtype=np.uint8, chunks=chunks,
                         compression=compression)
        f.create_dataset("labels", shape=lab_shape, dtype=np.int64)
    put("hdf5_dataset", "regress_sparse_huge.h5",
        h5bytes(lambda f: sparse(f, (1 << 40, 1, 1, 1), (1 << 40,)), "latest"))
    put("hdf5_dataset", "regress_sparse_huge_sample.h5",
        h5bytes(lambda f: sparse(f, (2, 1 << 20, 1 << 10, 1 << 10), (2,), chunks=(1, 1, 64, 64),
                                 compression="gzip"), "latest"))
    put("hdf5_dataset", "bad_not_hdf5.h5", b"not an HDF5 file\n" * 4)


# ---------------------------------------------------------------------------------------------
# convert_idx: images idx, separator, labels idx (either may be gzip).
def idx_images(n, h, w, pixels=None, magic=0x803):
    px = bytes(pixels) if pixels is not None else bytes((i * 37) % 256 for i in range(n * h * w))
    return struct.pack(">IIII", magic, n, h, w) + px


def idx_labels(labels, magic=0x801):
    return struct.pack(">II", magic, len(labels)) + bytes(labels)


def gz(b):
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as g:
        g.write(b)
    return out.getvalue()


def convert_idx():
    img, lab = idx_images(3, 4, 4), idx_labels([0, 2, 1])
    put("convert_idx", "plain.idx", img + SEP + lab)
    put("convert_idx", "gzip.idx", gz(img) + SEP + gz(lab))
    put("convert_idx", "bad_magic.idx", idx_labels([1]) + SEP + img)
    put("convert_idx", "bad_count.idx", img + SEP + idx_labels([0, 1]))
    put("convert_idx", "bad_truncated.idx", img[:-5] + SEP + lab)
    put("convert_idx", "bad_trailing.idx", img + b"xx" + SEP + lab)
    put("convert_idx", "bad_dims.idx", idx_images(0, 4, 4) + SEP + idx_labels([]))
    put("convert_idx", "bad_huge_header.idx",
        struct.pack(">IIII", 0x803, 0xFFFFFFFF, 16384, 16384) + SEP + lab)
    put("convert_idx", "bad_gzip.idx", gz(img)[:-12] + SEP + lab)


# ---------------------------------------------------------------------------------------------
# convert_cifar10: one test_batch.bin, or data_batch_1..5 joined with the separator.
def cifar_record(label, seed):
    return bytes([label]) + bytes((seed * 31 + i * 7) % 256 for i in range(3072))


def convert_cifar10():
    put("convert_cifar10", "test_two.bin", cifar_record(3, 1) + cifar_record(9, 2))
    put("convert_cifar10", "train_five.bin", SEP.join(cifar_record(i, i) for i in range(5)))
    put("convert_cifar10", "bad_label.bin", cifar_record(10, 1))
    put("convert_cifar10", "bad_size.bin", cifar_record(1, 1)[:-1])
    put("convert_cifar10", "bad_cifar100.bin", cifar_record(1, 1) + b"\x00")
    put("convert_cifar10", "bad_missing_batch.bin", cifar_record(1, 1) + SEP + cifar_record(2, 2))
    put("convert_cifar10", "bad_empty.bin", b"")


# ---------------------------------------------------------------------------------------------
# convert_npy: images .npy, separator, labels .npy.
def npy(a, version=None):
    out = io.BytesIO()
    if version is None:
        np.save(out, a)
    else:
        np.lib.format.write_array(out, a, version=version)
    return out.getvalue()


def convert_npy():
    rng = np.random.default_rng(3)
    u8 = rng.integers(0, 256, (3, 4, 4), dtype=np.uint8)
    f32 = rng.random((2, 3, 2, 2), dtype=np.float32)
    put("convert_npy", "u8_i64.npy", npy(u8) + SEP + npy(np.array([0, 2, 1], np.int64)))
    put("convert_npy", "f32_u1_v2.npy",
        npy(f32, (2, 0)) + SEP + npy(np.array([[1], [0]], np.uint8), (2, 0)))
    put("convert_npy", "f32be_i2be_v3.npy",
        npy(f32.astype(">f4"), (3, 0)) + SEP + npy(np.array([1, 1], ">i2"), (3, 0)))
    put("convert_npy", "bad_fortran.npy",
        npy(np.asfortranarray(u8)) + SEP + npy(np.arange(3)))
    put("convert_npy", "bad_dtype.npy", npy(u8.astype(np.float64)) + SEP + npy(np.arange(3)))
    put("convert_npy", "bad_label_dtype.npy", npy(u8) + SEP + npy(np.array([0.0, 1.0, 2.0])))
    put("convert_npy", "bad_negative_label.npy", npy(u8) + SEP + npy(np.array([0, -1, 2])))
    nan = f32.copy()
    nan[1, 2, 1, 0] = np.inf
    put("convert_npy", "bad_inf.npy", npy(nan) + SEP + npy(np.array([0, 1])))
    put("convert_npy", "bad_truncated.npy", npy(u8)[:-3] + SEP + npy(np.arange(3)))
    put("convert_npy", "bad_header.npy",
        b"\x93NUMPY\x01\x00\x36\x00{'descr': '<u1', 'fortran_order': False, 'shape': (3, 4, 4 }"
        + b" " * 5 + b"\n" + SEP + npy(np.arange(3)))
    put("convert_npy", "bad_structured.npy",
        npy(np.zeros(3, dtype=[("a", "<i4"), ("b", "<f4")])) + SEP + npy(np.arange(3)))


# ---------------------------------------------------------------------------------------------
# checkpoint: one HDF5 file in the layout of runtime/checkpoint/checkpoint.h.
def crc(a):
    return np.uint32(zlib.crc32(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()))


def state_crc32(attrs):
    """CRC-32 of docs/checkpoints.md's /state checksum text: name=value lines in name order."""
    def text(v):
        if isinstance(v, (bytes, str)):
            return v.decode() if isinstance(v, bytes) else v
        if isinstance(v, (float, np.floating)):
            return "nan" if np.isnan(v) else "%.17g" % v
        return str(int(v))
    lines = "".join(f"{k}={text(attrs[k])}\n" for k in sorted(attrs) if k != "crc32")
    return np.uint32(zlib.crc32(lines.encode()))


def checkpoint_file(params, optimizer=None, state=True, with_crc=True, config=True,
                    format_version=1, bad_crc=None, libver="latest", state_crc=None):
    def build(f):
        g = f.create_group("params")
        for name, a in params.items():
            d = g.create_dataset(name, data=a)
            if with_crc:
                d.attrs["crc32"] = crc(a) ^ np.uint32(1 if name == bad_crc else 0)
        if optimizer is not None:
            o = f.create_group("optimizer")
            o.attrs["kind"] = "sgd"
            o.attrs["steps"] = np.int64(3)
            for pname, slots in optimizer.items():
                pg = o.create_group(pname)
                for slot, a in slots.items():
                    d = pg.create_dataset(slot, data=a)
                    if with_crc:
                        d.attrs["crc32"] = crc(a)
        if state:
            s = f.create_group("state")
            ints = dict(format_version=format_version, step=3, epoch=1, samples_in_epoch=8,
                        seed=42, rng_state=42, world_size_at_save=2, global_batch=4,
                        accumulate=1, dataset_size=16, steps_per_epoch=4, optimizer_steps=3,
                        schedule_step=3, last_eval_step=-1)
            for k, v in ints.items():
                s.attrs[k] = np.int64(v)
            s.attrs["lr"] = np.float64(0.05)
            s.attrs["elapsed_s"] = np.float64(1.5)
            for k, v in dict(dptrain_version="0.1.0", created="2026-01-01T00:00:00Z",
                             optimizer="sgd", schedule="constant", rng="counter").items():
                s.attrs[k] = v
            if state_crc is not None:  # "good" or "bad" (off by one bit)
                s.attrs["crc32"] = state_crc32(s.attrs) ^ np.uint32(state_crc == "bad")
        if config:
            f["config"] = 'seed = 42\n[data]\ntrain = "synthetic"\n[model]\nname = "linear"\n'
    return h5bytes(build, libver)


def checkpoint():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    params = {"fc.weight": w, "fc.bias": b, "bn.num_batches_tracked": np.array(7, np.int64)}
    opt = {"fc.weight": {"momentum_buffer": w * 0.5}, "fc.bias": {"momentum_buffer": b * 0.5}}
    valid = checkpoint_file(params, opt)
    put("checkpoint", "valid.h5", valid)
    put("checkpoint", "valid_v0.h5", checkpoint_file(params, opt, libver=None))
    put("checkpoint", "params_only.h5",
        checkpoint_file({"fc.weight": w, "fc.bias": b}, state=False, with_crc=False,
                        config=False))
    put("checkpoint", "module_prefix.h5",
        checkpoint_file({"module.fc.weight": w, "module.fc.bias": b}, state=False,
                        with_crc=False, config=False))
    put("checkpoint", "bad_shape.h5",
        checkpoint_file({"fc.weight": w.T.copy(), "fc.bias": b, "extra": b}, opt))
    put("checkpoint", "bad_crc.h5", checkpoint_file(params, opt, bad_crc="fc.bias"))
    put("checkpoint", "valid_state_crc.h5", checkpoint_file(params, opt, state_crc="good"))
    put("checkpoint", "bad_state_crc.h5", checkpoint_file(params, opt, state_crc="bad"))
    put("checkpoint", "bad_newer_format.h5", checkpoint_file(params, opt, format_version=99))
    put("checkpoint", "bad_no_crc.h5", checkpoint_file(params, opt, with_crc=False))
    put("checkpoint", "bad_dtype.h5",
        checkpoint_file({"fc.weight": w.astype(np.float64), "fc.bias": b}, state=False,
                        with_crc=False))
    put("checkpoint", "bad_no_params.h5",
        dataset_file(np.zeros((1, 1, 2, 2), np.uint8), np.zeros(1, np.int32), libver="latest"))
    put("checkpoint", "bad_truncated.h5", valid[: len(valid) // 2])
    put("checkpoint", "bad_not_hdf5.h5", b"\x89HDF\r\n\x1a\n" + b"\x00" * 40)


# Reproducers of open findings in code outside the fuzz owner's reach: written to
# tests/fuzz/open-findings/<target>/ (NOT replayed by ctest until fixed; then move them into
# corpus/<target>/ so that they become regression tests).
def open_findings():
    d = os.path.join(os.path.dirname(OUT), "open-findings", "checkpoint")
    os.makedirs(d, exist_ok=True)  # also holds fuzzer-found reproducers, kept as found

    def sparse_param(f):  # /params tensor of 2^40 floats that were never written
        f.create_group("params").create_dataset("fc.weight", shape=(1 << 40,), dtype=np.float32)
    with open(os.path.join(d, "sparse_huge_param.h5"), "wb") as f:
        f.write(h5bytes(sparse_param, "latest"))

    def string_array_attr(f):  # /state @optimizer: 3 strings where one is expected
        f.create_group("params").create_dataset("fc.bias", data=np.zeros(2, np.float32))
        s = f.create_group("state")
        s.attrs["format_version"] = np.int64(1)
        s.attrs["optimizer"] = ["sgd", "adamw", "sgd"]
        s.attrs["dptrain_version"] = np.array([b"0.1.0", b"0.2.0"], dtype="S5")
        f.create_dataset("config", data=np.array([b"a = 1", b"b = 2", b"c = 3"], dtype="S5"))
    with open(os.path.join(d, "string_arrays.h5"), "wb") as f:
        f.write(h5bytes(string_array_attr, "latest"))


if __name__ == "__main__":
    for t in ("config", "hdf5_dataset", "convert_idx", "convert_cifar10", "convert_npy",
              "checkpoint"):
        shutil.rmtree(os.path.join(OUT, t), ignore_errors=True)
    config()
    hdf5_dataset()
    convert_idx()
    convert_cifar10()
    convert_npy()
    checkpoint()
    open_findings()
