"""Image data for the ViT: the scikit-learn digits set and an ImageNet-style image folder.

**Digits** (``load_digits``): the 1,797 handwritten 8x8 grey digits bundled with scikit-learn
(UCI "optdigits" test set; pixel values 0..16), 10 classes. The split is fixed: a stratified
80/20 split by ``sklearn.model_selection.train_test_split(test_size=0.2, random_state=0,
stratify=labels)``, i.e. 1,437 training and 360 test images, the same on every machine. Pixels
are scaled to [0, 1] and then standardised with the *training* mean and std.

**Image folder** (``ImageFolder``): ``root/<class name>/<image file>``, one sub-folder per class
(class index = position of the folder name in sorted order), decoded with Pillow to RGB. Training
augmentation is the standard "resize, random crop, horizontal flip": resize the shorter side to
``resize``, take a random ``image_size`` crop, flip with probability 1/2. Evaluation resizes and
takes the centre crop. Pixels are scaled to [0, 1] and standardised per channel with the ImageNet
mean/std. Every problem is reported in one line naming the folder or file at fault.

Arrays are ``(B, H, W, C)`` float32 images and ``(B,)`` int32 labels.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif",
                                     ".tiff", ".ppm", ".pgm")
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)

DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0


@dataclass(frozen=True)
class ImageSplit:
    """A labelled image set held in memory."""

    images: np.ndarray  # (B, H, W, C) float32
    labels: np.ndarray  # (B,) int32
    class_names: tuple[str, ...]

    def __post_init__(self):
        if self.images.ndim != 4 or self.labels.shape != self.images.shape[:1]:
            raise ValueError(f"images must be (B, H, W, C) and labels (B,), got "
                             f"{self.images.shape} and {self.labels.shape}")

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def load_digits() -> tuple[ImageSplit, ImageSplit]:
    """The scikit-learn digits with the fixed stratified 1,437 / 360 split (see module doc)."""
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    bunch = sk_load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[..., None]  # (1797, 8, 8, 1), in [0, 1]
    labels = bunch.target.astype(np.int32)
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, labels, test_size=DIGITS_TEST_FRACTION, random_state=DIGITS_SPLIT_SEED,
        stratify=labels,
    )
    # Statistics from the training split only, so the test set stays unseen.
    mean, std = float(x_tr.mean()), float(x_tr.std())
    names = tuple(str(n) for n in bunch.target_names)
    return (
        ImageSplit(((x_tr - mean) / std).astype(np.float32), y_tr, names),
        ImageSplit(((x_te - mean) / std).astype(np.float32), y_te, names),
    )


def _list_classes(root: Path) -> tuple[tuple[str, ...], list[tuple[Path, int]]]:
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist (expected "
                                "root/<class name>/<image files>)")
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        raise ValueError(f"image folder {root} has no class sub-folders (expected "
                         "root/<class name>/<image files>)")
    samples: list[tuple[Path, int]] = []
    for index, class_dir in enumerate(class_dirs):
        files = sorted(p for p in class_dir.iterdir()
                       if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        if not files:
            raise ValueError(f"class folder {class_dir} holds no images (extensions: "
                             f"{', '.join(IMAGE_EXTENSIONS)})")
        samples += [(f, index) for f in files]
    return tuple(p.name for p in class_dirs), samples


def decode_image(path: Path):
    """Open ``path`` with Pillow as RGB; a one-line ValueError naming the file if that fails."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise ValueError(f"cannot decode image {path}: {type(err).__name__}") from None


def _resize_shorter(img, size: int):
    from PIL import Image

    w, h = img.size
    scale = size / min(w, h)
    new = (max(size, round(w * scale)), max(size, round(h * scale)))
    return img.resize(new, Image.BILINEAR)


class ImageFolder:
    """An ImageNet-style folder ``root/<class>/<image>``; images are decoded lazily per batch.

    Args:
        root: the folder.
        image_size: side of the square crops fed to the model.
        resize: shorter side after resizing (default ``image_size * 8 // 7``, i.e. 256 for 224).
        train: random crop + flip if True, centre crop if False.
    """

    def __init__(self, root: str | Path, image_size: int, *, resize: int | None = None,
                 train: bool = True):
        self.root = Path(root)
        if image_size < 1:
            raise ValueError(f"image_size must be >= 1, got {image_size}")
        self.image_size = image_size
        self.resize = image_size * 8 // 7 if resize is None else resize
        if self.resize < image_size:
            raise ValueError(f"resize {self.resize} must be >= image_size {image_size}")
        self.train = train
        self.class_names, self.samples = _list_classes(self.root)

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, index: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """One preprocessed image ``(image_size, image_size, 3)``, float32, standardised."""
        path, _ = self.samples[index]
        img = _resize_shorter(decode_image(path), self.resize)
        w, h = img.size
        s = self.image_size
        if self.train:
            if rng is None:
                raise ValueError("train=True needs an rng for the random crop and flip")
            left, top = int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1))
        else:
            left, top = (w - s) // 2, (h - s) // 2
        x = np.asarray(img.crop((left, top, left + s, top + s)), np.float32) / 255.0
        if self.train and rng.random() < 0.5:
            x = x[:, ::-1]
        return (x - IMAGENET_MEAN) / IMAGENET_STD

    def batches(self, batch_size: int, *, seed: int = 0, epochs: int | None = 1,
                drop_last: bool | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Batches ``(images (B, S, S, 3), labels (B,))``; shuffled each epoch when training.

        ``epochs=None`` repeats forever. ``drop_last`` defaults to ``train``.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        drop_last = self.train if drop_last is None else drop_last
        rng = np.random.default_rng(seed)
        labels = np.array([label for _, label in self.samples], np.int32)
        epoch = 0
        while epochs is None or epoch < epochs:
            order = rng.permutation(len(self)) if self.train else np.arange(len(self))
            stop = len(order) - (len(order) % batch_size if drop_last else 0)
            for start in range(0, stop, batch_size):
                idx = order[start:start + batch_size]
                yield np.stack([self.load(int(i), rng) for i in idx]), labels[idx]
            epoch += 1

    def to_split(self, seed: int = 0) -> ImageSplit:
        """Decode every image once into memory (small folders only)."""
        images, labels = zip(*self.batches(max(1, len(self)), seed=seed, drop_last=False))
        return ImageSplit(np.concatenate(images), np.concatenate(labels), self.class_names)
