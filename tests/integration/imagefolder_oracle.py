# SPDX-License-Identifier: Apache-2.0
"""PIL side of tests/integration/imagefolder_convert.sh (run with Debian's /usr/bin/python3).

  make DIR            writes a small ImageFolder tree: 3 classes, ~10 images each, JPEG RGB /
                      greyscale / CMYK, PNG RGB / RGBA / palette (with and without transparency) /
                      greyscale / grey+alpha / 1-bit, sizes and aspects from 20x28 (smaller than
                      the output) to 300x200, a nested subfolder, upper-case extensions and files
                      that are not images.
  check DIR S H5...   the shards H5... (in order) hold DIR as torchvision's ImageFolder sees it:
                      order, labels, classes / class_names, shape [N, 3, S, S], one sample per
                      chunk, and pixels within a mean absolute difference of 2/255 of PIL's
                      convert("RGB").resize(BILINEAR, reducing_gap=None) + centre crop, per
                      image. --skip REL leaves a file out (repeatable). Prints the worst image.
  same A B            the /images and /labels of A and B are equal (thread count independence).
"""
import os
import sys

import h5py
import numpy as np
from PIL import Image

EXTS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
TOLERANCE = 2.0  # mean absolute difference, in 0..255 units


def picture(w, h, seed):
    """A smooth natural-looking RGB picture: gradients, a disc, a bar and blurred noise."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    u, v = x / max(w - 1, 1), y / max(h - 1, 1)
    r = 255 * (0.5 + 0.5 * np.sin(3 * u + seed))
    g = 255 * v
    b = 255 * (0.5 + 0.5 * np.cos(2 * (u + v) + seed))
    img = np.stack([r, g, b], axis=-1)
    cx, cy, rad = rng.uniform(0.3, 0.7) * w, rng.uniform(0.3, 0.7) * h, 0.25 * min(w, h)
    disc = (x - cx) ** 2 + (y - cy) ** 2 < rad**2
    img[disc] = rng.uniform(0, 255, size=3)
    img[(np.abs(y - 0.7 * h) < max(1, h // 12)), :] = rng.uniform(0, 255, size=3)
    noise = rng.normal(0, 12, size=(h // 4 + 1, w // 4 + 1, 3))
    img += np.kron(noise, np.ones((4, 4, 1)))[:h, :w]
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def make(root):
    # (class, relative name, width, height, kind)
    plan = [
        ("Zebra", "a.jpg", 64, 48, "jpeg-rgb"),
        ("Zebra", "b.JPG", 48, 96, "jpeg-rgb"),
        ("Zebra", "c.jpeg", 300, 200, "jpeg-rgb"),
        ("Zebra", "d.jpg", 100, 37, "jpeg-grey"),
        ("Zebra", "e.jpg", 37, 100, "jpeg-cmyk"),
        ("Zebra", "f.png", 33, 33, "png-rgb"),
        ("Zebra", "g.png", 20, 28, "png-rgba"),
        ("Zebra", "h.png", 80, 60, "png-palette"),
        ("Zebra", "i.png", 64, 64, "png-grey"),
        ("Zebra", "j.PNG", 32, 32, "png-la"),
        ("cat", "01.jpg", 128, 96, "jpeg-cmyk"),
        ("cat", "02.png", 96, 128, "png-palette-trns"),
        ("cat", "10.jpg", 50, 51, "jpeg-grey"),
        ("cat", "2.jpg", 200, 300, "jpeg-rgb"),
        ("cat", "more/x.png", 70, 45, "png-rgba"),
        ("cat", "more/y.jpg", 45, 70, "jpeg-rgb"),
        ("cat", "z.png", 40, 40, "png-1bit"),
        ("cat", "zz.jpg", 31, 47, "jpeg-rgb"),
        ("cat", "zzz.png", 120, 33, "png-grey"),
        ("dog", "a.png", 64, 48, "png-rgb"),
        ("dog", "b.jpg", 99, 66, "jpeg-rgb"),
        ("dog", "c.jpg", 66, 99, "jpeg-cmyk"),
        ("dog", "d.png", 150, 150, "png-palette"),
        ("dog", "e.jpg", 25, 40, "jpeg-grey"),
        ("dog", "f.png", 256, 77, "png-rgba"),
        ("dog", "g.jpg", 77, 256, "jpeg-rgb"),
        ("dog", "h.png", 45, 45, "png-la"),
        ("dog", "i.jpeg", 63, 65, "jpeg-rgb"),
        ("dog", "j.png", 57, 34, "png-grey"),
    ]
    for seed, (cls, rel, w, h, kind) in enumerate(plan):
        path = os.path.join(root, cls, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        img = picture(w, h, seed)
        if kind == "jpeg-rgb":
            img.save(path, "JPEG", quality=90)
        elif kind == "jpeg-grey":
            img.convert("L").save(path, "JPEG", quality=90)
        elif kind == "jpeg-cmyk":
            img.convert("CMYK").save(path, "JPEG", quality=90)  # Adobe inverted, as Photoshop
        elif kind == "png-rgb":
            img.save(path, "PNG")
        elif kind == "png-rgba":
            a = Image.fromarray(np.linspace(0, 255, w * h).reshape(h, w).astype(np.uint8))
            img.putalpha(a)
            img.save(path, "PNG")
        elif kind == "png-palette":
            img.convert("P", palette=Image.ADAPTIVE, colors=64).save(path, "PNG")
        elif kind == "png-palette-trns":
            img.convert("P", palette=Image.ADAPTIVE, colors=32).save(path, "PNG", transparency=3)
        elif kind == "png-grey":
            img.convert("L").save(path, "PNG")
        elif kind == "png-la":
            img.convert("LA").save(path, "PNG")
        elif kind == "png-1bit":
            img.convert("1").save(path, "PNG")
        else:
            raise ValueError(kind)
    # Not images: ignored, as torchvision ignores them.
    with open(os.path.join(root, "cat", "notes.txt"), "w") as f:
        f.write("not an image\n")
    with open(os.path.join(root, "README"), "w") as f:
        f.write("files beside the class folders are ignored\n")


def image_folder(root):
    """(classes, [(path, label)]) in torchvision's order; torchvision itself when installed."""
    try:
        from torchvision.datasets import ImageFolder

        ds = ImageFolder(root, loader=lambda p: p)
        return ds.classes, ds.samples
    except ImportError:
        pass
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for label, c in enumerate(classes):
        for r, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for n in sorted(names):
                if n.lower().endswith(EXTS):
                    samples.append((os.path.join(r, n), label))
    return classes, samples


def reference(path, size):
    """torchvision Resize(S) + CenterCrop(S) on PIL, spelled out: uint8 [3, S, S]."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(size * long / short)
    nw, nh = (size, new_long) if w <= h else (new_long, size)
    img = img.resize((nw, nh), Image.BILINEAR, reducing_gap=None)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    out = np.asarray(img.crop((left, top, left + size, top + size))).transpose(2, 0, 1)
    try:  # the spelled-out geometry must be torchvision's own
        from torchvision import transforms

        tv = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size)])
        tv_out = np.asarray(tv(Image.open(path).convert("RGB"))).transpose(2, 0, 1)
        assert np.array_equal(tv_out, out), f"{path}: oracle geometry differs from torchvision"
    except ImportError:
        pass
    return out


def check(root, size, files, skip):
    classes, samples = image_folder(root)
    samples = [(p, l) for p, l in samples if os.path.relpath(p, root) not in skip]
    images, labels = [], []
    for f in files:
        with h5py.File(f, "r") as h:
            assert h["images"].dtype == np.uint8, f"{f}: /images dtype {h['images'].dtype}"
            assert h["images"].shape[1:] == (3, size, size), f"{f}: shape {h['images'].shape}"
            assert h["images"].chunks == (1, 3, size, size), f"{f}: chunks {h['images'].chunks}"
            assert h["labels"].dtype == np.int32, f"{f}: /labels dtype {h['labels'].dtype}"
            assert int(h.attrs["classes"]) == len(classes), f"{f}: classes {h.attrs['classes']}"
            names = h.attrs["class_names"]
            names = names.decode() if isinstance(names, bytes) else names
            assert names.split("\n") == classes, f"{f}: class_names {names!r} != {classes}"
            images.append(h["images"][:])
            labels.append(h["labels"][:])
    images, labels = np.concatenate(images), np.concatenate(labels)
    assert len(labels) == len(samples), f"{len(labels)} samples stored, expected {len(samples)}"
    want = np.array([l for _, l in samples], dtype=np.int32)
    assert np.array_equal(labels, want), f"labels {labels.tolist()} != {want.tolist()}"
    worst, worst_path, worst_px = -1.0, "", 0
    for i, (p, _) in enumerate(samples):
        diff = np.abs(images[i].astype(np.int32) - reference(p, size).astype(np.int32))
        if diff.mean() > worst:
            worst, worst_path, worst_px = diff.mean(), p, int(diff.max())
        assert diff.mean() <= TOLERANCE, (
            f"{p} (sample {i}): mean |dptrain - PIL| = {diff.mean():.3f} > {TOLERANCE}/255"
        )
    print(
        f"{len(samples)} samples in {len(files)} file(s) match torchvision's order and labels; "
        f"worst mean |dptrain - PIL| = {worst:.3f}/255 (max pixel {worst_px}) on "
        f"{os.path.relpath(worst_path, root)}"
    )


def same(a, b):
    with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
        for k in ("images", "labels"):
            assert np.array_equal(x[k][:], y[k][:]), f"{a} and {b} differ in /{k}"
    print(f"{a} == {b}")


def main(argv):
    if argv[0] == "make":
        make(argv[1])
    elif argv[0] == "check":
        skip, rest = [], []
        it = iter(argv[3:])
        for a in it:
            if a == "--skip":
                skip.append(next(it))
            else:
                rest.append(a)
        check(argv[1], int(argv[2]), rest, set(skip))
    elif argv[0] == "same":
        same(argv[1], argv[2])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except AssertionError as e:
        print(f"FAIL: {e}")
        sys.exit(1)
